"""The interface between `EventStore` and a database: what a backend must provide.

The SQLite backend (``sqlite.py``) is the one shipped. A PostgreSQL backend for fleets that outgrow one
machine implements this protocol; nothing in the lifecycle or the projections changes. Rows are
``(seq, stream, version, type, at, body, prev, hash)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

Row = tuple[int, str, int, str, str, bytes, bytes, bytes]


class Backend(Protocol):
    """A durable, ordered, append-only table of event rows with a write lock."""

    path: str

    def write(self, action: str) -> AbstractContextManager[Any]:
        """A transaction that holds the write lock from its first statement to commit."""
        ...

    def read_tx(self, action: str) -> AbstractContextManager[Any]:
        """A read transaction: one consistent view for several queries."""
        ...

    def meta(self, key: str) -> bytes | None:
        """A value of the store's metadata."""
        ...

    def set_meta(self, key: str, value: bytes) -> None:
        """Record a metadata value (inside a write transaction)."""
        ...

    def head(self) -> tuple[int, bytes | None, str | None]:
        """(seq, hash, at) of the last event, by index."""
        ...

    def stream_version(self, stream: str) -> int:
        """The last version of a stream, by index."""
        ...

    def tail(self, stream: str) -> tuple[int, int, bytes | None]:
        """(stream version, head seq, head hash or None for an empty log), read together by index."""
        ...

    def insert(self, rows: Sequence[Row]) -> None:
        """Insert rows inside the current write transaction."""
        ...

    def rows(self, *, after: int, stream: str | None, limit: int) -> list[Row]:
        """A page of rows after a seq."""
        ...

    def stream_rows(self, stream: str, *, after_version: int, limit: int) -> list[Row]:
        """A page of one stream's rows after a version."""
        ...

    def row_at(self, seq: int) -> Row | None:
        """The row at a seq."""
        ...

    def streams(self) -> list[str]:
        """Every stream id."""
        ...

    def data_version(self) -> int:
        """A number that changes when another connection commits."""
        ...

    def snapshot(self, stream: str) -> tuple[int, int, bytes, bytes] | None:
        """A stream's snapshot: (version, seq, state bytes, hash of the event at seq)."""
        ...

    def put_snapshot(self, stream: str, version: int, seq: int, state: bytes, event_hash: bytes) -> None:
        """Store a stream's snapshot inside the current write transaction."""
        ...

    def clear_snapshots(self) -> None:
        """Drop every snapshot inside the current write transaction."""
        ...

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        """One parameterized statement (read models write through this in the event transaction)."""
        ...

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One parameterized statement run once per row (read models write many rows at once)."""
        ...

    def file_identity(self) -> tuple[int, int]:
        """An identity of the underlying file; a change means it was replaced underneath."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
