"""The PostgreSQL backend's read-model tables, ``runners`` and ``leases`` in the store's schema, and the
statements that keep them (the PostgreSQL form of ``sqlite_read_models``: the same columns and rows).

Text keys sort with ``COLLATE "C"`` (byte order), as SQLite sorts them, so both backends list rows alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from .postgres_errors import translated
from .read_model import LEASE_COLUMNS, RUNNER_COLUMNS, position_of

POSITION_NAME = "read_models"
_TABLES = (
    "CREATE TABLE IF NOT EXISTS {s}.runners ("
    " runner_id text PRIMARY KEY, target text NOT NULL, state text NOT NULL, accepting bigint NOT NULL,"
    " generation bigint NOT NULL, policy_revision bigint NOT NULL, base_dir text NOT NULL,"
    " cpu_seconds bigint NOT NULL, memory_bytes bigint NOT NULL, proxy_id text NOT NULL,"
    " proxy_revision bigint NOT NULL, post_session_hook_digest text NOT NULL, drain_signal text,"
    " drain_requested_at text, drain_deadline_at text, active_lease_count bigint NOT NULL,"
    " parked_lease_count bigint NOT NULL, settled_lease_count bigint NOT NULL, updated_at text NOT NULL,"
    " version bigint NOT NULL, seq bigint NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.leases ("
    " runner_id text NOT NULL REFERENCES {s}.runners (runner_id), lease_id text NOT NULL, session_id text NOT NULL,"
    " generation bigint NOT NULL, issued_at text NOT NULL, expires_at text NOT NULL, status text NOT NULL,"
    " result_digest text, hook_receipt_digest text, PRIMARY KEY (runner_id, lease_id))",
    "CREATE TABLE IF NOT EXISTS {s}.read_model_position (name text PRIMARY KEY, seq bigint NOT NULL)",
)
_INDEXES = ("CREATE INDEX IF NOT EXISTS leases_by_status ON {s}.leases (status, runner_id)",)


class ServerReadModelTables:
    """The read-model statements of a backend holding one psycopg connection (`PostgresBackend` is one)."""

    conn: psycopg.Connection[Any]
    schema: str
    path: str

    _live: Callable[[], None]
    """Before a statement: reconnect a lost connection, or send what a batch deferred (the backend's own method)."""

    def _run(self, action: str, query: str, params: Sequence[Any] = ()) -> None:
        self._live()
        with translated(action, self.path):
            self.conn.execute(query.format(s=self.schema), params)

    def _read(self, action: str, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._live()
        with translated(action, self.path):
            return self.conn.execute(query.format(s=self.schema), params).fetchall()

    def read_model_tables(self) -> set[str]:
        """Which of the read models' tables the schema holds."""
        rows = self._read("list the read models", "SELECT table_name FROM information_schema.tables"
                         " WHERE table_schema = %s AND table_name IN ('runners', 'leases', 'read_model_position')",
                         (self.schema,))
        return {str(row[0]) for row in rows}

    def create_read_models(self, *, indexes: bool = True) -> None:
        """Create the read models' tables where missing (inside a write transaction)."""
        for statement in _TABLES + _INDEXES if indexes else _TABLES:
            self._run("create the read models", statement)

    def create_read_model_indexes(self) -> None:
        """Create the read models' secondary indexes where missing (inside a write transaction)."""
        for statement in _INDEXES:
            self._run("index the read models", statement)

    def drop_read_models(self) -> None:
        """Drop the read models' tables (inside a write transaction): they are a cache the log rebuilds."""
        for table in ("leases", "runners", "read_model_position"):
            self._run("drop the read models", f"DROP TABLE IF EXISTS {{s}}.{table}")

    def read_model_position(self) -> int | None:
        """The last seq the read models applied: None without a position table, 0 without its row, -1 for a value
        that is no integer (a table made by hand)."""
        if "read_model_position" not in self.read_model_tables():
            return None
        rows = self._read("read the read models' position", "SELECT seq FROM {s}.read_model_position WHERE name = %s",
                         (POSITION_NAME,))
        return position_of(rows[0][0]) if rows else 0

    def set_read_model_position(self, seq: int) -> None:
        """Record the last seq the read models applied (inside a write transaction)."""
        self._run("record the read models' position", "INSERT INTO {s}.read_model_position (name, seq) VALUES (%s, %s)"
                  " ON CONFLICT (name) DO UPDATE SET seq = excluded.seq", (POSITION_NAME, seq))

    def upsert_runner_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Insert or replace ``runners`` rows (inside a write transaction)."""
        self._many("write runners rows", _upsert("runners", RUNNER_COLUMNS, 1), rows)

    def upsert_lease_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Insert or replace ``leases`` rows (inside a write transaction)."""
        self._many("write leases rows", _upsert("leases", LEASE_COLUMNS, 2), rows)

    def delete_lease_rows(self, keys: Sequence[tuple[str, str]]) -> None:
        """Delete ``leases`` rows by (runner id, lease id) (inside a write transaction)."""
        self._many("delete leases rows", "DELETE FROM {s}.leases WHERE runner_id = %s AND lease_id = %s", keys)

    def _many(self, action: str, query: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        self._live()
        with translated(action, self.path), self.conn.cursor() as cursor:
            cursor.executemany(query.format(s=self.schema), rows)

    def read_model_rows(self, table: str) -> list[tuple[Any, ...]]:
        """Every row of ``runners`` or ``leases`` as stored, in key order (empty when the table is missing)."""
        if table not in self.read_model_tables():
            return []
        columns = RUNNER_COLUMNS if table == "runners" else LEASE_COLUMNS
        order = 'runner_id COLLATE "C"' + ("" if table == "runners" else ', lease_id COLLATE "C"')
        return self._read(f"read {table} rows", f"SELECT {', '.join(columns)} FROM {{s}}.{table} ORDER BY {order}")

    def lease_rows_of(self, runner_id: str) -> list[tuple[Any, ...]]:
        """One runner's ``leases`` rows, ordered by lease id (empty when the table is missing)."""
        if "leases" not in self.read_model_tables():
            return []
        return self._read("read leases rows", f"SELECT {', '.join(LEASE_COLUMNS)} FROM {{s}}.leases"
                         ' WHERE runner_id = %s ORDER BY lease_id COLLATE "C"', (runner_id,))


def _upsert(table: str, columns: Sequence[str], keys: int) -> str:
    return (f"INSERT INTO {{s}}.{table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
            f" ON CONFLICT ({', '.join(columns[:keys])}) DO UPDATE SET "
            + ", ".join(f"{column} = excluded.{column}" for column in columns[keys:]))
