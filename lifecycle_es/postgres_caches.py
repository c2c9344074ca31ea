"""The PostgreSQL backend's caches beside the log: the ``snapshots`` table (a runner's state at a version,
which reads start from) and ``host_leases`` (which host holds a runner, and until when, by the server's
clock). The PostgreSQL form of ``sqlite_caches``.

Both are written inside the event transaction, so they move with the log; the snapshots are a cache the
log rebuilds (the audit checks each against a fold of the log), the host leases the store's own rows.
`PostgresBackend` has these methods, as it has `ServerReadModelTables`'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .backend import HostLeaseRow

if TYPE_CHECKING:
    from .postgres_statements import Statements


class ServerCacheTables:
    """The snapshot and host-lease statements of a backend holding one psycopg connection (`PostgresBackend`)."""

    _sql: Statements
    _rows: Callable[..., list[tuple[Any, ...]]]
    """A statement's rows, reconnecting outside a transaction as every read does (the backend's own method)."""
    _rows_none: Callable[..., None]
    """A statement inside a write transaction (the backend's own method)."""

    # --- host leases (renewals write here, never to the log) ---------------------------------------

    def clock_ms(self) -> int | None:
        """The server's clock (clock_timestamp()), epoch ms: host leases expire by it, whatever the drivers'."""
        rows = self._rows("read the server's clock", self._sql.clock)
        return int(rows[0][0])

    def host_lease(self, stream: str) -> HostLeaseRow | None:
        """(holder, token, expires_ms) of the runner's host lease, or None; inside a write transaction it
        is read after the head table was locked, so no other writer can change it before the commit."""
        rows = self._rows("read the host lease", self._sql.host_lease, (stream,))
        return (rows[0][0], int(rows[0][1]), int(rows[0][2])) if rows else None

    def put_host_lease(self, stream: str, holder: str, token: int, expires_ms: int) -> None:
        """Insert or replace the runner's host lease row (inside a write transaction)."""
        self._rows_none("write the host lease", self._sql.put_host_lease, (stream, holder, token, expires_ms))

    # --- snapshots ----------------------------------------------------------------------------------

    def snapshot(self, stream: str) -> tuple[int, int, bytes, bytes] | None:
        """(version, seq, state, event_hash) of a stream's snapshot, if any."""
        rows = self._rows("read snapshot", self._sql.snapshot, (stream,))
        return (rows[0][0], rows[0][1], bytes(rows[0][2]), bytes(rows[0][3])) if rows else None

    def put_snapshot(self, stream: str, version: int, seq: int, state: bytes, event_hash: bytes) -> None:
        """Insert or replace a stream's snapshot (inside a write transaction)."""
        self._rows_none("write snapshot", self._sql.put_snapshot, (stream, version, seq, state, event_hash))

    def snapshot_positions(self) -> list[tuple[str, int]]:
        """(stream, seq) of every stored snapshot, by seq."""
        return [(row[0], row[1]) for row in self._rows("list snapshots", self._sql.snapshot_positions)]

    def clear_snapshots(self) -> None:
        """Delete every snapshot (inside a write transaction)."""
        self._rows_none("clear snapshots", self._sql.clear_snapshots)
