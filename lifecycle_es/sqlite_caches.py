"""The SQLite backend's caches beside the log: the ``snapshots`` table (a runner's state at a version,
which reads start from) and ``host_leases`` (which host holds a runner, and until when).

Both are written inside the event transaction, so they move with the log; the snapshots are a cache the
log rebuilds (the audit checks each against a fold of the log), the host leases the store's own rows.
`SqliteBackend` has these methods, as it has `ReadModelTables`'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import apsw

from .backend import MAX_SNAPSHOT_BYTES, HostLeaseRow
from .sqlite_errors import translated

if TYPE_CHECKING:
    from .sqlite_write import LogEnd


class CacheTables:
    """The snapshot and host-lease statements of a backend holding one apsw connection."""

    conn: apsw.Connection
    log_end: LogEnd

    def snapshot(self, stream: str) -> tuple[int, int, bytes, bytes] | None:
        """(version, seq, state, event_hash) of a stream's snapshot, if any; the state empty when beyond
        MAX_SNAPSHOT_BYTES (``length()`` of a blob reads its size, not its pages)."""
        with translated("read snapshot"):
            rows = self.conn.execute(
                f"SELECT version, seq, iif(length(state) > {MAX_SNAPSHOT_BYTES}, x'', state), event_hash"
                " FROM snapshots WHERE stream = ?", (stream,)).fetchall()
        return cast("tuple[int, int, bytes, bytes]", rows[0]) if rows else None

    def host_lease(self, stream: str) -> HostLeaseRow | None:
        """(holder, token, expires_ms) of the runner's host lease, or None. A primary key lookup."""
        with translated("read the host lease"):
            rows = self.conn.execute("SELECT holder, token, expires_ms FROM host_leases WHERE stream = ?",
                                     (stream,)).fetchall()
        return cast("HostLeaseRow", rows[0]) if rows else None  # STRICT: TEXT, INTEGER, INTEGER

    def put_host_lease(self, stream: str, holder: str, token: int, expires_ms: int) -> None:
        """Insert or replace the runner's host lease row (inside a write transaction)."""
        self.log_end.check_open("write the host lease")
        before = self.conn.total_changes()
        self.conn.execute(
            "INSERT INTO host_leases (stream, holder, token, expires_ms) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (stream) DO UPDATE SET holder = excluded.holder, token = excluded.token,"
            " expires_ms = excluded.expires_ms", (stream, holder, token, expires_ms))
        self.log_end.wrote_one(before)

    def put_snapshot(self, stream: str, version: int, seq: int, state: bytes, event_hash: bytes) -> None:
        """Insert or replace a stream's snapshot (inside a write transaction)."""
        self.log_end.check_open("write a snapshot")
        before = self.conn.total_changes()
        self.conn.execute(
            "INSERT INTO snapshots (stream, version, seq, state, event_hash) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (stream) DO UPDATE SET version = excluded.version, seq = excluded.seq,"
            " state = excluded.state, event_hash = excluded.event_hash",
            (stream, version, seq, state, event_hash))
        self.log_end.wrote_one(before)

    def snapshot_positions(self) -> list[tuple[str, int]]:
        """(stream, seq) of every stored snapshot, by seq (snapshots of streams the log lacks included)."""
        with translated("list snapshots"):
            return [(row[0], row[1]) for row in self.conn.execute("SELECT stream, seq FROM snapshots ORDER BY seq")]

    def clear_snapshots(self) -> None:
        """Delete every snapshot (inside a write transaction); they are a cache the log rebuilds."""
        self.log_end.check_open("clear the snapshots")
        self.conn.execute("DELETE FROM snapshots")
