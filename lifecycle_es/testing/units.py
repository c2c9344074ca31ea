"""Unit facts a host driver could record, woven into a runner's event log; and values out of bounds."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from hypothesis import strategies as st

from ..events import (
    DrainExpired,
    Event,
    LeaseAcquired,
    LeaseParked,
    LeaseSettled,
    ReclaimCompleted,
    RunnerInitialized,
    RunnerParked,
    UnitExited,
    UnitRecord,
    UnitSignalled,
    UnitStarted,
    UnitStarting,
    UnitStopped,
    UnitWakeRecorded,
)

# Copied from the host drivers rather than imported from the rules: a strategy must not share a
# mistake with the code it checks.
_OUTCOMES = ("settled", "lost-poll", "resource-limit", "checkout-failure")
_STOP_REASONS = ("stopped", "lease-ended", "lease-expired", "parked-waiting")
_SIGNALLED = (("SIGTERM", "drain"), ("SIGKILL", "drain-deadline"))
_DEATHS = ("SIGKILL", "SIGXCPU", "SIGTERM", "SIGSEGV", "SIG35")
# Ended leases a fact may still name: recent ones, and none once retention may have evicted it.
_RECENT_ENDED = 64
_FULL = 1024
_AFTER_RECLAIM = 256


def _unit_name(lease_id: str) -> str:
    return ("les-" + re.sub(r"[^A-Za-z0-9:_.-]", "_", lease_id))[:190] + "-0a"


def _story(draw: Any, lease_id: str, generation: int | None, run_root: str) -> list[Event]:
    """A few facts of one lease's unit: a start (announced, maybe recorded started) when the lease is
    active (`generation` given), else only what may follow a lease's end (signals, ends, stops, wakes)."""
    facts: list[Event] = []
    run_dir = f"{run_root}/{lease_id}"
    if generation is not None and draw(st.booleans()):
        mode = draw(st.sampled_from(("child", "systemd")))
        unit = _unit_name(lease_id) if mode == "systemd" else None
        facts.append(UnitStarting(lease_id=lease_id, lease_generation=generation, mode=mode, run_dir=run_dir,
                                  unit=unit, command=("/usr/bin/agent", "--lease", lease_id)))
        if draw(st.integers(0, 3)):  # else the host died between intent and outcome
            handle = (UnitRecord(mode=mode, host="host-1", boot_id="boot-1", run_dir=run_dir,
                                 pid=draw(st.integers(2, 4_194_304)), start_ticks=draw(st.integers(0, 2**40)))
                      if mode == "child" else
                      UnitRecord(mode=mode, host="host-1", boot_id="boot-1", run_dir=run_dir, unit=unit))
            facts.append(UnitStarted(lease_id=lease_id, lease_generation=generation, handle=handle))
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(("signal", "exit", "stop", "wake")))
        if kind == "signal":
            signal, reason = draw(st.sampled_from(_SIGNALLED))
            facts.append(UnitSignalled(lease_id=lease_id, signal=signal, reason=reason))
        elif kind == "exit":
            died = draw(st.booleans())
            facts.append(UnitExited(lease_id=lease_id, code=None if died else draw(st.integers(0, 255)),
                                    signal=draw(st.sampled_from(_DEATHS)) if died else None,
                                    outcome=draw(st.sampled_from(_OUTCOMES))))
        elif kind == "stop":
            facts.append(UnitStopped(lease_id=lease_id, reason=draw(st.sampled_from(_STOP_REASONS))))
        else:
            facts.append(UnitWakeRecorded(lease_id=lease_id, wake_at=draw(st.integers(0, 2**43))))
    return facts


def with_unit_facts(draw: Any, log: list[tuple[int, Event]], run_root: str) -> list[tuple[int, Event]]:
    """`log` with unit facts a host could have recorded woven in, each stamped as the event before it.

    Facts go only where no park is due (before any event but a RunnerParked), and name a lease that is
    active there (any fact) or ended a little before (no start).
    """
    out: list[tuple[int, Event]] = []
    active: dict[str, int] = {}
    ended: list[str] = []
    held = 0  # leases the runner retains, at most
    for at_ms, event in log:
        if out and not isinstance(event, RunnerParked) and (active or ended) and draw(st.integers(0, 2)) == 0:
            lease_id = draw(st.sampled_from(sorted(active) + ended[-_RECENT_ENDED:]))
            out.extend((out[-1][0], fact) for fact in _story(draw, lease_id, active.get(lease_id), run_root))
        out.append((at_ms, event))
        if isinstance(event, LeaseAcquired):
            active[event.lease_id] = event.lease_generation
            held += 1
            if held >= _FULL:
                ended.clear()  # retention may evict an ended lease now: name none
        elif isinstance(event, ReclaimCompleted):
            held = min(held, _AFTER_RECLAIM)
            ended.clear()  # the leases kept after a reclaim are the last acquired, not the last ended
        elif isinstance(event, LeaseSettled | LeaseParked):
            del active[event.lease_id]
            ended.append(event.lease_id)
        elif isinstance(event, DrainExpired):
            ended.extend(event.lease_ids)
            active.clear()
    return out


# Per kind of event, fields set to a value its command (or the host driver) never writes: the rules
# refuse each at that event, whatever came before.
_OUT_OF_BOUNDS: dict[type[Event], tuple[tuple[str, object], ...]] = {
    RunnerInitialized: (("target", "mars"), ("base_dir", "srv/runner"), ("base_dir", "/srv/../etc/runner"),
                        ("post_session_hook_digest", "garbage")),
    LeaseAcquired: (("lease_id", "../../../etc"), ("session_id", "session\n\0"), ("lease_id", "l" * 300)),
    LeaseSettled: (("result_digest", "not-a-digest"),),
    LeaseParked: (("result_digest", ""),),
    UnitStarting: (("mode", "evil"), ("run_dir", "/etc"), ("command", ("x" * 9_000,))),
    UnitSignalled: (("signal", "SIGSEGV"), ("reason", "because")),
    UnitExited: (("outcome", "banana"), ("code", -5)),
    UnitStopped: (("reason", "r" * 1_000),),
    UnitWakeRecorded: (("wake_at", -1),),
}


def bounded(event: Event) -> bool:
    """Whether `out_of_bounds` has a way to spoil `event`."""
    return type(event) in _OUT_OF_BOUNDS or isinstance(event, UnitStarted)


def out_of_bounds(draw: Any, event: Event) -> Event:
    """`event` with one field set to a value no command or host driver writes."""
    if isinstance(event, UnitStarted):
        handle = event.handle
        spoiled = (msgspec.structs.replace(handle, pid=1) if handle.mode == "child"
                   else msgspec.structs.replace(handle, unit="les-another-unit"))
        return msgspec.structs.replace(event, handle=spoiled)
    field, value = draw(st.sampled_from(_OUT_OF_BOUNDS[type(event)]))
    return msgspec.structs.replace(event, **{field: value})
