"""The interface between `EventStore` and a database: everything the store, the projections, the audit
and the command line need from one, as named methods (no SQL crosses it).

Two backends implement it: SQLite (``sqlite.py``, the default) and PostgreSQL (``postgres.py``);
``backends.py`` picks one for a path or a URL. ``tests/store/backend_contract.py`` holds the contract
every backend must pass, one abstract case subclassed once per backend. Rows are
``(seq, stream, version, type, at, body, prev, hash)``.

Sizes: an event's body is at most `MAX_EVENT_BYTES` (512 KiB; the largest a command writes is a
DrainExpired naming 1024 lease ids, about 270 KB), and a read is paged by rows and by bytes (a page ends
at `PAGE_ROWS` rows or once its bodies reach `PAGE_BYTES`), so reading a log costs a bounded amount of
memory whatever its rows hold. A row whose body is beyond the bound is never loaded: reading it raises
IntegrityError at its seq. Its other columns are read only up to `MAX_FIELD_BYTES`: a longer one (which
only a file's or table's writer can make) reads as NULL, which the chain check, and every read that makes
an event of the row (``store_reads.recorded``), names at its seq. A
snapshot's state is at most `MAX_SNAPSHOT_BYTES` (a state is at most a few MB: its leases are retained by
count, each field bounded); a larger one is read as empty bytes, never loaded, and so proves nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .errors import StoreFormatError

Row = tuple[int, str, int, str, str, bytes, bytes, bytes]
# What an append reads under the lock: (stream version, head seq, head hash, head at).
Tail = tuple[int, int, bytes | None, str | None]
# A runner's host lease as stored: (holder, token, expires_ms by the store's clock).
HostLeaseRow = tuple[str, int, int]

MAX_EVENT_BYTES = 512 * 1024
MAX_SNAPSHOT_BYTES = 16 * 1024 * 1024
MAX_FIELD_BYTES = 1024
"""The most a row's stream, type, at, prev or hash is read as (each is far shorter in any row a store
writes: ids are at most 255 characters, hashes 32 bytes); beyond it the column reads as NULL, never loaded."""
PAGE_ROWS = 2000
PAGE_BYTES = 8 * 1024 * 1024


class Savepoint(Protocol):
    """What `Backend.savepoint` returns: a context manager that says whether the transaction was lost."""

    lost: bool
    """Set when the block raised and the database had ended the whole transaction under it."""

    def __enter__(self) -> Savepoint:
        """Set the savepoint; it is its own value (``with backend.savepoint(...) as savepoint``)."""
        ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool | None:
        """Release it, or roll back to it when the block raised."""
        ...


Page = tuple[list[Row], bool]
"""A page of rows and whether it is full (the next may hold more)."""


def oversized_meta(path: str, key: str, length: int) -> bytes:
    """StoreFormatError for a ``meta`` value longer than `MAX_FIELD_BYTES` (read as NULL, never loaded): the store
    writes a 16-byte store id and a short key id there, so only someone editing the file or table made one."""
    raise StoreFormatError(f"{path!r}: its meta value {key!r} is {length:,} bytes, beyond the {MAX_FIELD_BYTES:,} a "
                           "store writes there: the file was edited outside lifecycle-es; restore it from a good copy")


def paged(page: Callable[[int, int], Page], *, after: int, limit: int | None) -> Iterator[list[Row]]:
    """`Backend.pages` from one query: `page(after, want)` reads up to `want` rows with seq > `after`, and
    says whether its page is full; pages follow until one is not, or `limit` rows were read."""
    while limit is None or limit > 0:
        rows, full = page(after, PAGE_ROWS if limit is None else min(PAGE_ROWS, limit))
        if rows:
            yield rows
        if not full:
            return
        after = rows[-1][0]
        if limit is not None:
            limit -= len(rows)


def stream_paged(page: Callable[[int], Page], *, after_version: int) -> Iterator[list[Row]]:
    """`Backend.stream_pages` from one query: `page(after_version)` reads a page of one stream's rows."""
    while True:
        rows, full = page(after_version)
        if rows:
            yield rows
        if not full:
            return
        after_version = rows[-1][2]


class Backend(Protocol):
    """A durable, ordered, append-only log of event rows with a write lock, its metadata, snapshots and
    read models. Methods marked "inside a write transaction" are only called within `write`."""

    path: str
    """Where the store lives (a file's path; a server's URL)."""
    read_only: bool
    """Whether this connection was opened read-only: the store refuses every write before it reaches here."""
    identity: tuple[int, int]
    """The storage's identity when it was opened (see `file_identity`)."""

    # --- transactions ---------------------------------------------------------------------------------

    def write(self, action: str, streams: Sequence[str] = ()) -> AbstractContextManager[Any]:
        """A transaction that holds the write lock from its first statement to commit (StoreBusyError when
        the lock is not had in time; StoreIOError with ``outcome_unknown`` when a commit's fate is unknown).
        `streams`: streams whose `tail` it will read, which a server may read with the lock, in the same
        round trip (a hint: any stream may be read)."""
        ...

    def savepoint(self, action: str) -> Savepoint:
        """Inside a write transaction: a nested unit whose writes are kept when its block ends and rolled
        back alone when it raises, the transaction staying open and the block's exception passing through
        (a database error translated into its StoreError). When the database ended the whole transaction
        under it, nothing can be rolled back alone: `Savepoint.lost` is then set and its exit raises a
        StoreIOError of its own."""
        ...

    def read_tx(self, action: str) -> AbstractContextManager[Any]:
        """A read transaction: one consistent view for several queries."""
        ...

    def file_identity(self) -> tuple[int, int]:
        """The storage's identity now; a change since `identity` means it was replaced underneath
        (StoreFencedError when it is gone)."""
        ...

    def written_at_fork(self, busy: bool) -> tuple[int, int] | None:
        """In a process just forked from this one: what of the storage the child cannot write because this
        connection was writing it at the fork (`forked.written_at_fork`), or None; `busy` says whether the store
        was beginning, holding or ending a write transaction then."""
        ...

    def check_files(self) -> None:
        """StoreFencedError (naming what changed, saying what to do) when the storage this connection uses is
        no longer what is at the store's path: a file's store checks its files' identities and size before
        each write transaction begins; a server's store reads its identity with the write lock instead."""
        ...

    def data_version(self) -> int:
        """A number that changes when another connection commits (followers poll it); StoreFencedError when
        the storage was replaced underneath (the number would never move again)."""
        ...

    def wait(self, timeout: float, stop: threading.Event | None = None) -> None:
        """Return once another connection may have committed, or after `timeout` seconds (sooner when
        `stop` is set): followers call it between polls of `data_version`."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...

    # --- metadata and schema --------------------------------------------------------------------------

    def meta(self, key: str) -> bytes | None:
        """A value of the store's metadata."""
        ...

    def set_meta(self, key: str, value: bytes) -> None:
        """Record a metadata value (inside a write transaction)."""
        ...

    def schema_problems(self) -> list[str]:
        """How the storage's schema differs from the store's (empty when exact)."""
        ...

    # --- the log --------------------------------------------------------------------------------------

    def head(self) -> tuple[int, bytes | None, str | None]:
        """(seq, hash, at) of the last event; (0, None, None) for an empty log."""
        ...

    def head_at(self) -> str | None:
        """The last event's at (None for an empty log); inside a write transaction, without a query when
        `tail` was just read."""
        ...

    def stream_version(self, stream: str) -> int:
        """The last version of a stream (0 when it has none)."""
        ...

    def tail(self, stream: str) -> Tail:
        """(stream version, head seq, head hash or None for an empty log, head at), read together."""
        ...

    def insert(self, rows: Sequence[Row]) -> None:
        """Insert rows (inside a write transaction), then prove they landed: StoreFormatError, and nothing
        kept, when the head is not the last row written."""
        ...

    def pages(self, *, after: int, stream: str | None, limit: int | None = None) -> Iterator[list[Row]]:
        """Rows with seq > `after` in seq order (optionally of one stream, at most `limit`), in pages
        bounded by `PAGE_ROWS` and `PAGE_BYTES`; a body beyond `MAX_EVENT_BYTES` is IntegrityError at its seq."""
        ...

    def pages_within(self, *, after: int, through: int, seqs: tuple[int, int],
                     streams: Sequence[str]) -> Iterator[list[Row]]:
        """Rows with `after` < seq <= `through` whose seq lies in ``[seqs[0], seqs[1]]`` or whose stream is one
        of `streams`, in seq order, in pages as `pages` makes them (the same rows, the same IntegrityError
        for a body beyond the bound or text that does not decode): what one audit walker needs."""
        ...

    def stream_pages(self, stream: str, *, after_version: int) -> Iterator[list[Row]]:
        """One stream's rows with version > `after_version`, in pages (as `pages`)."""
        ...

    def row_at(self, seq: int) -> Row | None:
        """The row at a seq."""
        ...

    def streams(self) -> list[str]:
        """Every stream id, sorted."""
        ...

    def seq_bounds(self) -> tuple[int, int | None]:
        """How many rows the log holds and its lowest seq (None when empty)."""
        ...

    # --- host leases (one row per runner; renewals write here, never to the log) ----------------------

    def clock_ms(self) -> int | None:
        """The database's own clock, epoch ms, read now; None when it has none (SQLite, a file: the store's
        clock decides). Host leases of a server's store expire by it, so drivers' clocks may disagree."""
        ...

    def host_lease(self, stream: str) -> HostLeaseRow | None:
        """The runner's host lease row, (holder, token, expires_ms), or None when no driver ever took it.

        Inside a write transaction it reads under the write lock, so a check and the append after it
        see the same row."""
        ...

    def put_host_lease(self, stream: str, holder: str, token: int, expires_ms: int) -> None:
        """Insert or replace the runner's host lease row (inside a write transaction)."""
        ...

    # --- snapshots ------------------------------------------------------------------------------------

    def snapshot(self, stream: str) -> tuple[int, int, bytes, bytes] | None:
        """A stream's snapshot: (version, seq, tagged state bytes, hash of the event at seq); the state bytes
        empty, unread, when beyond `MAX_SNAPSHOT_BYTES`."""
        ...

    def snapshot_positions(self) -> list[tuple[str, int]]:
        """(stream, seq) of every stored snapshot, by seq."""
        ...

    def put_snapshot(self, stream: str, version: int, seq: int, state: bytes, event_hash: bytes) -> None:
        """Store a stream's snapshot (inside a write transaction)."""
        ...

    def clear_snapshots(self) -> None:
        """Drop every snapshot (inside a write transaction)."""
        ...

    # --- read models (rows shaped by ``lifecycle_es.read_model``) ---------------------------------------

    def read_model_tables(self) -> set[str]:
        """Which of the read models' tables (``runners``, ``leases``, ``read_model_position``) exist."""
        ...

    def create_read_models(self, *, indexes: bool = True) -> None:
        """Create the read models' tables where missing (inside a write transaction)."""
        ...

    def create_read_model_indexes(self) -> None:
        """Create the read models' secondary indexes where missing (inside a write transaction)."""
        ...

    def drop_read_models(self) -> None:
        """Drop the read models' tables (inside a write transaction)."""
        ...

    def read_model_position(self) -> int | None:
        """The last seq the read models applied: None without a position table, 0 without its row."""
        ...

    def set_read_model_position(self, seq: int) -> None:
        """Record the last seq the read models applied (inside a write transaction)."""
        ...

    def upsert_runner_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Insert or replace ``runners`` rows (inside a write transaction)."""
        ...

    def upsert_lease_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Insert or replace ``leases`` rows (inside a write transaction)."""
        ...

    def delete_lease_rows(self, keys: Sequence[tuple[str, str]]) -> None:
        """Delete ``leases`` rows by (runner id, lease id) (inside a write transaction)."""
        ...

    def read_model_rows(self, table: str) -> list[tuple[Any, ...]]:
        """Every row of ``runners`` or ``leases`` as stored, in key order (empty when the table is missing)."""
        ...

    def lease_rows_of(self, runner_id: str) -> list[tuple[Any, ...]]:
        """One runner's ``leases`` rows, ordered by lease id."""
        ...
