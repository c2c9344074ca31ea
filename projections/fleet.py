"""Replays over the log: every runner's state, state as of any seq, and the fleet view.

All of these are pure folds of the log through the same rules the commands obey
(``lifecycle_es.runner.apply``); nothing here is stored as truth. `replay` and `replay_all` fold the
whole log; `states_at`, `fleet` and `state_at` start each runner from its snapshot when the snapshot's
tag proves it (``lifecycle_es.replay.snapshot_of``, as the commands do) and fold only the runner's events
after it, so their cost follows the tail the snapshots leave, not the length of the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec

from lifecycle_es.log import RecordedEvent
from lifecycle_es.receipts import RunnerSnapshot, project
from lifecycle_es.replay import EMPTY, Fold, Folded, fold, fold_log, load, snapshot_of, stream_pages
from lifecycle_es.runner import LEASE_STATUSES, STATES
from lifecycle_es.state import RunnerState, lease_counts
from lifecycle_es.store import EventStore
from lifecycle_es.values import safe_id, safe_int, safe_progress


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


def state_at(store: EventStore, runner_id: str, seq: int | None = None, *,
             progress: Callable[[int, int], None] | None = None) -> RunnerState | None:
    """A runner's state as of global `seq` (its latest when None); None if it had no events by then.

    Starts from the runner's snapshot when the snapshot is no later than `seq` and its tag proves it, so
    it reads only the runner's own events after that. `progress`: called with (done, total) events of the
    runner folded after its snapshot, a page at a time; the last call is (done, done), since the runner's
    events up to `seq` may be fewer than the total it has.
    """
    safe_id(runner_id, "runner_id")
    if seq is not None:
        safe_int(seq, "seq")
    safe_progress(progress)
    if progress is None:
        return load(store, runner_id, until_seq=seq).state
    # `load`, a page at a time: the same snapshot, rows and fold.
    base = snapshot_of(store, runner_id)
    if base is None or (seq is not None and base.seq > seq):
        base = EMPTY
    total = store.stream_version(runner_id) - base.version
    folding = Fold(base)
    told: tuple[int, int] | None = None
    for rows in stream_pages(store, runner_id, base.version):
        if seq is not None and rows[-1][0] > seq:
            for row in rows:
                if row[0] > seq:
                    break
                folding.add_row(row)
            break
        for row in rows:
            folding.add_row(row)
        told = (folding.version - base.version, total)
        progress(*told)
    done = folding.version - base.version
    if told != (done, done):
        progress(done, done)  # the end: the runner's events up to `seq` may be fewer than it has
    return folding.state()


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


def states_at(store: EventStore, seq: int | None = None, *,
              progress: Callable[[int, int], None] | None = None) -> dict[str, RunnerState]:
    """Every runner's state as of global `seq` (the head when None): what `replay` returns, read cheaper.

    Each runner starts from its snapshot when the snapshot is no later than `seq` and its tag proves it
    (any other is ignored: that runner is replayed from its first event), and folds only its own events
    after it. When no runner has such a snapshot, the log is folded in one pass instead, which reads it
    in order. `progress`: called with (done, total) events folded, after each runner (after each page of
    a one-pass replay): the events up to `seq` that no snapshot covers; the last call is (total, total).
    """
    if seq is not None:
        safe_int(seq, "seq")
    safe_progress(progress)
    head = store.head().seq
    until = head if seq is None else min(seq, head)
    streams = store.streams()
    bases: dict[str, Folded] = {}
    for stream in streams:
        snapshot = snapshot_of(store, stream)
        if snapshot is not None and snapshot.seq <= until:
            bases[stream] = snapshot
    states: dict[str, RunnerState] = {}
    if not bases:
        told = [-1]

        def tell(done: int) -> None:
            told[0] = done
            progress(done, until)  # type: ignore[misc]

        for stream, folding in fold_log(store, until_seq=until, progress=tell if progress else None).items():
            state = folding.state()
            assert state is not None
            states[stream] = state
        if progress is not None and told[0] != until:
            progress(until, until)  # the last page held rows after `until`, or there was none: the end all the same
        return states
    # Seqs count the events up to `until`, and a snapshot's version the ones of its runner it covers: what is left
    # is the tails, a total in events as the one-pass replay's (a count of runners would draw no bar for a few
    # runners with long tails after old snapshots).
    total = until - sum(base.version for base in bases.values())
    done = 0
    for stream in streams:
        base = bases.get(stream, EMPTY)
        folded = load(store, stream, base=base, until_seq=until)
        if folded.state is not None:  # a runner whose first event is after `seq` was not there yet
            states[stream] = folded.state
        if progress is not None:
            done += folded.version - base.version
            progress(done, total)
    return states


def fleet(store: EventStore, *, at_seq: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> FleetView:
    """The whole fleet as of `at_seq` (the log's head when None): `states_at`, from proven snapshots and
    the tail of the log after them. Every runner is folded up to the one seq, so appends that other
    processes commit meanwhile are not in the view."""
    if at_seq is not None:
        safe_int(at_seq, "at_seq")
    safe_progress(progress)
    head = store.head().seq if at_seq is None else min(at_seq, store.head().seq)
    return fleet_of(states_at(store, head, progress=progress), head)

