"""SQL read models, ``runners`` and ``leases``, written in the same transaction as the events.

    with EventStore.open("runners.db") as store:
        attach(store)                     # from now on every append updates the tables too
        ...
    # any SQLite client:  SELECT runner_id, state, generation FROM runners WHERE state = 'draining'

The tables mirror the projection (the seed's retention included: a runner's ``leases`` rows are the
leases its state retains). A position row records the last seq applied, so a store written for a
while without the read models attached catches up on the next attach or append: exactly-once, in
the event transaction, as the eventsourcing library's tracking records do. They are a cache of the
log: `projections.rebuild` drops and rebuilds them, and the audit compares them to a fresh replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lifecycle_es.replay import Folded, fold, load
from lifecycle_es.state import Lease, RunnerState, lease_counts
from lifecycle_es.store import EventStore, RecordedEvent

POSITION_NAME = "read_models"
TABLE_NAMES = ("runners", "leases", "read_model_position")

TABLES = (
    "CREATE TABLE IF NOT EXISTS runners ("
    " runner_id TEXT PRIMARY KEY, target TEXT NOT NULL, state TEXT NOT NULL, accepting INTEGER NOT NULL,"
    " generation INTEGER NOT NULL, policy_revision INTEGER NOT NULL, base_dir TEXT NOT NULL,"
    " cpu_seconds INTEGER NOT NULL, memory_bytes INTEGER NOT NULL, proxy_id TEXT NOT NULL,"
    " proxy_revision INTEGER NOT NULL, post_session_hook_digest TEXT NOT NULL, drain_signal TEXT,"
    " drain_requested_at TEXT, drain_deadline_at TEXT, active_lease_count INTEGER NOT NULL,"
    " parked_lease_count INTEGER NOT NULL, settled_lease_count INTEGER NOT NULL, updated_at TEXT NOT NULL,"
    " version INTEGER NOT NULL, seq INTEGER NOT NULL) STRICT",
    "CREATE TABLE IF NOT EXISTS leases ("
    " runner_id TEXT NOT NULL REFERENCES runners (runner_id), lease_id TEXT NOT NULL, session_id TEXT NOT NULL,"
    " generation INTEGER NOT NULL, issued_at TEXT NOT NULL, expires_at TEXT NOT NULL, status TEXT NOT NULL,"
    " result_digest TEXT, hook_receipt_digest TEXT, PRIMARY KEY (runner_id, lease_id)) STRICT",
    "CREATE TABLE IF NOT EXISTS read_model_position (name TEXT PRIMARY KEY, seq INTEGER NOT NULL) STRICT",
)
INDEXES = ("CREATE INDEX IF NOT EXISTS leases_by_status ON leases (status, runner_id)",)
SCHEMA = TABLES + INDEXES
RUNNER_COLUMNS = ("runner_id", "target", "state", "accepting", "generation", "policy_revision", "base_dir",
                  "cpu_seconds", "memory_bytes", "proxy_id", "proxy_revision", "post_session_hook_digest",
                  "drain_signal", "drain_requested_at", "drain_deadline_at", "active_lease_count",
                  "parked_lease_count", "settled_lease_count", "updated_at", "version", "seq")
LEASE_COLUMNS = ("runner_id", "lease_id", "session_id", "generation", "issued_at", "expires_at", "status",
                 "result_digest", "hook_receipt_digest")
_UPSERT_RUNNER = (
    f"INSERT INTO runners ({', '.join(RUNNER_COLUMNS)}) VALUES ({', '.join('?' * len(RUNNER_COLUMNS))})"
    f" ON CONFLICT (runner_id) DO UPDATE SET "
    + ", ".join(f"{column} = excluded.{column}" for column in RUNNER_COLUMNS[1:])
)
_UPSERT_LEASE = (
    f"INSERT INTO leases ({', '.join(LEASE_COLUMNS)}) VALUES ({', '.join('?' * len(LEASE_COLUMNS))})"
    f" ON CONFLICT (runner_id, lease_id) DO UPDATE SET "
    + ", ".join(f"{column} = excluded.{column}" for column in LEASE_COLUMNS[2:])
)


def runner_row(state: RunnerState, version: int, seq: int) -> tuple[Any, ...]:
    """The ``runners`` row of a state."""
    active, parked, settled = lease_counts(state)
    drain = state.drain
    return (state.runner_id, state.target, state.state, int(state.state == "accepting"), state.generation,
            state.policy_revision, state.base_dir, state.resources.cpu_seconds, state.resources.memory_bytes,
            state.proxy_authority.id, state.proxy_authority.revision, state.post_session_hook_digest,
            drain.signal if drain else None, drain.requested_at if drain else None,
            drain.deadline_at if drain else None, active, parked, settled,
            state.updated_at, version, seq)


def lease_row(runner_id: str, lease: Lease) -> tuple[Any, ...]:
    """The ``leases`` row of a lease."""
    return (runner_id, lease.id, lease.session_id, lease.generation, lease.issued_at, lease.expires_at,
            lease.status, lease.result_digest, lease.hook_receipt_digest)


def create_tables(store: EventStore, *, indexes: bool = True) -> None:
    """Create the read-model tables if missing (inside a write transaction).

    `indexes`: False leaves the secondary indexes (`INDEXES`) for the caller to create once it has
    filled the tables (SQLite builds an index over existing rows faster than it keeps it row by row).
    """
    for statement in TABLES + INDEXES if indexes else TABLES:
        store.backend.execute(statement)


def write_runner(store: EventStore, old: RunnerState | None, new: RunnerState, version: int, seq: int) -> None:
    """Write a runner's row and the lease rows that changed between `old` and `new`."""
    backend = store.backend
    backend.execute(_UPSERT_RUNNER, runner_row(new, version, seq))
    runner_id = new.runner_id
    if old is None:
        # One statement run for every row (a rebuild writes every retained lease of every runner).
        backend.execute_many(_UPSERT_LEASE, [lease_row(runner_id, lease) for lease in new.leases])
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
        backend.execute_many(_UPSERT_LEASE, changed)
    gone = [(runner_id, lease_id) for lease_id in before.keys() - kept]
    if gone:
        backend.execute_many("DELETE FROM leases WHERE runner_id = ? AND lease_id = ?", gone)


class ReadModels:
    """The projector that keeps ``runners`` and ``leases`` in step with the log (see `attach`)."""

    def __init__(self) -> None:
        self._folded: dict[str, Folded] = {}

    def _position(self, store: EventStore) -> int:
        rows = store.backend.execute("SELECT seq FROM read_model_position WHERE name = ?", (POSITION_NAME,))
        return rows[0][0] if rows else 0

    def _set_position(self, store: EventStore, seq: int) -> None:
        store.backend.execute(
            "INSERT INTO read_model_position (name, seq) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET seq = excluded.seq", (POSITION_NAME, seq))

    def catch_up(self, store: EventStore, *, until_seq: int | None = None) -> None:
        """Create the tables if needed and apply every event after the recorded position."""
        create_tables(store)
        position = self._position(store)
        pending: list[RecordedEvent] = []
        for recorded in store.read(after=position):
            if until_seq is not None and recorded.seq > until_seq:
                break
            pending.append(recorded)
            if len(pending) >= 1000:
                self._apply(store, pending)
                pending = []
        if pending:
            self._apply(store, pending)

    def apply(self, store: EventStore, recorded: Sequence[RecordedEvent]) -> None:
        """Apply freshly appended events (called by the store inside the event transaction)."""
        if self._position(store) != recorded[0].seq - 1:
            self.catch_up(store, until_seq=recorded[0].seq - 1)
        self._apply(store, recorded)

    def _apply(self, store: EventStore, recorded: Sequence[RecordedEvent]) -> None:
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
        self._set_position(store, recorded[-1].seq)


def attach(store: EventStore) -> ReadModels:
    """Attach the read models to `store`: caught up now, then updated in every append's transaction."""
    models = ReadModels()
    store.attach(models)
    return models


def read_runner_rows(store: EventStore) -> dict[str, tuple[Any, ...]]:
    """Every ``runners`` row by runner id (empty if the tables do not exist)."""
    return {row[0]: row for row in read_every_row(store, "runners")}


def read_lease_rows(store: EventStore, runner_id: str) -> list[tuple[Any, ...]]:
    """A runner's ``leases`` rows, ordered by lease id."""
    if not _exists(store, "leases"):
        return []
    rows = store.backend.execute(
        f"SELECT {', '.join(LEASE_COLUMNS)} FROM leases WHERE runner_id = ? ORDER BY lease_id", (runner_id,))
    return [tuple(row) for row in rows]


def read_every_row(store: EventStore, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``runners`` or ``leases``, in key order, as stored (duplicates too, should the file hold any).

    Empty when the table does not exist.
    """
    columns = {"runners": RUNNER_COLUMNS, "leases": LEASE_COLUMNS}[table]
    if not _exists(store, table):
        return []
    key = "runner_id" if table == "runners" else "runner_id, lease_id"
    return [tuple(row) for row in store.backend.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {key}")]


def read_model_tables(store: EventStore) -> set[str]:
    """Which of the read models' tables (``runners``, ``leases``, ``read_model_position``) the file holds."""
    rows = store.backend.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name IN (?, ?, ?)", TABLE_NAMES)
    return {row[0] for row in rows}


def _exists(store: EventStore, table: str) -> bool:
    rows = store.backend.execute("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?", (table,))
    return bool(rows)
