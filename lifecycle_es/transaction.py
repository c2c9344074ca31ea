"""`WriteTransaction`: the write side's unit of work on an `EventStore` (``EventStore.transaction``, and each
batch of ``EventStore.commit``'s group commit).

    with store.transaction("acquire_lease") as tx:
        version = tx.stream_version("runner-1")      # read under the write lock
        tx.append_unchecked("runner-1", events, expected_version=version)

It holds the store's connection lock and the backend's write transaction from its first statement to
the commit: decisions read state under the lock, then append, all committed together or not at all. A
commit whose outcome is unknown (a failed fsync, a connection lost at COMMIT, the store's files changed
while it committed, Ctrl-C's KeyboardInterrupt while COMMIT ran) fences the store, so nothing is retried
onto a log the disk may not hold.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import forked
from .backend import HostLeaseRow
from .errors import InvalidInputError, StoreBehindSealError, StoreError, StoreFencedError, StoreIOError
from .events import Event, safe_holder
from .log import RecordedEvent
from .values import not_plain, safe_action, safe_id, safe_int

if TYPE_CHECKING:
    from .store import EventStore


def interrupted_commit(action: str, interrupt: BaseException) -> str:
    """The fence's cause when an interrupt (KeyboardInterrupt, SystemExit) ended a COMMIT under way, a lone
    command's or a batch's: no one knows whether it landed, and a retry could append the same facts twice."""
    return (f"commit outcome unknown ({action}: its COMMIT was interrupted by {type(interrupt).__name__}, so whether "
            "it landed is not known): reopen the store to learn whether it landed")


class _Fencing:
    """A backend's write transaction that checks the store's identity (and that its head is not behind what
    the handle knew) as it begins: its StoreFencedError, or StoreBehindSealError, fences the store, as
    `EventStore._write`'s own check does."""

    __slots__ = ("forks", "inner", "store")

    def __init__(self, store: EventStore, inner: Any) -> None:
        self.store = store
        self.inner = inner
        self.forks = forked.generation

    def __enter__(self) -> Any:
        try:
            return self.inner.__enter__()
        except StoreFencedError as exc:
            raise self.store._fenced_by(exc) from None
        except StoreBehindSealError as exc:
            self.store.fence(str(exc))
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Any:
        if forked.generation != self.forks:
            # A child forked inside the transaction, unwinding through it: its ROLLBACK or COMMIT would run on
            # the parent's connection (on a server, ending the parent's transaction under it). Left alone.
            if kind is None:
                raise StoreFencedError(self.store._fence or "this process was forked inside the transaction")
            return False
        return self.inner.__exit__(kind, exc, tb)


class WriteTransaction:
    """The write side's unit of work, from `EventStore.transaction`: decisions read state under the lock
    (`stream_version`, `read_stream`, `head_at`), then append, all committed together or not at all."""

    __slots__ = ("_action", "_context", "_held", "_store", "_streams", "_thread")

    def __init__(self, store: EventStore, action: str, streams: Sequence[str] = ()) -> None:
        self._store = store
        self._action = safe_action(action)
        # A list or tuple: a str is a sequence of its characters, and any other iterable may be read once only.
        if type(streams) is not list and type(streams) is not tuple:
            raise not_plain(streams, "streams") or InvalidInputError(
                "streams", f"streams is invalid: a {type(streams).__name__} is not a list of stream ids")
        for stream in streams:
            safe_id(stream, "streams")
        self._streams = streams
        self._context: Any = None
        self._thread: int | None = None  # the thread that holds it open, while it is open

    def __enter__(self) -> WriteTransaction:
        store = self._store
        lock = store._lock
        lock.acquire()
        outer = store._write_busy  # this thread's own transaction is open: this one is refused as nested
        try:
            self._context = context = store._write(self._action, self._streams)
            store._write_busy = True  # from before BEGIN to after COMMIT: what a fork asks (`forked.written_at_fork`)
            context.__enter__()
            self._thread = store._writing = threading.get_ident()
            self._held = lock  # released at the end, even in a child forked meanwhile (whose store has its own)
        except BaseException as exc:
            if not outer:
                # An interrupt (Ctrl-C) may land after BEGIN took the write lock and before the block began: what
                # began is rolled back, or the lock would stay held by a connection nothing ends a transaction of.
                self._abandon(exc)
                store._write_busy = False
            lock.release()
            raise
        return self

    def _abandon(self, exc: BaseException) -> None:
        """Roll back whatever the backend's transaction began before `exc` cut its start short (nothing, when it
        began nothing); a failure to is no more than `exc`, which is raised."""
        context = self._context
        self._thread = self._store._writing = None
        if context is not None:
            with contextlib.suppress(BaseException):
                context.__exit__(type(exc), exc, exc.__traceback__)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Any:
        store = self._store
        self._thread = store._writing = None
        committed = False
        try:
            result = self._context.__exit__(kind, exc, tb)
            if kind is None:
                store._local_commits += 1
                committed = True
            return result
        except StoreIOError as error:
            if error.outcome_unknown:
                # A retry could append the same facts twice, or chain onto a batch the disk lost.
                store.fence(f"commit outcome unknown ({error}): reopen the store to learn whether it landed")
            raise
        except BaseException as error:
            if kind is None and not isinstance(error, Exception):
                # An interrupt (a signal's KeyboardInterrupt) while the COMMIT ran: it may have landed or not.
                store.fence(interrupted_commit(self._action, error))
            raise
        finally:
            store._write_busy = False
            if not committed:
                store._rollbacks += 1
            self._held.release()

    @property
    def store(self) -> EventStore:
        """The store this transaction writes to."""
        return self._store

    def _open(self) -> EventStore:
        """The store, when this transaction is open in the calling thread; else StoreError."""
        if self._thread != threading.get_ident():
            # Kept past its block (returned by a commit's work, or an async function's coroutine run later)
            # or handed to another thread, it would write outside any transaction, or inside another's,
            # without the lock.
            raise StoreError(f"{self._action}: this write transaction is not open in this thread (it ended, or "
                             "another thread holds it): use it only inside its with block or the work it was "
                             "given to, in that thread")
        return self._store

    def head_at(self) -> str | None:
        """The head's at as of this transaction (None for an empty log): the earliest an event may be stamped.

        Read under the lock, and without a query after `stream_version` read the tail.
        """
        return self._open()._backend.head_at()

    def stream_version(self, stream: str) -> int:
        """The stream's version as of this transaction (read under the lock)."""
        # The tail, not the version alone: an append that follows in this transaction reuses the read.
        return self._open()._backend.tail(safe_id(stream, "stream"))[0]

    def read_stream(self, stream: str, *, after_version: int = 0) -> Iterable[RecordedEvent]:
        """The stream's events after a version, as of this transaction."""
        return self._open().read_stream(stream, after_version=after_version)

    def host_lease(self, stream: str) -> HostLeaseRow | None:
        """The runner's host lease row as of this transaction (read under the lock; see `lifecycle_es.host_lease`)."""
        return self._open()._backend.host_lease(safe_id(stream, "stream"))

    def lease_clock(self, now_ms: int) -> int:
        """The time host leases are judged at in this transaction: the database's clock where it has one (a
        server), else `now_ms` (the time the transaction stamps)."""
        safe_int(now_ms, "now_ms")
        database = self._open()._backend.clock_ms()
        return now_ms if database is None else database

    def put_host_lease(self, stream: str, holder: str, token: int, expires_ms: int) -> None:
        """Write the runner's host lease row in this transaction (a renewal is no event)."""
        store = self._open()
        store._backend.put_host_lease(safe_id(stream, "stream"), safe_holder(holder), safe_int(token, "token"),
                                      safe_int(expires_ms, "expires_ms"))

    def append(self, stream: str, events: Sequence[Event], *, expected_version: int | None = None,
               at: str | None = None) -> list[RecordedEvent]:
        """`EventStore.append` inside this transaction (it commits when the `with` block ends without error)."""
        return self._open()._append(stream, events, expected_version, at, checked=True)

    def append_unchecked(self, stream: str, events: Sequence[Event], *, expected_version: int | None = None,
                         at: str | None = None) -> list[RecordedEvent]:
        """`EventStore.append_unchecked` inside this transaction; also the path of a caller that has already
        decided its events through the rules under this transaction's lock (`RunnerLifecycle`)."""
        return self._open()._append(stream, events, expected_version, at, checked=False)
