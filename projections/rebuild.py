"""Rebuilding the caches from the log alone, and checking them against a fresh replay.

Snapshots and read models are caches; the log is the truth. `rebuild` drops both and rebuilds them
in one write transaction. `SnapshotCheck` and `check_read_models` are what the audit uses to prove
the caches equal a replay.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from lifecycle_es.replay import fold_log
from lifecycle_es.runner import RunnerState, encode_state
from lifecycle_es.store import EventStore, RecordedEvent

from .read_models import (
    INDEXES,
    ReadModels,
    create_tables,
    lease_row,
    read_lease_rows,
    read_runner_rows,
    runner_row,
    write_runner,
)


class RebuildReport(NamedTuple):
    """What a rebuild did: events replayed, runners written, snapshots written, seconds taken."""

    events: int
    runners: int
    snapshots: int
    seconds: float


def rebuild(store: EventStore) -> RebuildReport:
    """Drop and rebuild snapshots and the read models from the log alone, in one transaction."""
    started = time.perf_counter()
    with store.transaction("rebuild") as tx:
        backend = tx.store.backend
        for statement in ("DROP TABLE IF EXISTS leases", "DROP TABLE IF EXISTS runners",
                          "DROP TABLE IF EXISTS read_model_position"):
            backend.execute(statement)
        backend.clear_snapshots()
        create_tables(store, indexes=False)
        # Each runner folded into a draft and frozen once (the rules and errors of replay_all).
        folds = fold_log(store)
        count = 0
        snapshots = 0
        for stream, folding in folds.items():
            state, digest = folding.state(), folding.hash
            assert state is not None and digest is not None
            count += folding.steps
            write_runner(store, None, state, folding.version, folding.seq)
            if state.pending_park is None:
                backend.put_snapshot(stream, folding.version, folding.seq, encode_state(state), digest)
                snapshots += 1
        for statement in INDEXES:
            backend.execute(statement)
        if count:
            ReadModels()._set_position(store, store.head().seq)
    return RebuildReport(count, len(folds), snapshots, time.perf_counter() - started)


class SnapshotCheck:
    """Compares every stored snapshot with the replayed state at its seq, while a replay streams by."""

    def __init__(self, store: EventStore) -> None:
        self._due: dict[int, tuple[str, int, bytes, bytes]] = {}
        for stream in store.streams():
            found = store.backend.snapshot(stream)
            if found is not None:
                version, seq, data, event_hash = found
                self._due[seq] = (stream, version, data, event_hash)
        self.problems: list[tuple[int, str]] = []
        self.checked = 0

    def observe(self, recorded: RecordedEvent, state: RunnerState) -> None:
        """Check the snapshot taken at this event, if there is one."""
        due = self._due.pop(recorded.seq, None)
        if due is None:
            return
        stream, version, data, event_hash = due
        self.checked += 1
        if stream != recorded.stream or version != recorded.version or event_hash != recorded.hash:
            self.problems.append((recorded.seq, f"snapshot of {stream!r} does not name this event"))
        elif data != encode_state(state):
            self.problems.append((recorded.seq, f"snapshot of {stream!r} differs from the replayed state"))

    def finish(self) -> list[tuple[int, str]]:
        """Snapshots that named no event of the log are problems too; return every problem found."""
        for seq, (stream, _, _, _) in sorted(self._due.items()):
            self.problems.append((seq, f"snapshot of {stream!r} names seq {seq}, which the log does not hold"))
        self._due.clear()
        return self.problems


def check_read_models(store: EventStore, states: dict[str, tuple[RunnerState, int, int]]) -> list[tuple[str, str]]:
    """Compare the ``runners``/``leases`` tables with replayed states ``{id: (state, version, seq)}``.

    `states` must be the replay as of `read_model_position(store)` (the read models may lag the log
    when events were appended without them attached; they catch up on the next attach). Returns
    (runner id, what differs) pairs; empty when the tables equal the replay or do not exist.
    """
    rows = read_runner_rows(store)
    problems: list[tuple[str, str]] = []
    for runner_id, (state, version, seq) in sorted(states.items()):
        row = rows.pop(runner_id, None)
        if row is None:
            problems.append((runner_id, "no runners row"))
            continue
        if row != runner_row(state, version, seq):
            problems.append((runner_id, "runners row differs from the replay"))
        wanted = sorted(lease_row(runner_id, lease) for lease in state.leases)
        if read_lease_rows(store, runner_id) != wanted:
            problems.append((runner_id, "leases rows differ from the replay"))
    problems.extend((runner_id, "runners row for a runner the log does not have") for runner_id in sorted(rows))
    return problems


def read_model_position(store: EventStore) -> int | None:
    """The last seq the read models applied, or None when the store has no read models."""
    exists = store.backend.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'read_model_position'")
    if not exists:
        return None
    rows = store.backend.execute("SELECT seq FROM read_model_position WHERE name = 'read_models'")
    return rows[0][0] if rows else 0

