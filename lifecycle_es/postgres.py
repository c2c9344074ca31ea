"""The PostgreSQL backend: one psycopg connection to one store schema on a server, behind `Backend`.

A write transaction runs at READ COMMITTED and locks the one-row ``head`` table (``LOCK TABLE ... IN
EXCLUSIVE MODE``: every other writer waits, no reader does) before it reads anything, as Commanded's
EventStore locks its head row: writers queue on it, so commit order is seq order and a follower reading
``seq > last`` never meets a gap that a slower writer fills later. A table lock costs the server half
what ``SELECT ... FOR UPDATE`` does (which also writes the row and a WAL record). A command is two
round trips, each one simple query: BEGIN, the lock, the head with the store's id and the versions of the
streams it names; then the row, ``advance_head`` (which proves it landed) and the NOTIFY in one server
function (``append_one``, or ``append_rows`` for a few), and COMMIT. Rows wait for the transaction's next
statement or its COMMIT, whichever comes first (``postgres_write``). A group commit's batch sends its
commands' rows in one call with its COMMIT (``postgres_savepoint``). A plain round trip on a local socket costs
the client less than pipeline mode's bookkeeping, so none is used. The busy timeout is the connection's
``lock_timeout``, set once when every connection opens, a reader's too: a statement behind another
session's table lock waits that long, then is StoreBusyError. A connection lost while a COMMIT was in
flight leaves its outcome unknown (StoreIOError with ``outcome_unknown``), and the store fences itself,
as on SQLite.

The store's identity is its id with the server's system identifier: a handle that reconnects (its
connection was lost) and finds another store, another cluster, or a log without the last event the handle
committed or saw (a restore, or a failover that lost commits) is fenced (``postgres_connection``). A read
outside a transaction whose connection the server had closed reconnects, so checked, and runs once more.
Followers wait on LISTEN/NOTIFY on a connection of their own, with polling as the fallback.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from .backend import MAX_EVENT_BYTES, PAGE_BYTES, PAGE_ROWS, Row, Tail, oversized_meta, paged, stream_paged
from .backends import ServerTarget
from .errors import (
    IntegrityError,
    StoreError,
    StoreFencedError,
    StoreIOError,
)
from .postgres_caches import ServerCacheTables
from .postgres_connection import open_connection, reconnect
from .postgres_errors import translated, translation
from .postgres_read_models import ServerReadModelTables
from .postgres_savepoint import ServerSavepoint, send_deferred
from .postgres_schema import (
    connect,
    schema_problems,
)
from .postgres_statements import CHANNEL_PREFIX, Statements
from .postgres_write import CHUNK_BYTES, SMALL_APPEND_ROWS, ServerTransaction, array_literals, chunks


class PostgresBackend(ServerReadModelTables, ServerCacheTables):
    """One psycopg connection to a store schema on a PostgreSQL server (see the module's docstring)."""

    checks_identity_in_write = True
    """`write` reads the store's identity with its lock (StoreFencedError when it changed), so the store
    need not ask `file_identity` first."""

    def __init__(self, target: ServerTarget, *, durability: str, busy_timeout_ms: int,
                 read_only: bool = False) -> None:
        self.target = target
        self.path = target.shown
        self.schema = target.schema
        self.read_only = read_only
        self._durability = durability
        self._lock_timeout = f"{busy_timeout_ms}ms" if busy_timeout_ms > 0 else "1ms"
        self._writing = False
        self._reading = False  # inside `read_tx`: a statement that failed there is not run again alone
        # The last event (seq, hash) this handle knows the log holds: committed by it, or read under the write
        # lock or by `head` (see `postgres_connection`); the last its open transaction appended; and why the handle
        # is fenced for good, once a reconnect found another store or one without that event.
        self._known: tuple[int, bytes | None] = (0, None)
        self._pending: tuple[int, bytes] | None = None
        self._gone: str | None = None
        self._closed = False  # by `close`: a connection its owner closed is never opened again
        # Inside a write transaction: the head as the lock read it (or as this transaction's inserts left it)
        # and each stream's version as read or written. Only an insert moves them (every other write leaves
        # events alone), and a savepoint's rollback drops them; nothing else can, since the head table's lock
        # is held.
        self._head: tuple[int, bytes | None, str | None] | None = None
        self._versions: dict[str, int] = {}
        # A group commit's batch: rows of its commands that ended well, not sent yet, the command block open
        # now (whose own rows it keeps), and whether sending them failed (see `postgres_savepoint`).
        self._batch: list[Row] = []
        self._block: ServerSavepoint | None = None
        self._failed = False
        self._listener: psycopg.Connection[Any] | None = None
        self._sql = Statements(target.schema)
        self.conn = open_connection(self)
        self.identity = self._identity(self.conn)

    def _identity(self, conn: psycopg.Connection[Any]) -> tuple[int, int]:
        try:
            row = conn.execute(self._sql.identity).fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
        except psycopg.Error as exc:
            raise translation("read the store's identity", exc, self.path) from exc
        if row is None or row[1] is None:
            raise StoreFencedError(f"the store in {self.path} is gone (schema {self.schema!r} holds no store "
                                   "id): restore it from a good copy, or open the store where it now is")
        return (int(row[0]), int.from_bytes(bytes(row[1])[:8], "big"))

    def written_at_fork(self, busy: bool) -> tuple[int, int] | None:
        """None: a server's locks belong to its sessions, not to the client's process, so a child forked while
        this one wrote can write through a connection of its own."""
        return None

    def file_identity(self) -> tuple[int, int]:
        """The cluster's system identifier and the store's id, read now (one round trip).

        A lost connection is reconnected here (`postgres_connection.reconnect`): another cluster or store behind
        the address is StoreFencedError, a log without the last event this handle committed or saw is
        StoreBehindSealError, and either fences the handle.
        """
        if self._gone is not None:
            raise StoreFencedError(self._gone)
        if self._closed:
            raise StoreError(f"the store {self.path} was closed: open it again to use it")
        if not self._lost():
            if self._writing:
                return self.identity  # inside a write transaction, its head table lock holds the store
            try:
                return self._identity(self.conn)
            except StoreIOError:
                if not self._lost():
                    raise
        return reconnect(self)

    def _lost(self) -> bool:
        """Whether the server closed the connection (a restart, a failover, an administrator)."""
        return self.conn.closed or self.conn.broken

    def check_files(self) -> None:
        """Nothing to check apart from a write: `write` reads the store's identity with its lock, and
        `data_version` reconnects and checks it (a server's store has no files of its own to watch)."""

    def schema_problems(self) -> list[str]:
        """How the schema differs from the store's (see `postgres_schema.schema_problems`); empty when exact."""
        with translated("check the store's schema", self.path):
            return schema_problems(self.conn, self.schema)

    # --- transactions -------------------------------------------------------------------------------

    def write(self, action: str, streams: Sequence[str] = ()) -> ServerTransaction:
        """A write transaction that holds the head table's lock from its first round trip to COMMIT; that round
        trip also reads the head and the versions of `streams`, so their tails cost no query of their own."""
        return ServerTransaction(self, action, streams)

    def savepoint(self, action: str) -> ServerSavepoint:
        """A savepoint inside the open write transaction (see `Backend.savepoint`)."""
        return ServerSavepoint(self, action)

    @contextlib.contextmanager
    def read_tx(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        """A REPEATABLE READ transaction: one consistent view of the log for several queries."""
        self._live()  # inside a write transaction: the rows it holds back go first, so that reads see them
        if self._writing or self._reading:
            yield self.conn
            return
        self._once(action, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", fetch=False)
        self._reading = True
        try:
            yield self.conn
        finally:
            self._reading = False
            with translated(action, self.path):
                if self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    self.conn.execute("ROLLBACK")

    # --- queries ------------------------------------------------------------------------------------

    def _live(self) -> None:
        """Before a statement: reconnect a lost connection outside a transaction (see `file_identity`); inside a
        read transaction, refuse to go on without it (StoreIOError); inside a write transaction, send the rows a
        batch deferred first, so that the statement sees them."""
        if self._writing:
            if self._batch or (self._block is not None and not self._block.opened):
                send_deferred(self)
        elif self._reading and self._lost():
            # A new connection would answer outside the transaction: another snapshot than its earlier reads.
            raise StoreIOError(f"the connection to {self.path} was lost inside a read transaction, and its snapshot "
                               "with it: nothing more is read in it; end it and run the whole read again")
        elif self._gone is not None or self._lost():
            self.file_identity()

    def _rows(self, action: str, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._live()
        if self._writing or self._reading:
            with translated(action, self.path):
                return self.conn.execute(query, params).fetchall()
        return self._once(action, query, params)

    def _once(self, action: str, query: str, params: Sequence[Any] = (), *,
              fetch: bool = True) -> list[tuple[Any, ...]]:
        """A statement outside any transaction (its rows, when `fetch`), run once more on a new connection
        (`file_identity` checks it reaches the same store) when the server had closed this one since its last
        use: a read, or BEGIN, is safe to repeat."""
        try:
            with translated(action, self.path):
                cursor = self.conn.execute(query, params)
                return cursor.fetchall() if fetch else []
        except StoreIOError:
            if not self._lost():
                raise
        self.file_identity()
        with translated(action, self.path):
            cursor = self.conn.execute(query, params)
            return cursor.fetchall() if fetch else []

    def meta(self, key: str) -> bytes | None:
        """A value of the ``meta`` table."""
        rows = self._rows("read meta", self._sql.meta, (key,))
        if not rows:
            return None
        value, length = rows[0]
        return bytes(value) if value is not None else oversized_meta(self.path, key, length)

    def set_meta(self, key: str, value: bytes) -> None:
        """Insert a ``meta`` value (inside a write transaction)."""
        self._rows_none("write meta", self._sql.set_meta, (key, value))

    def _rows_none(self, action: str, query: str, params: Sequence[Any] = ()) -> None:
        self._live()
        with translated(action, self.path):
            self.conn.execute(query, params)

    def head(self) -> tuple[int, bytes | None, str | None]:
        """(seq, hash, at) of the last event; (0, None, None) for an empty log."""
        rows = self._rows("read head", self._sql.last)
        if not rows:
            return (0, None, None)
        seq, digest = int(rows[0][0]), bytes(rows[0][1])
        if seq > self._known[0] and not self._writing:  # (a write transaction's own rows are not committed yet)
            self._known = (seq, digest)
        return (seq, digest, rows[0][2])

    def head_at(self) -> str | None:
        """The head's at (None for an empty log); in a write transaction, from a tail it read (no query)."""
        if self._writing and self._head is not None:
            return self._head[2]
        return self.head()[2]

    def stream_version(self, stream: str) -> int:
        """The last version of a stream (0 when it has none)."""
        rows = self._rows("read stream version", self._sql.stream_version, (stream,))
        return int(rows[0][0]) if rows else 0

    def tail(self, stream: str) -> Tail:
        """(stream version, head seq, head hash, head at): in a write transaction, read once the head table is
        locked, so no other writer's commit can follow it, and kept until this transaction inserts."""
        head = self._head if self._writing else None
        if head is not None:
            version = self._versions.get(stream)
            if version is None:
                version = self._versions[stream] = self.stream_version(stream)
            return (version, *head)
        rows = self._rows("read stream version and head", self._sql.tail, (stream,))
        version, seq, digest, at = rows[0]
        found: Tail = (int(version or 0), int(seq or 0), bytes(digest) if digest is not None else None, at)
        if self._writing:
            self._head, self._versions[stream] = found[1:], found[0]
        return found

    def _moved(self, rows: Sequence[Row]) -> None:
        """Inside a write transaction: `rows` were inserted, so the head is the last of them and each stream
        written is at its last row's version (advance_head fails the commit, or the savepoint, if the rows
        did not land, and either drops what is kept here)."""
        versions = self._versions
        for row in rows:
            versions[row[1]] = row[2]
        last = rows[-1]
        self._head = (last[0], last[7], last[4])
        self._pending = (last[0], last[7])

    def _forget(self) -> None:
        """Drop the head and versions kept for a write transaction (it ended, or a savepoint rolled back)."""
        self._head = None
        self._versions = {}

    def insert(self, rows: Sequence[Row]) -> None:
        """Insert event rows (inside a write transaction) with ``advance_head``, which raises (and so fails
        the COMMIT) unless the rows written are the log's last, and the NOTIFY. A command of a group commit's
        batch keeps its rows, sent with the batch's (see `postgres_savepoint`)."""
        if not rows:
            return
        block = self._block
        if block is None:
            # Kept until the next statement or COMMIT, which carries them in its round trip (a long run of
            # appends goes as it grows, so that no transaction holds more than a small batch back).
            self._batch.extend(rows)
            if len(self._batch) >= SMALL_APPEND_ROWS:
                self._live()
        elif not block.opened:
            block.rows.extend(rows)
        else:
            self._live()
            self.send(rows)
        self._moved(rows)

    def send(self, rows: Sequence[Row]) -> None:
        """Send `insert`'s rows now: one call of ``append_one`` or ``append_rows``, or chunks of INSERTs then
        ``advance_head`` and the NOTIFY for a large batch."""
        last = rows[-1]
        channel = f"{CHANNEL_PREFIX}{self.schema}" if self.target.notify else None
        if len(rows) == 1:
            with translated("append", self.path):
                self.conn.execute(self._sql.append_one, (*last, channel))
            return
        if len(rows) <= SMALL_APPEND_ROWS and sum(len(row[5]) for row in rows) < CHUNK_BYTES:
            with translated("append", self.path):
                self.conn.execute(self._sql.append_rows, (*array_literals(rows), channel))
            return
        with translated("append", self.path):
            for chunk in chunks(rows):
                # executemany pipelines a chunk's INSERTs; a chunk at a time, so that megabytes of rows are
                # never all in flight at once.
                with self.conn.cursor() as cursor:
                    cursor.executemany(self._sql.insert, chunk)
            self.conn.execute(self._sql.advance, (rows[0][0], rows[0][6], last[0], last[7], last[4]))
            if self.target.notify:
                self.conn.execute(self._sql.notify, (str(last[0]),))

    def pages(self, *, after: int, stream: str | None, limit: int | None = None) -> Iterator[list[Row]]:
        """Rows with seq > `after` in seq order (of one stream, at most `limit`), in pages bounded by
        PAGE_ROWS and PAGE_BYTES; a body beyond MAX_EVENT_BYTES is IntegrityError at its seq."""
        if stream is None:
            return paged(lambda start, want: self._page(self._sql.page_all, (start, want)), after=after, limit=limit)
        return paged(lambda start, want: self._page(self._sql.page_stream_seq, (stream, start, want)),
                     after=after, limit=limit)

    def pages_within(self, *, after: int, through: int, seqs: tuple[int, int],
                     streams: Sequence[str]) -> Iterator[list[Row]]:
        """Rows with `after` < seq <= `through` whose seq is in ``[seqs[0], seqs[1]]`` or whose stream is one of
        `streams` (one text[] parameter), in seq order, in pages (see `pages`)."""
        wanted = list(streams)
        low, high = seqs
        return paged(lambda start, want: self._page(self._sql.page_within, (start, through, low, high, wanted, want)),
                     after=after, limit=None)

    def stream_pages(self, stream: str, *, after_version: int) -> Iterator[list[Row]]:
        """One stream's rows with version > `after_version`, in order, in pages (see `pages`)."""
        return stream_paged(lambda start: self._page(self._sql.page_stream, (stream, start, PAGE_ROWS)),
                            after_version=after_version)

    def row_at(self, seq: int) -> Row | None:
        """The row at `seq`, if any (IntegrityError when its body is beyond the bound)."""
        rows = self._page(self._sql.row_at, (seq, 1))[0]
        return rows[0] if rows else None

    def _page(self, query: str, params: Sequence[Any]) -> tuple[list[Row], bool]:
        """The rows of a page query (its last parameter the LIMIT), up to PAGE_BYTES of bodies, and whether
        the page is full (the next may hold more). A NULL body stands for one beyond the bound."""
        found: list[Row] = []
        size = 0
        for seq, stream, version, type_, at, body, prev, digest, length in self._rows("read events", query, params):
            if body is None:
                if found:
                    return found, True
                raise IntegrityError(seq, f"its body is {length:,} bytes, beyond the bound of {MAX_EVENT_BYTES:,} "
                                          "(MAX_EVENT_BYTES): no command writes one so large", stream=stream)
            found.append((seq, stream, version, type_, at, bytes(body), bytes(prev), bytes(digest)))
            size += len(body)
            if size >= PAGE_BYTES:
                return found, True
        return found, len(found) == params[-1]

    def streams(self) -> list[str]:
        """Every stream id, sorted (byte order, as SQLite sorts)."""
        return [row[0] for row in self._rows("list streams", self._sql.streams)]

    def seq_bounds(self) -> tuple[int, int | None]:
        """How many rows the events table holds, and its lowest seq (None when empty)."""
        ((count, lowest),) = self._rows("count events", self._sql.bounds)
        return int(count), lowest

    def data_version(self) -> int:
        """The head row's seq: it moves with every append, by any connection. StoreFencedError when the store
        under the URL is no longer the one this handle opened (its number would be another log's)."""
        if self.file_identity() != self.identity:
            raise StoreFencedError(f"the store in {self.path} was replaced underneath this handle (another store "
                                   "id, or another cluster): reopen the store")
        rows = self._rows("read head", self._sql.head)
        return int(rows[0][0]) if rows else 0

    def wait(self, timeout: float, stop: threading.Event | None = None) -> None:
        """Return once another connection may have appended (a NOTIFY came) or after `timeout` seconds.

        LISTEN runs on a connection of its own; when it fails (the server restarted) it is dropped and this
        waits out the timeout: the caller polls `data_version` meanwhile, and the next wait listens again.
        """
        if not self.target.notify:
            _sleep(timeout, stop)
            return
        try:
            listener = self._listen()
            for _ in listener.notifies(timeout=timeout, stop_after=1):
                break
            # Drain what else queued meanwhile: one wake-up per wait, however many commits.
            for _ in listener.notifies(timeout=0):
                pass
        except (psycopg.Error, StoreIOError):
            self._drop_listener()
            _sleep(timeout, stop)

    def _listen(self) -> psycopg.Connection[Any]:
        if self._listener is None or self._listener.closed or self._listener.broken:
            listener = connect(self.target, read_only=True)
            listener.execute(f"LISTEN {CHANNEL_PREFIX}{self.schema}")
            self._listener = listener
        return self._listener

    def _drop_listener(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(psycopg.Error):
                self._listener.close()
            self._listener = None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one raw statement, as `SqliteBackend.execute`: for tests and tools that reach under the store.
        Not part of `Backend`: nothing in the packages uses it. It may move the log under a write transaction,
        so the head and versions that transaction kept are read again when next asked."""
        self._live()
        self._forget()
        with translated("execute", self.path):
            cursor = self.conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def close(self) -> None:
        """Close the connections; every later call raises StoreError, never reconnecting."""
        self._closed = True
        self._drop_listener()
        self.conn.close()


def _sleep(timeout: float, stop: threading.Event | None) -> None:
    if stop is not None:
        stop.wait(timeout)
    else:
        time.sleep(timeout)
