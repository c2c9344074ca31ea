"""Group commit: the writes that threads make at the same time on one store share one transaction.

    store.commit("acquire_lease", lambda tx: tx.append(stream, events, expected_version=3))

A durable commit costs one fsync (on PostgreSQL a round trip and the commit under the head table's
lock), whatever it holds; so the commands that arrive while one commits wait, and the next writer
commits them all in one transaction. Leader and followers, as in PostgreSQL's WAL writer or
RocksDB's write groups: a caller that finds no writer becomes it and serves itself at once (a lone
command pays a lock and a flag, nothing more); a caller that finds one queues and sleeps. When a
batch is done, its writer wakes every caller it served and hands the queue to the first caller
waiting in it, which becomes the next writer.

In a batch of several, each caller's work runs under a savepoint, in arrival order: it decides
against a state that holds the writes of the ones before it (one connection reads its own writes),
and when it raises, its writes are rolled back alone and it gets its own error while the others go
on. Every caller returns only once the batch's commit is durable. When the commit fails, every
caller whose work had succeeded gets that failure (its own copy of it); a commit whose outcome is
unknown has fenced the store by then (`WriteTransaction`), exactly as a lone commit does. When the
database ends the transaction under a savepoint (a full disk, an I/O error), the whole batch fails.
An interrupt (an exception that is no Exception: KeyboardInterrupt, SystemExit) raised while the main
thread serves a batch is that thread's, where a signal lands: the batch is rolled back, the writer raises
it, and every other caller gets a StoreIOError saying nothing was committed; during the commit itself, the
outcome is unknown and the store is fenced. In any other thread no signal lands, so what a work raises
there, an exception that is no Exception included (sys.exit(), asyncio.CancelledError), is its own caller's,
rolled back alone as a refusal is.

A caller whose wait is interrupted (a signal's exception, KeyboardInterrupt, in the main thread) leaves
the queue, and its work never runs; when a writer had already taken it into a batch, its work may still
commit there, as a command whose reply was lost.

A batch holds at most `max_batch` callers. The writer lingers (up to `linger_ms`) for late arrivals
only while the store is busy: when the batch before it held more callers than are queued and ended
less than `linger_ms` ago. A store that was idle never lingers.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from . import forked
from .errors import InvalidInputError, StoreFencedError, StoreIOError
from .transaction import interrupted_commit
from .values import MAX_ACTION_CHARS, safe_action, safe_callable, safe_id, safe_int, safe_number

if TYPE_CHECKING:
    from .store import EventStore, WriteTransaction

T = TypeVar("T")

DEFAULT_MAX_BATCH = 64
DEFAULT_LINGER_MS = 1.0


_DONE = frozenset({type(None), tuple, list, dict, int, str, bytes, bool})


def worked(work: Callable[[WriteTransaction], T], tx: WriteTransaction) -> T:
    """`work(tx)`, or InvalidInputError("work") when it returned work left undone: a coroutine or another
    awaitable, a generator or another iterator (what an ``async def`` or a ``yield`` makes, or a lazy read) would
    run after its transaction ended, if at all. Raised inside the transaction, so what `work` wrote rolls back."""
    value = work(tx)
    if type(value) in _DONE:  # what commands return: no ABC walk on the hot path
        return value
    if isinstance(value, Iterator | AsyncIterator) or inspect.isawaitable(value):
        if inspect.iscoroutine(value) or inspect.isgenerator(value):
            value.close()  # never run: no warning that it was never awaited, no body left suspended
        raise InvalidInputError("work", f"work must do its work when called and return its result, not a "
                                        f"{type(value).__name__}: a coroutine or an iterator would run after its "
                                        "transaction ended (pass a plain function; read into a list inside it)")
    return value


class _Caller:
    """One caller's work, and what became of it."""

    __slots__ = ("action", "error", "lead", "shared", "stream", "value", "wake", "work")

    def __init__(self, action: str, work: Callable[[WriteTransaction], Any], stream: str | None) -> None:
        self.action = action
        self.work = work
        self.stream = stream
        self.value: Any = None
        self.error: BaseException | None = None
        self.shared = False  # the error is the batch's, not this caller's own
        self.lead = False
        self.wake: threading.Lock | None = None

    def outcome(self) -> Any:
        error = self.error
        if error is None:
            return self.value
        if not self.shared:
            raise error
        # Each caller raises its own copy: one exception raised in many threads would share a traceback.
        raise _copy(error) from error


def _copy(error: BaseException) -> BaseException:
    """The same exception as a new object: its args and fields, without running its ``__init__`` again
    (which would wrap a message already made, as StoreFencedError's does)."""
    kind = type(error)
    try:
        clone = kind.__new__(kind, *error.args)
        clone.__dict__.update(error.__dict__)
    except Exception:  # an exception that cannot be made so: raise the one there is
        return error
    return clone


def _batch_name(first: str, size: int) -> str:
    """The name of a batch's transaction: its first command's, cut to leave room for its size within the bound
    on a name (a name the store takes for one command must not fail a batch of them)."""
    suffix = f" (a batch of {size})"
    return first[:MAX_ACTION_CHARS - len(suffix)] + suffix


class GroupCommit:
    """The leader/follower queue of one store's writes (see the module docstring); `EventStore.commit` uses it.

    `batches` and `commands` count what it committed (batches of one included), for metrics and tests.
    """

    def __init__(self, store: EventStore, *, max_batch: int = DEFAULT_MAX_BATCH,
                 linger_ms: float = DEFAULT_LINGER_MS) -> None:
        self._store = store
        self._mutex = threading.Lock()
        self._arrived = threading.Condition(self._mutex)
        self._queue: deque[_Caller] = deque()
        self._leading = False  # a writer is serving a batch (or handing the queue on)
        self._writer: int | None = None  # the thread id of the writer while its transaction is open
        self._wanted = 0  # how many queued callers a lingering writer waits for (0: none lingers)
        self._last_size = 0
        self._last_end = 0.0
        self.max_batch = DEFAULT_MAX_BATCH
        self.linger_ms = DEFAULT_LINGER_MS
        self.tune(max_batch=max_batch, linger_ms=linger_ms)
        self.batches = 0
        self.commands = 0

    def __repr__(self) -> str:
        return (f"GroupCommit({len(self._queue)} queued, {'writing' if self._leading else 'idle'}, "
                f"{self.commands} commands in {self.batches} batches)")

    def tune(self, *, max_batch: int | None = None, linger_ms: float | None = None) -> None:
        """Set the most callers a batch holds (1..4096; 1 turns grouping off) and the longest a writer waits
        for late arrivals while the store is busy (0..100 ms; 0: never). A refused value changes neither."""
        batch = safe_int(max_batch, "max_batch", 1, 4096) if max_batch is not None else self.max_batch
        linger = safe_number(linger_ms, "linger_ms", 0, 100) if linger_ms is not None else self.linger_ms
        self.max_batch, self.linger_ms = batch, linger

    @property
    def queued(self) -> int:
        """How many callers wait for a writer now."""
        return len(self._queue)

    def run(self, action: str, work: Callable[[WriteTransaction], T], stream: str | None = None) -> T:
        """`work(tx)` in a transaction shared with the callers of the same moment; its result once durable.
        `stream`: the stream `work` reads and appends to, if it is one (its tail is read with the lock).
        InvalidInputError, before anything runs, for an `action` that is no name of 1..256 characters, a `work` that
        is not callable, a `stream` that is no id (and, from inside the transaction, for a `work` that returns a
        coroutine or an iterator: see `worked`)."""
        safe_action(action)
        safe_callable(work, "work", "the write transaction")
        if stream is not None:
            safe_id(stream, "stream")
        if self._writer == threading.get_ident() or self._store.lock._is_owned():  # type: ignore[attr-defined]
            # A write from a thread that holds the store's lock (in a batch's work, a transaction of its own, a
            # `with store.lock` block): queued, it would wait for a writer that waits for that lock, or for
            # the very batch it is part of. So it is a transaction of its own at once, which the backend
            # refuses as nested when one is open, as it always has.
            with self._store.transaction(action) as tx:
                return worked(work, tx)
        caller = _Caller(action, work, stream)
        with self._mutex:
            lead = not self._leading
            if lead:
                self._leading = True
            else:
                caller.wake = wake = threading.Lock()
                wake.acquire()
                self._queue.append(caller)
                if self._wanted and len(self._queue) >= self._wanted:
                    self._arrived.notify()
        if not lead:
            assert caller.wake is not None
            try:
                caller.wake.acquire()  # released when served, or when handed the queue
            except BaseException:
                self._withdraw(caller)  # a signal's exception (KeyboardInterrupt) in the waiting thread
                raise
            if not caller.lead:
                return caller.outcome()  # type: ignore[no-any-return]
        try:
            self._serve(self._gather(caller))
        finally:
            self._hand_on()
        return caller.outcome()  # type: ignore[no-any-return]

    def _gather(self, first: _Caller) -> list[_Caller]:
        batch = [first]
        limit = self.max_batch
        with self._mutex:
            queue = self._queue
            wanted = min(self._last_size, limit) - 1
            if (self.linger_ms > 0 and len(queue) < wanted
                    and time.monotonic() - self._last_end < self.linger_ms / 1000):
                # Busy: the callers of the last batch are coming back; wait a moment for them.
                deadline = time.monotonic() + self.linger_ms / 1000
                self._wanted = wanted
                while len(queue) < wanted:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._arrived.wait(left)
                self._wanted = 0
            while queue and len(batch) < limit:
                batch.append(queue.popleft())
        return batch

    def _serve(self, batch: list[_Caller]) -> None:
        """Run every caller's work in one transaction and commit; every caller of `batch` has its outcome after."""
        store = self._store
        failure: BaseException | None = None
        committing = False
        self._writer = threading.get_ident()
        action = batch[0].action if len(batch) == 1 else _batch_name(batch[0].action, len(batch))
        try:
            streams = [caller.stream for caller in batch if caller.stream is not None]
            with store.transaction(action, streams=streams) as tx:
                if len(batch) == 1:
                    batch[0].value = worked(batch[0].work, tx)  # alone: its error rolls back the transaction
                else:
                    self._each(tx, batch)
                committing = True  # what fails from here on fails the commit
        except BaseException as exc:
            failure = exc
        finally:
            self._writer = None
        if failure is not None:
            if len(batch) == 1:
                batch[0].error = failure
            else:
                shared = failure if isinstance(failure, Exception) else self._interrupted(action, failure, committing)
                for caller in batch:
                    if caller.error is None:
                        caller.error = shared
                        caller.shared = True
        self.batches += 1
        self.commands += len(batch)
        self._last_size = len(batch)
        for caller in batch:
            if caller.wake is not None and not caller.lead:
                caller.wake.release()
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # an interrupt of the writer's own thread, after every caller was answered

    def _interrupted(self, action: str, interrupt: BaseException, committing: bool) -> StoreIOError:
        """The error of the other callers of a batch that an interrupt (KeyboardInterrupt, SystemExit) ended in
        the writer's thread: the interrupt is that thread's, and would end theirs if raised there."""
        name = type(interrupt).__name__
        if not committing:
            return StoreIOError(f"{action}: the thread writing the batch was interrupted ({name}) before its commit, "
                                "so the batch was rolled back: nothing of it was committed")
        # Fenced already when the interrupt came out of the COMMIT (`WriteTransaction`); not when it landed just
        # after, where the others cannot tell either.
        cause = interrupted_commit(action, interrupt)
        self._store.fence(cause)
        return StoreIOError(cause, outcome_unknown=True)

    def _each(self, tx: WriteTransaction, batch: list[_Caller]) -> None:
        backend = self._store.backend
        forks = forked.generation
        for caller in batch:
            savepoint = backend.savepoint(caller.action)
            try:
                savepoint.__enter__()
                try:
                    caller.value = worked(caller.work, tx)
                except BaseException as exc:
                    if forked.generation != forks:
                        raise  # forked inside the work: this is the child, whose connection is the parent's
                    savepoint.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                if forked.generation != forks:
                    raise StoreFencedError(self._store.fenced or "this process was forked inside the batch")
                savepoint.__exit__(None, None, None)
            except BaseException as exc:
                if forked.generation != forks:
                    raise  # the batch ends here in the child, its transaction left alone (`WriteTransaction`)
                if not isinstance(exc, Exception) and threading.current_thread() is threading.main_thread():
                    raise  # may be a signal's, which lands in the main thread only: the writer's (`_interrupted`)
                caller.error = exc
                self._store._rollbacks += 1  # its writes are undone: what a projector kept of them is stale
                if savepoint.lost:
                    raise  # the transaction is gone: every other caller fails with this
                caller.value = None

    def _withdraw(self, caller: _Caller) -> None:
        """`caller` stopped waiting: out of the queue if it is still there (its work never runs); the queue
        handed on if it had been handed it; else its work is in a batch, and may commit with it."""
        with self._mutex:
            if caller in self._queue:
                self._queue.remove(caller)
                return
        if caller.lead:
            self._hand_on()

    def _hand_on(self) -> None:
        """The batch is done: hand the queue to the first caller waiting in it, or stand down."""
        with self._mutex:
            self._last_end = time.monotonic()
            if self._queue:
                following = self._queue.popleft()
                following.lead = True
                assert following.wake is not None
                following.wake.release()
            else:
                self._leading = False
