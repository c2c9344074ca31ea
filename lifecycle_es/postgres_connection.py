"""A PostgreSQL handle's connection: how one opens (`open_connection`), and how a lost one is replaced
(`reconnect`) only once it proves to reach the store the handle opened, as the handle last knew it.

Every connection waits for another session's table lock only as long as the busy timeout, a reader's too,
and any server error while one opens is a StoreError naming the server (its URL, password masked).

A handle's store is its server's cluster (the system identifier, which every physical copy and replica
shares and no other cluster has) with the store's id, read when it opened, and the last event it knows the
log holds: the last it committed, or the head it last read under the write lock (`PostgresBackend._known`,
a seq and its hash). Both are checked where the store could have changed under the handle:

- at a reconnect (`reconnect`): another cluster, or another store, behind the same address is
  StoreFencedError; the same store without the known event at its seq (a restore from an older copy, a
  failover to a replica that had not received it) is StoreBehindSealError. Either fences the handle for good.
- at each write transaction's lock (`check_head`, a comparison): a head behind the known event, or at its seq
  with another hash, is StoreBehindSealError (the store was restored under an open connection).

Writing on in either case would fork the log: new events chained onto an older head while events this
handle acknowledged (or saw) sit in another copy.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import psycopg

from .errors import StoreBehindSealError, StoreFencedError, StoreFormatError
from .postgres_errors import translated
from .postgres_schema import check_format, check_settings, connect, create, schema_problems, store_exists

if TYPE_CHECKING:
    from .postgres import PostgresBackend


def open_connection(backend: PostgresBackend, *, create_missing: bool = True) -> psycopg.Connection[Any]:
    """A new connection for `backend`, set up and checked (the store made when missing and `create_missing`)."""
    conn = connect(backend.target, read_only=backend.read_only)
    path, schema = backend.path, backend.schema
    try:
        with translated("open", path):
            # The busy timeout, once per connection: a writer's head table lock waits for it, and so does any
            # statement behind another session's table lock (ALTER TABLE, VACUUM FULL, LOCK TABLE by hand).
            conn.execute(backend._sql.lock_timeout.format(timeout=backend._lock_timeout))
            if not backend.read_only:
                check_settings(conn, durability=backend._durability, where=path)
                if backend._durability == "normal":
                    conn.execute("SET synchronous_commit = off")
                if create_missing and not store_exists(conn, schema):
                    create(conn, schema, where=path)
            check_format(conn, schema, path)
            if not backend.read_only:
                problems = schema_problems(conn, schema)
                if problems:
                    raise StoreFormatError(
                        f"{path} was altered outside lifecycle-es, so it is not opened for writing: "
                        f"{'; '.join(problems[:5])}" + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
                        + "; audit it (lifecycle-es audit) and restore the store from a good copy")
    except BaseException:
        conn.close()
        raise
    return conn


def behind(backend: PostgresBackend, head_seq: int, why: str) -> StoreBehindSealError:
    """The error of a store found without the last event `backend` knows it held (see the module's docstring).

    Opened with durability ``"normal"`` (synchronous_commit off), a server crash losing the last commits it
    acknowledged is what the handle accepted, not a fault: the message says so, and how to go on."""
    known = backend._known[0]
    lost = f"{why}: the store in {backend.path} no longer holds seq {known} as this handle committed or read it"
    if backend._durability == "normal":
        message = (
            f"{lost}: this handle had the log up to seq {known}, and the server's head is seq {head_seq}. It was "
            "opened with durability='normal' (synchronous_commit off), under which commits the server acknowledged "
            "can be lost by a server crash: most likely the server crashed and lost them (else an older copy was "
            "restored, or a replica that had not received them took over). Nothing more is written through this "
            f"handle: reopen the store to go on from the server's head (seq {head_seq}), or open it with "
            "durability='full' so that no commit the server acknowledged can be lost")
    else:
        message = (
            f"{lost} (its head is seq {head_seq}), so the server lost or rewrote events (a restore of an older copy, "
            "or a failover to a replica that had not received them). Nothing more is written through this handle: "
            "find the copy that holds the missing events, then reopen the store")
    return StoreBehindSealError(message, sealed_seq=known, head_seq=head_seq)


def check_head(backend: PostgresBackend, seq: int, digest: bytes | None) -> None:
    """Inside a write transaction, with the head table locked: StoreBehindSealError when the head (`seq`,
    `digest`) is behind the last event `backend` knows the log held, or at its seq with another hash; else
    the head becomes the known event."""
    known_seq, known_hash = backend._known
    if seq > known_seq:
        backend._known = (seq, digest)
    elif seq < known_seq or digest != known_hash:
        raise behind(backend, seq, "the store moved back under this handle's connection")


def reconnect(backend: PostgresBackend) -> tuple[int, int]:
    """Replace `backend`'s lost connection (the server closed it: a restart, a failover, an administrator)
    with a new one, once that one proves to reach the same store holding what `backend` knows it held;
    return the store's identity. A failed proof fences the handle: this and every later call raise."""
    if backend._gone is not None:
        raise StoreFencedError(backend._gone)
    backend._drop_listener()
    try:
        conn = open_connection(backend, create_missing=False)
    except StoreFormatError as exc:
        raise _gone(backend, StoreFencedError(
            f"the store in {backend.path} is not the one this handle opened ({exc}): reopen it")) from None
    try:
        identity = backend._identity(conn)
        if identity[0] != backend.identity[0]:
            raise _gone(backend, StoreFencedError(
                f"{backend.path} reconnected to another cluster (system identifier {identity[0]}, not "
                f"{backend.identity[0]}): a failover or a restore onto another server may have lost events this "
                "handle committed, so nothing more is written through it; check the new server's copy, then "
                "reopen the store"))
        if identity[1] != backend.identity[1]:
            raise _gone(backend, StoreFencedError(
                f"the store in {backend.path} is not the one this handle opened (another store id): reopen it"))
        _check_known(backend, conn)
    except BaseException:
        conn.close()
        raise
    with contextlib.suppress(psycopg.Error):
        backend.conn.close()
    backend.conn = conn
    return identity


def _check_known(backend: PostgresBackend, conn: psycopg.Connection[Any]) -> None:
    """StoreBehindSealError unless the store behind `conn` holds the last event `backend` knows it held."""
    seq, digest = backend._known
    if not seq:
        return
    with translated("read the store after a reconnect", backend.path):
        row = conn.execute(backend._sql.hash_at, (seq,)).fetchone()
        if row is not None and bytes(row[0]) == digest:
            return
        head = conn.execute(backend._sql.head).fetchone()
    raise _gone(backend, behind(backend, int(head[0]) if head else 0, "after a reconnect"))


def _gone(backend: PostgresBackend, error: StoreFencedError | StoreBehindSealError) -> Exception:
    """`error`, remembered: every later call on `backend` raises StoreFencedError with its message."""
    backend._gone = error.cause if isinstance(error, StoreFencedError) else str(error)
    return error
