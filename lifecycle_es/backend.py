"""The interface between `EventStore` and a database: what a backend must provide.

The SQLite backend (``sqlite.py``) is the one shipped. A PostgreSQL backend for fleets that outgrow one
machine implements this protocol; nothing in the lifecycle or the projections changes. Rows are
``(seq, stream, version, type, at, body, prev, hash)``.

Sizes: an event's body is at most `MAX_EVENT_BYTES` (512 KiB; the largest a command writes is a
DrainExpired naming 1024 lease ids, about 270 KB), and a read is paged by rows and by bytes (a page ends
at `PAGE_ROWS` rows or once its bodies reach `PAGE_BYTES`), so reading a log costs a bounded amount of
memory whatever its rows hold. A row whose body is beyond the bound is never loaded: reading it raises
IntegrityError at its seq.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

Row = tuple[int, str, int, str, str, bytes, bytes, bytes]
# What an append reads under the lock: (stream version, head seq, head hash, head at).
Tail = tuple[int, int, bytes | None, str | None]

MAX_EVENT_BYTES = 512 * 1024
PAGE_ROWS = 2000
PAGE_BYTES = 8 * 1024 * 1024


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

    def tail(self, stream: str) -> tuple[int, int, bytes | None, str | None]:
        """(stream version, head seq, head hash, head at; None for an empty log), read together by index."""
        ...

    def head_at(self) -> str | None:
        """The head's at (None for an empty log); inside a write transaction, what the lock holds."""
        ...

    def insert(self, rows: Sequence[Row]) -> None:
        """Insert rows inside the current write transaction, then check that they are in the file.

        StoreFormatError when they are not (the store's schema was altered: a trigger ignored them).
        """
        ...

    def pages(self, *, after: int, stream: str | None, limit: int | None = None) -> Iterator[list[Row]]:
        """The rows after a seq (optionally of one stream, at most `limit`), in pages of bounded size."""
        ...

    def stream_pages(self, stream: str, *, after_version: int) -> Iterator[list[Row]]:
        """One stream's rows after a version, in pages of bounded size."""
        ...

    def rows(self, *, after: int, stream: str | None, limit: int) -> list[Row]:
        """The first page of `pages` (fewer than `limit` rows when their bodies reach PAGE_BYTES)."""
        ...

    def stream_rows(self, stream: str, *, after_version: int, limit: int) -> list[Row]:
        """The first page of `stream_pages`, at most `limit` rows."""
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

    def schema_problems(self) -> list[str]:
        """How the file's schema differs from the store's (empty when exact); a writer refuses any."""
        ...

    def file_identity(self) -> tuple[int, int]:
        """An identity of the underlying file; a change means it was replaced underneath."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
