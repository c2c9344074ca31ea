"""The SQLite backend's read-model tables, ``runners`` and ``leases``, and the statements that keep them.

The tables belong to the backend, like the events: `projections.read_models` decides which rows change
(their shape is ``lifecycle_es.read_model``) and calls the named methods of `ReadModelTables`, which
`SqliteBackend` has; the audit reads every row back through them. Writes run inside the event
transaction, so the read models move with the log, exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import apsw

from .read_model import LEASE_COLUMNS, RUNNER_COLUMNS, position_of
from .sqlite_errors import translated

if TYPE_CHECKING:
    from .sqlite_write import LogEnd

READ_MODEL_TABLES = ("runners", "leases", "read_model_position")
"""The read models' tables, as the schema check allows them beside the store's own."""
POSITION_NAME = "read_models"

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
_SELECT_ALL = {
    "runners": f"SELECT {', '.join(RUNNER_COLUMNS)} FROM runners ORDER BY runner_id",
    "leases": f"SELECT {', '.join(LEASE_COLUMNS)} FROM leases ORDER BY runner_id, lease_id",
}


class ReadModelTables:
    """The read-model statements of a backend holding one apsw connection (`SqliteBackend` is one)."""

    conn: apsw.Connection
    log_end: LogEnd

    def read_model_tables(self) -> set[str]:
        """Which of the read models' tables the file holds."""
        with translated("list the read models"):
            rows = self.conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table' AND name IN (?, ?, ?)",
                                     READ_MODEL_TABLES).fetchall()
        return {cast(str, row[0]) for row in rows}

    def create_read_models(self, *, indexes: bool = True) -> None:
        """Create the read models' tables where missing (inside a write transaction).

        `indexes`: False leaves the secondary indexes for `create_read_model_indexes`, once the tables
        are filled (SQLite builds an index over existing rows faster than it keeps it row by row).
        """
        self.log_end.check_open("create the read models")
        with translated("create the read models"):
            for statement in TABLES + INDEXES if indexes else TABLES:
                self.conn.execute(statement)

    def create_read_model_indexes(self) -> None:
        """Create the read models' secondary indexes where missing (inside a write transaction)."""
        self.log_end.check_open("index the read models")
        with translated("index the read models"):
            for statement in INDEXES:
                self.conn.execute(statement)

    def drop_read_models(self) -> None:
        """Drop the read models' tables (inside a write transaction): they are a cache the log rebuilds."""
        self.log_end.check_open("drop the read models")
        with translated("drop the read models"):
            for table in ("leases", "runners", "read_model_position"):
                self.conn.execute(f"DROP TABLE IF EXISTS {table}")

    def read_model_position(self) -> int | None:
        """The last seq the read models applied: None without a position table, 0 without its row, -1 for a value
        that is no integer (a table made by hand)."""
        if "read_model_position" not in self.read_model_tables():
            return None
        with translated("read the read models' position"):
            rows = self.conn.execute("SELECT seq FROM read_model_position WHERE name = ?",
                                     (POSITION_NAME,)).fetchall()
        return position_of(rows[0][0]) if rows else 0

    def set_read_model_position(self, seq: int) -> None:
        """Record the last seq the read models applied (inside a write transaction)."""
        self.log_end.check_open("record the read models' position")
        with translated("record the read models' position"):
            self.conn.execute("INSERT INTO read_model_position (name, seq) VALUES (?, ?)"
                              " ON CONFLICT (name) DO UPDATE SET seq = excluded.seq", (POSITION_NAME, seq))

    def upsert_runner_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Insert or replace ``runners`` rows (inside a write transaction)."""
        self.log_end.check_open("write runners rows")
        with translated("write runners rows"):
            self.conn.executemany(_UPSERT_RUNNER, rows)

    def upsert_lease_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Insert or replace ``leases`` rows (inside a write transaction)."""
        self.log_end.check_open("write leases rows")
        with translated("write leases rows"):
            self.conn.executemany(_UPSERT_LEASE, rows)

    def delete_lease_rows(self, keys: Sequence[tuple[str, str]]) -> None:
        """Delete ``leases`` rows by (runner id, lease id) (inside a write transaction)."""
        self.log_end.check_open("delete leases rows")
        with translated("delete leases rows"):
            self.conn.executemany("DELETE FROM leases WHERE runner_id = ? AND lease_id = ?", keys)

    def read_model_rows(self, table: str) -> list[tuple[Any, ...]]:
        """Every row of ``runners`` or ``leases`` as stored, in key order (empty when the table is missing)."""
        if table not in self.read_model_tables():
            return []
        with translated(f"read {table} rows"):
            return [tuple(row) for row in self.conn.execute(_SELECT_ALL[table])]

    def lease_rows_of(self, runner_id: str) -> list[tuple[Any, ...]]:
        """One runner's ``leases`` rows, ordered by lease id (empty when the table is missing)."""
        if "leases" not in self.read_model_tables():
            return []
        with translated("read leases rows"):
            return [tuple(row) for row in self.conn.execute(
                f"SELECT {', '.join(LEASE_COLUMNS)} FROM leases WHERE runner_id = ? ORDER BY lease_id", (runner_id,))]
