"""Units and unit facts as hostile input to LocalHost, on real child units and real processes.

A unit controls the files of its run directory: a FIFO, a link to /dev/zero, a huge sparse file, a
link to a file elsewhere. The host runs in a subprocess under an address-space limit with a bounded
wait, so a host that hangs or reads a file whole fails the test instead of hanging or exhausting the
machine. Unit facts are public: a forged ``UnitStarted`` naming a bystander process never gets it
signalled, and its lease ends ``lost-poll``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from waiting import wait_for

from hosts.local import LocalHost
from hosts.proc import UnprovenUnitError, current_boot_id, proc_start_ticks
from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import UnitRecord, UnitStarted, UnitStarting, UnitStopped, UnitWakeRecorded
from lifecycle_es.receipts import LeaseReceipt
from lifecycle_es.testing import FakeClock

HOOK = "sha256:" + "a" * 64
# Enough for the host (about 40 MiB of address space) with room to spare; far below any file here.
HOST_ADDRESS_SPACE = 384 << 20
GOOD = ("import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nsys.stdin.read()\n"
        "open('ready','w').close()\ntime.sleep(120)\n")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(time.time_ns() // 1_000_000)  # real time: unit names and pids are real


@pytest.fixture
def runner(tmp_path: Path, clock: FakeClock) -> Iterator[tuple[EventStore, RunnerLifecycle]]:
    base = tmp_path / "base"
    base.mkdir()
    store = EventStore.open(tmp_path / "events.db")
    lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(base),
                                resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                                post_session_hook_digest=HOOK, now=clock)
    lifecycle.initialize()
    yield store, lifecycle
    _kill_units(base)
    store.close()


def _kill_units(base: Path) -> None:
    """SIGKILL every unit whose wrapper wrote a pid file under `base` (a failed test leaves none behind)."""
    for pid_file in base.glob("*/unit.pid"):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(pid_file.read_text())
            if proc_start_ticks(record["pid"]) == record["start_ticks"]:
                os.killpg(record["pid"], signal.SIGKILL)


def lease(lifecycle: RunnerLifecycle, clock: FakeClock, session: str, ttl_ms: int = 600_000) -> LeaseReceipt:
    authority = ProxyAuthority(id="proxy-a", revision=1, issued_at=iso_ms(clock() - 1000),
                               expires_at=iso_ms(clock() + 3_600_000))
    return lifecycle.acquire_lease(session_id=session, expected_generation=lifecycle.snapshot().generation,
                                   ttl_ms=ttl_ms, proxy_authority=authority)


def parked(store: EventStore, lease_id: str) -> list[str]:
    return [r.event.reason for r in store.read() if r.type == "LeaseParked" and r.event.lease_id == lease_id]


def stops(store: EventStore, lease_id: str) -> list[str]:
    return [r.event.reason for r in store.read() if r.type == "UnitStopped" and r.event.lease_id == lease_id]


# --- a unit's files ----------------------------------------------------------------------------------

# The host, alone in a process whose address space is limited: starts a bad unit then a good one, and
# reconciles until the bad unit's lease has ended. Prints the actions as JSON lines.
HOST = textwrap.dedent("""
    import json, resource, sys, time
    import msgspec
    from lifecycle_es import EventStore, Resources, RunnerLifecycle
    from lifecycle_es.receipts import LeaseReceipt
    from hosts.local import LocalHost
    db, base, now, limit, bad_json, good_json, bad_cmd, good_cmd = sys.argv[1:9]
    resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))
    store = EventStore.open(db)
    lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=base,
                                resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                                post_session_hook_digest="sha256:" + "a" * 64, now=lambda: int(now))
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=3000)
    bad = msgspec.json.decode(bad_json.encode(), type=LeaseReceipt)
    good = msgspec.json.decode(good_json.encode(), type=LeaseReceipt)
    host.start(bad, command=json.loads(bad_cmd), token="tok")
    host.start(good, command=json.loads(good_cmd), token="tok")
    deadline = time.monotonic() + 60
    while lifecycle.state().lease(bad.lease.id).status == "active" and time.monotonic() < deadline:
        for action in host.reconcile():
            print(json.dumps(msgspec.structs.asdict(action)), flush=True)
        time.sleep(0.05)
    host.close()
""")

BAD_UNITS = {
    # name: (shell line run by the unit in its work dir, the lease's end)
    "status-fifo": ("mkfifo ../status.json && exec sleep 120", "running"),
    "status-link-to-dev-zero": ("ln -s /dev/zero ../status.json && exec sleep 120", "running"),
    "status-2g-sparse": ("truncate -s 2G ../status.json && exec sleep 120", "running"),
    "result-fifo": ("mkfifo ../result", "exited"),
    "result-3g-sparse": ("truncate -s 3G ../result", "exited"),
    "result-link-outside": ('ln -s "$SECRET" ../result', "exited"),
}


@pytest.mark.parametrize("name", sorted(BAD_UNITS))
def test_a_unit_with_a_hostile_file_fails_alone_and_the_host_goes_on(runner, clock, tmp_path: Path,
                                                                      name: str) -> None:
    store, lifecycle = runner
    line, how = BAD_UNITS[name]
    secret = tmp_path / "secret"
    secret.write_bytes(b"the host's own secret")
    bad, good = lease(lifecycle, clock, "bad"), lease(lifecycle, clock, "good")
    bad_cmd = ["/bin/sh", "-c", f"SECRET={secret}; cat >/dev/null; {line}"]
    try:
        done = subprocess.run(
            [sys.executable, "-c", HOST, store.path, lifecycle.base_dir, str(clock()), str(HOST_ADDRESS_SPACE),
             msgspec.json.encode(bad).decode(), msgspec.json.encode(good).decode(), json.dumps(bad_cmd),
             json.dumps([sys.executable, "-c", GOOD])],
            capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: reconcile did not return (the host hung on the unit's file)")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    actions = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert any(a["kind"] == "unsafe-file" and a["lease_id"] == bad.lease.id for a in actions), actions
    state = lifecycle.state()
    assert state.lease(bad.lease.id).status == "parked"  # type: ignore[union-attr]
    assert parked(store, bad.lease.id) == ["lost-poll"]
    if how == "running":
        assert stops(store, bad.lease.id) == ["unsafe-file"]
    else:
        exited = [r.event for r in store.read() if r.type == "UnitExited" and r.event.lease_id == bad.lease.id]
        assert [(e.code, e.outcome) for e in exited] == [(0, "settled")]
        digest = state.lease(bad.lease.id).result_digest  # type: ignore[union-attr]
        assert digest != "sha256:" + hashlib.sha256(secret.read_bytes()).hexdigest()
    # The good unit of the same runner still runs, its lease active, and this host can still stop it.
    assert state.lease(good.lease.id).status == "active"  # type: ignore[union-attr]
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=3000)
    handle = host.units()[good.lease.id].handle
    assert handle is not None and host.status(handle) == "running"
    assert wait_for(lambda: (Path(handle.run_dir) / "work" / "ready").exists())
    host.stop(handle, then=None)
    assert host.status(handle) in ("stopped", "gone")
    host.close()


# --- forged unit facts -------------------------------------------------------------------------------

# A bystander: any process of this machine. It records a SIGTERM in a file instead of dying of it.
BYSTANDER = ("import signal,sys,time\n"
             "signal.signal(signal.SIGTERM, lambda *a: open(sys.argv[1], 'a').write('TERM\\n'))\n"
             "open(sys.argv[2], 'w').close()\n"
             "time.sleep(60)\n")


@pytest.fixture
def bystander(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    marker, ready = tmp_path / "bystander-signalled", tmp_path / "bystander-ready"
    # Its own session and group, as a daemon has: a group signal would reach it.
    proc = subprocess.Popen([sys.executable, "-c", BYSTANDER, str(marker), str(ready)], start_new_session=True)
    assert wait_for(ready.exists)
    yield proc, marker
    proc.kill()
    proc.wait()


def forge_started(lifecycle: RunnerLifecycle, receipt: LeaseReceipt, run_dir: str, pid: int) -> UnitRecord:
    """Record, as anyone with the store could, that the lease's unit is the process `pid`."""
    ticks = proc_start_ticks(pid)
    assert ticks is not None
    handle = UnitRecord(mode="child", host=socket.gethostname(), boot_id=current_boot_id(), run_dir=run_dir,
                        pid=pid, start_ticks=ticks)
    lease_id, generation = receipt.lease.id, receipt.lease.generation
    lifecycle.record_host_facts([
        UnitStarting(lease_id=lease_id, lease_generation=generation, mode="child", run_dir=run_dir,
                     command=("sleep", "60")),
        UnitStarted(lease_id=lease_id, lease_generation=generation, handle=handle)])
    return handle


PATHS = ["reconcile", "lease-ended", "lease-expired", "drain", "drain-deadline", "stop"]


@pytest.mark.parametrize("where", ["own-run-dir", "outside-run-root"])
@pytest.mark.parametrize("path", PATHS)
def test_a_forged_unit_started_is_never_signalled_and_its_lease_is_lost(runner, clock, bystander, tmp_path: Path,
                                                                        path: str, where: str) -> None:
    store, lifecycle = runner
    proc, marker = bystander
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=1000)
    receipt = lease(lifecycle, clock, "s1", ttl_ms=60_000)
    lease_id = receipt.lease.id
    run_dir = str(Path(lifecycle.base_dir) / lease_id) if where == "own-run-dir" else str(tmp_path / "x" / lease_id)
    handle = forge_started(lifecycle, receipt, run_dir, proc.pid)
    if path == "lease-ended":
        lifecycle.settle_lease(lease_id=lease_id, lease_generation=1, result_digest="sha256:" + "c" * 64)
    elif path == "lease-expired":
        clock.advance(60_000)
    elif path in ("drain", "drain-deadline"):
        lifecycle.request_drain(expected_generation=lifecycle.snapshot().generation, timeout_ms=5_000)
        if path == "drain-deadline":
            clock.advance(5_000)
    elif path == "stop":
        with pytest.raises(UnprovenUnitError):
            host.stop(handle, then=None)
        assert host.status(handle) == "unknown"
    host.reconcile()
    assert host.reconcile() == []  # converged
    assert proc.poll() is None and not marker.exists(), "the bystander was signalled"
    assert [r.type for r in store.read()].count("UnitSignalled") == 0
    assert stops(store, lease_id) == ["unproven-handle"]
    # A lease still active when reconcile met the forged unit is parked lost-poll; one settled or
    # ended by the drain deadline first keeps that end.
    assert parked(store, lease_id) == ([] if path in ("lease-ended", "drain-deadline") else ["lost-poll"])
    assert lifecycle.state().lease(lease_id).status != "active"  # type: ignore[union-attr]
    host.close()


def test_a_forged_intent_outside_the_run_root_is_never_adopted(runner, clock, bystander, tmp_path: Path) -> None:
    store, lifecycle = runner
    proc, marker = bystander
    receipt = lease(lifecycle, clock, "s1", ttl_ms=60_000)
    elsewhere = tmp_path / "elsewhere" / receipt.lease.id
    elsewhere.mkdir(parents=True)
    ticks = proc_start_ticks(proc.pid)
    # What the wrapper of a unit writes, planted where the forged intent points.
    (elsewhere / "unit.pid").write_text(json.dumps({"pid": proc.pid, "start_ticks": ticks, "boot_id": current_boot_id(),
                                                    "host": socket.gethostname(), "argv": ["sleep", "60"]}))
    lifecycle.record_host_facts([UnitStarting(lease_id=receipt.lease.id, lease_generation=1, mode="child",
                                   run_dir=str(elsewhere), command=("sleep", "60"))])
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=1000)
    host.reconcile()
    clock.advance(60_000)
    host.reconcile()
    assert proc.poll() is None and not marker.exists(), "the bystander was signalled"
    assert "UnitStarted" not in [r.type for r in store.read()]
    assert stops(store, receipt.lease.id) == ["unproven-handle"]
    assert parked(store, receipt.lease.id) == ["lost-poll"]
    host.close()


def test_a_forged_wake_never_runs_the_command_the_log_names(runner, clock, tmp_path: Path) -> None:
    store, lifecycle = runner
    receipt = lease(lifecycle, clock, "s1")
    planted = tmp_path / "ran"
    lifecycle.record_host_facts([
        UnitStarting(lease_id=receipt.lease.id, lease_generation=1, mode="child",
                     run_dir=str(Path(lifecycle.base_dir) / receipt.lease.id),
                     command=(sys.executable, "-c", f"open({str(planted)!r}, 'w')")),
        UnitWakeRecorded(lease_id=receipt.lease.id, wake_at=clock()),
        UnitStopped(lease_id=receipt.lease.id, reason="parked-waiting"),
    ])
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=1000)
    host.reconcile()
    assert "UnitStarted" not in [r.type for r in store.read()]
    assert parked(store, receipt.lease.id) == ["lost-poll"]
    assert not planted.exists()
    host.close()


def test_a_forged_command_for_a_running_unit_stops_it_and_is_never_woken(runner, clock) -> None:
    store, lifecycle = runner
    host = LocalHost(lifecycle, mode="child", stop_timeout_ms=3000)
    receipt, other = lease(lifecycle, clock, "s1"), lease(lifecycle, clock, "s2")
    handle = host.start(receipt, command=[sys.executable, "-c", GOOD], token="tok")
    kept = host.start(other, command=[sys.executable, "-c", GOOD], token="tok")
    # The same handle, under an intent naming another command: what a wake would start.
    lifecycle.record_host_facts([UnitStarting(lease_id=receipt.lease.id, lease_generation=1, mode="child",
                                   run_dir=handle.run_dir, command=("/bin/sh", "-c", "exit 0")),
                      UnitStarted(lease_id=receipt.lease.id, lease_generation=1, handle=handle)])
    host.reconcile()
    assert stops(store, receipt.lease.id) == ["unproven-handle"]
    assert parked(store, receipt.lease.id) == ["lost-poll"]
    assert host.status(handle) in ("stopped", "gone")  # the host's own unit goes with its lease
    assert host.status(kept) == "running"
    host.stop(kept, then=None)
    host.close()
