"""Unit facts are the host driver's to write, and are decided like commands (issue 10, items 4 and 14).

`RunnerLifecycle.record_host_facts` appends a fact only when the runner holds its lease (a start: active,
at the generation named), a ``UnitStarted`` follows the ``UnitStarting`` it announces (same mode and
run directory), and every field lies within what a host driver writes. A refused fact raises
InvalidInputError naming the field (or StaleFenceError) and the store stays byte-identical. The
replay holds a fact written straight into the store to the same rules: IntegrityError at its seq. On both
backends (a file, and a schema on a PostgreSQL server).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from forging import forge
from targets import durable_state

import projections
from lifecycle_es import EventStore, IntegrityError, InvalidInputError, RunnerLifecycle, StaleFenceError
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import (
    Event,
    UnitExited,
    UnitRecord,
    UnitSignalled,
    UnitStarted,
    UnitStarting,
    UnitStopped,
    UnitWakeRecorded,
)
from lifecycle_es.replay import load
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS, FakeClock, SequentialIds
from lifecycle_es.values import ProxyAuthority

HOUR = 3_600_000


@dataclass
class Host:
    """A runner holding one active lease (``lease-000001``), on a real store (a file, or a schema on a server)."""

    path: str
    store: EventStore
    lifecycle: RunnerLifecycle
    clock: FakeClock
    lease_id: str
    run_dir: str

    def fingerprint(self) -> tuple[str | None, ...]:
        return durable_state(self.path)

    def starting(self, mode: str = "child", **changes: object) -> UnitStarting:
        unit = "les-lease-000001-0a" if mode == "systemd" else None
        fact = UnitStarting(lease_id=self.lease_id, lease_generation=1, mode=mode, run_dir=self.run_dir, unit=unit,
                            command=("/usr/bin/agent", "--once"))
        return msgspec.structs.replace(fact, **changes)

    def started(self, mode: str = "child", **handle_changes: object) -> UnitStarted:
        handle = (UnitRecord(mode="child", host="host-1", boot_id="boot-1", run_dir=self.run_dir, pid=4242,
                             start_ticks=123_456) if mode == "child" else
                  UnitRecord(mode="systemd", host="host-1", boot_id="boot-1", run_dir=self.run_dir,
                             unit="les-lease-000001-0a"))
        return UnitStarted(lease_id=self.lease_id, lease_generation=1,
                           handle=msgspec.structs.replace(handle, **handle_changes))


@pytest.fixture
def host(tmp_path: Path, store_target: str) -> Iterator[Host]:
    clock = FakeClock()
    path = store_target
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    with EventStore.open(path, now=clock) as store:
        lifecycle = RunnerLifecycle(store, **RUNNER_DEFAULTS, base_dir=str(base_dir), now=clock,
                                    random_id=SequentialIds())
        lifecycle.initialize()
        proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(START_MS), expires_at=iso_ms(START_MS + HOUR))
        lease = lifecycle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy).lease
        yield Host(path, store, lifecycle, clock, lease.id, f"{base_dir}/{lease.id}")


def refused(host: Host, kind: type[Exception], facts: list[Event], field: str | None = None) -> Exception:
    """Record `facts`, expect `kind` (naming `field`), and the store file unchanged."""
    before = host.fingerprint()
    with pytest.raises(kind) as info:
        host.lifecycle.record_host_facts(facts)
    if field is not None:
        assert isinstance(info.value, InvalidInputError) and info.value.field == field, info.value
    assert host.fingerprint() == before, "a refused fact changed the store file"
    return info.value


def test_the_write_path_is_named_as_the_hosts() -> None:
    assert not hasattr(RunnerLifecycle, "record")
    assert "host driver" in (RunnerLifecycle.record_host_facts.__doc__ or "")


def test_a_host_records_a_unit_from_start_to_end(host: Host) -> None:
    for mode in ("child", "systemd"):
        recorded = host.lifecycle.record_host_facts([host.starting(mode), host.started(mode)])
        assert [r.type for r in recorded] == ["UnitStarting", "UnitStarted"]
        host.lifecycle.record_host_facts([
            UnitSignalled(lease_id=host.lease_id, signal="SIGTERM", reason="drain"),
            UnitWakeRecorded(lease_id=host.lease_id, wake_at=START_MS + HOUR),
            UnitStopped(lease_id=host.lease_id, reason="parked-waiting"),
        ])
    host.lifecycle.record_host_facts([UnitExited(lease_id=host.lease_id, code=None, signal="SIGXCPU",
                                                 outcome="resource-limit")])
    host.lifecycle.settle_lease(lease_id=host.lease_id, lease_generation=1, result_digest="sha256:" + "0" * 64)
    # A unit outliving its lease is stopped and recorded so, after the lease ended.
    host.lifecycle.record_host_facts([UnitStopped(lease_id=host.lease_id, reason="lease-ended")])
    assert projections.replay(host.store)["runner-1"] == host.lifecycle.state()


def test_a_stopped_unit_with_a_path_for_a_lease_id_and_a_huge_reason_is_refused(host: Host) -> None:
    refused(host, InvalidInputError, [UnitStopped(lease_id="../../etc/passwd\0", reason="x" * 100_000)], "lease_id")
    refused(host, InvalidInputError, [UnitStopped(lease_id=host.lease_id, reason="x" * 100_000)], "reason")


def test_a_fact_for_a_lease_the_runner_never_held_is_refused(host: Host) -> None:
    for fact in (UnitStarted(lease_id="lease-999999", lease_generation=1,
                             handle=UnitRecord(mode="child", host="h", boot_id="b", run_dir="/srv/lease-999999",
                                               pid=1, start_ticks=1)),
                 UnitExited(lease_id="lease-999999", code=0, signal=None, outcome="settled"),
                 UnitSignalled(lease_id="lease-999999", signal="SIGTERM", reason="drain"),
                 UnitWakeRecorded(lease_id="lease-999999", wake_at=1)):
        assert "lease-999999" in str(refused(host, StaleFenceError, [fact]))


def test_a_start_needs_the_lease_active_at_its_generation(host: Host) -> None:
    refused(host, StaleFenceError, [host.starting(lease_generation=2)])
    host.lifecycle.record_host_facts([host.starting()])
    host.lifecycle.park_lease(lease_id=host.lease_id, lease_generation=1, result_digest="sha256:" + "1" * 64,
                              reason="lost-poll")
    refused(host, StaleFenceError, [host.starting()])
    refused(host, StaleFenceError, [host.started()])


def test_started_must_follow_its_announced_start(host: Host) -> None:
    # No UnitStarting: a host never recorded a start of this unit, so it names no process of its own.
    assert "UnitStarting" in str(refused(host, StaleFenceError, [host.started()]))
    host.lifecycle.record_host_facts([host.starting()])
    refused(host, InvalidInputError, [host.started("systemd")], "handle.mode")
    refused(host, InvalidInputError, [host.started(run_dir="/tmp/other/lease-000001")], "handle.run_dir")
    host.lifecycle.record_host_facts([host.started()])
    # Recorded once: a second UnitStarted needs a new start announced first.
    refused(host, StaleFenceError, [host.started()])
    host.lifecycle.record_host_facts([UnitExited(lease_id=host.lease_id, code=0, signal=None, outcome="settled")])
    refused(host, StaleFenceError, [host.started()])


def test_the_announced_start_survives_another_handle_and_a_snapshot(host: Host) -> None:
    host.lifecycle.record_host_facts([host.starting("systemd")])
    # Another process's handle, catching up from a snapshot taken at the announcement.
    other = RunnerLifecycle(host.store, **RUNNER_DEFAULTS, base_dir=host.lifecycle.base_dir, now=host.clock,
                            snapshot_every=1)
    other.record_host_facts([UnitSignalled(lease_id=host.lease_id, signal="SIGKILL", reason="drain-deadline")])
    assert load(host.store, "runner-1").state.units_starting == host.lifecycle.state().units_starting
    fresh = RunnerLifecycle(host.store, **RUNNER_DEFAULTS, base_dir=host.lifecycle.base_dir, now=host.clock)
    refused_host = Host(host.path, host.store, fresh, host.clock, host.lease_id, host.run_dir)
    refused(refused_host, InvalidInputError, [host.started("systemd", unit="les-another-0a")], "handle.unit")
    fresh.record_host_facts([host.started("systemd")])


BAD_STARTS = [
    pytest.param({"mode": "evil"}, "mode", id="mode-evil"),
    pytest.param({"run_dir": "/etc"}, "run_dir", id="run-dir-not-the-leases"),
    pytest.param({"run_dir": "srv/lease-000001"}, "run_dir", id="run-dir-relative"),
    pytest.param({"run_dir": "/srv/x/../../etc/lease-000001"}, "run_dir", id="run-dir-not-normalized"),
    pytest.param({"run_dir": "/srv/\udc80/lease-000001"}, "run_dir", id="run-dir-lone-surrogate"),
    pytest.param({"unit": "les-unit"}, "unit", id="child-with-a-unit-name"),
    pytest.param({"mode": "systemd", "unit": "les/../../x"}, "unit", id="unit-name-unsafe"),
    pytest.param({"mode": "systemd", "unit": None}, "unit", id="systemd-without-a-unit-name"),
    pytest.param({"command": tuple("a" for _ in range(257))}, "command", id="command-too-many-arguments"),
    pytest.param({"command": ("a" * 8193,)}, "command", id="command-argument-too-long"),
    pytest.param({"command": ("/bin/sh", "a\0b")}, "command", id="command-nul"),
    pytest.param({"command": ("",)}, "command", id="command-empty-program"),
    pytest.param({"command": ("/bin/sh", 5)}, "command", id="command-not-text"),
    pytest.param({"lease_generation": True}, "lease_generation", id="generation-a-bool"),
]


@pytest.mark.parametrize(("changes", "field"), BAD_STARTS)
def test_a_start_out_of_bounds_is_refused(host: Host, changes: dict[str, object], field: str) -> None:
    refused(host, InvalidInputError, [host.starting(**changes)], field)


BAD_HANDLES = [
    pytest.param({"pid": 1}, "handle.pid", id="pid-1"),
    pytest.param({"pid": None}, "handle.pid", id="child-without-pid"),
    pytest.param({"pid": 4_194_305}, "handle.pid", id="pid-beyond-pid-max"),
    pytest.param({"start_ticks": -1}, "handle.start_ticks", id="start-ticks-negative"),
    pytest.param({"host": "host\n1"}, "handle.host", id="host-newline"),
    pytest.param({"host": ""}, "handle.host", id="host-empty"),
    pytest.param({"boot_id": "b" * 256}, "handle.boot_id", id="boot-id-too-long"),
    pytest.param({"unit": "les-x"}, "handle.unit", id="child-with-a-unit-name"),
]


@pytest.mark.parametrize(("changes", "field"), BAD_HANDLES)
def test_a_started_handle_out_of_bounds_is_refused(host: Host, changes: dict[str, object], field: str) -> None:
    host.lifecycle.record_host_facts([host.starting()])
    refused(host, InvalidInputError, [host.started(**changes)], field)


BAD_ENDS = [
    pytest.param(UnitExited(lease_id="lease-000001", code=-5, signal=None, outcome="settled"), "code", id="code-neg"),
    pytest.param(UnitExited(lease_id="lease-000001", code=256, signal=None, outcome="settled"), "code", id="code-256"),
    pytest.param(UnitExited(lease_id="lease-000001", code=0, signal=None, outcome="banana"), "outcome",
                 id="outcome-banana"),
    pytest.param(UnitExited(lease_id="lease-000001", code=None, signal="KILL", outcome="lost-poll"), "signal",
                 id="signal-not-a-name"),
    pytest.param(UnitExited(lease_id="lease-000001", code=0, signal="SIGKILL", outcome="lost-poll"), "code",
                 id="code-and-signal"),
    pytest.param(UnitSignalled(lease_id="lease-000001", signal="SIGSEGV", reason="drain"), "signal",
                 id="signal-a-host-never-sends"),
    pytest.param(UnitSignalled(lease_id="lease-000001", signal="SIGTERM", reason="because"), "reason",
                 id="signal-reason"),
    pytest.param(UnitStopped(lease_id="lease-000001", reason="evil"), "reason", id="stop-reason"),
    pytest.param(UnitWakeRecorded(lease_id="lease-000001", wake_at=-1), "wake_at", id="wake-before-epoch"),
    pytest.param(UnitWakeRecorded(lease_id="lease-000001", wake_at=2**63), "wake_at", id="wake-beyond-year-9999"),
]


@pytest.mark.parametrize(("fact", "field"), BAD_ENDS)
def test_an_end_out_of_bounds_is_refused(host: Host, fact: Event, field: str) -> None:
    refused(host, InvalidInputError, [fact], field)


def test_one_refused_fact_refuses_the_whole_batch(host: Host) -> None:
    refused(host, InvalidInputError, [host.starting(), host.started(pid=1)], "handle.pid")
    assert host.lifecycle.state().units_starting == ()


FORGED = [
    pytest.param(lambda h: [UnitStarted(lease_id="lease-999999", lease_generation=1,
                                        handle=UnitRecord(mode="child", host="h", boot_id="b",
                                                          run_dir="/srv/lease-999999", pid=1, start_ticks=1))],
                 "lease-999999", id="started-for-no-lease"),
    pytest.param(lambda h: [h.started()], "UnitStarting", id="started-with-no-start-announced"),
    pytest.param(lambda h: [h.starting(mode="evil", run_dir="/etc/passwd")], "mode", id="starting-evil"),
    pytest.param(lambda h: [UnitExited(lease_id=h.lease_id, code=-5, signal=None, outcome="banana")], "code",
                 id="exited-banana"),
    pytest.param(lambda h: [UnitStopped(lease_id="../../etc/passwd\0", reason="x" * 100_000)], "lease_id",
                 id="stopped-path-lease"),
]


@pytest.mark.parametrize(("facts", "word"), FORGED)
def test_a_fact_written_into_the_file_is_held_to_the_same_rules(host: Host, facts: Callable[[Host], list[Event]],
                                                                word: str) -> None:
    forged = facts(host)
    with pytest.raises((InvalidInputError, StaleFenceError)) as command:  # refused on the command path too
        host.lifecycle.record_host_facts(forged)
    host.store.close()
    seqs = forge(host.path, "runner-1", forged, iso_ms(host.clock()))
    with EventStore.open(host.path, read_only=True) as store, pytest.raises(IntegrityError) as replayed:
        projections.replay(store)
    assert (replayed.value.seq, replayed.value.stream) == (seqs[0], "runner-1")
    assert word in replayed.value.reason and str(command.value) in replayed.value.reason
