"""Event logs a runner's stream could hold, and logs broken by one mutation at a known event."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

from ..canonical import iso_ms
from ..events import (
    DrainRequested,
    Event,
    HookAuthorized,
    LeaseAcquired,
    LeaseParked,
    LeaseSettled,
    ProxyRotated,
    ReclaimBegun,
    ReclaimCompleted,
    RunnerParked,
    UnitExited,
    UnitRecord,
    UnitStarted,
    UnitStopped,
)
from ..values import ProxyAuthority
from .bounds import TARGETS
from .clock import START_MS, FakeClock
from .model import ReferenceRunner
from .programs import _plan
from .units import bounded, out_of_bounds, with_unit_facts
from .values import digests, ids, resources


@st.composite
def event_logs(draw: Any, *, max_commands: int = 30, runner_id: str | None = None,
               start_ms: int = START_MS, unit_facts: bool = True) -> list[tuple[int, Event]]:
    """Event logs a runner's stream could hold: ``(at_ms, event)`` from a valid program on the model.

    The runner's identity (id unless given, target, resources, hook digest) is drawn too. With
    `unit_facts`, facts a host driver could have recorded about the leases' units are woven in
    (starts of active leases' units, signals, ends, stops, wakes), stamped as the event before them.
    Every log replays clean through ``lifecycle_es.runner.apply`` with ``at = iso_ms(at_ms)``: each
    field within its command's bounds, no event stamped before the one before it.
    """
    clock = FakeClock(start_ms)
    runner = runner_id if runner_id is not None else draw(ids(max_size=16))
    base_dir = f"/srv/runners/{runner}"
    model = ReferenceRunner(runner_id=runner, target=draw(st.sampled_from(TARGETS)),
                            base_dir=base_dir, resources=draw(resources()),
                            post_session_hook_digest=draw(digests()), now=clock)
    _plan(draw, model, clock, max_commands, invalid=False)
    return with_unit_facts(draw, model.log, base_dir) if unit_facts else model.log


_GENERATION_FIELDS: dict[type, str] = {
    LeaseAcquired: "lease_generation", LeaseSettled: "lease_generation", LeaseParked: "lease_generation",
    HookAuthorized: "runner_generation", ProxyRotated: "generation", DrainRequested: "generation",
    RunnerParked: "generation", ReclaimBegun: "generation", ReclaimCompleted: "generation",
}


def _proxy_before(log: list[tuple[int, Event]], index: int) -> tuple[str, int]:
    """The runner's proxy (id, revision) after the events before `index` (the last one granted)."""
    for _, event in reversed(log[:index]):
        if isinstance(event, LeaseAcquired | ProxyRotated | ReclaimBegun):
            return event.proxy_authority.id, event.proxy_authority.revision
    return "proxy-1", 1


@st.composite
def invalid_event_logs(draw: Any, /, **options: Any) -> tuple[list[tuple[int, Event]], int]:
    """An `event_logs` log broken by one mutation, and the index of the first event that breaks a rule.

    Mutations (each guaranteed to break a rule at the index returned, whatever came before):
    a second RunnerInitialized; a generation field off by one; a settle of a lease never acquired;
    a RunnerParked the rules require removed (the next event breaks); a LeaseAcquired right after
    the runner parked; a field set to a value its command never writes (a target ``mars``, a
    relative base dir, a lease id ``../../../etc``, a result digest ``not-a-digest``, a unit outcome
    ``banana``, ...); a unit fact for a lease never acquired; an event stamped before the one before
    it. `options` go to `event_logs`.
    """
    log = draw(event_logs(**options))
    generations = [i for i, (_, event) in enumerate(log) if type(event) in _GENERATION_FIELDS]
    parks = [i for i, (_, event) in enumerate(log) if isinstance(event, RunnerParked)]
    spoilable = [i for i, (_, event) in enumerate(log) if bounded(event)]
    kinds = ["initialized-again", "settle-unknown", "unit-fact-unknown-lease", "field-out-of-bounds"]
    kinds += ["generation-off-by-one"] if generations else []
    kinds += ["missing-park"] if any(i < len(log) - 1 for i in parks) else []
    kinds += ["acquire-while-parked"] if parks else []
    kinds += ["time-backwards"] if len(log) > 1 else []
    kind = draw(st.sampled_from(kinds))
    if kind == "field-out-of-bounds":
        index = draw(st.sampled_from(spoilable))  # the RunnerInitialized at 0 always is
        at_ms, event = log[index]
        return [*log[:index], (at_ms, out_of_bounds(draw, event)), *log[index + 1:]], index
    if kind == "time-backwards":
        index = draw(st.integers(1, len(log) - 1))
        back = draw(st.sampled_from((1, 1_000, 365 * 24 * 60 * 60 * 1000)))
        return [*log[:index], (log[index - 1][0] - back, log[index][1]), *log[index + 1:]], index
    if kind == "unit-fact-unknown-lease":
        index = draw(st.integers(1, len(log)))
        fact = draw(st.sampled_from((
            UnitStarted(lease_id="lease-never-acquired", lease_generation=1,
                        handle=UnitRecord(mode="child", host="host-1", boot_id="boot-1",
                                          run_dir="/srv/lease-never-acquired", pid=1, start_ticks=1)),
            UnitExited(lease_id="lease-never-acquired", code=0, signal=None, outcome="settled"),
            UnitStopped(lease_id="lease-never-acquired", reason="stopped"))))
        return [*log[:index], (log[index - 1][0], fact), *log[index:]], index
    if kind == "generation-off-by-one":
        index = draw(st.sampled_from(generations))
        at_ms, event = log[index]
        field = _GENERATION_FIELDS[type(event)]
        changed = msgspec.structs.replace(event, **{field: getattr(event, field) + draw(st.sampled_from((-1, 1)))})
        return [*log[:index], (at_ms, changed), *log[index + 1:]], index
    if kind == "missing-park":
        index = draw(st.sampled_from([i for i in parks if i < len(log) - 1]))
        return [*log[:index], *log[index + 1:]], index
    if kind == "acquire-while-parked":
        index = draw(st.sampled_from(parks)) + 1
        at_ms, parked = log[index - 1]
        proxy_id, revision = _proxy_before(log, index)
        inserted: Event = LeaseAcquired(
            lease_id="lease-while-parked", session_id="session-while-parked",
            lease_generation=parked.generation, issued_at=iso_ms(at_ms),
            expires_at=iso_ms(at_ms + 60_000),
            proxy_authority=ProxyAuthority(id=proxy_id, revision=revision, issued_at=iso_ms(at_ms),
                                           expires_at=iso_ms(at_ms + 60_000)))
    else:
        index = draw(st.integers(1, len(log)))
        at_ms = log[index - 1][0]
        inserted = log[0][1] if kind == "initialized-again" else LeaseSettled(
            lease_id="lease-never-acquired", lease_generation=1, result_digest="sha256:" + "0" * 64)
    return [*log[:index], (at_ms, inserted), *log[index:]], index
