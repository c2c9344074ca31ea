"""How `lifecycle_es.aio` hands the store's threads' outcomes back to the event loop: the calls that end together
(a batch's commands) reach the loop in one wake-up, each outcome to its own await; a call that ends after its loop
closed is dropped quietly, and the store goes on serving another loop."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from holding import Held
from test_aio import COMMANDS, proxy, runner
from waiting import wait_for

from lifecycle_es import StaleFenceError, StoreError
from lifecycle_es.aio import AsyncEventStore
from lifecycle_es.testing import FakeClock

GUARD_S = 20


def test_a_batchs_outcomes_reach_the_loop_in_one_wake_up_each_to_its_own_await(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncEventStore.open(tmp_path / "events.db", now=FakeClock()) as store:
            runners = [runner(store, tmp_path, f"runner-{n:02d}") for n in range(COMMANDS)]
            await asyncio.gather(*(each.initialize() for each in runners))
            group = store.store.group_commit
            held = Held(store.store)
            # Every third command is refused by its runner's fence: refusals and receipts end in one batch.
            commands = [asyncio.ensure_future(each.acquire_lease(
                session_id=f"s-{n}", expected_generation=2 if n % 3 == 0 else 1, proxy_authority=proxy()))
                for n, each in enumerate(runners)]
            async with asyncio.timeout(GUARD_S):
                while group.queued < COMMANDS:
                    await asyncio.sleep(0.001)
            loop = asyncio.get_running_loop()
            wakes: list[Any] = []
            original = loop.call_soon_threadsafe

            def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
                wakes.append(callback)
                return original(callback, *args, **kwargs)

            loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
            try:
                held.gate.set()
                # The loop is kept busy here until every command's thread has handed its outcome over: none of
                # them can be delivered meanwhile, so all wait in one hand-over, which one wake-up delivers.
                replies = store._replies
                assert replies is not None
                assert wait_for(lambda: len(replies.ready) == COMMANDS, GUARD_S)
                outcomes = await asyncio.gather(*commands, return_exceptions=True)
            finally:
                loop.call_soon_threadsafe = original  # type: ignore[method-assign]
            held.release()
            assert len(wakes) == 1
            for n, outcome in enumerate(outcomes):
                if n % 3 == 0:
                    assert isinstance(outcome, StaleFenceError), (n, outcome)
                else:
                    assert not isinstance(outcome, BaseException), (n, outcome)
                    assert (outcome.runner_id, outcome.lease.session_id) == (f"runner-{n:02d}", f"s-{n}")
            assert (await store.verify()).events == COMMANDS + COMMANDS - len(range(0, COMMANDS, 3))

    asyncio.run(main())


def test_a_call_that_ends_after_its_loop_closed_is_dropped_and_the_store_serves_the_next_loop(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    entered, gate = threading.Event(), threading.Event()

    def blocking() -> str:
        entered.set()
        assert gate.wait(GUARD_S)
        return "late"

    async def first(store: AsyncEventStore) -> None:
        call = asyncio.ensure_future(store.run(blocking))
        async with asyncio.timeout(GUARD_S):
            while not entered.is_set():
                await asyncio.sleep(0.001)
        call.cancel()  # as asyncio.run does to a task left running when its loop ends

    async def second(store: AsyncEventStore) -> int:
        one = runner(store, tmp_path, "runner-1")
        await one.initialize()
        return (await store.head()).seq

    store = asyncio.run(AsyncEventStore.open(tmp_path / "events.db", now=FakeClock()))
    closed = False
    try:
        with caplog.at_level(logging.ERROR):
            asyncio.run(first(store))  # its loop is closed now, with `blocking` still in a thread
            late = store._replies
            assert late is not None
            assert asyncio.run(second(store)) == 1  # another loop, served while the first's call still runs
            gate.set()
            asyncio.run(store.close())  # returns once every call in flight has ended and handed its outcome over
            closed = True
        # The late outcome met its closed loop and was dropped, not kept nor raised into the thread pool's log.
        assert late.ready == []
        assert [record.getMessage() for record in caplog.records] == []
    finally:
        gate.set()
        if not closed:
            asyncio.run(store.close())


def test_a_call_that_meets_a_close_from_another_thread_raises_store_error(tmp_path: Path) -> None:
    # Another thread's loop closes the store between a call's check that it is open and its hand-off to the pool
    # (which `close` has shut down): the call's error is the closed store's, as the contract says.
    async def main() -> None:
        store = await AsyncEventStore.open(tmp_path / "events.db", now=FakeClock())
        pool = store._pool
        submit = pool.submit

        def closed_meanwhile(*args: Any, **kwargs: Any) -> Any:
            store._closed = True
            pool.shutdown()
            return submit(*args, **kwargs)

        pool.submit = closed_meanwhile  # type: ignore[method-assign]
        try:
            with pytest.raises(StoreError, match="was closed"):
                await store.head()
        finally:
            store.store.close()

    asyncio.run(main())
