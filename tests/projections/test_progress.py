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


def _without_snapshots(store: EventStore) -> None:
    with store.transaction("drop snapshots") as tx:
        tx.store.backend.clear_snapshots()


def told(call: Callable[[Callable[[int, int], None]], Any]) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    call(lambda done, total: seen.append((done, total)))
    return seen


def assert_reaches_the_end(seen: list[tuple[int, int]]) -> None:
    assert seen, "progress was never called"
    done, total = seen[-1]
    assert done == total, seen
    assert [each for each, _ in seen] == sorted(each for each, _ in seen), seen  # never backwards


@pytest.mark.parametrize("snapshots", [True, False], ids=["from snapshots", "one pass"])
def test_states_at_tells_the_end_at_every_seq(runners: EventStore, snapshots: bool) -> None:
    store = runners
    if not snapshots:
        _without_snapshots(store)
    head = store.head().seq
    for seq in (None, 0, 1, 2, head // 2, head - 1, head):
        seen = told(lambda progress, seq=seq: states_at(store, seq, progress=progress))  # type: ignore[misc]
        assert_reaches_the_end(seen)
        seen = told(lambda progress, seq=seq: fleet(store, at_seq=seq, progress=progress))  # type: ignore[misc]
        assert_reaches_the_end(seen)


def test_states_at_of_an_empty_log_tells_nothing_to_do(store: EventStore) -> None:
    assert told(lambda progress: states_at(store, progress=progress)) == [(0, 0)]


@pytest.mark.parametrize("snapshots", [True, False], ids=["from snapshots", "from the start"])
def test_state_at_tells_the_end_at_every_seq(runners: EventStore, snapshots: bool) -> None:
    store = runners
    if not snapshots:
        _without_snapshots(store)
    for seq in (None, 1, 5, 12, store.head().seq - 1):
        for runner_id in store.streams():
            seen = told(lambda progress, runner_id=runner_id, seq=seq: state_at(  # type: ignore[misc]
                store, runner_id, seq, progress=progress))
            assert_reaches_the_end(seen)
