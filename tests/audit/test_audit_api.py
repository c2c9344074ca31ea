"""lifecycle_es.audit as a user calls it: a path or an open store, a report with checks and typed problems,
worker processes from a plain script and from a thread, progress as a callback, only LifecycleErrors.

On both backends: the logs are built once per module in a file, and again in schemas on a PostgreSQL
server (`fleet`, `keyed`, `long`); a superuser's edits of a server's rows are caught as a file's are.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import psycopg
import pytest
from fleets import KEY, attack, build_fleet, build_long, copy_store
from pg import Server

import lifecycle_es
from lifecycle_es import AuditReport, EventStore, InvalidInputError, LifecycleError, Problem, StoreKeyError, audit
from lifecycle_es.backends import server_target
from lifecycle_es.walk import MIN_RANGE_EVENTS, STARTUP_EVENTS, counted, open_for_audit, owners, share_of


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Log(NamedTuple):
    """A log built for the module: where it is, its marks, and its seal (None: beside the file)."""

    target: str
    facts: dict[str, int]
    seal: str | None


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Server | None]:
    """The backend of the module's logs: None for files, else the cluster their schemas are on."""
    if request.param == "sqlite":
        yield None
        return
    server: Server = request.getfixturevalue("pg_server")
    yield server


@pytest.fixture(scope="module")
def places(backend: Server | None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Schemas made on the module's server, dropped after the module."""
    made: list[str] = []
    yield made
    if backend is not None:
        for schema in made:
            backend.drop(schema)


def module_log(backend: Server | None, places: list[str], factory: pytest.TempPathFactory,
               name: str) -> tuple[str, Path]:
    """A target for one of the module's logs, and a directory of its own."""
    directory = factory.mktemp(name)
    if backend is None:
        return str(directory / f"{name}.db"), directory
    places.append(backend.new_schema())
    return backend.url(places[-1]), directory


@pytest.fixture(scope="module")
def fleet(backend: Server | None, places: list[str], tmp_path_factory: pytest.TempPathFactory) -> Log:
    target, directory = module_log(backend, places, tmp_path_factory, "fleet")
    seal = None if backend is None else str(directory / "fleet.seal")
    return Log(target, build_fleet(target, base=directory / "base", seal=seal), seal)


@pytest.fixture(scope="module")
def keyed(backend: Server | None, places: list[str], tmp_path_factory: pytest.TempPathFactory) -> Log:
    target, directory = module_log(backend, places, tmp_path_factory, "keyed")
    seal = None if backend is None else str(directory / "keyed.seal")
    return Log(target, build_fleet(target, key=KEY, base=directory / "base", seal=seal), seal)


@pytest.fixture(scope="module")
def long(backend: Server | None, places: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    target, _ = module_log(backend, places, tmp_path_factory, "long")
    build_long(target)
    return target


def test_a_whole_log_reports_every_check_proved(fleet: Log) -> None:
    path, facts = fleet.target, fleet.facts
    report = audit(path, seal=fleet.seal)
    assert isinstance(report, AuditReport)
    assert report.ok and report.first_problem is None and report.problems == []
    with EventStore.open(path, read_only=True) as store:
        streams = len(store.streams())
    assert report.events == facts["head"] == report.head[0]
    assert report.streams == streams > 1
    assert report.checks["schema"] is True and report.checks["chain"] is True and report.checks["rules"] is True
    assert report.checks["read_models"] is True
    assert report.checks["seal"] is True and report.seal is not None  # a file's seal beside it, by default


def test_an_open_store_can_be_audited_and_is_left_open(fleet: Log) -> None:
    path, facts = fleet.target, fleet.facts
    with EventStore.open(path, read_only=True, seal=fleet.seal) as store:
        # A file's seal beside it is checked by default; a server's store has none beside it: named.
        report = audit(store, seal=fleet.seal)
        assert report.ok and report.events == facts["head"]
        assert report.checks["seal"] is True
        assert store.head().seq == facts["head"]  # still usable


def test_an_edited_event_is_a_chain_problem_naming_its_seq(fleet_log: tuple[Path, dict[str, int]],
                                                          tmp_path: Path) -> None:
    copy = copy_store(fleet_log[0], tmp_path / "edited.db", seal=False)
    attack(copy, ("UPDATE events SET at = '2026-01-01T00:00:00.001Z' WHERE seq = 3", ()))
    before = digest(copy)
    report = audit(copy)
    assert not report.ok
    first = report.first_problem
    assert isinstance(first, Problem)
    assert (first.seq, first.kind) == (3, "chain")
    assert report.checks["chain"] is False
    assert digest(copy) == before  # reading changed nothing


def test_a_dropped_trigger_is_a_schema_problem(fleet_log: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    import apsw

    copy = copy_store(fleet_log[0], tmp_path / "schema.db", seal=False)
    conn = apsw.Connection(str(copy))
    conn.execute("DROP TRIGGER events_no_delete")
    conn.close()
    report = audit(copy)
    assert not report.ok
    assert [problem.kind for problem in report.problems] == ["schema"]
    assert report.checks["schema"] is False and report.checks["chain"] is True


def test_a_keyed_store_needs_its_key_and_a_key_for_an_unkeyed_one_is_a_problem(keyed: Log, fleet: Log) -> None:
    with pytest.raises(StoreKeyError):
        audit(keyed.target, seal=keyed.seal)
    assert audit(keyed.target, key=KEY, seal=keyed.seal).ok
    report = audit(fleet.target, key=KEY, seal=fleet.seal)
    assert not report.ok
    assert [problem.kind for problem in report.problems] == ["key"]
    assert "downgrade" in report.problems[0].reason


@pytest.mark.parametrize(("option", "value"), [("jobs", 0), ("jobs", True), ("jobs", "2"), ("jobs", 10**9),
                                               ("key", b"short"), ("progress", "bar"), ("seal", "\udcff.seal")])
def test_bad_arguments_are_invalid_input_naming_the_field(fleet: Log, option: str, value: object) -> None:
    with pytest.raises(InvalidInputError) as raised:
        audit(fleet.target, **{option: value})  # type: ignore[arg-type]
    assert raised.value.field == option


def test_what_cannot_be_audited_raises_only_lifecycle_errors(tmp_path: Path) -> None:
    for target in (tmp_path / "missing.db", tmp_path, b"not a path"):
        with pytest.raises(LifecycleError):
            audit(target)  # type: ignore[arg-type]
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(LifecycleError):
        audit(junk)


def test_progress_is_a_callback_and_the_library_draws_nothing(long: str,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[int, int]] = []
    report = audit(long, progress=lambda done, total: seen.append((done, total)))
    assert report.ok
    assert seen and seen[-1] == (report.events, report.events)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_jobs_share_the_work_and_agree_with_one_process(long: str) -> None:
    one = audit(long)
    seen: list[tuple[int, int]] = []
    two = audit(long, jobs=2, progress=lambda done, total: seen.append((done, total)))
    # The workers' progress reaches the caller (the slowest worker's count), never past the log.
    assert seen and all(total == two.events and 0 <= done <= total for done, total in seen)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert one.events >= 2 * MIN_RANGE_EVENTS
    assert two.jobs == 2 and one.jobs == 1
    assert (two.ok, two.events, two.streams, two.head) == (one.ok, one.events, one.streams, one.head)


def test_jobs_from_a_thread(long: str) -> None:
    found: list[AuditReport] = []
    thread = threading.Thread(target=lambda: found.append(audit(long, jobs=2)))
    thread.start()
    thread.join(300)
    assert found and found[0].ok and found[0].jobs == 2


def test_jobs_from_a_plain_script_without_a_main_guard(long: str, tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        import lifecycle_es
        report = lifecycle_es.audit({long!r}, jobs=2)
        print(report.ok, report.jobs, report.events)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    ok, jobs, events = done.stdout.split()
    assert (ok, jobs) == ("True", "2") and int(events) >= 2 * MIN_RANGE_EVENTS


def test_jobs_walk_one_part_here_and_start_a_worker_only_for_the_others(long: str) -> None:
    # This process walks a part of its own while the workers walk the rest: two jobs, one worker process.
    workers: list[int] = []
    report = audit(long, jobs=2, progress=lambda done, total: workers.append(
        sum("lifecycle_es.workers" in line for line in descendants_argv())))
    assert report.ok and report.jobs == 2, report.problems
    assert max(workers) == 1, workers
    # The shares are cut by each runner's count of events (its last version).
    with contextlib.closing(open_for_audit(long, None)) as store:
        counts = counted(store)
        assert sorted(counts) == store.streams() and sum(counts.values()) == store.head().seq == report.events


def test_shares_are_balanced_by_events_not_by_a_hash_of_names() -> None:
    counts = {"runner-a": 9_000, "runner-b": 6_000, "runner-c": 5_000, "runner-d": 1_000, "runner-e": 1_000}
    shared = owners(counts, 2, head_start=0)
    assert sorted(shared) == sorted(counts)
    loads = [sum(count for stream, count in counts.items() if shared[stream] == part) for part in (0, 1)]
    assert loads in ([11_000, 11_000], [10_000, 12_000], [12_000, 10_000]), loads
    # This process's share (0) starts at once: the workers' shares start a worker's start-up behind it.
    even = {f"runner-{n}": 1_000 for n in range(40)}
    ahead = owners(even, 2)
    here = sum(1_000 for stream in even if ahead[stream] == 0)
    assert here - (40_000 - here) in range(STARTUP_EVENTS - 1_000, STARTUP_EVENTS + 1_001)
    # A stream no share names is everyone's to place alike.
    assert share_of("runner-x", 2) in (0, 1)


def descendants_argv() -> list[str]:
    """The command lines of this process's children (the audit's workers while it runs)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            if parent == os.getpid():
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    found.append(cmdline.read().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ValueError, IndexError):
            continue
    return found


@contextlib.contextmanager
def password_role(server: Server, schema: str) -> Iterator[tuple[str, str]]:
    """A role that logs in with a password only (scram, its own pg_hba line) and has what the README says
    an auditor needs, USAGE and SELECT; the role and its line are gone afterwards."""
    role, password = f"auditor_{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    hba = Path(server.directory, "data", "pg_hba.conf")
    before = hba.read_text()
    with psycopg.connect(server.conninfo(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")  # type: ignore[arg-type]
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")  # type: ignore[arg-type]
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")  # type: ignore[arg-type]
        hba.write_text(f"local all {role} scram-sha-256\n" + before)
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield role, password
    finally:
        hba.write_text(before)
        with psycopg.connect(server.conninfo(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"DROP OWNED BY {role}")  # type: ignore[arg-type]
            conn.execute(f"DROP ROLE {role}")  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_jobs_open_a_server_store_by_a_url_with_a_password_never_in_argv(backend: Server, long: str) -> None:
    schema = server_target(long).schema
    with password_role(backend, schema) as (role, password):
        url = f"postgresql://{role}:{password}@/postgres?host={backend.directory}&schema={schema}"
        with pytest.raises(LifecycleError):  # the password is asked for: a wrong one is refused
            audit(url.replace(password, "wrong"))
        argv: list[str] = []
        report = audit(url, jobs=2, progress=lambda done, total: argv.extend(descendants_argv()))
        assert report.ok and report.jobs == 2, report.problems
        assert any("lifecycle_es.workers" in line for line in argv), argv
        assert not [line for line in argv if password in line]
        assert password not in str(report.as_dict())


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_jobs_reopen_a_server_store_opened_by_a_url_with_a_password(backend: Server, long: str) -> None:
    # The store opened first, then audited with workers (as rebuild(store, jobs=) always is). The store's path
    # has the password masked; the workers must still reach the server as the caller did.
    schema = server_target(long).schema
    with password_role(backend, schema) as (role, password):
        url = f"postgresql://{role}:{password}@/postgres?host={backend.directory}&schema={schema}"
        with EventStore.open(url, read_only=True) as store:
            report = audit(store, jobs=2)
        assert report.ok and report.jobs == 2, report.problems
        assert password not in str(report.as_dict())


def test_the_report_is_plain_json_values(fleet: Log) -> None:
    import json

    data = json.loads(json.dumps(audit(fleet.target, seal=fleet.seal).as_dict()))
    assert data["ok"] is True and data["checks"]["chain"] is True and data["problems"] == []
    assert lifecycle_es.audit is audit


# --- a superuser's edits of a server's rows -------------------------------------------------------------

HEAD_SEQ = 32  # build_fleet's head (checked below)
BACK_ONE = "UPDATE head SET (seq, hash, at) = (SELECT seq, hash, at FROM events ORDER BY seq DESC LIMIT 1)"


@pytest.fixture
def server_log(pg_url: str, tmp_path: Path) -> tuple[str, str]:
    """A fleet log on the server, closed and audited whole: its URL and its seal file."""
    seal = str(tmp_path / "fleet.seal")
    assert build_fleet(pg_url, base=tmp_path / "base", seal=seal)["head"] == HEAD_SEQ
    assert audit(pg_url, seal=seal).ok
    return pg_url, seal


def as_superuser(server: Server, url: str, *statements: str, enable_again: bool = True) -> None:
    """Run `statements` on the store's schema as the cluster's superuser, past the append-only trigger
    (disabled first and, when `enable_again`, enabled after: the schema left as the store made it)."""
    schema = server_target(url).schema
    with psycopg.connect(server.conninfo(), autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        conn.execute("ALTER TABLE events DISABLE TRIGGER events_no_change")
        try:
            for statement in statements:
                conn.execute(statement.format(head=HEAD_SEQ))  # type: ignore[arg-type]
        finally:
            if enable_again:
                conn.execute("ALTER TABLE events ENABLE TRIGGER events_no_change")


@pytest.mark.parametrize(("statements", "first", "behind_seal"), [
    pytest.param(["UPDATE events SET at = '2026-01-01T00:00:00.001Z' WHERE seq = 3"], (3, "chain"), False,
                 id="edited-at"),
    pytest.param(["UPDATE events SET body = body || ' '::bytea WHERE seq = 4"], (4, "chain"), False,
                 id="edited-body"),
    pytest.param(["DELETE FROM events WHERE seq = 2"], (2, "chain"), False, id="deleted-middle"),
    # The head row moved back with it, as a careful editor would: the chain is whole but behind its seal (and
    # its last runner is left with a park pending).
    pytest.param(["DELETE FROM events WHERE seq = {head}", BACK_ONE], (HEAD_SEQ - 1, "rules"), True,
                 id="deleted-last"),
    # A row appended with a made-up hash, the head row advanced to it.
    pytest.param(["INSERT INTO events SELECT seq + 1, stream, version + 1, type, at, body, hash, sha256(hash)"
                  " FROM events WHERE seq = {head}", BACK_ONE], (HEAD_SEQ + 1, "chain"), False, id="forged-row"),
])
def test_a_superusers_edit_of_a_server_store_is_caught_at_its_seq(pg_server: Server, server_log: tuple[str, str],
                                                                   statements: list[str], first: tuple[int, str],
                                                                   behind_seal: bool) -> None:
    url, seal = server_log
    as_superuser(pg_server, url, *statements)
    report = audit(url, seal=seal)
    assert not report.ok and report.first_problem is not None, report
    assert (report.first_problem.seq, report.first_problem.kind) == first, report.problems
    assert report.checks["schema"] is True  # the trigger was put back: only the rows tell
    assert ("seal" in [problem.kind for problem in report.problems]) is behind_seal, report.problems


def test_a_trigger_a_superuser_left_disabled_is_a_schema_problem(pg_server: Server,
                                                                 server_log: tuple[str, str]) -> None:
    url, seal = server_log
    as_superuser(pg_server, url, "UPDATE events SET at = '2026-01-01T00:00:00.001Z' WHERE seq = 5",
                 enable_again=False)
    report = audit(url, seal=seal)
    schema = [problem for problem in report.problems if problem.kind == "schema"]
    assert report.checks["schema"] is False and report.checks["chain"] is False
    assert schema and all("events_no_change" in problem.reason and "(disabled)" in problem.reason
                          for problem in schema), report.problems
    assert [(problem.seq, problem.kind) for problem in report.problems if problem.kind == "chain"][:1] == [(5, "chain")]
