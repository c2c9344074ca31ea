"""The logs the command-line tests run against, how they run the real console script, and how they attack.

Every test drives ``.venv/bin/lifecycle-es`` (the console script beside ``sys.executable``) as a child
process, as an operator would. The fleet log is written by `RunnerLifecycle` itself (a fake clock, a
base directory under tmp_path), with read models attached and snapshots taken, then sealed; the long
log (for worker processes) is appended in batches straight through `EventStore.append`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import pytest

from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle, RunnerState, chain
from lifecycle_es.canonical import iso_ms, parse_iso_ms
from lifecycle_es.events import RUNNER_SCHEMA, LeaseAcquired, LeaseSettled, RunnerInitialized
from lifecycle_es.runner import apply
from lifecycle_es.sqlite_schema import MIGRATIONS
from lifecycle_es.testing import FakeClock
from lifecycle_es.walk import MIN_RANGE_EVENTS
from projections import attach, rebuild

CLI = shutil.which("lifecycle-es", path=os.path.dirname(sys.executable))
DIGEST = "sha256:" + "ab" * 32
HOOK = "sha256:" + "cd" * 32
KEY = bytes(range(32))
# The append-only triggers as the store made them (events_no_update first).
TRIGGERS = [statement for statement in MIGRATIONS[1] if statement.startswith("CREATE TRIGGER")]
LONG_EVENTS = 2 * MIN_RANGE_EVENTS + 500  # two worker ranges and a bit


def run(*args: str | bytes | os.PathLike[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``lifecycle-es ARGS`` and return what it did (never raises on a non-zero exit).

    A bytes argument reaches the command as those bytes (a path that is not UTF-8, as a shell passes it);
    the command's output must still decode as UTF-8. `timeout` is the hang bound: past it the command is
    killed and subprocess.TimeoutExpired fails the test.
    """
    assert CLI is not None, "the lifecycle-es console script is not installed beside this interpreter"
    argv = [CLI, *(arg if isinstance(arg, bytes) else str(arg) for arg in args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def store_bytes(path: Path) -> tuple[str, str]:
    """sha256 of the store file and of its WAL (an absent WAL counts as an empty one: it holds nothing)."""
    wal = Path(f"{path}-wal")
    return (hashlib.sha256(path.read_bytes()).hexdigest(),
            hashlib.sha256(wal.read_bytes() if wal.exists() else b"").hexdigest())


def audit_json(path: Path | str, *extra: str) -> tuple[int, dict[str, Any]]:
    """``audit PATH --json`` (plus `extra`): the exit code and the parsed object."""
    done = run("audit", path, "--json", *extra)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The command's stderr, which must be exactly one line and no traceback."""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def authority(clock: FakeClock, revision: int) -> ProxyAuthority:
    """A proxy authority issued a second ago that lives an hour."""
    return ProxyAuthority(id="proxy-a", revision=revision, issued_at=iso_ms(clock.ms - 1000),
                          expires_at=iso_ms(clock.ms + 3_600_000))


def build_fleet(path: Path | str, *, key: bytes | None = None, base: Path | None = None,
                seal: str | None = None) -> dict[str, int]:
    """Three runners living most of the lifecycle; read models on, snapshots every 3 events, sealed.

    `path`: a file, or a store URL (then `base`, the runners' base directory, and `seal`, the seal file,
    must be named: a server's store has no directory beside it). Returns seqs worth knowing:
    ``active_seq`` (runner-0 holds lease ``lease-0001`` active there) and ``head``.
    """
    clock = FakeClock()
    base = base if base is not None else Path(path).parent / "base"
    base.mkdir(exist_ok=True)
    ids = iter(range(1, 10_000))
    marks: dict[str, int] = {}
    with EventStore.open(path, key=key, now=clock) as store:
        attach(store)
        runners = [RunnerLifecycle(store, runner_id=f"runner-{n}", target="local", base_dir=base,
                                   resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                                   post_session_hook_digest=HOOK, now=clock, random_id=lambda: f"{next(ids):04d}",
                                   snapshot_every=3) for n in range(3)]
        for runner in runners:
            clock.advance(1000)
            runner.initialize()
        one, two, three = runners
        clock.advance(1000)
        first = one.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=authority(clock, 1))
        marks["active_seq"] = store.head().seq
        for round_ in range(3):  # some history on every runner
            for runner in runners:
                clock.advance(1000)
                receipt = runner.acquire_lease(session_id=f"s-{round_}-x", expected_generation=runner.snapshot()
                                               .generation, proxy_authority=authority(clock, 1))
                clock.advance(1000)
                runner.settle_lease(lease_id=receipt.lease.id, lease_generation=receipt.lease.generation,
                                    result_digest=DIGEST)
        clock.advance(1000)
        one.request_drain(expected_generation=1, timeout_ms=30_000)
        clock.advance(1000)
        one.settle_lease(lease_id=first.lease.id, lease_generation=first.lease.generation, result_digest=DIGEST)
        clock.advance(1000)
        one.authorize_post_session_hook(expected_runner_generation=3, lease_id=first.lease.id,
                                        lease_generation=first.lease.generation, result_digest=DIGEST,
                                        hook_digest=HOOK)
        clock.advance(1000)
        one.begin_reclaim(expected_generation=3, proxy_authority=authority(clock, 2))
        one.complete_reclaim(expected_generation=4)
        clock.advance(1000)
        two.rotate_proxy_authority(expected_generation=1, proxy_authority=authority(clock, 2))
        clock.advance(1000)
        held = three.acquire_lease(session_id="s-park", expected_generation=1, proxy_authority=authority(clock, 1))
        clock.advance(1000)
        three.park_lease(lease_id=held.lease.id, lease_generation=held.lease.generation, result_digest=DIGEST,
                         reason="lost-poll")
        store.seal(seal) if seal is not None else store.seal()
        marks["head"] = store.head().seq
    return marks


def build_long(path: Path | str, events: int = LONG_EVENTS, *, chunk: int = 1000, interleaved: bool = False,
               key: bytes | None = None) -> None:
    """`events` valid events of 10 runners (acquire/settle pairs), appended up to `chunk` at a time: each
    runner's in turn, or (`interleaved`) a chunk of each runner in turn, so that every runner's events
    run from the log's start to its end.

    The caches lag the log the way they do in life: snapshots and read models rebuilt at 40% of it,
    read models attached until the last batch, which a process without them appended.
    """
    at = "2026-01-01T00:00:00.000Z"
    proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=at, expires_at="2026-01-01T01:00:00.000Z")
    per_runner = -(-events // 10)
    appends: list[tuple[str, list[Any]]] = []
    written = 0
    for n in range(10):
        runner = f"runner-{n}"
        batch: list[Any] = [RunnerInitialized(
            schema=RUNNER_SCHEMA, runner_id=runner, target="local", base_dir=f"/srv/{runner}",
            resources=Resources(cpu_seconds=600, memory_bytes=1 << 30), post_session_hook_digest=HOOK)]
        lease = 0
        while len(batch) < min(per_runner, events - written):
            lease_id = f"lease-{n}-{lease}"
            batch.append(LeaseAcquired(lease_id=lease_id, session_id=f"s-{lease}", lease_generation=1, issued_at=at,
                                       expires_at="2026-01-01T00:10:00.000Z", proxy_authority=proxy))
            batch.append(LeaseSettled(lease_id=lease_id, lease_generation=1, result_digest=DIGEST))
            lease += 1
        batch = batch[:min(per_runner, events - written)]
        appends += [(runner, batch[start:start + chunk]) for start in range(0, len(batch), chunk)]
        written += len(batch)
    if interleaved:
        turns = Counter[str]()
        order = []
        for runner, batch in appends:
            order.append((turns[runner], runner, batch))
            turns[runner] += 1
        appends = [(runner, batch) for _, runner, batch in sorted(order, key=lambda item: item[:2])]
    tail = appends.pop()  # the last batch: appended by a process without the read models
    rebuilt = False
    with EventStore.open(path, durability="normal", key=key) as store:
        for runner, chunk in appends:
            store.append_unchecked(runner, chunk, at=at)
            if not rebuilt and store.head().seq >= 0.4 * events:
                rebuild(store)
                attach(store)
                rebuilt = True
    with EventStore.open(path, durability="normal", key=key) as store:
        store.append_unchecked(tail[0], tail[1], at=at)


def copy_store(source: Path, target: Path, *, seal: bool = True) -> Path:
    """A copy of a closed store (its WAL was checkpointed on close), with its seal when asked."""
    shutil.copyfile(source, target)
    if seal and os.path.exists(f"{source}.seal"):
        shutil.copyfile(f"{source}.seal", f"{target}.seal")
    return target


def attack(path: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """Edit the file as an attacker would: plain apsw, the append-only triggers dropped first and put back
    after (a schema left altered is a problem of its own: the audit reports it, a writer refuses it)."""
    conn = apsw.Connection(str(path))
    try:
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        conn.execute("DROP TRIGGER IF EXISTS events_no_delete")
        for sql, params in statements:
            conn.execute(sql, params)
    finally:
        for statement in TRIGGERS:
            conn.execute(statement)
        conn.close()



def set_events_schema(path: Path, transform: Callable[[str], str]) -> str:
    """Rewrite the events table's CREATE statement in the schema (writable_schema); return the old one."""
    conn = apsw.Connection(str(path))
    try:
        (sql,), = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'events'").fetchall()
        conn.execute("PRAGMA writable_schema=ON")
        conn.execute("UPDATE sqlite_schema SET sql = ? WHERE name = 'events'", (transform(sql),))
        conn.execute("PRAGMA writable_schema=OFF")
    finally:
        conn.close()  # the next connection reads the rewritten schema
    return str(sql)


def smuggle(path: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """`attack` with the events table's STRICT and NOT NULL lifted for the edits and put back after: values of
    any type in any column, in a file whose schema reads as the store made it."""
    original = set_events_schema(path, lambda sql: sql.replace(") STRICT", ")").replace(" NOT NULL", ""))
    try:
        attack(path, *statements)
    finally:
        set_events_schema(path, lambda _: original)


def smuggled(path: Path, column: str, value: object, seq: int) -> None:
    """Set `column` of the row at `seq` to a value STRICT refuses, as an attacker does (`smuggle`)."""
    smuggle(path, (f"UPDATE events SET {column} = ? WHERE seq = ?", (value, seq)))


def edit_caches(path: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """Edit the caches (snapshots, read models) as anyone with write access can: plain apsw, nothing else touched.

    Unlike `attack`, the schema stays as the store made it, so what the audit finds is the edit alone.
    """
    conn = apsw.Connection(str(path))
    try:
        for sql, params in statements:
            conn.execute(sql, params)
    finally:
        conn.close()


def row(path: Path, seq: int) -> tuple[Any, ...]:
    """The events row at `seq`: (seq, stream, version, type, at, body, prev, hash)."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute("SELECT seq, stream, version, type, at, body, prev, hash FROM events WHERE seq = ?",
                            (seq,)).fetchall()[0]
    finally:
        conn.close()


def rows_and_meta(path: Path) -> tuple[list[tuple[Any, ...]], dict[str, bytes]]:
    """Every events row, and the meta table: what an export and import must carry over exactly."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute("SELECT seq, stream, version, type, at, body, prev, hash FROM events ORDER BY seq")
        return list(rows), dict(conn.execute("SELECT key, value FROM meta").fetchall())
    finally:
        conn.close()


def rechain(path: Path) -> None:
    """Recompute every prev and hash of an unkeyed store, as an attacker who edited a body would."""
    conn = apsw.Connection(str(path))
    try:
        (store_id,), = conn.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchall()
        prev = chain.genesis(store_id)
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        conn.execute("BEGIN")
        for seq, stream, version, type_, at, body in conn.execute(
                "SELECT seq, stream, version, type, at, body FROM events ORDER BY seq").fetchall():
            digest = chain.link(prev, seq, stream, version, type_, at, body)
            conn.execute("UPDATE events SET prev = ?, hash = ? WHERE seq = ?", (prev, digest, seq))
            prev = digest
        conn.execute(TRIGGERS[0])  # events_no_update, as the store made it
        conn.execute("COMMIT")
    finally:
        conn.close()


def fleet_in(factory: pytest.TempPathFactory, *, key: bytes | None = None) -> tuple[Path, dict[str, int]]:
    """A fleet log in a fresh directory (test modules make it once, as a module fixture)."""
    path = factory.mktemp("fleet") / "fleet.db"
    return path, build_fleet(path, key=key)


def long_in(factory: pytest.TempPathFactory) -> Path:
    """A long log in a fresh directory."""
    path = factory.mktemp("long") / "long.db"
    build_long(path)
    return path


def truncated_replay(store: EventStore, until_seq: int) -> dict[str, RunnerState]:
    """Every runner's state after the log's first `until_seq` events, folded from nothing through the rules: no
    snapshot, no projection helper."""
    states: dict[str, RunnerState] = {}
    for recorded in store.read(limit=until_seq):
        states[recorded.stream] = apply(states.get(recorded.stream), recorded.event, parse_iso_ms(recorded.at),
                                        recorded.at)
    return states
