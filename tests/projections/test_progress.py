"""Progress callbacks: refused up front when they cannot be called, and told the end when the work is done.

A `progress` that is not callable (a number, a string, a list) is InvalidInputError("progress") at the call,
before any page is read, not a TypeError in the middle of a fold or a rebuild's transaction. And the last
call a read makes is (total, total): a bar drawn from it reaches its end, also when the read stops at a
seq before the head (its last page holds rows it does not fold), and for a log with nothing to fold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle_es import EventStore, InvalidInputError, RunnerLifecycle, audit
from lifecycle_es.canonical import iso_ms
from lifecycle_es.testing import RUNNER_DEFAULTS, FakeClock, SequentialIds
from projections import fleet, rebuild, state_at, states_at

CALLS: dict[str, Callable[[EventStore, Any], Any]] = {
    "state_at": lambda store, progress: state_at(store, "runner-0", progress=progress),
    "states_at": lambda store, progress: states_at(store, progress=progress),
    "fleet": lambda store, progress: fleet(store, progress=progress),
    "rebuild": lambda store, progress: rebuild(store, progress=progress),
    "audit": lambda store, progress: audit(store, progress=progress),
    "verify": lambda store, progress: store.verify(progress=progress),
}


@pytest.fixture
def runners(store: EventStore, tmp_path: Path) -> Iterator[EventStore]:
    """Three runners, each with leases taken and settled: a log of a few dozen events, snapshots every 4."""
    for n in range(3):
        own = tmp_path / f"runner-{n}"
        own.mkdir()
        lifecycle = RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "runner_id": f"runner-{n}"},  # type: ignore[arg-type]
                                    base_dir=str(own), now=FakeClock(), random_id=SequentialIds(), snapshot_every=4)
        lifecycle.initialize()
        for session in range(5):
            clock = lifecycle.clock()
            lease = lifecycle.acquire_lease(session_id=f"s-{session}", expected_generation=1, proxy_authority={
                "id": "proxy-1", "revision": 1, "issued_at": iso_ms(clock), "expires_at": iso_ms(clock + 60_000)}).lease
            lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest="sha256:" + "b" * 64)
    yield store


@pytest.mark.parametrize("progress", [5, "bar", [print]], ids=["int", "str", "list"])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_progress_that_cannot_be_called_is_refused_up_front(runners: EventStore, name: str, progress: Any) -> None:
    rows = [recorded.row() for recorded in runners.read()]
    with pytest.raises(InvalidInputError) as info:
        CALLS[name](runners, progress)
    assert info.value.field == "progress"
    assert [recorded.row() for recorded in runners.read()] == rows
