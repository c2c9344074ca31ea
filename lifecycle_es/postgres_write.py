"""The PostgreSQL backend's write side: its write transaction, and how rows travel to the server.

`ServerTransaction` is `PostgresBackend.write`: BEGIN, the head table's lock and ``tail_of`` in one
simple query, then COMMIT (or ROLLBACK). Rows kept back (a lone transaction's last, a batch's: see
``postgres_savepoint``) go with the COMMIT, in one simple query that spells them as constants
(`commit_with`). `array_literals` spells a batch's columns as array literals for ``append_rows``;
`chunks` cuts a large batch into runs of about a megabyte.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import psycopg

from .backend import Row
from .errors import StoreBehindSealError, StoreError, StoreFencedError, StoreIOError
from .postgres_connection import check_head
from .postgres_errors import translation
from .postgres_statements import CHANNEL_PREFIX
from .values import ID_RE

if TYPE_CHECKING:
    from .postgres import PostgresBackend
    from .postgres_statements import Statements

CHUNK_BYTES = 1 << 20
# An append of at most this many rows (and under CHUNK_BYTES) goes as one call of append_rows.
SMALL_APPEND_ROWS = 64


def chunks(rows: Sequence[Row]) -> Iterator[Sequence[Row]]:
    """`rows` itself when its bodies are under CHUNK_BYTES, else runs of rows of about that many bytes."""
    if sum(len(row[5]) for row in rows) < CHUNK_BYTES:
        yield rows
        return
    start = size = 0
    for index, row in enumerate(rows):
        size += len(row[5])
        if size >= CHUNK_BYTES:
            yield rows[start:index + 1]
            start, size = index + 1, 0
    if start < len(rows):
        yield rows[start:]


def array_literals(rows: Sequence[Row]) -> list[str]:
    """`rows`' eight columns as PostgreSQL array literals, one text each (``append_rows`` casts them).

    A client's array adapter spends Python on every element; these are joins. Every text element is quoted
    (so none reads as NULL) with its backslashes and quotes escaped, every bytea one spelled in hex.
    """
    seqs, streams, versions, types, ats, bodies, prevs, hashes = zip(*rows, strict=True)
    return ["{" + ",".join(map(str, map(int, seqs))) + "}", _texts(streams),
            "{" + ",".join(map(str, map(int, versions))) + "}", _texts(types), _texts(ats),
            _hexes(bodies), _hexes(prevs), _hexes(hashes)]


def _texts(values: Sequence[str]) -> str:
    return "{" + ",".join('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in values) + "}"


def _hexes(values: Sequence[bytes]) -> str:
    return "{" + ",".join('"\\\\x' + bytes(value).hex() + '"' for value in values) + "}"


def commit_with(statements: Statements, rows: Sequence[Row], channel: str | None) -> str | None:
    """One simple query that appends `rows` (``append_one`` or ``append_rows``) and commits: COMMIT in the
    append's round trip. None when the rows are too many or too large for one call, or a text holds a NUL
    (which no text column takes): those go with parameters first."""
    if len(rows) > SMALL_APPEND_ROWS or sum(len(row[5]) for row in rows) >= CHUNK_BYTES:
        return None
    if any("\0" in text for row in rows for text in (row[1], row[3], row[4])):
        return None
    if len(rows) == 1:
        seq, stream, version, type_, at, body, prev, digest = rows[0]
        args = [str(int(seq)), _quoted(stream), str(int(version)), _quoted(type_), _quoted(at), _bytea(body),
                _bytea(prev), _bytea(digest)]
        call = statements.append_one_literal
    else:
        args = [_quoted(literal) for literal in array_literals(rows)]
        call = statements.append_rows_literal
    return call.format(*args, "NULL" if channel is None else _quoted(channel))


def _quoted(text: str) -> str:
    """`text` as an escape-string constant: read the same whatever standard_conforming_strings says."""
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def _bytea(value: bytes | None) -> str:
    return "NULL" if value is None else "E'\\\\x" + bytes(value).hex() + "'::bytea"


class ServerTransaction:
    """`PostgresBackend.write`: the head table locked in the first round trip, which also reads the store's id,
    the head and the versions of the streams named; COMMIT (or ROLLBACK) at the end."""

    __slots__ = ("action", "backend", "streams")

    def __init__(self, backend: PostgresBackend, action: str, streams: Sequence[str]) -> None:
        self.backend = backend
        self.action = action
        self.streams = streams

    def __enter__(self) -> psycopg.Connection[Any]:
        backend = self.backend
        if backend._writing:
            # The server would only warn, and this transaction's COMMIT would end the open one early.
            raise StoreError(f"{self.action}: cannot start a transaction within a transaction")
        if backend._gone is not None or backend._lost():
            backend.file_identity()  # reconnects, fencing on another store or a log without the known event
        try:
            return self._begin()
        except StoreIOError:
            if not backend._lost():
                raise
        # The server closed the connection since its last use (a restart, a failover): once more, anew.
        backend.file_identity()
        return self._begin()

    def _begin(self) -> psycopg.Connection[Any]:
        backend = self.backend
        conn = backend.conn
        backend._pending = None
        # Only ids go into the query's text: their characters need no quoting (any other stream is read when
        # asked, by a statement with parameters).
        streams = [stream for stream in self.streams if type(stream) is str and ID_RE.fullmatch(stream)]
        try:
            # BEGIN, the lock and the streams' versions in one simple query: one round trip. The versions, and
            # every later read, come after the lock, each statement with a fresh snapshot: they see every commit
            # made before the lock was had. Had before this returns: the lock is held from the transaction's
            # start, as the contract says, not from its first read.
            cursor = conn.execute(backend._sql.begin(streams), prepare=False)
            cursor.nextset()
            cursor.nextset()
            locked = cursor.fetchone()
        except psycopg.Error as exc:
            self._abandon()
            if isinstance(exc, psycopg.errors.UndefinedTable):
                raise StoreFencedError(f"the store in {backend.path} is gone (schema {backend.schema!r}): restore it "
                                       "from a good copy, or open the store where it now is") from None
            raise translation(self.action, exc, backend.path) from exc
        # The store's identity, read under the lock: the storage replaced underneath fences this handle here,
        # without a round trip of its own (`checks_identity_in_write`).
        # The cluster's system identifier is the connection's: read when it opened (a reconnect reads it again).
        if locked is None or locked[0] is None or int.from_bytes(bytes(locked[0])[:8], "big") != backend.identity[1]:
            self._abandon()
            raise StoreFencedError(f"the store in {backend.path} is not the one this handle opened (replaced "
                                   "underneath, or another cluster answers at its address): reopen the store, "
                                   "after checking which copy is the right one")
        # The head as the locked row holds it: each write is checked against the last event by advance_head,
        # so a head row edited by hand fails there. Behind the last event this handle committed or saw, the
        # store was restored under the connection: writing on would fork the log (a comparison, no query).
        head = (int(locked[1]), bytes(locked[2]) if locked[2] is not None else None, locked[3])
        try:
            check_head(backend, head[0], head[1])
        except StoreBehindSealError:
            self._abandon()
            raise
        backend._head = head
        backend._versions = dict(zip(streams, locked[4], strict=True))
        backend._batch, backend._block, backend._failed = [], None, False
        backend._writing = True
        return conn

    def _abandon(self) -> None:
        """Roll back after an error (the connection may be gone)."""
        conn = self.backend.conn
        with contextlib.suppress(psycopg.Error):
            if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:
        backend = self.backend
        backend._writing = False
        backend._forget()
        conn = backend.conn
        batch, backend._batch, backend._block = backend._batch, [], None
        if exc is not None:
            self._abandon()
            if isinstance(exc, psycopg.Error):
                raise translation(self.action, exc, backend.path) from exc
            return False
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            # A statement failed and its caller went on (it caught the error): the server would answer COMMIT
            # with ROLLBACK, and the transaction's writes would pass for committed.
            self._abandon()
            raise StoreError(f"{self.action}: a statement of this transaction failed on {backend.path} and its "
                             "caller went on, so the server rolled it back: nothing of it was committed")
        commit = "COMMIT"
        try:
            if batch:
                channel = f"{CHANNEL_PREFIX}{backend.schema}" if backend.target.notify else None
                query = commit_with(backend._sql, batch, channel)
                if query is not None:
                    commit = query
                else:
                    backend.send(batch)
        except BaseException:
            self._abandon()
            raise
        try:
            conn.execute(commit, prepare=False)
        except psycopg.Error as error:
            lost = conn.broken or conn.closed or error.sqlstate is None
            self._abandon()
            if lost:
                raise StoreIOError(f"{self.action}: the connection to {backend.path} was lost during COMMIT "
                                   f"({error}), so whether the server committed it is unknown",
                                   outcome_unknown=True) from error
            raise translation(self.action, error, backend.path) from error
        except BaseException:
            # Text the connection cannot encode is refused before anything is sent; an interrupt is left to
            # the caller: either way the transaction is rolled back if it is still open.
            self._abandon()
            raise
        if backend._pending is not None:
            backend._known = backend._pending
        return False


