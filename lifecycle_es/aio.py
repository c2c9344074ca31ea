"""The event store and the runner lifecycle for asyncio programs: the same API, awaited.

    from lifecycle_es.aio import AsyncEventStore, AsyncRunnerLifecycle

    async with await AsyncEventStore.open("runners.db") as store:
        runner = AsyncRunnerLifecycle(store, runner_id="runner-1", target="local", base_dir="/srv/runner",
                                      resources=resources, post_session_hook_digest=digest)
        await runner.initialize()
        receipt = await runner.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy)
        async for event in store.follow(after=0):
            ...

The event loop never waits on the disk or on a lock: every call that reads or writes runs in a
thread of the store's own pool (`threads` of them, 64 by default: the default executor's handful
would cap how many commands can wait for one commit), and the commands of concurrent tasks meet in
the store's group commit, so 64 tasks' commands share a few transactions, not 64 fsyncs in a row;
the outcomes of calls that end together (a batch's commands) reach the loop in one wake-up.
Arguments are checked as the synchronous API checks them, with the same errors, raised from the
await. A cancelled await does not stop a command already running in a thread: it may still commit,
as a command whose reply was lost would; one still waiting for a free thread never runs. In a process
forked from the one that opened it, the store gets threads of its own, and every call raises its fence.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from . import following
from .backend import PAGE_ROWS
from .errors import InvalidInputError, StoreError
from .events import Event
from .host_fence import HostLeaseGrant
from .lifecycle import RunnerLifecycle
from .log import Head, RecordedEvent, VerifyReport
from .seal import Seal
from .store import EventStore, WriteTransaction
from .values import safe_callable, safe_int

if TYPE_CHECKING:
    from .checkpoints import Checkpoint
    from .signing import Signer

__all__ = ["DEFAULT_THREADS", "AsyncEventStore", "AsyncRunnerLifecycle"]

T = TypeVar("T")
P = ParamSpec("P")

DEFAULT_THREADS = 64
"""How many threads an `AsyncEventStore` runs blocking calls in: at most this many commands wait for one commit."""


class AsyncEventStore:
    """An `EventStore` whose reads and writes are awaited; open it with `AsyncEventStore.open`.

    `store` is the synchronous store underneath (its `group_commit`, its `lock`); using it from the
    loop's thread would block the loop.
    """

    def __init__(self, store: EventStore, *, threads: int = DEFAULT_THREADS) -> None:
        if not isinstance(store, EventStore):
            raise InvalidInputError("store", f"store must be an EventStore, got {type(store).__name__}")
        self.store = store
        self._closed = False
        self._threads = safe_int(threads, "threads", 1, 1024)
        self._pool = self._new_pool()
        self._replies: _Replies | None = None
        _OPEN.add(self)

    @classmethod
    async def open(cls, path: Any, *, threads: int = DEFAULT_THREADS, **options: Any) -> AsyncEventStore:
        """`EventStore.open(path, **options)` in a thread (opening reads and may create the file)."""
        safe_int(threads, "threads", 1, 1024)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lifecycle-es-open")
        opening = _Opening(path, options)
        try:
            store = await asyncio.get_running_loop().run_in_executor(pool, opening.open)
        except asyncio.CancelledError:
            # The open may go on in its thread; what it opens reaches no one, so it is closed there, after it.
            pool.submit(opening.abandon)
            raise
        finally:
            pool.shutdown(wait=False)
        return cls(store, threads=threads)

    def __repr__(self) -> str:
        return f"Async{self.store!r}"

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="lifecycle-es")

    async def __aenter__(self) -> AsyncEventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`call(*args, **kwargs)` in one of the store's threads: any blocking work on the store, awaited.

        Once `close` has begun, StoreError (as the synchronous store raises once closed).
        """
        safe_callable(call, "call", "the arguments given")
        if self._closed:
            # The pool is shut down: its RuntimeError would be no LifecycleError, and say nothing of the store.
            raise StoreError(f"the store {self.store.path!r} was closed: open it again to use it")
        loop = asyncio.get_running_loop()
        replies = self._replies
        if replies is None or replies.loop is not loop:
            replies = self._replies = _Replies(loop)
        try:
            done = self._pool.submit(_called, call, args, kwargs)
        except RuntimeError:
            if not self._closed:
                raise
            # Closed from another thread or loop between the check above and here: the pool is shut down.
            raise StoreError(f"the store {self.store.path!r} was closed: open it again to use it") from None
        reply: asyncio.Future[T] = loop.create_future()
        done.add_done_callback(lambda _: replies.put(reply, done))
        try:
            return await reply
        except asyncio.CancelledError:
            done.cancel()  # a call still waiting for a thread never runs; one running goes on
            raise

    async def close(self) -> None:
        """Wait for the calls in flight, then close the store (in a thread); later calls raise StoreError.

        A cancelled close still closes the store, in its thread, once the calls in flight have ended."""
        self._closed = True
        # Shielded: cancelling the executor's future before a thread took it up would drop the close.
        await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, self._close))

    def _close(self) -> None:
        # One call: were the store's close a second await, a task cancelled in the first would never close it.
        self._pool.shutdown()
        self.store.close()

    # --- writing ---------------------------------------------------------------------------------------

    async def append(self, stream: str, events: Sequence[Event], *, expected_version: int | None = None,
                     at: str | None = None) -> list[RecordedEvent]:
        """`EventStore.append`, awaited (in a batch with the other tasks' writes)."""
        return await self.run(self.store.append, stream, events, expected_version=expected_version, at=at)

    async def append_unchecked(self, stream: str, events: Sequence[Event], *, expected_version: int | None = None,
                               at: str | None = None) -> list[RecordedEvent]:
        """`EventStore.append_unchecked`, awaited."""
        return await self.run(self.store.append_unchecked, stream, events, expected_version=expected_version, at=at)

    async def commit(self, action: str, work: Callable[[WriteTransaction], T], *, stream: str | None = None) -> T:
        """`EventStore.commit`, awaited: `work` runs in the writer's thread, never on the loop.

        `work` is a plain function: an ``async def`` one is refused (InvalidInputError), since its body would run
        on the loop only when awaited, after its transaction ended.
        """
        if inspect.iscoroutinefunction(work):
            raise InvalidInputError("work", f"work must be a plain function that runs inside the transaction, not the "
                                            f"coroutine function {getattr(work, '__qualname__', type(work).__name__)}")
        return await self.run(self.store.commit, action, work, stream=stream)

    # --- reading ---------------------------------------------------------------------------------------

    async def head(self) -> Head:
        """`EventStore.head`, awaited."""
        return await self.run(self.store.head)

    async def stream_version(self, stream: str) -> int:
        """`EventStore.stream_version`, awaited."""
        return await self.run(self.store.stream_version, stream)

    async def streams(self) -> list[str]:
        """`EventStore.streams`, awaited."""
        return await self.run(self.store.streams)

    async def event_at(self, seq: int) -> RecordedEvent | None:
        """`EventStore.event_at`, awaited."""
        return await self.run(self.store.event_at, seq)

    async def verify(self, *, key: bytes | None = None, seal: str | os.PathLike[str] | None = None,
                     progress: Callable[[int], None] | None = None) -> VerifyReport:
        """`EventStore.verify`, awaited (it holds the connection for the whole walk: writes wait). `progress` is
        called in the store's thread, not on the loop."""
        return await self.run(self.store.verify, key=key, seal=seal, progress=progress)

    async def seal(self, path: str | os.PathLike[str] | None = None) -> Seal:
        """`EventStore.seal`, awaited."""
        return await self.run(self.store.seal, path)

    async def check_seal(self, path: str | os.PathLike[str], *, key: bytes | None = None) -> Seal:
        """`EventStore.check_seal`, awaited."""
        return await self.run(self.store.check_seal, path, key=key)

    async def checkpoint(self, signer: Signer, path: str | os.PathLike[str] | None = None) -> Checkpoint:
        """`EventStore.checkpoint`, awaited."""
        return await self.run(self.store.checkpoint, signer, path)

    async def schema_problems(self) -> list[str]:
        """`EventStore.schema_problems`, awaited."""
        return await self.run(self.store.schema_problems)

    @property
    def path(self) -> str:
        """`EventStore.path`: the store's file, or its server URL."""
        return self.store.path

    @property
    def keyed(self) -> bool:
        """`EventStore.keyed`."""
        return self.store.keyed

    @property
    def fenced(self) -> str | None:
        """`EventStore.fenced`: the fence's cause, or None."""
        return self.store.fenced

    def fence(self, cause: str) -> None:
        """`EventStore.fence` (no I/O): refuse every later write."""
        self.store.fence(cause)

    def read(self, *, after: int = 0, stream: str | None = None,
             limit: int | None = None) -> AsyncIterator[RecordedEvent]:
        """`EventStore.read` as an async iterator: each page is read in a thread. Arguments are checked here."""
        return self._pages(self.store.read(after=after, stream=stream, limit=limit))

    def read_stream(self, stream: str, *, after_version: int = 0) -> AsyncIterator[RecordedEvent]:
        """`EventStore.read_stream` as an async iterator."""
        return self._pages(iter(self.store.read_stream(stream, after_version=after_version)))

    async def _pages(self, events: Iterator[RecordedEvent]) -> AsyncIterator[RecordedEvent]:
        while True:
            page = await self.run(lambda: list(itertools.islice(events, PAGE_ROWS)))
            for recorded in page:
                yield recorded
            if len(page) < PAGE_ROWS:
                return

    def follow(self, *, after: int = 0, poll_interval: float = 0.05,
               stream: str | None = None) -> AsyncIterator[RecordedEvent]:
        """`EventStore.follow` as an async iterator: events after `after` as they commit, by any process.

        Each poll reads a page in a thread; between polls the task sleeps on the loop. It ends when the
        caller stops iterating (or cancels the task). Arguments are checked here, as `EventStore.follow`
        checks them; a log cut back under it raises IntegrityError, its file replaced StoreFencedError, as
        there (`EventStore.check_followed`). Unlike there, the head it holds to is read with its first page,
        in a thread, not at this call, which reads nothing on the loop: a log cut back and written again between
        the call and the first iteration is the log it follows.
        """
        following.checked(after, poll_interval, stream, None)  # no read here: the loop's thread never waits
        return self._follow(after, poll_interval, stream)

    async def _follow(self, last: int, poll_interval: float, stream: str | None) -> AsyncIterator[RecordedEvent]:
        # The highest seq the log is known to have held up to the follower's place (yielded, or held at its start):
        # a head found below it is a log cut back under the follower, even one that has yielded nothing yet.
        reached, reached_hash = await self.run(following.held, self.store, last)
        while True:
            page = await self.run(self._page, last, stream, reached, reached_hash)
            for recorded in page:
                last = reached = recorded.seq
                reached_hash = recorded.hash
                yield recorded
            if len(page) < PAGE_ROWS:
                await asyncio.sleep(poll_interval)

    def _page(self, after: int, stream: str | None, reached: int, reached_hash: bytes | None) -> list[RecordedEvent]:
        """The next page, once the log is found to hold what was yielded (`EventStore.check_followed`, whose check
        of its arguments is for a caller's: a hash the file holds is compared as it is, whatever its length)."""
        following.check_followed(self.store, reached, reached_hash)
        return list(self.store.read(after=after, stream=stream, limit=PAGE_ROWS))


class _Opening:
    """`EventStore.open(path, **options)` in a thread of its own, and the store it opened closed there after it,
    when the task that awaited it was cancelled meanwhile (`abandon`)."""

    def __init__(self, path: Any, options: dict[str, Any]) -> None:
        self.path = path
        self.options = options
        self.store: EventStore | None = None

    def open(self) -> EventStore:
        self.store = EventStore.open(self.path, **self.options)
        return self.store

    def abandon(self) -> None:
        if self.store is not None:
            self.store.close()


class _Replies:
    """What the store's threads hand back to one event loop: the outcomes of the calls that end together (a
    batch's commands do) reach the loop in one wake-up, not one each, which would take the GIL from the
    writer once per command. `put` runs in the thread that ran the call; the loop sets each awaited future."""

    __slots__ = ("lock", "loop", "ready")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()  # held for an append or a swap, never across a wait
        self.ready: list[tuple[asyncio.Future[Any], concurrent.futures.Future[Any]]] = []

    def put(self, reply: asyncio.Future[Any], done: concurrent.futures.Future[Any]) -> None:
        with self.lock:
            self.ready.append((reply, done))
            if len(self.ready) > 1:
                return  # a wake-up is on its way and hands this one over too
        try:
            self.loop.call_soon_threadsafe(self._hand_over)
        except RuntimeError:  # the loop is closed: no one awaits these any more
            with self.lock:
                self.ready.clear()

    def _hand_over(self) -> None:
        with self.lock:
            ready, self.ready = self.ready, []
        for reply, done in ready:
            if reply.done():
                continue  # its await was cancelled
            if done.cancelled():
                reply.cancel()
                continue
            error = done.exception()
            if error is None:
                reply.set_result(done.result())
            else:
                reply.set_exception(error)


def _called(call: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    """`call(*args, **kwargs)`, its StopIteration raised as a RuntimeError: asyncio refuses StopIteration into a
    future, which would then never end, and its await with it (as a generator turns one into RuntimeError)."""
    try:
        return call(*args, **kwargs)
    except StopIteration as exc:
        raise RuntimeError(f"{getattr(call, '__qualname__', type(call).__name__)} raised StopIteration, which "
                           "cannot end an await: catch it where it is raised (a next() on an empty "
                           "iterator, say)") from exc


_OPEN: weakref.WeakSet[AsyncEventStore] = weakref.WeakSet()


def _in_child() -> None:
    # A forked child has none of the parent's threads, but a pool still counts them as its own: with all of
    # them busy at the fork, a call queued there would wait for ever instead of reaching the store's fence.
    for store in list(_OPEN):
        store._pool = store._new_pool()
        store._replies = None  # its lock may have been held by a thread the child does not have


os.register_at_fork(after_in_child=_in_child)


def _awaited(method: Callable[Concatenate[RunnerLifecycle, P], T]
             ) -> Callable[Concatenate[AsyncRunnerLifecycle, P], Coroutine[Any, Any, T]]:
    """`AsyncRunnerLifecycle`'s form of a `RunnerLifecycle` command: the same parameters (typed, and shown by
    ``help()``), awaited, run in one of the store's threads."""
    name = method.__name__

    async def command(self: AsyncRunnerLifecycle, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.store.run(getattr(self.lifecycle, name), *args, **kwargs)

    command.__name__ = name
    command.__qualname__ = f"AsyncRunnerLifecycle.{name}"
    command.__doc__ = f"`RunnerLifecycle.{name}`, awaited."
    command.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return command


class AsyncRunnerLifecycle:
    """A `RunnerLifecycle` whose commands are awaited; it takes the same arguments, on an `AsyncEventStore`.

    `lifecycle` is the synchronous handle underneath. Each command runs in one of the store's threads,
    its preflight and its decision included, and commits in a batch with the other tasks' commands.
    """

    def __init__(self, store: AsyncEventStore, **options: Any) -> None:
        if not isinstance(store, AsyncEventStore):
            raise InvalidInputError("store", f"store must be an AsyncEventStore, got {type(store).__name__}")
        self.store = store
        self.lifecycle = RunnerLifecycle(store.store, **options)

    def __repr__(self) -> str:
        return f"Async{self.lifecycle!r}"

    @property
    def runner_id(self) -> str:
        """The runner's id (its stream)."""
        return self.lifecycle.runner_id

    initialize = _awaited(RunnerLifecycle.initialize)
    snapshot = _awaited(RunnerLifecycle.snapshot)
    state = _awaited(RunnerLifecycle.state)
    acquire_lease = _awaited(RunnerLifecycle.acquire_lease)
    assert_poll = _awaited(RunnerLifecycle.assert_poll)
    rotate_proxy_authority = _awaited(RunnerLifecycle.rotate_proxy_authority)
    refresh_lease_authority = _awaited(RunnerLifecycle.refresh_lease_authority)
    request_drain = _awaited(RunnerLifecycle.request_drain)
    settle_lease = _awaited(RunnerLifecycle.settle_lease)
    park_lease = _awaited(RunnerLifecycle.park_lease)
    park_expired_drain = _awaited(RunnerLifecycle.park_expired_drain)
    begin_reclaim = _awaited(RunnerLifecycle.begin_reclaim)
    complete_reclaim = _awaited(RunnerLifecycle.complete_reclaim)
    record_host_facts = _awaited(RunnerLifecycle.record_host_facts)
    take_host_lease = _awaited(RunnerLifecycle.take_host_lease)
    renew_host_lease = _awaited(RunnerLifecycle.renew_host_lease)
    release_host_lease = _awaited(RunnerLifecycle.release_host_lease)

    def hold_host_lease(self, grant: HostLeaseGrant | None) -> None:
        """`RunnerLifecycle.hold_host_lease` (no I/O: it only says which lease this handle writes under)."""
        self.lifecycle.hold_host_lease(grant)

    authorize_post_session_hook = _awaited(RunnerLifecycle.authorize_post_session_hook)
