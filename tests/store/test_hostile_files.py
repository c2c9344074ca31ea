"""Hostile files, generated: whatever bytes a store file holds, the library and the audit refuse it cleanly.

Hypothesis makes the files: random bytes; a real store cut at any byte; a real store with bits flipped
anywhere (after a checkpoint, so every byte of the log is in the main file); SQLite files with foreign
schemas (some wearing our application_id and user_version); and real stores edited as an attacker
would (plain apsw, the append-only triggers dropped, then put back or not): seqs huge, zero or
negative, bodies that are not JSON, JSON that is not an event, unknown tags, a 10 MB body, NUL in text,
and wrong-typed values or NULLs (STRICT refuses them, so the attacker first rewrites the table's schema
without STRICT and NOT NULL, then leaves it so or puts the STRICT text back over the values), each edit
then re-chained or not; and real stores whose schema was changed: triggers added (one that ignores
inserts, no-ops, on any table), dropped or redefined (``WHEN 0``), constraints dropped (events rebuilt
without UNIQUE (stream, version) or a NOT NULL), side tables edited (a meta key, an index, a view). A
writer must refuse every schema change (StoreFormatError) and the audit must fail it (65).

Each file goes two ways, and both must end cleanly:

- in-process: ``EventStore.open`` (read-write or read-only), ``verify()``, and ``.event`` of every
  event read, each step either succeeding or raising a `LifecycleError` kind. They run in a long-lived
  probe process (one per module, fed one path at a time), so a hang is a timeout the test reports
  instead of a stuck run, and under ``RLIMIT_AS`` of 1 GiB, so unbounded memory is a MemoryError
  the test reports instead of a swapping machine;
- the real ``lifecycle-es audit`` console script, under the same limit and a timeout: exit 0 (the file
  is still whole: a flip in free space), 65 or 66, at most one line on stderr, never a traceback.

`make test` runs ``EXAMPLES`` (30) examples a test; ``LIFECYCLE_ES_HOSTILE_EXAMPLES=500`` runs more.
The examples of one test all copy a template store built once per module.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import apsw
import pytest
from fleets import build_long, set_events_schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle_es import EventStore, IntegrityError, ProxyAuthority, Resources, RunnerLifecycle, chain
from lifecycle_es.canonical import iso_ms
from lifecycle_es.sqlite_schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from lifecycle_es.testing import FakeClock, SequentialIds
from projections import attach

CLI = shutil.which("lifecycle-es", path=os.path.dirname(sys.executable))
EXAMPLES = int(os.environ.get("LIFECYCLE_ES_HOSTILE_EXAMPLES", "30"))
MEMORY_LIMIT = 1 << 30  # RLIMIT_AS of every child: a parse that grows without bound dies of it, visibly
# Not a timing assert: a file that takes this long is a hang (the whole template audits in well under 1 s).
HANG_S = 60
CLEAN_EXITS = (0, 65, 66)
DIGEST = "sha256:" + "ab" * 32
HOOK = "sha256:" + "cd" * 32
TEN_MB = 10 * 1024 * 1024

HOSTILE = settings(max_examples=EXAMPLES, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.function_scoped_fixture])

# The probe: EventStore.open, verify, and every event's .event, one file per request line. Each step
# answers "ok", "refused" (a LifecycleError kind) or "crashed" (anything else, with its traceback).
PROBE = textwrap.dedent("""
    import json, sys, traceback
    from lifecycle_es import EventStore, LifecycleError

    def step(name, action, replies):
        try:
            action()
        except LifecycleError as exc:
            replies.append({"step": name, "outcome": "refused", "kind": type(exc).__name__,
                            "message": str(exc)[:500]})
            return False
        except BaseException as exc:
            replies.append({"step": name, "outcome": "crashed", "kind": type(exc).__name__,
                            "traceback": traceback.format_exc()[-4000:]})
            return False
        replies.append({"step": name, "outcome": "ok"})
        return True

    for line in sys.stdin:
        request = json.loads(line)
        replies = []
        opened = []
        if step("open", lambda: opened.append(EventStore.open(request["path"], read_only=request["read_only"])),
                replies):
            store = opened[0]
            step("verify", store.verify, replies)
            step("events", lambda: [recorded.event for recorded in store.read()], replies)
            step("close", store.close, replies)
        print(json.dumps(replies), flush=True)
""")


def _limit_memory() -> None:
    """preexec_fn of every child: a 1 GiB address space."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


class Probe:
    """The long-lived process that opens, verifies and decodes one file per request (started on demand)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def submit(self, path: Path, *, read_only: bool) -> None:
        """Hand the probe `path`; the answer is read by `answer` (so the CLI can run meanwhile)."""
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True, preexec_fn=_limit_memory)
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"path": str(path), "read_only": read_only}) + "\n")
        self._process.stdin.flush()

    def answer(self, path: Path) -> list[dict[str, Any]]:
        """The steps' outcomes; a probe that does not answer within HANG_S, or dies, fails the test."""
        process = self._process
        assert process is not None and process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], HANG_S)
        if not ready:
            self.close()
            pytest.fail(f"EventStore.open/verify/read hung on {path} for {HANG_S} s")
        line = process.stdout.readline()
        if not line:
            code = process.wait()
            self._process = None
            pytest.fail(f"the probe died on {path} with exit status {code} (SIGKILL or out of memory?)")
        return list(json.loads(line))

    def close(self) -> None:
        """Stop the probe (it is ours: killed by its own handle)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


@dataclass(frozen=True)
class Template:
    """A valid store, checkpointed into its main file and closed, that every example copies."""

    path: Path
    data: bytes
    head: int

    def __repr__(self) -> str:  # hypothesis prints it with every failing example: not all its bytes
        return f"Template({str(self.path)!r}, {len(self.data):,} bytes, head seq {self.head})"


def _authority(clock: FakeClock, revision: int) -> ProxyAuthority:
    return ProxyAuthority(id="proxy-a", revision=revision, issued_at=iso_ms(clock() - 1000),
                          expires_at=iso_ms(clock() + 3_600_000))


def build_template(directory: Path) -> Template:
    """Three runners through most of the lifecycle, read models attached, snapshots every 3 events."""
    clock = FakeClock()
    base = directory / "base"
    base.mkdir()
    path = directory / "template.db"
    with EventStore.open(path, now=clock) as store:
        attach(store)
        ids = SequentialIds()
        one, two, three = (RunnerLifecycle(store, runner_id=f"runner-{n}", target="local", base_dir=base,
                                           resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                                           post_session_hook_digest=HOOK, now=clock, random_id=ids,
                                           snapshot_every=3) for n in range(3))
        for runner in (one, two, three):
            clock.advance(1000)
            runner.initialize()
        for round_ in range(2):
            for runner in (one, two, three):
                clock.advance(1000)
                receipt = runner.acquire_lease(session_id=f"s-{round_}", expected_generation=1,
                                               proxy_authority=_authority(clock, 1))
                clock.advance(1000)
                runner.settle_lease(lease_id=receipt.lease.id, lease_generation=1, result_digest=DIGEST)
        held = one.acquire_lease(session_id="s-held", expected_generation=1, proxy_authority=_authority(clock, 1))
        clock.advance(1000)
        one.request_drain(expected_generation=1, timeout_ms=60_000)
        clock.advance(1000)
        one.settle_lease(lease_id=held.lease.id, lease_generation=1, result_digest=DIGEST)
        one.authorize_post_session_hook(expected_runner_generation=3, lease_id=held.lease.id, lease_generation=1,
                                        result_digest=DIGEST, hook_digest=HOOK)
        clock.advance(1000)
        one.begin_reclaim(expected_generation=3, proxy_authority=_authority(clock, 2))
        one.complete_reclaim(expected_generation=4)
        two.rotate_proxy_authority(expected_generation=1, proxy_authority=_authority(clock, 2))
        parked = three.acquire_lease(session_id="s-park", expected_generation=1,
                                     proxy_authority=_authority(clock, 1))
        three.park_lease(lease_id=parked.lease.id, lease_generation=1, result_digest=DIGEST, reason="lost-poll")
        head = store.head().seq
        store.backend.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # Closed: the WAL is folded into the main file and removed, so a byte of the file is a byte of the log.
    assert not os.path.exists(f"{path}-wal") or os.path.getsize(f"{path}-wal") == 0
    return Template(path, path.read_bytes(), head)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    """The one valid store of this module; examples copy it."""
    return build_template(tmp_path_factory.mktemp("template"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where examples write their files (each in a directory of its own, removed after it)."""
    return tmp_path_factory.mktemp("hostile")


# --- the check every example ends in ----------------------------------------------------------------


def audit(path: Path, *, as_json: bool, jobs: int = 1) -> subprocess.CompletedProcess[str]:
    """The real console script on `path`, under the memory limit and the hang timeout.

    One process by default (the logs here are far below a worker's share anyway), so the audit does
    not depend on how many CPUs the machine has.
    """
    assert CLI is not None, "the lifecycle-es console script is not installed beside this interpreter"
    args = [CLI, "audit", str(path), "--jobs", str(jobs), *(["--json"] if as_json else [])]
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=HANG_S, check=False,
                              preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"lifecycle-es audit hung on {path} for {HANG_S} s")


def check_both_ways(path: Path, *, read_only: bool, as_json: bool, whole: bool | None = None,
                    writer_refused: bool = False) -> tuple[int, bool]:
    """Run the probe and the audit on `path` (side by side) and hold both to a clean end.

    `whole`: True when the file must audit clean, False when it must not, None when either may hold.
    `writer_refused`: the probe's open (read-write) must be refused with StoreFormatError.
    Returns the audit's exit code and whether every in-process step succeeded.
    """
    # The audit first, on a copy of its own: a read-write open by the probe may add a WAL to the file.
    audited = path.with_name("audited-" + path.name)
    shutil.copyfile(path, audited)
    probe = _PROBE
    probe.submit(path, read_only=read_only)
    done = audit(audited, as_json=as_json)
    steps = probe.answer(path)

    crashed = [step for step in steps if step["outcome"] == "crashed"]
    assert not crashed, f"{path}: the library raised something other than a LifecycleError:\n" + "\n".join(
        f"{step['step']}: {step['traceback']}" for step in crashed)
    in_process_ok = all(step["outcome"] == "ok" for step in steps) and len(steps) == 4

    context = f"{path}: exit {done.returncode}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, context
    assert done.returncode in CLEAN_EXITS, context  # not 70 (a bug), not -9 or MemoryError (unbounded memory)
    assert len(done.stderr.splitlines()) <= 1, context
    if done.stderr:
        assert done.stderr.startswith("lifecycle-es audit: error: "), context
    if as_json:
        report = json.loads(done.stdout)
        assert report["exit_code"] == done.returncode and report["ok"] is (done.returncode == 0), context
    if done.returncode == 0:
        # The audit proves more than verify does: a file it passes must open, verify and decode too.
        assert in_process_ok, (context, steps)
    if whole is not None:
        assert (done.returncode == 0) is whole, context
    if writer_refused:
        assert not read_only and steps[0]["outcome"] == "refused" and steps[0]["kind"] == "StoreFormatError", steps
    return done.returncode, in_process_ok


_PROBE = Probe()


@pytest.fixture(scope="module", autouse=True)
def _probe_lifetime() -> Iterator[None]:
    """Stop the module's probe when the module is done."""
    yield
    _PROBE.close()


@pytest.fixture
def example_dir(scratch: Path) -> Callable[[], Any]:
    """A context manager factory: a fresh directory for one hypothesis example, removed after it."""
    return lambda: tempfile.TemporaryDirectory(dir=scratch)


# --- random bytes and foreign files -----------------------------------------------------------------

SQLITE_HEADER = b"SQLite format 3\x00"


@given(data=st.one_of(
    st.binary(max_size=8192),
    st.binary(max_size=8192).map(lambda tail: SQLITE_HEADER + tail),
    # A valid-looking 100-byte header (page size 4096, WAL) over noise: SQLite gets past the first check.
    st.binary(min_size=4096, max_size=16384).map(
        lambda tail: SQLITE_HEADER + struct.pack(">HBBBBBB", 4096, 2, 2, 0, 64, 32, 32) + tail[24:]),
), read_only=st.booleans(), as_json=st.booleans())
@HOSTILE
def test_random_bytes(example_dir: Callable[[], Any], data: bytes, read_only: bool, as_json: bool) -> None:
    with example_dir() as directory:
        path = Path(directory) / "noise.db"
        path.write_bytes(data)
        code, _ = check_both_ways(path, read_only=read_only, as_json=as_json, whole=False)
        assert code == 65 or (code == 66 and not data), code


@given(cut=st.data(), read_only=st.booleans(), as_json=st.booleans())
@HOSTILE
def test_a_store_cut_at_any_byte(template: Template, example_dir: Callable[[], Any], cut: st.DataObject,
                                 read_only: bool, as_json: bool) -> None:
    size = len(template.data)
    at = cut.draw(st.one_of(st.integers(0, size - 1), st.integers(0, size // 4096 - 1).map(lambda page: page * 4096)
                            ), label="cut at")
    with example_dir() as directory:
        path = Path(directory) / "cut.db"
        path.write_bytes(template.data[:at])
        check_both_ways(path, read_only=read_only, as_json=as_json)


@given(flips=st.data(), read_only=st.booleans(), as_json=st.booleans())
@HOSTILE
def test_a_store_with_bits_flipped_anywhere(template: Template, example_dir: Callable[[], Any],
                                            flips: st.DataObject, read_only: bool, as_json: bool) -> None:
    size = len(template.data)
    # Anywhere, the 100-byte header more often than its share (page size, format numbers, counters).
    offsets = st.one_of(st.integers(0, 99), st.integers(0, size - 1))
    positions = flips.draw(st.lists(st.tuples(offsets, st.integers(0, 7)), min_size=1, max_size=8), label="flips")
    damaged = bytearray(template.data)
    for offset, bit in positions:
        damaged[offset] ^= 1 << bit
    with example_dir() as directory:
        path = Path(directory) / "flipped.db"
        path.write_bytes(bytes(damaged))
        check_both_ways(path, read_only=read_only, as_json=as_json)


SQL_VALUES = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True),
                       st.text(max_size=40), st.binary(max_size=40))
TABLE_NAMES = st.sampled_from(("meta", "events", "snapshots", "runners", "leases", "read_model_position",
                               "notes"))
COLUMN_TYPES = st.sampled_from(("", "INTEGER", "TEXT", "BLOB", "REAL", "ANY"))
EVENT_COLUMNS = ("seq", "stream", "version", "type", "at", "body", "prev", "hash")


@st.composite
def foreign_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """Another program's database: random tables (often named like ours), our header or not."""
    tables = {}
    for name in draw(st.lists(TABLE_NAMES, min_size=0, max_size=4, unique=True)):
        names = (list(EVENT_COLUMNS) if name == "events" and draw(st.booleans())
                 else draw(st.lists(st.sampled_from((*EVENT_COLUMNS, "key", "value", "state", "x")), min_size=1,
                                    max_size=9, unique=True)))
        strict = draw(st.booleans())
        types = COLUMN_TYPES.filter(bool) if strict else COLUMN_TYPES  # STRICT wants a type on every column
        columns = [(column, draw(types)) for column in names]
        rows = draw(st.lists(st.tuples(*[SQL_VALUES for _ in columns]), max_size=4))
        tables[name] = (columns, strict, rows)
    return {
        "tables": tables,
        "application_id": draw(st.sampled_from((0, APPLICATION_ID, APPLICATION_ID + 1))),
        "user_version": draw(st.sampled_from((0, 1, SCHEMA_VERSION, SCHEMA_VERSION + 1, -1, 2**31 - 1))),
        "wal": draw(st.booleans()),
    }


def write_foreign(path: Path, schema: dict[str, Any]) -> None:
    """Write `schema` as a SQLite file (rows STRICT refuses are left out: the file holds what it can)."""
    conn = apsw.Connection(str(path))
    try:
        if schema["wal"]:
            conn.execute("PRAGMA journal_mode=wal")
        conn.execute(f"PRAGMA application_id={schema['application_id']}")
        conn.execute(f"PRAGMA user_version={schema['user_version']}")
        for name, (columns, strict, rows) in schema["tables"].items():
            spelled = ", ".join(f'"{column}" {kind}'.strip() for column, kind in columns)
            conn.execute(f'CREATE TABLE "{name}" ({spelled}){" STRICT" if strict else ""}')
            marks = ", ".join("?" for _ in columns)
            for values in rows:
                with contextlib.suppress(apsw.ConstraintError):
                    conn.execute(f'INSERT INTO "{name}" VALUES ({marks})', values)
    finally:
        conn.close()


@given(schema=foreign_schemas(), read_only=st.booleans(), as_json=st.booleans())
@HOSTILE
def test_a_foreign_sqlite_schema(example_dir: Callable[[], Any], schema: dict[str, Any], read_only: bool,
                                 as_json: bool) -> None:
    with example_dir() as directory:
        path = Path(directory) / "foreign.db"
        write_foreign(path, schema)
        check_both_ways(path, read_only=read_only, as_json=as_json, whole=False)


# --- a real store, edited ---------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12)
HUGE_SEQS = st.sampled_from((2**63 - 1, 2**62, 2**53 + 1, 10**12, 0, -1, -(2**63)))


def _with_nul(text: object, where: int) -> object:
    if not isinstance(text, str):  # an earlier edit gave the column another type
        return text
    where %= len(text) + 1
    return text[:where] + "\0" + text[where:]


class Edits(NamedTuple):
    """SQL an attacker runs on the events table, and whether the table's schema was unSTRICTed for it."""

    statements: list[tuple[str, tuple[Any, ...]]]
    unstrict: str | None  # None, "left" (the schema stays without STRICT) or "restored" (STRICT on paper)


@st.composite
def row_edits(draw: st.DrawFn, head: int) -> Edits:
    """One to three edits an attacker makes to the events table (the triggers already dropped)."""
    edits: list[tuple[str, tuple[Any, ...]]] = []
    wrong_types = False
    for _ in range(draw(st.integers(1, 3))):
        seq = draw(st.integers(1, head))
        kind = draw(st.sampled_from(("move-seq", "insert-seq", "version", "body-not-json", "body-json",
                                     "body-unknown-tag", "body-ten-mb", "nul-in-text", "wrong-type")))
        if kind == "move-seq":
            edits.append(("UPDATE OR IGNORE events SET seq = ? WHERE seq = ?", (draw(HUGE_SEQS), seq)))
        elif kind == "insert-seq":
            # A copy of a real row at a seq no chain reaches; (stream, version) moves on so UNIQUE lets it in.
            edits.append(("INSERT OR IGNORE INTO events (seq, stream, version, type, at, body, prev, hash)"
                          " SELECT ?, stream, version + 1000000, type, at, body, prev, hash FROM events WHERE seq = ?",
                          (draw(HUGE_SEQS), seq)))
        elif kind == "version":
            edits.append(("UPDATE OR IGNORE events SET version = ? WHERE seq = ?", (draw(HUGE_SEQS), seq)))
        elif kind == "body-not-json":
            edits.append(("UPDATE events SET body = ? WHERE seq = ?",
                          (draw(st.binary(max_size=200).filter(_not_json)), seq)))
        elif kind == "body-json":
            body = json.dumps(draw(JSON_VALUES), separators=(",", ":")).encode()
            edits.append(("UPDATE events SET body = ? WHERE seq = ?", (body, seq)))
        elif kind == "body-unknown-tag":
            tag = draw(st.text(min_size=1, max_size=30))
            fields = draw(st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=4))
            body = json.dumps({**fields, "type": tag}, sort_keys=True, separators=(",", ":")).encode()
            retyped = draw(st.booleans())  # the type column agrees with the body, or still names the old tag
            edits.append((f"UPDATE events SET body = ?{', type = ?' if retyped else ''} WHERE seq = ?",
                          (body, tag, seq) if retyped else (body, seq)))
        elif kind == "body-ten-mb":
            # A real event's shape with one field 10 MB long: valid JSON, a valid tag, a hostile size.
            field = draw(st.sampled_from(("lease_id", "session_id", "result_digest", "extra")))
            body = (b'{"' + field.encode() + b'":"' + b"x" * TEN_MB + b'","lease_generation":1,"lease_id":"l",'
                    b'"result_digest":"' + DIGEST.encode() + b'","type":"LeaseSettled"}')
            edits.append(("UPDATE events SET body = ?, type = 'LeaseSettled' WHERE seq = ?", (body, seq)))
        elif kind == "nul-in-text":
            column = draw(st.sampled_from(("stream", "type", "at")))
            where = draw(st.integers(0, 40))
            edits.append((f"UPDATE OR IGNORE events SET {column} = nul_in({column}, ?) WHERE seq = ?", (where, seq)))
        else:
            column = draw(st.sampled_from(EVENT_COLUMNS[1:]))
            value = draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(), st.text(max_size=20),
                                   st.binary(max_size=40)))
            edits.append((f"UPDATE OR IGNORE events SET {column} = ? WHERE seq = ?", (value, seq)))
            wrong_types = True
    # STRICT (and NOT NULL) refuse a wrong-typed value, so the attacker rewrites the table's schema first;
    # then leaves it so (the store must refuse the table) or puts the STRICT text back (the values stay).
    return Edits(edits, draw(st.sampled_from(("left", "restored"))) if wrong_types else None)


def _not_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return True
    return False


def edit_store(path: Path, edits: Edits, *, rechain: bool, restore_triggers: bool = False) -> None:
    """Apply `edits` with plain apsw, triggers dropped; then re-chain every row that can be, if asked, and
    put the triggers back as the store made them, if asked (the schema is then the store's again)."""
    original = None
    if edits.unstrict is not None:
        original = set_events_schema(path, lambda sql: sql.replace(") STRICT", ")").replace(" NOT NULL", ""))
    conn = apsw.Connection(str(path))
    try:
        conn.create_scalar_function("nul_in", lambda text, where: _with_nul(text, where), 2)
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        conn.execute("DROP TRIGGER IF EXISTS events_no_delete")
        for sql, params in edits.statements:
            conn.execute(sql, params)
        if rechain:
            _rechain(conn)
        if restore_triggers:
            for statement in TRIGGERS:
                conn.execute(statement)
    finally:
        conn.close()
    if edits.unstrict == "restored":
        set_events_schema(path, lambda _: original or "")


def _rechain(conn: apsw.Connection) -> None:
    """Recompute prev and hash in seq order, as an attacker of an unkeyed store can; rows that cannot be
    framed (a negative seq, a body that is not bytes) keep theirs, and the chain goes on from the last."""
    (store_id,), = conn.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchall()
    prev = chain.genesis(store_id)
    conn.execute("BEGIN")
    for seq, stream, version, type_, at, body in conn.execute(
            "SELECT seq, stream, version, type, at, body FROM events ORDER BY seq").fetchall():
        try:
            digest = chain.link(prev, seq, stream, version, type_, at, body)
        except (IntegrityError, TypeError, AttributeError):  # IntegrityError: a seq the frame cannot hold
            continue
        conn.execute("UPDATE events SET prev = ?, hash = ? WHERE seq = ?", (prev, digest, seq))
        prev = digest
    conn.execute("COMMIT")


@given(edits=st.data(), rechain=st.booleans(), restore_triggers=st.booleans(), read_only=st.booleans(),
       as_json=st.booleans())
@HOSTILE
def test_a_store_with_rows_edited(template: Template, example_dir: Callable[[], Any], edits: st.DataObject,
                                  rechain: bool, restore_triggers: bool, read_only: bool, as_json: bool) -> None:
    changes = edits.draw(row_edits(template.head), label="edits")
    with example_dir() as directory:
        path = Path(directory) / "edited.db"
        path.write_bytes(template.data)
        # Triggers put back: the schema is the store's again, so only the chain and the rules can tell.
        edit_store(path, changes, rechain=rechain, restore_triggers=restore_triggers)
        check_both_ways(path, read_only=read_only, as_json=as_json)


# --- a real store, its schema changed ---------------------------------------------------------------------

TRIGGERS = [statement for statement in MIGRATIONS[1] if statement.startswith("CREATE TRIGGER")]
EVENTS_SQL = MIGRATIONS[1][1]
# Every table of the template: the store's, and the read models' (a trigger on any of them is refused).
TEMPLATE_TABLES = {"events": EVENT_COLUMNS, "meta": ("key", "value"), "snapshots": ("stream", "version", "seq"),
                   "runners": ("runner_id", "state"), "leases": ("runner_id", "status"),
                   "read_model_position": ("name", "seq")}
TRIGGER_BODIES = ("SELECT RAISE(IGNORE);", "SELECT 1;", "SELECT RAISE(ABORT, 'no');",
                  "DELETE FROM snapshots;", "INSERT INTO read_model_position (name, seq) VALUES ('x', 0);")
EVENTS_VARIANTS = {  # the events table rebuilt with one constraint dropped or changed
    "no-unique": EVENTS_SQL.replace(", UNIQUE (stream, version)", ""),
    "unique-widened-to-seq": EVENTS_SQL.replace("UNIQUE (stream, version)", "UNIQUE (stream, version, seq)"),
    "no-not-null": EVENTS_SQL.replace("body BLOB NOT NULL", "body BLOB"),
    "not-strict": EVENTS_SQL.replace(") STRICT", ")"),
    "a-check": EVENTS_SQL.replace(" UNIQUE (stream, version)", " UNIQUE (stream, version), CHECK (length(body) > 0)"),
    "a-collation": EVENTS_SQL.replace("stream TEXT NOT NULL", "stream TEXT NOT NULL COLLATE NOCASE"),
    "a-default": EVENTS_SQL.replace("at TEXT NOT NULL", "at TEXT NOT NULL DEFAULT ''"),
}


@st.composite
def schema_edits(draw: st.DrawFn) -> list[str]:
    """One to three changes to the template's schema, each of them one a writer must refuse."""
    statements: list[str] = []
    kinds = draw(st.lists(st.sampled_from(("add-trigger", "drop-trigger", "redefine-trigger", "rebuild-events",
                                           "meta-key", "index", "view")), min_size=1, max_size=3))
    if "rebuild-events" in kinds:  # first: rebuilding events drops whatever triggers it had, then makes ours
        table_sql = EVENTS_VARIANTS[draw(st.sampled_from(sorted(EVENTS_VARIANTS)), label="events variant")]
        statements += ["ALTER TABLE events RENAME TO old_events", table_sql,
                       "INSERT INTO events SELECT * FROM old_events", "DROP TABLE old_events", *TRIGGERS]
    for number, kind in enumerate(kinds):
        if kind == "add-trigger":
            table = draw(st.sampled_from(sorted(TEMPLATE_TABLES)))
            timing, action = draw(st.sampled_from(("BEFORE", "AFTER"))), draw(st.sampled_from(("INSERT", "UPDATE",
                                                                                                 "DELETE")))
            when = draw(st.sampled_from(("", " WHEN 0", " WHEN 1")))
            statements.append(f"CREATE TRIGGER added_{number} {timing} {action} ON {table}{when} BEGIN "
                              f"{draw(st.sampled_from(TRIGGER_BODIES))} END")
        elif kind == "drop-trigger":
            for statement in draw(st.lists(st.sampled_from(TRIGGERS), min_size=1, max_size=2, unique=True)):
                statements.append(f"DROP TRIGGER IF EXISTS {statement.split()[2]}")
        elif kind == "redefine-trigger":
            original = draw(st.sampled_from(TRIGGERS))
            redefined = draw(st.sampled_from((
                original.replace(" ON events", " ON events WHEN 0"),  # the same name, never firing
                original.replace("RAISE(ABORT, 'events are append-only')", "RAISE(IGNORE)"),  # skips, no error
                original.replace("BEFORE", "AFTER"),
                original.lower(),  # the same words, spelled otherwise: not the store's text
            )))
            statements += [f"DROP TRIGGER IF EXISTS {original.split()[2]}", redefined]
        elif kind == "meta-key":
            key = draw(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), min_size=1,
                               max_size=12).filter(lambda text: text not in ("store_id", "key_id")))
            statements.append(f"INSERT OR IGNORE INTO meta (key, value) VALUES ({_quoted(key)}, x'00')")
        elif kind == "index":
            table = draw(st.sampled_from(("events", "meta", "snapshots")))
            column = draw(st.sampled_from(TEMPLATE_TABLES[table]))
            where = draw(st.sampled_from(("", " WHERE 0")))
            statements.append(f"CREATE INDEX added_{number} ON {table} ({column}){where}")
        elif kind == "view":
            table = draw(st.sampled_from(sorted(TEMPLATE_TABLES)))
            statements.append(f"CREATE VIEW added_{number} AS SELECT * FROM {table}")
    return statements


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def edit_schema(path: Path, statements: list[str]) -> None:
    """Run `statements` on the file with plain apsw, as anyone who can write it can."""
    conn = apsw.Connection(str(path))
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


@given(edits=schema_edits(), as_json=st.booleans())
@HOSTILE
def test_a_store_with_its_schema_changed(template: Template, example_dir: Callable[[], Any], edits: list[str],
                                         as_json: bool) -> None:
    """Whatever was changed, a writer refuses the file and the audit fails it: never 0, never a traceback."""
    with example_dir() as directory:
        path = Path(directory) / "altered.db"
        path.write_bytes(template.data)
        edit_schema(path, edits)
        code, _ = check_both_ways(path, read_only=False, as_json=as_json, whole=False, writer_refused=True)
        assert code == 65, edits


@pytest.fixture(scope="module")
def long_template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    """A log long enough that ``audit --jobs 2`` walks it in two worker processes."""
    path = tmp_path_factory.mktemp("long") / "long.db"
    build_long(path)
    with EventStore.open(path, read_only=True) as store:
        head = store.head().seq
    return Template(path, path.read_bytes(), head)


@given(seq=st.data(), column=st.sampled_from(EVENT_COLUMNS[1:]),
       value=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.binary(max_size=8)))
@settings(HOSTILE, max_examples=max(3, EXAMPLES // 8))  # each example audits 20,000 events twice
def test_worker_processes_meet_a_value_smuggled_past_strict(long_template: Template, example_dir: Callable[[], Any],
                                                          seq: st.DataObject, column: str, value: object) -> None:
    """Every worker reads every row, checking the chain of its own range only: a row outside its range that
    holds a value of the wrong type must not crash it either."""
    at = seq.draw(st.integers(1, long_template.head), label="seq")
    with example_dir() as directory:
        path = Path(directory) / "smuggled.db"
        path.write_bytes(long_template.data)
        before = _row_at(path, at)
        edit_store(path, Edits([(f"UPDATE OR IGNORE events SET {column} = ? WHERE seq = ?", (value, at))],
                               "restored"), rechain=False)
        done = audit(path, as_json=True, jobs=2)
        context = f"exit {done.returncode}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
        assert done.returncode in (0, 65) and "Traceback" not in done.stderr, context
        report = json.loads(done.stdout)
        assert report["jobs"] == 2, context
        if _row_at(path, at) != before:
            # A value changed is a hash that no longer matches.
            assert report["first_bad_seq"] == at, context
        else:
            # The same value, or one a constraint ignored: the log is whole; only the triggers the edit
            # dropped are missing from the schema.
            assert report["checks"]["chain"] and report["checks"]["rules"], context


def _row_at(path: Path, seq: int) -> list[Any]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute("SELECT * FROM events WHERE seq = ?", (seq,)).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("value", [0, "ab"])
def test_a_head_whose_hash_is_not_bytes_is_named_at_its_seq(template: Template, example_dir: Callable[[], Any],
                                                            value: object) -> None:
    """The report shows the head's hash as hex: a head row's hash smuggled past STRICT has none to show."""
    with example_dir() as directory:
        path = Path(directory) / "head.db"
        path.write_bytes(template.data)
        edit_store(path, Edits([("UPDATE events SET hash = ? WHERE seq = ?", (value, template.head))], "restored"),
                   rechain=False)
        done = audit(path, as_json=True)
        assert done.returncode == 65 and "Traceback" not in done.stderr, done.stderr
        report = json.loads(done.stdout)
        assert (report["first_bad_seq"], report["head_hash"]) == (template.head, None), report


def test_the_template_itself_passes_both_ways(template: Template, example_dir: Callable[[], Any]) -> None:
    """The baseline every hostile case departs from: an unedited copy is whole, in-process and audited."""
    with example_dir() as directory:
        path = Path(directory) / "copy.db"
        path.write_bytes(template.data)
        code, in_process_ok = check_both_ways(path, read_only=False, as_json=True, whole=True)
        assert code == 0 and in_process_ok
