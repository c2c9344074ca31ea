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
An interrupt (a signal's exception: a KeyboardInterrupt, or what a Python signal handler raises, a SIGTERM
handler's SystemExit) raised while the main thread serves a batch is that thread's, where a signal lands: the
batch is rolled back, the writer raises it, and every other caller gets a StoreIOError saying nothing was
committed; during the commit itself, the outcome is unknown and the store is fenced. Any other exception a work
raises, one that is no Exception included (sys.exit(), GeneratorExit, asyncio.CancelledError), is its own
caller's, rolled back alone as a refusal is, whichever thread writes the batch. Two cannot be told from a signal's
when the main thread writes: a KeyboardInterrupt a work raises itself, and what a work raises by calling a signal
handler's function itself; both are taken for the main thread's.

A caller whose wait is interrupted (a signal's exception, KeyboardInterrupt, in the main thread) leaves
the queue, and its work never runs; when a writer had already taken it into a batch, its work may still
commit there, as a command whose reply was lost. Wherever such an interrupt lands in a writer's bookkeeping
(taking the lead, gathering, answering, handing the queue on), every other caller of its batch is answered and
the queue is handed on: a lost answer or a lost writer would leave the others waiting for ever. A second interrupt
(Ctrl-C pressed twice) that lands as the answering or the hand-on begins runs that step once more; only one
landing inside that second run is beyond it.

A batch holds at most `max_batch` callers. The writer lingers (up to `linger_ms`) for late arrivals
only while the store is busy: when the batch before it held more callers than are queued and ended
less than `linger_ms` ago. A store that was idle never lingers.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from . import forked
from .errors import InvalidInputError, StoreFencedError, StoreIOError
from .signals import handler_codes, signal_raised
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
        self._handing: _Caller | None = None  # the caller being handed the queue (see `_hand_on`)
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
        forks = forked.generation
        served = False
        try:
            with self._mutex:
                if not self._leading:
                    caller.lead = True  # before the flag: an interrupt between the two leaves nothing to hand on
                    self._leading = True
                else:
                    caller.wake = wake = threading.Lock()
                    wake.acquire()
                    self._queue.append(caller)
                    if self._wanted and len(self._queue) >= self._wanted:
                        self._arrived.notify()
            if not caller.lead:
                assert caller.wake is not None
                caller.wake.acquire()  # released when served, or when handed the queue
                served = not caller.lead
        except BaseException:
            # A signal's exception (KeyboardInterrupt) in this thread, the main one, wherever it landed here.
            if forked.generation == forks:
                self._withdraw(caller)
            raise
        if served:
            return caller.outcome()  # type: ignore[no-any-return]  # out of the try: a refusal withdraws nothing
        try:
            self._serve(caller)
        finally:
            # In a child forked inside a work the queue is the parent's, its mutex perhaps held by a thread the child
            # does not have: the store is fenced there, and nothing is handed on.
            if forked.generation == forks:
                try:
                    self._hand_on(caller)
                except BaseException:
                    self._hand_on(caller)  # an interrupt that landed as it began: the queue is handed on all the same
                    raise
        return caller.outcome()  # type: ignore[no-any-return]

    def _gather(self, batch: list[_Caller]) -> None:
        """Take the callers queued now (up to `max_batch`, lingering when busy) into `batch`, which holds the
        writer's own: each is in `batch` as soon as it left the queue, so that an interrupt cannot lose one."""
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
                batch.append(queue[0])
                queue.popleft()

    def _serve(self, first: _Caller) -> None:
        """Gather a batch after `first` (the writer's own), run every caller's work in one transaction and commit;
        every caller of the batch has its outcome and is woken after, even when an interrupt of this thread (a
        signal's exception, in the main thread) lands in the bookkeeping around the transaction."""
        batch = [first]
        woken = 1  # the callers of `batch` answered so far (the writer's own needs no waking)
        failure: BaseException | None = None
        committing = committed = False
        action = first.action
        try:
            self._gather(batch)
            store = self._store
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
                committed = True
            except BaseException as exc:
                failure = exc
            finally:
                self._writer = None
            if failure is not None:
                if len(batch) == 1:
                    batch[0].error = failure
                else:
                    shared = failure if isinstance(failure, Exception) else self._interrupted(action, failure,
                                                                                              committing)
                    for caller in batch:
                        if caller.error is None:
                            caller.error = shared
                            caller.shared = True
            self.batches += 1
            self.commands += len(batch)
            self._last_size = len(batch)
            while woken < len(batch):
                caller = batch[woken]
                if caller.wake is not None and not caller.lead:
                    caller.wake.release()
                woken += 1  # after: one released twice (an interrupt just before this) is released no more for it
        finally:
            if self._writer == threading.get_ident():
                self._writer = None  # set just before an interrupt kept the transaction from starting
            if woken < len(batch):
                # Inline, as the hand-on's: a function of its own would be one more place for a second interrupt.
                try:
                    self._answer_rest(batch[woken:], action, committed, committing, failure)
                except BaseException:
                    self._answer_rest(batch[woken:], action, committed, committing, failure)  # Ctrl-C twice
                    raise
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # an interrupt of the writer's own thread, after every caller was answered

    def _answer_rest(self, rest: list[_Caller], action: str, committed: bool, committing: bool,
                     failure: BaseException | None) -> None:
        """An interrupt of the writer's thread cut the batch's bookkeeping short: answer and wake the callers it
        had not (those whose work committed keep their outcomes; the others learn nothing of theirs committed, or,
        when it came during the commit, that the outcome is unknown)."""
        if not committed:
            error: BaseException = (self._interrupted(action, failure or KeyboardInterrupt(), committing)
                                    if failure is None or not isinstance(failure, Exception) else failure)
            for caller in rest:
                if caller.error is None:
                    caller.error, caller.shared, caller.value = error, True, None
        with self._mutex:  # one taken into the batch just before it left the queue (`_gather`) leaves it now
            for caller in rest:
                if caller in self._queue:
                    self._queue.remove(caller)
        for caller in rest:
            if caller.wake is not None and not caller.lead:
                with contextlib.suppress(RuntimeError):  # released already, just before the interrupt landed
                    caller.wake.release()

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
        main = threading.current_thread() is threading.main_thread()
        installed = handler_codes() if main else set()  # where a signal's exception may come from (`signal_raised`)
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
                if not isinstance(exc, Exception) and main and signal_raised(exc, installed):
                    raise  # a signal's, which lands in the main thread only: the writer's (`_interrupted`)
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
            self._hand_on(caller)

    def _hand_on(self, leader: _Caller) -> None:
        """`leader`'s batch is done: hand the queue to the first caller waiting in it, or stand down.

        Done so that a second call finishes what an interrupt (a signal's exception, landing where a C call
        returns) cut short, and does nothing once it is done: the caller handed the queue is named in
        `_handing` before it leaves the queue, and is woken last.
        """
        with self._mutex:
            following = self._handing
            if following is leader:  # handed the queue, it has led since: that hand-on was done
                following = self._handing = None
            if following is None:
                if not leader.lead:
                    return
                self._last_end = time.monotonic()
                if not self._queue:
                    leader.lead = False
                    self._leading = False
                    return
                following = self._queue[0]
                self._handing = following
                following.lead = True
                leader.lead = False
            if self._queue and self._queue[0] is following:
                self._queue.popleft()
            assert following.wake is not None
            with contextlib.suppress(RuntimeError):  # released already, by the hand-on an interrupt cut short
                following.wake.release()
            self._handing = None
