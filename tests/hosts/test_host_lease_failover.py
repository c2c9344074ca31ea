"""One driver acts per runner, with real ``lifecycle-es host`` processes, on a store file and on a
PostgreSQL server.

Three hosts for one runner: exactly one takes the host lease and acts, the others stand by. The holder
is paused (SIGSTOP) past its lease's ttl: a standby takes over; resumed (SIGCONT), the old holder
finds itself fenced and exits 75 having written nothing and touched no unit after the takeover. A
holder killed (SIGKILL) leaves its units running: the next holder adopts them and drives them on.

Every unit writes ``start`` and ``stop`` lines (lease, holder, token, pid, CLOCK_MONOTONIC ns) to one
record file; the test proves from them that no two units of one lease ever ran at once. Units that
park themselves (their work only waits) are stopped and woken again and again, so starts and stops
keep happening across the takeover. Waits are bounded waits for conditions, never assertions on time.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import apsw
import psycopg
import pytest
from pg import Blackhole, Server
from waiting import wait_for

from hosts.lease import holder_name
from hosts.local import LocalHost
from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.backends import is_url, server_target
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import HostLeaseAcquired
from lifecycle_es.lifecycle import DEFAULT_TTL_MS

CLI = str(Path(sys.executable).with_name("lifecycle-es"))
TTL_MS = 1_500
# A unit that notes its start and its stop (on SIGTERM); with "cycle" its work only ever waits 2.5 s ahead,
# so the host parks it (stops it, records the wake) and starts it again at that time, over and over.
UNIT = r"""
import json, os, signal, sys, time
record, lease, mode = sys.argv[1:4]
sys.stdin.read()
def note(what):
    line = " ".join((what, lease, os.environ.get("LIFECYCLE_ES_HOST_HOLDER", "-"),
                     os.environ.get("LIFECYCLE_ES_HOST_TOKEN", "0"), str(os.getpid()),
                     str(time.clock_gettime_ns(time.CLOCK_MONOTONIC)))) + "\n"
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, line.encode())
    os.close(fd)
def stop(*_):
    note("stop")
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
note("start")
while True:
    if mode == "cycle":  # said again and again, so a host that looks late still sees work 2.5 s ahead
        now = time.time_ns() // 1_000_000
        report = {"tasks": [{"id": "t", "state": "sleeping", "until": now + 2_500}], "updated_at": now}
        with open("../status.json.tmp", "w") as f:
            json.dump(report, f)
        os.rename("../status.json.tmp", "../status.json")
    time.sleep(0.3)
"""


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Host:
    """A ``lifecycle-es host`` process and the JSON lines it printed so far (read by a thread)."""

    process: subprocess.Popen[str]
    lines: list[dict[str, object]] = field(default_factory=list)

    def events(self, kind: str) -> list[dict[str, object]]:
        return [line for line in list(self.lines) if line.get("event") == kind]

    @property
    def holder(self) -> str | None:
        serving = self.events("serving")
        return str(serving[0]["holder"]) if serving else None


@dataclass
class Runner:
    db: str
    record: Path
    base: Path
    lease_ids: list[str]
    hosts: list[Host] = field(default_factory=list)

    def start_host(self, *extra: str) -> Host:
        process = subprocess.Popen(
            [CLI, "host", str(self.db), "--runner", "runner-1", "--tick", "0.2", "--log-format", "json",
             "--host-lease-ttl-ms", str(TTL_MS), "--host-lease-grace-ms", "500", "--park-threshold-ms", "1000",
             "--stop-timeout-ms", "5000", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        host = Host(process)

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                host.lines.append(json.loads(line) if line.startswith("{") else {"event": "text", "text": line})

        threading.Thread(target=read, daemon=True).start()
        self.hosts.append(host)
        return host

    def acquisitions(self) -> list[tuple[int, HostLeaseAcquired]]:
        with EventStore.open(self.db, read_only=True) as store:
            return [(recorded.seq, recorded.event) for recorded in store.read(stream="runner-1")
                    if isinstance(recorded.event, HostLeaseAcquired)]

    def host_events(self) -> list[tuple[int, str, object]]:
        """(seq, type, host_token) of every event that can carry a host token."""
        with EventStore.open(self.db, read_only=True) as store:
            return [(recorded.seq, recorded.type, getattr(recorded.event, "host_token", None))
                    for recorded in store.read(stream="runner-1") if hasattr(recorded.event, "host_token")]

    def records(self) -> list[tuple[str, str, str, int, int, int]]:
        if not self.record.exists():
            return []
        out = []
        for line in self.record.read_text().splitlines():
            what, lease, holder, token, pid, at = line.split()
            out.append((what, lease, holder, int(token), int(pid), int(at)))
        return out

    def starts(self, token: int) -> int:
        return sum(1 for what, _, _, tok, _, _ in self.records() if what == "start" and tok == token)


@pytest.fixture(params=["sqlite", "postgres"])
def runner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runner]:
    base = tmp_path / "base"
    base.mkdir()
    db = request.getfixturevalue("pg_url") if request.param == "postgres" else str(tmp_path / "runners.db")
    made = Runner(db, tmp_path / "units.record", base, [])
    try:
        yield made
    finally:
        for host in made.hosts:
            if host.process.poll() is None:
                host.process.send_signal(signal.SIGCONT)
                host.process.kill()
            host.process.wait(timeout=30)
        for line in made.records():  # units outlive their hosts (detached): end them
            if line[0] == "start":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(line[4], signal.SIGKILL)


def leased_units(runner: Runner, mode: str, count: int) -> None:
    """Initialize the runner, grant `count` leases and start their units under a host lease the test holds."""
    now = wall_ms()
    proxy = ProxyAuthority(id="p", revision=1, issued_at=iso_ms(now - 1000), expires_at=iso_ms(now + 600_000))
    with EventStore.open(runner.db) as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(runner.base),
                                    resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                                    post_session_hook_digest="sha256:" + "a" * 64)
        lifecycle.initialize()
        grant = lifecycle.take_host_lease(holder=holder_name(instance="test"), ttl_ms=TTL_MS)
        host = LocalHost(lifecycle, env={"LIFECYCLE_ES_HOST_HOLDER": grant.holder,
                                         "LIFECYCLE_ES_HOST_TOKEN": str(grant.token)})
        for index in range(count):
            receipt = lifecycle.acquire_lease(session_id=f"s{index}", expected_generation=1, ttl_ms=DEFAULT_TTL_MS,
                                              proxy_authority=proxy)
            runner.lease_ids.append(receipt.lease.id)
            host.start(receipt, command=[sys.executable, "-c", UNIT, str(runner.record), receipt.lease.id, mode])
        assert wait_for(lambda: sum(1 for line in runner.records() if line[0] == "start") == count)
        host.close()
        lifecycle.release_host_lease(grant)  # the first host may act at once


def pause_holding_nothing(runner: Runner, host: Host) -> None:
    """SIGSTOP `host` at a moment it holds neither the store's write lock nor a run directory's owner lock.

    A process paused inside a write transaction blocks every writer of an SQLite file (a paused holder of
    a lease's owner lock keeps that lease's directory from the next host until it dies): the failover
    under test is the host lease's, so the pause is retried until it lands outside both.
    """
    for _ in range(200):
        host.process.send_signal(signal.SIGSTOP)
        if not any(held(runner.base / lease_id / "owner.lock") for lease_id in runner.lease_ids) and not db_locked(
                runner.db):
            return
        host.process.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    pytest.fail("the holder never paused outside a lock")


def held(lock: Path) -> bool:
    """Whether another process holds `lock`'s flock (probed and let go at once)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def db_locked(db: str) -> bool:
    """Whether another connection holds the store's write lock (probed without waiting); on a server,
    whether any session sits inside a transaction (a paused process holding the head row would)."""
    if is_url(db):
        with psycopg.connect(server_target(db).conninfo, autocommit=True) as probe:
            row = probe.execute("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                                " AND state LIKE 'idle in transaction%%'").fetchone()
        return bool(row and row[0])
    conn = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READWRITE)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except apsw.BusyError:
        return True
    finally:
        with contextlib.suppress(apsw.Error):
            conn.execute("ROLLBACK")
        conn.close()
    return False


@contextlib.contextmanager
def write_lock_held(db: str) -> Iterator[None]:
    """Hold the store's write lock from another connection (on a server: its head row, FOR UPDATE)."""
    if is_url(db):
        target = server_target(db)
        with psycopg.connect(target.conninfo) as blocker:
            blocker.execute(f"SELECT seq FROM {target.schema}.head FOR UPDATE")  # type: ignore[arg-type]
            yield
            blocker.rollback()
        return
    blocker = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READWRITE)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        yield
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


def assert_no_overlap(runner: Runner) -> None:
    """No two units of one lease ever ran at once: each starts after the one before it stopped."""
    by_lease: dict[str, list[tuple[int, int | None, int]]] = {}
    stops = {(lease, pid): at for what, lease, _, _, pid, at in runner.records() if what == "stop"}
    for what, lease, _, _, pid, at in runner.records():
        if what == "start":
            by_lease.setdefault(lease, []).append((at, stops.get((lease, pid)), pid))
    assert by_lease, "no unit ever ran"
    for lease, spans in by_lease.items():
        spans.sort()
        for (_, stopped, pid), (began, _, next_pid) in itertools.pairwise(spans):
            assert stopped is not None and stopped <= began, (
                f"{lease}: unit {next_pid} started while unit {pid} still ran: {spans}")


def test_three_hosts_one_acts_a_paused_holder_is_taken_over_and_exits_75_untouched(runner: Runner) -> None:
    leased_units(runner, "cycle", 2)
    hosts = [runner.start_host() for _ in range(3)]
    assert wait_for(lambda: len(runner.acquisitions()) == 2, 30)
    first = runner.acquisitions()[-1][1]
    assert wait_for(lambda: runner.starts(first.token) >= 2, 30), runner.records()
    # Exactly one acts: one took the lease, the others stand by; every host event is under its token.
    assert wait_for(lambda: all(host.holder for host in hosts))
    holder = next(host for host in hosts if host.holder == first.holder)
    standbys = [host for host in hosts if host is not holder]
    assert wait_for(lambda: all(host.events("standby") for host in standbys))
    assert all(not host.events("action") and not host.events("lease-taken") for host in standbys)
    taken_seq = runner.acquisitions()[-1][0]
    assert {token for seq, _, token in runner.host_events() if seq > taken_seq} == {first.token}

    pause_holding_nothing(runner, holder)
    assert wait_for(lambda: len(runner.acquisitions()) == 3, 30)
    second_seq, second = runner.acquisitions()[-1]
    assert second.token == first.token + 1 and second.holder != first.holder
    taker = next(host for host in standbys if host.holder == second.holder)
    # The taker drives the units on: parks and wakes them under its own token.
    assert wait_for(lambda: runner.starts(second.token) >= 1, 30), runner.records()

    holder.process.send_signal(signal.SIGCONT)
    assert holder.process.wait(timeout=30) == 75
    assert wait_for(lambda: holder.events("stopped")), holder.lines  # whichever of its threads saw the fence
    assert holder.events("stopped")[-1]["exit"] == 75
    assert holder.events("fenced") and not holder.events("released")
    # Nothing the old holder did comes after the takeover: no event of its token in the log after it, no
    # action done after the taker took the lease (a line may be printed after the pause: its `at` says
    # when the deed was done), no unit started under its token since.
    assert all(token != first.token for seq, _, token in runner.host_events() if seq > second_seq)
    taken_at = str(taker.events("lease-taken")[0]["ts"])
    assert all(str(line["at"]) < taken_at for line in holder.events("action")), holder.events("action")
    assert runner.starts(first.token) == sum(1 for _, kind, token in runner.host_events()
                                             if kind == "UnitStarted" and token == first.token)
    assert_no_overlap(runner)
    for host in standbys:
        host.process.send_signal(signal.SIGTERM)
    assert [host.process.wait(timeout=30) for host in standbys] == [0, 0]
    assert_no_overlap(runner)


def test_a_killed_holders_units_are_adopted_by_the_next_holder(runner: Runner) -> None:
    leased_units(runner, "steady", 1)
    first = runner.start_host()
    assert wait_for(lambda: first.events("adopted"), 30), first.lines
    assert first.events("adopted")[0]["leases"] == runner.lease_ids
    second = runner.start_host()
    assert wait_for(lambda: second.events("standby"), 30)
    first.process.kill()
    assert first.process.wait(timeout=30) == -signal.SIGKILL
    assert wait_for(lambda: second.events("adopted"), 30), second.lines
    assert second.events("adopted")[0]["leases"] == runner.lease_ids
    token = runner.acquisitions()[-1][1].token
    # The unit the killed host left kept running, adopted as it is: one start, no stop, its lease active.
    assert [line[0] for line in runner.records()] == ["start"]
    with EventStore.open(runner.db) as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(runner.base),
                                    resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                                    post_session_hook_digest="sha256:" + "a" * 64)
        assert [lease.status for lease in lifecycle.state().leases] == ["active"]
        lifecycle.request_drain(expected_generation=1, timeout_ms=60_000)
    # The new holder drives it on: the drain's SIGTERM is its, under its token, and the unit stops.
    assert wait_for(lambda: [line[0] for line in runner.records()] == ["start", "stop"], 30), runner.records()
    assert (next(kind for _, kind, tok in runner.host_events() if kind == "UnitSignalled" and tok == token)
            == "UnitSignalled")
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(timeout=30) == 0


def test_a_host_with_no_wait_exits_76_while_another_holds_the_lease(runner: Runner) -> None:
    leased_units(runner, "steady", 1)
    first = runner.start_host()
    assert wait_for(lambda: first.events("acting"), 30)
    late = runner.start_host("--no-wait")
    assert late.process.wait(timeout=30) == 76
    assert wait_for(lambda: late.events("held"))
    assert late.events("held")[0]["holder"] == first.holder and not late.events("acting")
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(timeout=30) == 0


def test_a_holder_that_cannot_renew_by_its_local_deadline_stops_and_exits_75(runner: Runner) -> None:
    leased_units(runner, "steady", 1)
    host = runner.start_host()
    assert wait_for(lambda: host.events("acting"), 30)
    # The store's write lock held elsewhere: no renewal can land, so the driver's own deadline decides.
    with write_lock_held(runner.db):
        assert host.process.wait(timeout=30) == 75
    assert wait_for(lambda: host.events("stopped")), host.lines
    (fenced,) = host.events("fenced")
    assert "not renewed by its local deadline" in str(fenced["reason"]), fenced
    assert host.events("stopped")[-1]["exit"] == 75
    assert [line[0] for line in runner.records()] == ["start"]  # its unit was left alone, for the next holder


def test_a_holder_cut_off_from_the_server_self_fences_and_the_standby_takes_over(
        pg_server: Server, pg_url: str, tmp_path: Path) -> None:
    """The holder's connections pass through a relay the test silences (a network partition: no error, no
    close, every read waits): it stops acting by its own deadline and exits 75; the standby, which still
    reaches the server, takes the lease once it expired and drives the units on."""
    base = tmp_path / "base"
    base.mkdir()
    runner = Runner(pg_url, tmp_path / "units.record", base, [])
    relay = Blackhole(pg_server)
    try:
        leased_units(runner, "cycle", 1)
        runner.db = relay.url(pg_url)
        holder = runner.start_host()
        assert wait_for(lambda: holder.events("acting"), 30), holder.lines
        runner.db = pg_url
        standby = runner.start_host()
        assert wait_for(lambda: standby.events("standby"), 30), standby.lines
        first = runner.acquisitions()[-1][1]
        relay.cut()
        assert holder.process.wait(timeout=60) == 75
        # Its loop is stuck in a read that never returns: the watch thread fences it and exits, and says so.
        assert wait_for(lambda: holder.events("fenced") and holder.events("stopped")), holder.lines
        assert holder.events("stopped")[-1]["exit"] == 75
        assert wait_for(lambda: len(runner.acquisitions()) == 3, 30)
        second = runner.acquisitions()[-1][1]
        assert second.token == first.token + 1 and second.holder != first.holder
        assert wait_for(lambda: runner.starts(second.token) >= 1, 30), runner.records()
        assert_no_overlap(runner)
        standby.process.send_signal(signal.SIGTERM)
        assert standby.process.wait(timeout=30) == 0
    finally:
        for host in runner.hosts:
            if host.process.poll() is None:
                host.process.kill()
            host.process.wait(timeout=30)
        for line in runner.records():
            if line[0] == "start":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(line[4], signal.SIGKILL)
        relay.close()
