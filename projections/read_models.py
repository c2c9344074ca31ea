"""SQL read models, ``runners`` and ``leases``, written in the same transaction as the events.

    with EventStore.open("runners.db") as store:
        attach(store)                     # from now on every append updates the tables too
        ...
    # any SQLite client:  SELECT runner_id, state, generation FROM runners WHERE state = 'draining'

The tables mirror the projection (its retention included: a runner's ``leases`` rows are the
leases its state retains). A position row records the last seq applied, so a store written for a
while without the read models attached catches up on the next attach or append: exactly-once, in
the event transaction, as the eventsourcing library's tracking records do. A position past the log's
head (a row edited, a log cut back under the tables) empties them and catches them up from the start. They
are a cache of the log: `projections.rebuild` drops and rebuilds them, and the audit compares them to a
fresh replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lifecycle_es.log import RecordedEvent
from lifecycle_es.read_model import LEASE_COLUMNS, RUNNER_COLUMNS, lease_row, runner_row
from lifecycle_es.replay import Folded, fold, load
from lifecycle_es.state import RunnerState
from lifecycle_es.store import EventStore
from lifecycle_es.values import safe_id

__all__ = ["LEASE_COLUMNS", "RUNNER_COLUMNS", "ReadModels", "attach", "read_lease_rows", "read_runner_rows",
           "write_runner"]


def write_runner(store: EventStore, old: RunnerState | None, new: RunnerState, version: int, seq: int) -> None:
    """Write a runner's row and the lease rows that changed between `old` and `new`."""
    backend = store.backend
    backend.upsert_runner_rows([runner_row(new, version, seq)])
    runner_id = new.runner_id
    if old is None:
        # One statement run for every row (a rebuild writes every retained lease of every runner).
        backend.upsert_lease_rows([lease_row(runner_id, lease) for lease in new.leases])
        return
    before = {lease.id: lease for lease in old.leases}
    kept = set()
    changed = []
    for lease in new.leases:
        kept.add(lease.id)
        # Leases are immutable values: an unchanged lease is the very same object in both states.
        if before.get(lease.id) is not lease:
            changed.append(lease_row(runner_id, lease))
    if changed:
        backend.upsert_lease_rows(changed)
    gone = [(runner_id, lease_id) for lease_id in before.keys() - kept]
    if gone:
        backend.delete_lease_rows(gone)


class ReadModels:
    """The projector that keeps ``runners`` and ``leases`` in step with the log (see `attach`)."""

    def __init__(self) -> None:
        # Each runner as last folded here. A write can be rolled back after it was applied (its transaction, or
        # its savepoint in a batch, fails): the entries are kept only while the store rolled back nothing since.
        self._folded: dict[str, Folded] = {}
        self._rollbacks = 0

    def _start(self, store: EventStore, last: int) -> int:
        """The position to catch up from, `last` the log's last seq: the recorded one when the log can have it.

        A position past `last` (or no seq at all) says the tables describe events the log does not hold: a row
        edited, or a log cut back under them. Resumed from there, they would skip for good the events written
        next, up to that position, and keep rows of what is gone; so they are emptied, and caught up from the
        start, in this transaction. So are tables with no position (new ones, or rows of unknown provenance):
        caught up from the start either way, they keep no row the log does not make."""
        backend = store.backend
        position = backend.read_model_position() or 0
        if type(position) is int and 0 < position <= last:
            return position
        backend.drop_read_models()
        backend.create_read_models()
        self._folded.clear()
        return 0

    def catch_up(self, store: EventStore, *, until_seq: int | None = None) -> None:
        """Create the tables if needed and apply every event after the recorded position (up to `until_seq`).
        Tables whose position the log cannot have are started afresh (see `_start`)."""
        store.backend.create_read_models()
        last = store.head().seq if until_seq is None else until_seq
        position = self._start(store, last)
        pending: list[RecordedEvent] = []
        for recorded in store.read(after=position):
            if recorded.seq > last:
                break
            pending.append(recorded)
            if len(pending) >= 1000:
                self._apply(store, pending)
                pending = []
        if pending:
            self._apply(store, pending)

    def apply(self, store: EventStore, recorded: Sequence[RecordedEvent]) -> None:
        """Apply freshly appended events (called by the store inside the event transaction)."""
        if store.backend.read_model_position() != recorded[0].seq - 1:
            self.catch_up(store, until_seq=recorded[0].seq - 1)
        self._apply(store, recorded)

    def _apply(self, store: EventStore, recorded: Sequence[RecordedEvent]) -> None:
        if store.rollbacks != self._rollbacks:
            self._folded.clear()
            self._rollbacks = store.rollbacks
        first: dict[str, RunnerState | None] = {}
        for event in recorded:
            stream = event.stream
            folded = self._folded.get(stream)
            if folded is None or folded.version != event.version - 1:
                folded = load(store, stream, until_seq=event.seq - 1)
            first.setdefault(stream, folded.state)
            self._folded[stream] = Folded(fold(folded.state, event), event.version, event.seq)
        for stream, old in first.items():
            folded = self._folded[stream]
            assert folded.state is not None
            write_runner(store, old, folded.state, folded.version, folded.seq)
        store.backend.set_read_model_position(recorded[-1].seq)


def attach(store: EventStore) -> ReadModels:
    """Attach the read models to `store`: caught up now, then updated in every append's transaction."""
    models = ReadModels()
    store.attach(models)
    return models


def read_runner_rows(store: EventStore) -> dict[str, tuple[Any, ...]]:
    """Every ``runners`` row by runner id (empty if the tables do not exist), as committed."""
    with store.lock:  # never another thread's batch in flight on the store's connection
        rows = store.backend.read_model_rows("runners")
    return {row[0]: row for row in rows}


def read_lease_rows(store: EventStore, runner_id: str) -> list[tuple[Any, ...]]:
    """A runner's ``leases`` rows, ordered by lease id, as committed (InvalidInputError for a `runner_id` that is
    no id, as every read refuses one)."""
    safe_id(runner_id, "runner_id")
    with store.lock:  # never another thread's batch in flight on the store's connection
        return store.backend.lease_rows_of(runner_id)
