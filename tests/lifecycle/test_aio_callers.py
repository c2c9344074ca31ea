"""`lifecycle_es.aio` as careless callers use it: a process forked while the store's threads are busy, tasks
cancelled while their commands wait, stores closed under them; on a real file and on a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from waiting import wait_child, wait_for

from lifecycle_es import EventStore, StoreError, StoreFencedError
from lifecycle_es.aio import AsyncEventStore
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.store import WriteTransaction

# How long a wait may take before the test calls it hung: a guard, not a timing assertion.
GUARD_S = 20


def test_a_child_forked_while_every_thread_of_the_store_is_busy_gets_the_fence_not_a_hang(store_target: str,
                                                                                         tmp_path: Path) -> None:
    # The pool's threads are the parent's: none runs in the child, yet the pool counts them, so a call queued
    # there would wait for ever instead of reaching the store's fence.
    entered, gate = threading.Event(), threading.Event()

    def held(tx: WriteTransaction) -> None:
        entered.set()
        assert gate.wait(GUARD_S)

    async def parent() -> int:
        store = await AsyncEventStore.open(store_target, threads=1)
        try:
            holding = asyncio.ensure_future(store.commit("held", held))
            assert await asyncio.to_thread(entered.wait, GUARD_S)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = asyncio.new_event_loop().run_until_complete(child(store))
                finally:
                    os._exit(code)
            gate.set()
            await holding
            await store.head()  # the parent's store goes on
            return await asyncio.to_thread(wait_child, pid)
        finally:
            gate.set()
            await store.close()

    async def child(store: AsyncEventStore) -> int:
        try:
            async with asyncio.timeout(GUARD_S):
                await store.head()
        except StoreFencedError as exc:
            return 0 if "forked" in str(exc) else 2
        except TimeoutError:
            return 3
        return 4

    assert asyncio.run(parent()) == 0


def test_a_close_whose_task_is_cancelled_still_closes_the_store_once_its_calls_end(store_target: str) -> None:
    # A task cancelled as it leaves ``async with`` (a task group's cancel, a timeout around the close) must not
    # leave the connection open for ever behind a store that already refuses every call.
    entered, gate = threading.Event(), threading.Event()

    def held(tx: WriteTransaction) -> str:
        entered.set()
        assert gate.wait(GUARD_S)
        return "committed"

    async def main() -> AsyncEventStore:
        store = await AsyncEventStore.open(store_target)
        holding = asyncio.ensure_future(store.commit("held", held))
        assert await asyncio.to_thread(entered.wait, GUARD_S)
        closing = asyncio.ensure_future(store.close())
        await asyncio.sleep(0)  # the close begins: it waits for the held call
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        gate.set()
        assert await holding == "committed"
        return store

    store = asyncio.run(main())  # which waits for the default executor's threads to end
    with pytest.raises(StoreError):
        store.store.head()


def test_a_closed_store_refuses_later_calls_and_never_opens_a_connection_again(store_target: str) -> None:
    # A server's handle reconnects when the server closed its connection; one its owner closed must stay
    # closed ("later calls fail"), or a store closed by `AsyncEventStore.close` would open a session again.
    store = EventStore.open(store_target)
    head = store.head()
    store.close()
    for call in (store.head, lambda: store.append_unchecked("other", [ReclaimCompleted(generation=2)])):
        with pytest.raises(StoreError, match="closed"):
            call()
    with EventStore.open(store_target) as reopened:
        assert reopened.head() == head


def test_a_call_that_raises_stop_iteration_fails_its_await_instead_of_hanging_it(store_target: str) -> None:
    # asyncio refuses StopIteration into a future (it would end a generator's frame): raised as is from the
    # thread, the await would never end. A work's stray next() on an empty iterator is a careless caller's bug.
    def stray_next(tx: WriteTransaction) -> None:
        tx.append_unchecked("other", [ReclaimCompleted(generation=2)])
        next(iter([]))

    async def main() -> None:
        async with await AsyncEventStore.open(store_target) as store:
            head = await store.head()
            async with asyncio.timeout(GUARD_S):  # a guard: the bug is an await that never ends
                with pytest.raises(RuntimeError, match="StopIteration") as raised:
                    await store.commit("stray", stray_next)
                assert type(raised.value.__cause__) is StopIteration
                with pytest.raises(RuntimeError, match="StopIteration"):
                    await store.run(next, iter([]))
            assert await store.head() == head  # its write rolled back
            assert await store.append_unchecked("other", [ReclaimCompleted(generation=2)])

    asyncio.run(main())


def test_a_store_opened_for_a_task_cancelled_meanwhile_is_closed_not_left_open(store_target: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # A timeout around the open (a slow server, a retry loop) must not leave a connection open per attempt.
    entered, gate = threading.Event(), threading.Event()
    opened: list[EventStore] = []
    real_open = EventStore.open

    def slow_open(path: str, **options: object) -> EventStore:
        entered.set()
        assert gate.wait(GUARD_S)
        opened.append(real_open(path, **options))  # type: ignore[arg-type]
        return opened[-1]

    monkeypatch.setattr(EventStore, "open", slow_open)

    async def main() -> None:
        opening = asyncio.ensure_future(AsyncEventStore.open(store_target))
        assert await asyncio.to_thread(entered.wait, GUARD_S)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        gate.set()

    asyncio.run(main())

    def closed() -> bool:
        if not opened:
            return False
        try:
            opened[0].head()
        except StoreError:
            return True
        return False

    assert wait_for(closed, GUARD_S)
