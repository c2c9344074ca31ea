"""The read side of `EventStore`: the log's events in pages, one event, the head, a stream's version, the
streams, a host lease, the schema's problems, and following the log as it grows (``following``).

    for recorded in store.read(stream="runner-1"):      # paged: memory stays flat however long the log
        print(recorded.seq, recorded.type)
    for recorded in store.follow(after=store.head().seq, stop=stop):
        ...

Every read takes the store's connection lock for one statement or one page, and gives it back between
pages: a reader never sees another thread's batch in flight, and never holds writers off for a whole
pass. `EventStore` has these methods, as `SqliteBackend` has `CacheTables`'.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from . import following
from .backend import MAX_FIELD_BYTES, Backend, HostLeaseRow, Row
from .errors import IntegrityError, InvalidInputError
from .log import Head, RecordedEvent
from .values import MAX_SAFE_INTEGER, safe_id, safe_int, shown

if TYPE_CHECKING:
    from .store import EventStore


class StoreReads:
    """The reads of a store holding one backend behind one lock (`EventStore` is one)."""

    _backend: Backend
    _lock: threading.RLock
    _genesis: bytes  # the head's hash of an empty log

    def read(self, *, after: int = 0, stream: str | None = None, limit: int | None = None) -> Iterator[RecordedEvent]:
        """Events with seq > `after`, in order, optionally of one stream, at most `limit`.

        Reads in pages, so memory stays flat however long the log, and no statement is left open
        between yields. Arguments are checked at the call, not at the first ``next()``.
        """
        safe_int(after, "after")
        if stream is not None:
            safe_id(stream, "stream")
        if limit is not None:
            safe_int(limit, "limit")
        return self._read_pages(after, stream, limit)

    def _read_pages(self, after: int, stream: str | None, limit: int | None) -> Iterator[RecordedEvent]:
        for rows in self.locked_pages(self._backend.pages(after=after, stream=stream, limit=limit)):
            for row in rows:
                yield recorded(row)

    def locked_pages(self, pages: Iterator[list[Row]]) -> Iterator[list[Row]]:
        """`pages` (the backend's paged reads), each page read under the store's lock and the lock released
        between pages: a reader never sees another thread's batch in flight, and never holds writers off
        for a whole pass."""
        lock = self._lock
        while True:
            with lock:
                rows = next(pages, None)
            if rows is None:
                return
            yield rows

    def read_stream(self, stream: str, *, after_version: int = 0) -> Iterator[RecordedEvent]:
        """One stream's events with version > `after_version`, in order, in pages."""
        safe_id(stream, "stream")
        safe_int(after_version, "after_version")
        return self._read_stream_pages(stream, after_version)

    def _read_stream_pages(self, stream: str, after_version: int) -> Iterator[RecordedEvent]:
        for rows in self.locked_pages(self._backend.stream_pages(stream, after_version=after_version)):
            for row in rows:
                yield recorded(row)

    def event_at(self, seq: int) -> RecordedEvent | None:
        """The event at `seq`, or None."""
        seq = safe_int(seq, "seq")
        with self._lock:
            row = self._backend.row_at(seq)
        return recorded(row) if row else None

    def head(self) -> Head:
        """The last event's seq, hash and at (seq 0 and the genesis link for an empty log)."""
        with self._lock:
            seq, digest, at = self._backend.head()
        if seq:
            counted(seq, seq, "seq")
        return Head(seq, digest if digest is not None else self._genesis, at)

    def stream_version(self, stream: str) -> int:
        """The last version of `stream` (0 when it has no events)."""
        stream = safe_id(stream, "stream")
        with self._lock:
            version = self._backend.stream_version(stream)
        return counted(version, None, "version", stream) if version else version

    def streams(self) -> list[str]:
        """Every stream id in the log, sorted."""
        with self._lock:
            return self._backend.streams()

    def host_lease(self, stream: str) -> HostLeaseRow | None:
        """The runner's host lease as stored, (holder, token, expires_ms by the store's clock), or None."""
        stream = safe_id(stream, "stream")
        with self._lock:
            return self._backend.host_lease(stream)

    def schema_problems(self) -> list[str]:
        """How the file's schema differs from what the store made (empty when exact).

        A writer's open refuses a file with any (StoreFormatError); a read-only open still opens it, so
        that the audit can report each: a trigger added (one that ignores inserts makes the store lose
        acknowledged writes), dropped or redefined, an index or view added, a constraint gone, a meta
        key the store never writes.
        """
        with self._lock:
            return self._backend.schema_problems()

    def follow(self, *, after: int = 0, poll_interval: float = 0.05, stream: str | None = None,
               stop: threading.Event | None = None) -> Iterator[RecordedEvent]:
        """Yield events after `after` as they are committed, by this or any other process.

        Change detection is the backend's data version (SQLite's ``PRAGMA data_version``, a server's head
        row: one cheap read per poll); the log is only read when it moved. Between polls it waits up to
        `poll_interval` (on a server, woken at once by an append's NOTIFY). Stops when `stop` is set, or
        when the caller stops iterating. A log cut back under the follower (its head found below a seq it
        yielded, or below `after` and the head as this call found it: rows deleted, an older copy put back)
        raises IntegrityError at the first seq gone; so does the event there found rewritten (the last one it
        yielded, or before that the one it started after); the store's files replaced underneath raise
        StoreFencedError (see `check_followed`). The head is read here, not at the first iteration: called
        in the read transaction its caller listed the log's tail in, it holds the follower to that tail.
        """
        last, interval, watched = following.checked(after, poll_interval, stream, stop)
        store = cast("EventStore", self)
        return following.follow_log(store, last, interval, stream, watched, held=following.held(store, last))

    def check_followed(self, reached: int, *, event_hash: bytes | None = None) -> None:
        """Check that the log still holds what a follower has yielded, up to seq `reached` (whose event's hash
        is `event_hash`, when given).

        Raises IntegrityError if the log's head is now below `reached` (events deleted, an older copy put
        back), naming the first seq gone, or if the event at `reached` no longer has `event_hash` (the log cut
        back and written again between two looks); StoreFencedError if the store's files changed underneath
        this handle (replaced, removed or cut short: it would go on reading a file no one writes), fencing the
        store. `follow` calls it before and after each read; so does any follower of its own (the ``aio``
        one). On a server the head's query and one lookup by seq are the check.
        """
        if event_hash is not None and (type(event_hash) is not bytes or len(event_hash) != 32):
            raise InvalidInputError("event_hash", f"event_hash is invalid: {shown(event_hash)} is not a 32-byte "
                                                  "hash (pass a RecordedEvent's hash, or None)")
        following.check_followed(cast("EventStore", self), safe_int(reached, "reached"), event_hash)


_COLUMNS = ("seq", "stream", "version", "type", "at", "body", "prev", "hash")


def recorded(row: Row) -> RecordedEvent:
    """The RecordedEvent of a row read from the log, or IntegrityError at its seq for a row no append writes: a
    column the backend read as NULL (longer than `MAX_FIELD_BYTES`: only the file's or table's writer makes one),
    a seq or version outside 1..2^53-1. What the chain check names in an audit, every other read names too,
    instead of passing the NULL on as a value (an export that writes it, a window that compares it)."""
    seq, version = row[0], row[2]
    # One test for the rows every append writes (a read yields each of them); the slow path names the fault.
    if type(seq) is int and type(version) is int and 0 < seq <= MAX_SAFE_INTEGER and 0 < version <= MAX_SAFE_INTEGER \
            and None not in row:
        return RecordedEvent(*row)
    if None in row:
        missing = _COLUMNS[row.index(None)]
        raise IntegrityError(row[0], f"its {missing} is longer than {MAX_FIELD_BYTES:,} bytes (edited outside the "
                                     "store): audit it (lifecycle-es audit)", stream=row[1])
    counted(row[0], row[0], "seq", row[1])
    counted(row[2], row[0], "version", row[1])
    return RecordedEvent(*row)


def counted(value: int, seq: int | None, column: str, stream: str | None = None) -> int:
    """`value`, a seq or version read from the log, or IntegrityError when it is outside 1..2^53-1 (no append
    writes one there; a reader would otherwise refuse it as an argument it was never given)."""
    if type(value) is not int or not 0 < value <= MAX_SAFE_INTEGER:
        raise IntegrityError(seq if seq is not None else 0, f"a {column} of {shown(value)} is outside "
                                                            f"1..{MAX_SAFE_INTEGER} (edited outside the store): "
                                                            "audit it (lifecycle-es audit)", stream=stream)
    return value
