"""LocalHost in systemd mode against a REAL systemd user manager (see tests/systemd_manager.py).

Transient services started through LocalHost are observed and stopped through systemctl, and their
ends recorded in the log: a drain's SIGTERM settles them, a CPU limit parks the lease resource-limit,
an ended lease's unit is stopped (its whole control group). Skips, with the reason, where a systemd
manager cannot be started (not root, no unshare).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from systemd_manager import SystemdUserManager, systemd_manager  # noqa: F401  (the fixture)
from waiting import wait_for

from hosts.local import LocalHost
from hosts.systemd_show import parse_show
from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import UnitRecord, UnitStarted, UnitStarting

pytestmark = pytest.mark.systemd
TOKEN = "systemd-token-5d1e"
POLITE = ("import signal,sys,time\n"
          "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
          "sys.stdin.read()\n"
          "open('ready','w').close()\n"
          "time.sleep(300)\n")


def now() -> int:
    return time.time_ns() // 1_000_000


def proxy() -> ProxyAuthority:
    return ProxyAuthority(id="proxy-a", revision=1, issued_at=iso_ms(now() - 1000),
                          expires_at=iso_ms(now() + 3_600_000))


@pytest.fixture
def runner(tmp_path: Path, systemd_manager: SystemdUserManager,  # noqa: F811
           request: pytest.FixtureRequest) -> Iterator[tuple[EventStore, RunnerLifecycle, LocalHost]]:
    cpu = getattr(request, "param", 60)
    base = tmp_path / "base"
    base.mkdir()
    tokens = tmp_path / "tokens"
    store = EventStore.open(tmp_path / "events.db")
    lifecycle = RunnerLifecycle(store, runner_id="runner-sd", target="local", base_dir=str(base),
                                resources=Resources(cpu_seconds=cpu, memory_bytes=1 << 30),
                                post_session_hook_digest="sha256:" + "a" * 64)
    lifecycle.initialize()
    host = LocalHost(lifecycle, mode="systemd", scope="user", exec=systemd_manager.exec, token_dir=str(tokens),
                     stop_timeout_ms=5_000)
    yield store, lifecycle, host
    for view in host.units().values():
        if view.handle is not None and host.status(view.handle) == "running":
            host.driver.stop(view.handle)
    host.close()
    store.close()


def test_drain_sigterms_systemd_units_and_settles_their_leases(runner) -> None:
    store, lifecycle, host = runner
    receipts = [lifecycle.acquire_lease(session_id=f"s{i}", expected_generation=1, proxy_authority=proxy())
                for i in range(2)]
    handles = [host.start(r, command=[sys.executable, "-c", POLITE], token=TOKEN) for r in receipts]
    assert all(h.mode == "systemd" and h.unit for h in handles)
    assert all(host.status(h) == "running" for h in handles)
    assert wait_for(lambda: all((Path(h.run_dir) / "work" / "ready").exists() for h in handles))
    lifecycle.request_drain(expected_generation=1, timeout_ms=60_000)
    assert wait_for(lambda: (host.reconcile() or True) and lifecycle.snapshot().state == "parked")
    kinds = [r.type for r in store.read()]
    assert kinds.count("UnitSignalled") == 2 and kinds.count("LeaseSettled") == 2
    exits = [r.event for r in store.read() if r.type == "UnitExited"]
    assert [(e.code, e.outcome) for e in exits] == [(0, "settled"), (0, "settled")]
    assert all(host.status(h) in ("stopped", "gone") for h in handles)


@pytest.mark.parametrize("runner", [1], indirect=True)
def test_a_systemd_unit_killed_by_its_cpu_limit_parks_resource_limit(runner) -> None:
    store, lifecycle, host = runner
    receipt = lifecycle.acquire_lease(session_id="s1", expected_generation=1, proxy_authority=proxy())
    host.start(receipt, command=[sys.executable, "-c", "import sys\nsys.stdin.read()\nwhile True: pass\n"],
               token=TOKEN)
    assert wait_for(lambda: any(a.kind == "parked resource-limit" for a in host.reconcile()), timeout_s=40)
    exited = [r.event for r in store.read() if r.type == "UnitExited"]
    assert exited[-1].signal == "SIGXCPU" and exited[-1].outcome == "resource-limit"


def test_the_unit_of_an_ended_lease_is_stopped_with_its_control_group(runner) -> None:
    _store, lifecycle, host = runner
    receipt = lifecycle.acquire_lease(session_id="s1", expected_generation=1, proxy_authority=proxy())
    keep = lifecycle.acquire_lease(session_id="s2", expected_generation=1, proxy_authority=proxy())
    handle = host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    host.start(keep, command=[sys.executable, "-c", POLITE], token=TOKEN)
    lifecycle.settle_lease(lease_id=receipt.lease.id, lease_generation=1, result_digest="sha256:" + "b" * 64)
    assert [(a.kind, a.detail) for a in host.reconcile()] == [("stopped", "lease-ended")]
    assert host.status(handle) in ("stopped", "gone")
    assert not host.driver.token_file(handle.unit).exists()


def test_a_systemd_unit_whose_proof_cannot_be_written_is_never_started(
        runner, systemd_manager: SystemdUserManager) -> None:  # noqa: F811
    from hosts.proc import UnitStartError

    store, lifecycle, host = runner
    receipt = lifecycle.acquire_lease(session_id="s1", expected_generation=1, proxy_authority=proxy())
    run_dir = Path(lifecycle.base_dir) / receipt.lease.id
    (run_dir / "unit.handle").mkdir(parents=True)  # a non-empty directory: the proof cannot be renamed over it
    (run_dir / "unit.handle" / "x").touch()
    with pytest.raises(UnitStartError, match="proof"):
        host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    unit = next(r.event.unit for r in store.read() if r.type == "UnitStarting")
    assert unit  # the name was chosen and recorded first; the proof of it comes before systemd-run
    shown = systemd_manager.exec(["/usr/bin/systemctl", "--user", "show", f"{unit}.service", "--property=LoadState"])
    assert parse_show(shown.stdout).get("LoadState") == "not-found"
    assert not host.driver.token_file(unit).exists()  # type: ignore[attr-defined]
    assert "UnitStarted" not in [r.type for r in store.read()]
    assert [r.event.reason for r in store.read() if r.type == "LeaseParked"] == ["checkout-failure"]


@pytest.fixture
def bystander_unit(systemd_manager: SystemdUserManager) -> Iterator[str]:  # noqa: F811
    """A service of the same manager that no host started (a user's own unit)."""
    name = f"bystander-{uuid.uuid4().hex[:8]}"
    started = systemd_manager.exec(["/usr/bin/systemd-run", "--user", f"--unit={name}", "--service-type=exec",
                                    "--quiet", "/bin/sleep", "300"])
    assert started.ok, started.stderr
    yield name
    systemd_manager.exec(["/usr/bin/systemctl", "--user", "stop", f"{name}.service"])
    systemd_manager.exec(["/usr/bin/systemctl", "--user", "reset-failed", f"{name}.service"])


def active_state(manager: SystemdUserManager, unit: str) -> str:
    shown = manager.exec(["/usr/bin/systemctl", "--user", "show", f"{unit}.service", "--property=ActiveState"])
    return parse_show(shown.stdout).get("ActiveState", "")


@pytest.mark.parametrize("path", ["lease-ended", "drain", "intent-only"])
def test_a_forged_systemd_unit_is_never_stopped_or_adopted(runner, systemd_manager: SystemdUserManager,  # noqa: F811
                                                           bystander_unit: str, path: str) -> None:
    store, lifecycle, host = runner
    receipt = lifecycle.acquire_lease(session_id="s1", expected_generation=1, proxy_authority=proxy())
    keep = lifecycle.acquire_lease(session_id="s2", expected_generation=1, proxy_authority=proxy())
    lease_id = receipt.lease.id
    run_dir = str(Path(lifecycle.base_dir) / lease_id)
    forged: list = [UnitStarting(lease_id=lease_id, lease_generation=1, mode="systemd", run_dir=run_dir,
                                 unit=bystander_unit, command=("/bin/sleep", "300"))]
    if path != "intent-only":
        forged.append(UnitStarted(lease_id=lease_id, lease_generation=1, handle=UnitRecord(
            mode="systemd", host=host.driver.host_name, boot_id=host.driver.boot_id, run_dir=run_dir,
            unit=bystander_unit)))
    lifecycle.record_host_facts(forged)
    if path == "lease-ended":
        lifecycle.settle_lease(lease_id=lease_id, lease_generation=1, result_digest="sha256:" + "b" * 64)
    elif path == "drain":
        lifecycle.request_drain(expected_generation=1, timeout_ms=60_000)
    host.reconcile()
    host.reconcile()
    assert active_state(systemd_manager, bystander_unit) == "active"
    kinds = [r.type for r in store.read()]
    assert "UnitSignalled" not in kinds and kinds.count("UnitStarted") == (0 if path == "intent-only" else 1)
    # A forged handle: UnitStopped unproven-handle, its lease lost (unless settled first). A forged
    # intent alone names a unit this host has no proof of starting: nothing is adopted, the checkout failed.
    parked = [r.event.reason for r in store.read() if r.type == "LeaseParked" and r.event.lease_id == lease_id]
    stops = [r.event.reason for r in store.read() if r.type == "UnitStopped" and r.event.lease_id == lease_id]
    assert parked == {"lease-ended": [], "drain": ["lost-poll"], "intent-only": ["checkout-failure"]}[path]
    assert stops == ([] if path == "intent-only" else ["unproven-handle"])
    assert lifecycle.state().lease(lease_id).status != "active"  # type: ignore[union-attr]
    assert lifecycle.state().lease(keep.lease.id).status == "active"  # type: ignore[union-attr]


def test_a_systemd_unit_started_by_a_host_that_died_before_recording_it_is_adopted(runner) -> None:
    store, lifecycle, host = runner
    receipt = lifecycle.acquire_lease(session_id="s1", expected_generation=1, proxy_authority=proxy())
    record = lifecycle.record_host_facts

    class Died(Exception):
        pass

    def dies_before_the_outcome(events):
        if isinstance(events[0], UnitStarted):
            raise Died  # the host is gone between systemd-run and its record
        return record(events)

    lifecycle.record_host_facts = dies_before_the_outcome  # type: ignore[method-assign]
    with pytest.raises(Died):
        host.start(receipt, command=[sys.executable, "-c", POLITE], token=TOKEN)
    lifecycle.record_host_facts = record  # type: ignore[method-assign]
    host.close()
    again = LocalHost(lifecycle, mode="systemd", scope="user", exec=host.driver.exec,  # type: ignore[attr-defined]
                      token_dir=str(host.driver.token_dir), stop_timeout_ms=5_000)  # type: ignore[attr-defined]
    assert [a.kind for a in again.reconcile()] == ["adopted"]
    handle = again.units()[receipt.lease.id].handle
    assert handle is not None and again.status(handle) == "running"
    assert [r.type for r in store.read()][-2:] == ["UnitStarting", "UnitStarted"]
    again.stop(handle, then=None)
    again.close()
