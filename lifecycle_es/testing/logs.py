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
)
from ..values import ProxyAuthority
from .clock import START_MS, FakeClock
from .model import ReferenceRunner
from .programs import _plan
from .seed import TARGETS
from .values import digests, ids, resources


@st.composite
def event_logs(draw: Any, *, max_commands: int = 30, runner_id: str | None = None,
               start_ms: int = START_MS) -> list[tuple[int, Event]]:
    """Event logs a runner's stream could hold: ``(at_ms, event)`` from a valid program on the model.

    The runner's identity (id unless given, target, resources, hook digest) is drawn too. Every log
    replays clean through ``lifecycle_es.runner.apply`` with ``at = iso_ms(at_ms)``.
    """
    clock = FakeClock(start_ms)
    runner = runner_id if runner_id is not None else draw(ids(max_size=16))
    model = ReferenceRunner(runner_id=runner, target=draw(st.sampled_from(TARGETS)),
                            base_dir=f"/srv/runners/{runner}", resources=draw(resources()),
                            post_session_hook_digest=draw(digests()), now=clock)
    _plan(draw, model, clock, max_commands, invalid=False)
    return model.log


_GENERATION_FIELDS = {
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
def invalid_event_logs(draw: Any, **options: Any) -> tuple[list[tuple[int, Event]], int]:
    """An `event_logs` log broken by one mutation, and the index of the first event that breaks a rule.

    Mutations (each guaranteed to break a rule at the index returned, whatever came before):
    a second RunnerInitialized; a generation field off by one; a settle of a lease never acquired;
    a RunnerParked the rules require removed (the next event breaks); a LeaseAcquired right after
    the runner parked. `options` go to `event_logs`.
    """
    log = draw(event_logs(**options))
    generations = [i for i, (_, event) in enumerate(log) if type(event) in _GENERATION_FIELDS]
    parks = [i for i, (_, event) in enumerate(log) if isinstance(event, RunnerParked)]
    kinds = ["initialized-again", "settle-unknown"]
    kinds += ["generation-off-by-one"] if generations else []
    kinds += ["missing-park"] if any(i < len(log) - 1 for i in parks) else []
    kinds += ["acquire-while-parked"] if parks else []
    kind = draw(st.sampled_from(kinds))
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
        event: Event = LeaseAcquired(
            lease_id="lease-while-parked", session_id="session-while-parked",
            lease_generation=parked.generation, issued_at=iso_ms(at_ms),  # type: ignore[attr-defined]
            expires_at=iso_ms(at_ms + 60_000),
            proxy_authority=ProxyAuthority(id=proxy_id, revision=revision, issued_at=iso_ms(at_ms),
                                           expires_at=iso_ms(at_ms + 60_000)))
    else:
        index = draw(st.integers(1, len(log)))
        at_ms = log[index - 1][0]
        event = log[0][1] if kind == "initialized-again" else LeaseSettled(
            lease_id="lease-never-acquired", lease_generation=1, result_digest="sha256:" + "0" * 64)
    return [*log[:index], (at_ms, event), *log[index:]], index
