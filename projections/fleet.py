"""Replays over the whole log: every runner's state, state as of any seq, and the fleet view.

All of these are pure folds of the log through the same rules the commands obey
(``lifecycle_es.runner.apply``); nothing here is stored as truth.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from lifecycle_es.log import RecordedEvent
from lifecycle_es.receipts import RunnerSnapshot, project
from lifecycle_es.replay import fold, fold_log, load
from lifecycle_es.runner import LEASE_STATUSES, STATES
from lifecycle_es.state import RunnerState, lease_counts
from lifecycle_es.store import EventStore
from lifecycle_es.values import safe_id, safe_int


class FleetView(msgspec.Struct, frozen=True, kw_only=True):
    """Every runner at one point of the log: snapshots, runners by state, leases by status."""

    head_seq: int
    runners: dict[str, RunnerSnapshot]
    runners_by_state: dict[str, list[str]]
    leases_by_status: dict[str, int]


def replay_all(store: EventStore, *, until_seq: int | None = None) -> Iterator[tuple[RecordedEvent, RunnerState]]:
    """Fold the whole log in seq order, yielding each event with its runner's state after it."""
    states: dict[str, RunnerState] = {}
    for recorded in store.read():
        if until_seq is not None and recorded.seq > until_seq:
            return
        state = fold(states.get(recorded.stream), recorded)
        states[recorded.stream] = state
        yield recorded, state


def replay(store: EventStore, *, until_seq: int | None = None) -> dict[str, RunnerState]:
    """Every runner's state after a full replay of the log (up to `until_seq` when given)."""
    if until_seq is not None:
        safe_int(until_seq, "until_seq")
    # The same rules and errors as replay_all, folding each runner into a draft frozen once at the end.
    states: dict[str, RunnerState] = {}
    for stream, folding in fold_log(store, until_seq=until_seq).items():
        state = folding.state()
        assert state is not None
        states[stream] = state
    return states


def state_at(store: EventStore, runner_id: str, seq: int | None = None) -> RunnerState | None:
    """A runner's state as of global `seq` (its latest when None); None if it had no events by then.

    Starts from the runner's snapshot when the snapshot is no later than `seq`, so it reads only the
    runner's own events after that.
    """
    safe_id(runner_id, "runner_id")
    if seq is not None:
        safe_int(seq, "seq")
    return load(store, runner_id, until_seq=seq).state


def runner_at(store: EventStore, runner_id: str, seq: int | None = None) -> RunnerSnapshot | None:
    """A runner's snapshot (the original's ``project()``) as of `seq`."""
    state = state_at(store, runner_id, seq)
    return project(state) if state is not None else None


def fleet_of(states: dict[str, RunnerState], head_seq: int) -> FleetView:
    """The fleet view of a set of runner states."""
    by_state: dict[str, list[str]] = {name: [] for name in STATES}
    by_status = dict.fromkeys(LEASE_STATUSES, 0)
    for runner_id in sorted(states):
        state = states[runner_id]
        by_state[state.state].append(runner_id)
        for status, count in zip(("active", "parked", "settled"), lease_counts(state), strict=True):
            by_status[status] += count
    return FleetView(head_seq=head_seq, runners={rid: project(states[rid]) for rid in sorted(states)},
                     runners_by_state=by_state, leases_by_status=by_status)


def fleet(store: EventStore, *, at_seq: int | None = None) -> FleetView:
    """The whole fleet as of `at_seq` (the log's head when None), by replay."""
    head = store.head().seq if at_seq is None else min(safe_int(at_seq, "at_seq"), store.head().seq)
    return fleet_of(replay(store, until_seq=head), head)

