"""LocalHost's rules of use on real child processes: one unit per lease, a command is a list, what a
stop does to the lease, what a unit is told, and a stop that had to escalate, on the record."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from hosts.local import LocalHost
from hosts.proc import UnitRunningError
from lifecycle_es import EventStore, InvalidInputError, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.errors import StaleFenceError
from lifecycle_es.events import UnitRecord, UnitStopped
from lifecycle_es.receipts import LeaseReceipt
from lifecycle_es.testing import FakeClock

TOKEN = "tok-5be1d0-only-on-stdin"
HOOK = "sha256:" + "a" * 64
POLITE = ("import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nsys.stdin.read()\n"
          "open('ready','w').close()\ntime.sleep(120)\n")
STUBBORN = ("import signal,sys,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsys.stdin.read()\n"
            "open('ready','w').close()\ntime.sleep(120)\n")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(time.time_ns() // 1_000_000)


@pytest.fixture
def env(tmp_path: Path, clock: FakeClock) -> Iterator[tuple[EventStore, RunnerLifecycle, LocalHost]]:
    base = tmp_path / "base"
    base.mkdir()
    store = EventStore.open(tmp_path / "events.db")
    lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(base),
                                resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                                post_session_hook_digest=HOOK, now=clock)
    lifecycle.initialize()
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=3000)
    yield store, lifecycle, host
    for view in host.units().values():
        if view.handle is not None and host.driver.status(view.handle) == "running":
            with contextlib.suppress(Exception):
                host.driver.stop(view.handle)
    host.close()
    store.close()


def lease(lifecycle: RunnerLifecycle, clock: FakeClock, session: str, ttl_ms: int = 600_000) -> LeaseReceipt:
    proxy = ProxyAuthority(id="proxy-a", revision=1, issued_at=iso_ms(clock() - 1000),
                           expires_at=iso_ms(clock() + 3_600_000))
    return lifecycle.acquire_lease(session_id=session, expected_generation=lifecycle.snapshot().generation,
                                   ttl_ms=ttl_ms, proxy_authority=proxy)


def log_bytes(store: EventStore) -> list[tuple[int, bytes, bytes]]:
    return [(recorded.seq, recorded.body, recorded.hash) for recorded in store.read()]


def ready(handle: UnitRecord) -> bool:
    return (Path(handle.run_dir) / "work" / "ready").exists()


def processes_in(work: Path) -> list[int]:
    """The live processes whose working directory is `work`: the units running there."""
    found = []
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if name.isdigit() and os.readlink(f"/proc/{name}/cwd") == str(work):
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(name))
    return found


def lease_status(lifecycle: RunnerLifecycle, lease_id: str) -> str:
    found = lifecycle.state().lease(lease_id)
    assert found is not None
    return found.status


def stops(store: EventStore) -> list[UnitStopped]:
    return [recorded.event for recorded in store.read() if isinstance(recorded.event, UnitStopped)]


# --- one unit per lease ------------------------------------------------------------------------------


def test_starting_a_lease_twice_makes_one_process(env, clock) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    assert wait_for(lambda: ready(handle))
    before = log_bytes(store)
    with pytest.raises(UnitRunningError, match=f"lease {receipt.lease.id} already has a unit") as refused:
        host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    assert refused.value.lease_id == receipt.lease.id and refused.value.handle == handle
    assert log_bytes(store) == before  # nothing recorded
    work = Path(handle.run_dir) / "work"
    assert processes_in(work) and len(processes_in(work)) == 1
    # A second host on the same log is refused the same way, before it touches the run directory.
    other = LocalHost(lifecycle, mode="child")
    with pytest.raises(UnitRunningError):
        other.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    other.close()
    assert len(processes_in(work)) == 1 and log_bytes(store) == before
    host.stop(handle, then=None)
    assert processes_in(work) == []
    # Once its unit stopped, the lease (still active) may have another.
    again = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    assert wait_for(lambda: ready(again)) and len(processes_in(work)) == 1


@pytest.mark.parametrize(("command", "field"), [
    (f"{sys.executable} -c pass", "command"), (b"/bin/true", "command"), ([], "command"), (["/bin/true", 3], "command"),
])
def test_a_command_that_is_not_a_list_of_strings_is_refused_before_anything_is_recorded(env, clock, command,
                                                                                         field: str) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    before = log_bytes(store)
    with pytest.raises(InvalidInputError) as refused:
        host.start(receipt, command=command, token=TOKEN)
    assert refused.value.field == field
    assert log_bytes(store) == before
    assert lease_status(lifecycle, receipt.lease.id) == "active"
    assert not (Path(lifecycle.base_dir) / receipt.lease.id).exists()


@pytest.mark.parametrize(("change", "field"), [({"token": 5}, "token"), ({"token": ""}, "token"),
                                               ({"env": {"BAD NAME": "x"}}, "env")])
def test_a_bad_token_or_env_is_refused_before_anything_is_recorded(env, clock, change, field: str) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    before = log_bytes(store)
    with pytest.raises(InvalidInputError) as refused:
        host.start(receipt, **{"command": [sys.executable, "-c", POLITE], "token": TOKEN, **change})
    assert refused.value.field == field and log_bytes(store) == before


# --- what a stop does to the lease -------------------------------------------------------------------


def test_stop_then_settle_settles_with_the_unit_s_result(env, clock) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    code = POLITE.replace("sys.exit(0)", "(open(os.environ['LIFECYCLE_ES_RESULT'],'w').write('partial'), "
                                         "sys.exit(0))").replace("import signal", "import os,signal")
    handle = host.start(receipt, command=[sys.executable, "-c", code], token=TOKEN)
    assert wait_for(lambda: ready(handle))
    host.stop(handle, then="settle")
    settled = lifecycle.state().lease(receipt.lease.id)
    assert settled is not None and settled.status == "settled"
    assert settled.result_digest == "sha256:" + hashlib.sha256(b"partial").hexdigest()
    assert [(s.reason, s.signals) for s in stops(store)] == [("stopped", ("SIGTERM",))]


def test_stop_then_park_parks_lost_poll(env, clock) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    keep = lease(lifecycle, clock, "s2")  # so the runner stays accepting
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    assert wait_for(lambda: ready(handle))
    host.stop(handle, then="park")
    parked = [r.event for r in store.read() if r.type == "LeaseParked"]
    assert [(p.lease_id, p.reason) for p in parked] == [(receipt.lease.id, "lost-poll")]
    assert lease_status(lifecycle, keep.lease.id) == "active"
    with pytest.raises(StaleFenceError):  # the lease ended: nothing more to park (the unit is gone anyway)
        host.stop(handle, then="park")


def test_stop_then_none_leaves_the_lease_active_until_it_expires(env, clock) -> None:
    _store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1", ttl_ms=60_000)
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    assert wait_for(lambda: ready(handle))
    host.stop(handle, then=None)
    assert lease_status(lifecycle, receipt.lease.id) == "active"
    assert host.reconcile() == []  # nothing to do before its expiry
    clock.advance(60_000)
    assert [a.kind for a in host.reconcile()] == ["parked lost-poll"]
    assert lease_status(lifecycle, receipt.lease.id) == "parked"


@pytest.mark.parametrize("then", ["settled", "stop", ""])
def test_stop_needs_a_then_it_knows(env, clock, then: str) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    before = log_bytes(store)
    with pytest.raises(InvalidInputError) as refused:
        host.stop(handle, then=then)
    assert refused.value.field == "then" and log_bytes(store) == before
    assert host.status(handle) == "running"


def test_a_stop_that_escalated_to_sigkill_is_recorded(env, clock) -> None:
    store, lifecycle, host = env
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=200)
    receipt = lease(lifecycle, clock, "s1")
    handle = host.start(receipt, command=[sys.executable, "-c", STUBBORN], token=TOKEN)
    assert wait_for(lambda: ready(handle))
    host.stop(handle, then=None)
    assert [(s.reason, s.signals) for s in stops(store)] == [("stopped", ("SIGTERM", "SIGKILL"))]
    assert processes_in(Path(handle.run_dir) / "work") == []
    host.close()


def test_a_lease_that_expires_under_a_stubborn_unit_records_the_escalation(env, clock) -> None:
    store, lifecycle, _ = env
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=200)
    receipt = lease(lifecycle, clock, "s1", ttl_ms=10_000)
    handle = host.start(receipt, command=[sys.executable, "-c", STUBBORN], token=TOKEN)
    assert wait_for(lambda: ready(handle))
    clock.advance(10_000)
    assert [a.kind for a in host.reconcile()] == ["stopped", "parked lost-poll"]
    assert [(s.reason, s.signals) for s in stops(store)] == [("lease-expired", ("SIGTERM", "SIGKILL"))]
    host.close()


# --- what a unit is told, and where its result goes --------------------------------------------------


def test_a_unit_finds_its_run_dir_and_result_path_in_its_environment(env, clock) -> None:
    _store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    code = ("import os,sys\nsys.stdin.read()\n"
            "open(os.environ['LIFECYCLE_ES_RESULT'],'w').write(os.environ['LIFECYCLE_ES_RUN_DIR'])\n")
    # The caller's env cannot move them: the host's values win.
    handle = host.start(receipt, command=[sys.executable, "-c", code], token=TOKEN,
                        env={"LIFECYCLE_ES_RESULT": "/tmp/elsewhere", "LIFECYCLE_ES_RUN_DIR": "/tmp"})
    assert wait_for(lambda: any(a.kind == "settled" for a in host.reconcile()))
    run_dir = Path(handle.run_dir)
    assert (run_dir / "result").read_text() == str(run_dir)
    found = lifecycle.state().lease(receipt.lease.id)
    assert found is not None and found.result_digest == "sha256:" + hashlib.sha256(str(run_dir).encode()).hexdigest()


def test_a_result_left_in_the_working_directory_is_not_ignored(env, clock) -> None:
    store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    keep = lease(lifecycle, clock, "s2")
    code = "import sys\nsys.stdin.read()\nopen('result','w').write('42')\n"  # relative: lands in work/
    host.start(receipt, command=[sys.executable, "-c", code], token=TOKEN)
    seen: list[tuple[str, str]] = []

    def ended() -> bool:
        seen.extend((a.kind, a.detail) for a in host.reconcile())
        return lease_status(lifecycle, receipt.lease.id) != "active"

    assert wait_for(ended)
    assert lease_status(lifecycle, receipt.lease.id) == "parked"
    assert any(kind == "unsafe-file" and "LIFECYCLE_ES_RESULT" in detail and "work/result" in detail
               for kind, detail in seen), seen
    parked = [r.event for r in store.read() if r.type == "LeaseParked"]
    assert [p.reason for p in parked] == ["lost-poll"]
    assert lease_status(lifecycle, keep.lease.id) == "active"


def test_killing_the_supervisor_outright_takes_its_unit_with_it(env, clock) -> None:
    _store, lifecycle, host = env
    receipt = lease(lifecycle, clock, "s1")
    keep = lease(lifecycle, clock, "s2")
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    assert wait_for(lambda: ready(handle))
    work = Path(handle.run_dir) / "work"
    assert len(processes_in(work)) == 1
    assert handle.pid is not None
    os.kill(handle.pid, signal.SIGKILL)
    assert wait_for(lambda: processes_in(work) == [])
    assert wait_for(lambda: any(a.kind == "parked lost-poll" for a in host.reconcile()))  # its end is unknown
    assert lease_status(lifecycle, keep.lease.id) == "active"
