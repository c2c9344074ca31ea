"""LocalHost end to end in child mode, on real processes (``sys.executable -c`` snippets).

Time that the rules read (lease expiry, drain deadline, wake time) comes from a fake clock; the
processes themselves run in real time and every wait for them is bounded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from waiting import wait_for

from hosts.local import LocalHost
from hosts.park import Task, write_status
from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import UnitRecord
from lifecycle_es.receipts import LeaseReceipt
from lifecycle_es.testing import FakeClock

TOKEN = "tok-7f3a9c-never-in-argv-or-env"
HOOK = "sha256:" + "a" * 64
# Ends cleanly on SIGTERM, reads the token from stdin, says it is ready (a file in its work dir), sleeps.
POLITE = ("import signal,sys,time\n"
          "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
          "sys.stdin.read()\n"
          "open('ready','w').close()\n"
          "time.sleep(120)\n")
STUBBORN = ("import signal,sys,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsys.stdin.read()\n"
            "open('ready','w').close()\ntime.sleep(120)\n")


def unit_pid(handle: UnitRecord) -> int:
    """The unit's own pid: the one child of its supervisor (the handle's pid)."""
    children = Path(f"/proc/{handle.pid}/task/{handle.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def ready(handle: UnitRecord) -> bool:
    """Whether the unit has installed its SIGTERM handler and read its token."""
    return (Path(handle.run_dir) / "work" / "ready").exists()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(time.time_ns() // 1_000_000)  # real time: unit names and pids are real


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path,
        clock: FakeClock) -> Iterator[tuple[EventStore, RunnerLifecycle, LocalHost]]:
    """A runner and its child-mode host, on a store file or (the same tests) on a PostgreSQL server."""
    base = tmp_path / "base"
    base.mkdir()
    target = request.getfixturevalue("pg_url") if request.param == "postgres" else str(tmp_path / "events.db")
    store = EventStore.open(target)
    lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(base),
                                resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                                post_session_hook_digest=HOOK, now=clock)
    lifecycle.initialize()
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=3000)
    yield store, lifecycle, host
    for view in host.units().values():
        if view.handle is not None and view.handle.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(view.handle.pid, signal.SIGKILL)
    host.close()
    store.close()


def proxy(clock: FakeClock, revision: int = 1) -> ProxyAuthority:
    return ProxyAuthority(id="proxy-a", revision=revision, issued_at=iso_ms(clock() - 1000),
                          expires_at=iso_ms(clock() + 3_600_000))


def lease(lifecycle: RunnerLifecycle, clock: FakeClock, session: str, ttl_ms: int = 600_000) -> LeaseReceipt:
    generation = lifecycle.snapshot().generation
    return lifecycle.acquire_lease(session_id=session, expected_generation=generation, ttl_ms=ttl_ms,
                                   proxy_authority=proxy(clock))


def types(store: EventStore) -> list[str]:
    return [recorded.type for recorded in store.read()]


def lease_status(lifecycle: RunnerLifecycle, lease_id: str) -> tuple[str, str | None]:
    found = lifecycle.state().lease(lease_id)
    assert found is not None
    return found.status, found.result_digest


def test_start_status_stop_and_the_token_reaches_only_stdin(env, clock, tmp_path: Path) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    echo = f"import sys,time\nopen({str(tmp_path / 'got')!r},'w').write(sys.stdin.read())\ntime.sleep(120)\n"
    handle = host.start(receipt, command=[sys.executable, "-c", echo], token=TOKEN)
    assert host.status(handle) == "running"
    assert wait_for(lambda: (tmp_path / "got").exists() and (tmp_path / "got").read_text() == TOKEN)
    cmdline = Path(f"/proc/{handle.pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{handle.pid}/environ").read_bytes()
    assert TOKEN.encode() not in cmdline and TOKEN.encode() not in environ
    db_bytes = b"".join(p.read_bytes() for p in tmp_path.glob("events.db*"))
    assert TOKEN.encode() not in db_bytes
    run_dir = Path(handle.run_dir)
    assert run_dir.name == receipt.lease.id and (run_dir / "work").is_dir()
    assert types(store)[-2:] == ["UnitStarting", "UnitStarted"]
    host.stop(handle, then=None)
    assert host.status(handle) in ("stopped", "gone")
    assert types(store)[-1] == "UnitStopped"


def test_a_killed_unit_parks_its_lease_lost_poll(env, clock) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    other = lease(lifecycle, clock, "s2")
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    host.start(other, command=[sys.executable, "-c", POLITE], token=TOKEN)
    os.kill(unit_pid(handle), signal.SIGKILL)
    seen: list[tuple[str, str]] = []

    def parked() -> bool:
        actions = host.reconcile()
        seen.extend((action.kind, action.detail) for action in actions)
        return any(action.kind == "parked lost-poll" for action in actions)

    assert wait_for(parked)
    # Said as people read it (what `lifecycle-es host` prints), never as Python's reprs of the values.
    assert ("exited", "lost-poll (killed by SIGKILL)") in seen
    assert lease_status(lifecycle, receipt.lease.id)[0] == "parked"
    assert lease_status(lifecycle, other.lease.id)[0] == "active"
    exited = [r.event for r in store.read() if r.type == "UnitExited"]
    assert exited[0].signal == "SIGKILL" and exited[0].outcome == "lost-poll"
    assert host.reconcile() == []  # converged: a second pass does nothing


def test_drain_sigterms_each_unit_once_settles_them_and_parks_the_runner(env, clock) -> None:
    store, lifecycle, host = env
    receipts = [lease(lifecycle, clock, f"s{i}") for i in range(3)]
    handles = [host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN) for receipt in receipts]
    assert wait_for(lambda: all(ready(handle) for handle in handles))
    lifecycle.request_drain(expected_generation=1, timeout_ms=60_000)
    host.reconcile()
    assert wait_for(lambda: (host.reconcile() or True) and lifecycle.snapshot().state == "parked")
    kinds = types(store)
    assert kinds.count("UnitSignalled") == 3 and kinds.count("LeaseSettled") == 3
    assert kinds[-1] == "RunnerParked"
    assert all(lease_status(lifecycle, r.lease.id)[0] == "settled" for r in receipts)


def test_drain_deadline_parks_every_lease_then_sigkills(env, clock) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    handle = host.start(receipt, command=[sys.executable, "-c", STUBBORN], token=TOKEN)
    assert wait_for(lambda: ready(handle))
    lifecycle.request_drain(expected_generation=1, timeout_ms=5_000)
    host.reconcile()  # SIGTERM, which the unit ignores
    assert host.status(handle) == "running"
    clock.advance(5_000)
    actions = host.reconcile()
    assert [a.kind for a in actions][:2] == ["park_expired_drain", "signalled"]
    assert lifecycle.snapshot().state == "parked"
    assert lease_status(lifecycle, receipt.lease.id)[0] == "parked"
    assert wait_for(lambda: host.status(handle) != "running")
    signals = [r.event.signal for r in store.read() if r.type == "UnitSignalled"]
    assert signals == ["SIGTERM", "SIGKILL"]


def test_a_unit_killed_by_its_cpu_limit_parks_its_lease_resource_limit(tmp_path: Path, clock) -> None:
    base = tmp_path / "base"
    base.mkdir()
    with EventStore.open(tmp_path / "events.db") as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(base),
                                    resources=Resources(cpu_seconds=1, memory_bytes=1 << 30),
                                    post_session_hook_digest=HOOK, now=clock)
        lifecycle.initialize()
        host = LocalHost(lifecycle, mode="child")
        receipt = lease(lifecycle, clock, "s1")
        host.start(receipt, command=[sys.executable, "-c", "import sys\nsys.stdin.read()\nwhile True: pass\n"],
                   token=TOKEN)
        assert wait_for(lambda: any(a.kind == "parked resource-limit" for a in host.reconcile()), timeout_s=30)
        status, _ = lease_status(lifecycle, receipt.lease.id)
        assert status == "parked"
        parked = [r.event for r in store.read() if r.type == "LeaseParked"]
        assert parked[-1].reason == "resource-limit"
        host.close()


def test_a_unit_that_exits_zero_settles_with_the_digest_of_its_result(env, clock) -> None:
    _store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    writes_result = "import sys\nsys.stdin.read()\nopen('../result','w').write('42')"
    host.start(receipt, command=[sys.executable, "-c", writes_result], token=TOKEN)
    assert wait_for(lambda: any(a.kind == "settled" for a in host.reconcile()))
    assert lease_status(lifecycle, receipt.lease.id) == ("settled", "sha256:" + hashlib.sha256(b"42").hexdigest())


def test_a_unit_of_an_ended_lease_is_stopped(env, clock) -> None:
    _store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    keep = lease(lifecycle, clock, "s2")
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    host.start(keep, command=[sys.executable, "-c", POLITE], token=TOKEN)
    lifecycle.settle_lease(lease_id=receipt.lease.id, lease_generation=1, result_digest="sha256:" + "c" * 64)
    actions = host.reconcile()
    assert [(a.kind, a.detail) for a in actions] == [("stopped", "lease-ended")]
    assert host.status(handle) in ("stopped", "gone")


def test_an_expired_lease_stops_its_unit_and_parks_lost_poll(env, clock) -> None:
    _store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1", ttl_ms=10_000)
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    clock.advance(10_000)
    kinds = [a.kind for a in host.reconcile()]
    assert kinds == ["stopped", "parked lost-poll"]
    assert host.status(handle) in ("stopped", "gone")
    assert lifecycle.snapshot().state == "parked"  # its last active lease parked: the seed parks the runner


def test_a_failed_start_parks_the_lease_checkout_failure(env, clock) -> None:
    from hosts.proc import UnitStartError

    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    with pytest.raises(UnitStartError):
        host.start(receipt, command=["/nonexistent/agent"], token=TOKEN)
    parked = [r.event for r in store.read() if r.type == "LeaseParked"]
    assert parked and parked[-1].reason == "checkout-failure"


def test_a_unit_whose_proof_cannot_be_written_is_stopped_reaped_and_its_lease_parked(env, clock) -> None:
    from hosts.proc import UnitStartError, proc_stat

    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    run_dir = Path(lifecycle.base_dir) / receipt.lease.id
    (run_dir / "unit.handle").mkdir(parents=True)  # a non-empty directory: the proof cannot be renamed over it
    (run_dir / "unit.handle" / "x").touch()
    with pytest.raises(UnitStartError, match="proof"):
        host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    started = json.loads((run_dir / "unit.pid").read_text())  # the unit ran before its proof failed
    stat = proc_stat(started["pid"])
    assert stat is None or stat.start_ticks != started["start_ticks"]  # stopped and reaped: no process, no zombie
    assert "UnitStarted" not in types(store)
    assert [r.event.outcome for r in store.read() if r.type == "UnitExited"] == ["checkout-failure"]
    assert lease_status(lifecycle, receipt.lease.id)[0] == "parked"


def test_a_unit_that_only_waits_is_parked_and_woken_at_its_wake_time(env, clock) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1", ttl_ms=3_600_000)
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    wake = clock() + 120_000
    write_status(handle.run_dir, [Task(id="t1", state="sleeping", until=wake)], clock())
    assert [a.kind for a in host.reconcile()] == ["parked-waiting"]
    assert host.status(handle) in ("stopped", "gone")
    wakes = [r.event for r in store.read() if r.type == "UnitWakeRecorded"]
    assert [w.wake_at for w in wakes] == [wake]
    assert host.reconcile() == []  # not yet: the wake time has not come
    clock.advance(120_000)
    assert [a.kind for a in host.reconcile()] == ["woken"]
    restarted = host.units()[receipt.lease.id].handle
    assert restarted is not None and restarted.pid != handle.pid and host.status(restarted) == "running"
    assert types(store).count("UnitStarted") == 2


CRASHING_HOST = textwrap.dedent("""
    import os, signal, sys
    from lifecycle_es import EventStore, Resources, RunnerLifecycle
    from lifecycle_es.events import UnitStarted
    from lifecycle_es.receipts import LeaseReceipt
    import msgspec
    from hosts.local import LocalHost
    db, base, receipt_json, now = sys.argv[1:5]
    store = EventStore.open(db)
    lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=base,
                                resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                                post_session_hook_digest="sha256:" + "a" * 64, now=lambda: int(now))
    host = LocalHost(lifecycle, mode="child")
    record = lifecycle.record_host_facts
    def dying_record(events):
        if isinstance(events[0], UnitStarted):
            os.kill(os.getpid(), signal.SIGKILL)  # the host dies between the side effect and its outcome
        return record(events)
    lifecycle.record_host_facts = dying_record
    receipt = msgspec.json.decode(receipt_json.encode(), type=LeaseReceipt)
    host.start(receipt, command=[sys.executable, "-c", %r], token="tok")
""") % POLITE


def test_a_host_killed_between_intent_and_outcome_adopts_its_unit_on_restart(env, clock, tmp_path: Path) -> None:
    import msgspec

    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    crashed = subprocess.run([sys.executable, "-c", CRASHING_HOST, store.path, lifecycle.base_dir,
                              msgspec.json.encode(receipt).decode(), str(clock())], capture_output=True, timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()
    assert types(store)[-1] == "UnitStarting"
    actions = host.reconcile()
    assert [a.kind for a in actions] == ["adopted"]
    adopted = host.units()[receipt.lease.id].handle
    assert adopted is not None and host.status(adopted) == "running"
    assert host.reconcile() == []  # idempotent: no second unit, nothing more to do
    assert wait_for(lambda: ready(adopted))
    run_dir = Path(adopted.run_dir)
    units_in_dir = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cwd(pid) == str(run_dir / "work")]
    assert units_in_dir == [str(unit_pid(adopted))]
    lifecycle.request_drain(expected_generation=1, timeout_ms=60_000)
    host.reconcile()
    # Not this host's child, but its supervisor recorded the clean exit: the lease settles.
    assert wait_for(lambda: (host.reconcile() or True) and lifecycle.snapshot().state == "parked")
    assert lease_status(lifecycle, receipt.lease.id)[0] == "settled"


def _cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


DRAINER = textwrap.dedent("""
    import sys
    from lifecycle_es import EventStore, Resources, RunnerLifecycle
    db, base, now = sys.argv[1:4]
    with EventStore.open(db) as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=base,
                                    resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                                    post_session_hook_digest="sha256:" + "a" * 64, now=lambda: int(now))
        lifecycle.request_drain(expected_generation=1, timeout_ms=60_000)
""")


def test_a_drain_from_another_process_reaches_the_units_through_serve(env, clock) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    assert wait_for(lambda: ready(handle))
    stop = threading.Event()
    server = threading.Thread(target=host.serve, args=(stop,), kwargs={"tick": 60.0}, daemon=True)
    server.start()
    try:
        subprocess.run([sys.executable, "-c", DRAINER, store.path, lifecycle.base_dir, str(clock())],
                       check=True, timeout=60)
        # The timer is a minute away: only following the log can have delivered the SIGTERM.
        assert wait_for(lambda: types(store).count("UnitSignalled") == 1)
        assert wait_for(lambda: not Path(f"/proc/{handle.pid}").exists()
                        or Path(f"/proc/{handle.pid}/stat").read_text().split(") ")[1][0] == "Z")
    finally:
        stop.set()
        server.join(timeout=30)
    assert not server.is_alive()
    host.reconcile()
    assert lifecycle.snapshot().state == "parked"


@pytest.mark.parametrize("root", ["/tmp/runs-\ud800", "/tmp/runs-\udcff"])
def test_a_run_root_holding_a_lone_surrogate_is_refused_naming_run_root(env, root: str) -> None:
    from lifecycle_es import InvalidInputError

    _store, lifecycle, _host = env
    with pytest.raises(InvalidInputError) as err:
        LocalHost(lifecycle, mode="child", run_root=root)
    assert err.value.field == "run_root"


LEAVING_HOST = textwrap.dedent("""
    import sys
    import msgspec
    from lifecycle_es import EventStore, Resources, RunnerLifecycle
    from lifecycle_es.receipts import LeaseReceipt
    from hosts.local import LocalHost
    db, base, receipt_json, now, code = sys.argv[1:6]
    with EventStore.open(db) as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=base,
                                    resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                                    post_session_hook_digest="sha256:" + "a" * 64, now=lambda: int(now))
        host = LocalHost(lifecycle, mode="child")
        receipt = msgspec.json.decode(receipt_json.encode(), type=LeaseReceipt)
        host.start(receipt, command=[sys.executable, "-c", code], token="tok")
        host.close()
""")
# Reads its token, says it is ready, exits 0 once the test lets it go (after the host that started it is gone).
WAITS_THEN_EXITS = ("import os,sys,time\nsys.stdin.read()\nopen('ready','w').close()\n"
                    "while not os.path.exists('go'): time.sleep(0.01)\n")


def test_a_clean_exit_after_the_host_restarted_settles_the_lease(env, clock) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    subprocess.run([sys.executable, "-c", LEAVING_HOST, store.path, lifecycle.base_dir,
                    msgspec.json.encode(receipt).decode(), str(clock()), WAITS_THEN_EXITS], check=True, timeout=60)
    handle = host.units()[receipt.lease.id].handle
    assert handle is not None and host.status(handle) == "running"  # the old host is gone, its unit is not
    assert wait_for(lambda: ready(handle))
    (Path(handle.run_dir) / "work" / "go").touch()
    assert wait_for(lambda: host.status(handle) != "running")
    actions = host.reconcile()  # this host is not the unit's parent, and never was
    assert [(a.kind, a.detail) for a in actions] == [("exited", "settled (exit code 0)"), ("settled", "")]
    assert lease_status(lifecycle, receipt.lease.id)[0] == "settled"
