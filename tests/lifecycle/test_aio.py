"""`lifecycle_es.aio` (issue 14): the lifecycle and the store awaited, with the event loop never blocked.

The loop's latency while 64 commands commit is tested structurally, not timed: the store's writer is
held inside a first command (`holding.Held`) while 64 tasks' commands queue behind it, and a heartbeat
task must keep ticking the whole time; were any command's I/O or lock wait on the loop's thread, the
heartbeat would stop with it and the test would fail at its guard. Every statement the backend runs
is recorded with its thread: none runs on the loop's. Then the gate opens and all 64 commit, in
fewer batches than commands.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import pytest
from holding import Held

import lifecycle_es
from lifecycle_es import (
    EventStore,
    IntegrityError,
    InvalidInputError,
    RecordedEvent,
    StaleFenceError,
    StoreError,
    StoreFencedError,
)
from lifecycle_es.aio import AsyncEventStore, AsyncRunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS, FakeClock, SequentialIds
from lifecycle_es.values import ProxyAuthority

COMMANDS = 64
HOUR = 3_600_000
# How long a wait may take before the test calls it hung: a guard, not a timing assertion.
GUARD_S = 60


def proxy() -> ProxyAuthority:
    return ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(START_MS), expires_at=iso_ms(START_MS + HOUR))


def runner(store: AsyncEventStore, tmp_path: Path, runner_id: str) -> AsyncRunnerLifecycle:
    base_dir = tmp_path / "base" / runner_id
    base_dir.mkdir(parents=True, exist_ok=True)
    return AsyncRunnerLifecycle(store, **{**RUNNER_DEFAULTS, "runner_id": runner_id}, base_dir=str(base_dir),
                                now=FakeClock(), random_id=SequentialIds())


class Heartbeat:
    """A task that ticks every millisecond of the loop's time, for as long as the loop is free to run it."""

    def __init__(self) -> None:
        self.ticks = 0
        self.task = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            self.ticks += 1

    async def beats(self, count: int) -> None:
        """Return once the heartbeat has ticked `count` more times."""
        target = self.ticks + count
        async with asyncio.timeout(GUARD_S):
            while self.ticks < target:
                await asyncio.sleep(0.001)


async def until(predicate: Any) -> None:
    async with asyncio.timeout(GUARD_S):
        while not predicate():
            await asyncio.sleep(0.001)


def test_the_loop_keeps_running_while_64_commands_wait_and_commit(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncEventStore.open(tmp_path / "events.db", now=FakeClock()) as store:
            runners = [runner(store, tmp_path, f"runner-{n:02d}") for n in range(COMMANDS)]
            await asyncio.gather(*(each.initialize() for each in runners))
            loop_thread = threading.get_ident()
            statements: list[int] = []
            backend = store.store.backend
            conn = backend.conn  # type: ignore[attr-defined]
            conn.exec_trace = lambda cursor, sql, bindings: statements.append(threading.get_ident()) or True
            heartbeat = Heartbeat()
            group = store.store.group_commit
            batches = group.batches
            held = Held(store.store)  # a thread holds the writer: every command now waits on it
            commands = [asyncio.ensure_future(each.acquire_lease(session_id="s-1", expected_generation=1,
                                                                 proxy_authority=proxy())) for each in runners]
            await until(lambda: group.queued == COMMANDS)
            await heartbeat.beats(10)  # 64 commands in flight, and the loop runs on
            assert not any(command.done() for command in commands)
            held.gate.set()
            receipts = await asyncio.gather(*commands)
            await heartbeat.beats(1)
            heartbeat.task.cancel()
            held.release()
            conn.exec_trace = None
            assert [receipt.lease.session_id for receipt in receipts] == ["s-1"] * COMMANDS
            assert statements and loop_thread not in statements
            assert group.batches - batches < COMMANDS  # the gate's, then the 64 in batches of up to 64
            assert (await store.verify()).events == 2 * COMMANDS
            assert [event.type for event in await collect(store.read(after=COMMANDS))] == ["LeaseAcquired"] * COMMANDS

    asyncio.run(main())


async def collect(events: Any) -> list[RecordedEvent]:
    return [event async for event in events]


def test_commands_reads_and_follow_mirror_the_synchronous_api(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncEventStore.open(tmp_path / "events.db", now=FakeClock()) as store:
            one = runner(store, tmp_path, "runner-1")
            assert (await one.initialize()).generation == 1
            receipt = await one.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy())
            with pytest.raises(StaleFenceError):
                await one.request_drain(expected_generation=5)
            with pytest.raises(InvalidInputError) as caught:
                await one.acquire_lease(session_id="bad id", expected_generation=1, proxy_authority=proxy())
            assert caught.value.field == "session_id"
            await one.settle_lease(lease_id=receipt.lease.id, lease_generation=1, result_digest="sha256:" + "c" * 64)
            state = await one.state()
            assert state == one.lifecycle.state() and state.leases[0].status == "settled"
            await store.append_unchecked("other", [ReclaimCompleted(generation=2)])
            assert await store.streams() == ["other", "runner-1"]
            assert await store.commit("read", lambda tx: tx.stream_version("other"), stream="other") == 1
            head = await store.head()

            async def awaited_work(tx: Any) -> None:  # would append on the loop, after its transaction
                tx.append_unchecked("other", [ReclaimCompleted(generation=3)])

            with pytest.raises(InvalidInputError) as refused:
                await store.commit("async", awaited_work)
            assert refused.value.field == "work" and "awaited_work" in str(refused.value)
            assert await store.head() == head
            assert (await store.head()).seq == 4 and await store.stream_version("runner-1") == 3
            assert [event.seq for event in await collect(store.read(after=1))] == [2, 3, 4]
            assert [event.version for event in await collect(store.read_stream("runner-1"))] == [1, 2, 3]
            with pytest.raises(InvalidInputError):
                store.follow(poll_interval=0)  # checked at the call, as the synchronous follow checks it

            followed: list[int] = []

            async def follow() -> None:
                async for event in store.follow(after=2, poll_interval=0.001):
                    followed.append(event.seq)
                    if event.seq == 6:
                        return

            follower = asyncio.ensure_future(follow())
            await until(lambda: followed == [3, 4])
            # Another connection commits: the follower sees it, as EventStore.follow does.
            with EventStore.open(tmp_path / "events.db", now=FakeClock()) as other:
                other.append_unchecked("other", [ReclaimCompleted(generation=3), ReclaimCompleted(generation=4)])
            async with asyncio.timeout(GUARD_S):
                await follower
            assert followed == [3, 4, 5, 6]

    asyncio.run(main())


def test_every_command_and_read_of_the_synchronous_api_is_mirrored() -> None:
    import inspect

    from lifecycle_es import RunnerLifecycle, aio

    def public(cls: type) -> set[str]:
        return {name for name, value in inspect.getmembers(cls) if not name.startswith("_") and callable(value)}

    assert public(RunnerLifecycle) - {"clock"} <= public(AsyncRunnerLifecycle)
    mirrored = {"append", "append_unchecked", "check_seal", "checkpoint", "commit", "event_at", "fence", "head", "read",
                "read_stream", "schema_problems", "seal", "stream_version", "streams", "verify"}
    assert mirrored | {"follow"} <= public(AsyncEventStore)
    # The same parameters, so that help() and a type checker show them (follow has no `stop`: cancel the task).
    for cls, sync, names in ((AsyncRunnerLifecycle, RunnerLifecycle, public(RunnerLifecycle) - {"clock"}),
                             (AsyncEventStore, EventStore, mirrored)):
        for name in names:
            assert inspect.signature(getattr(cls, name)).parameters == \
                inspect.signature(getattr(sync, name)).parameters, f"{cls.__name__}.{name}"
    for name in ("path", "keyed", "fenced"):
        assert isinstance(getattr(AsyncEventStore, name), property)
    for name in aio.__all__:
        value = getattr(aio, name)
        if inspect.isclass(value):
            assert inspect.getdoc(value)
            for member in public(value):
                assert inspect.getdoc(getattr(value, member)), f"{name}.{member}"


def test_a_closed_store_raises_a_store_error_from_every_call_and_ends_a_follower(tmp_path: Path) -> None:
    # As the synchronous store does once closed; the pool's own RuntimeError is no LifecycleError, and a
    # follower's task would die of it.
    async def main() -> None:
        store = await AsyncEventStore.open(tmp_path / "events.db", now=FakeClock())
        await store.append_unchecked("other", [ReclaimCompleted(generation=2)])
        followed: list[Any] = []

        async def follow() -> None:
            async for event in store.follow(poll_interval=0.001):
                followed.append(event.seq)

        follower = asyncio.ensure_future(follow())
        await until(lambda: followed == [1])
        await store.close()
        async with asyncio.timeout(GUARD_S):
            with pytest.raises(StoreError, match="closed"):
                await follower
        one = runner(store, tmp_path, "runner-1")
        for call in (store.head, lambda: store.append_unchecked("other", [ReclaimCompleted(generation=3)]),
                     lambda: collect(store.read()), one.initialize):
            with pytest.raises(StoreError, match="closed"):
                await call()
        await store.close()  # twice is no error

    asyncio.run(main())


def test_a_cancelled_command_commits_once_in_a_thread_and_never_runs_while_it_waits_for_one(tmp_path: Path) -> None:
    # What the module and the README say of cancellation: a command already in a thread may still commit
    # (here two wait in the group commit's queue behind a held writer), one waiting for a free thread never runs.
    async def main() -> None:
        async with await AsyncEventStore.open(tmp_path / "events.db", now=FakeClock(), threads=2) as store:
            group = store.store.group_commit
            held = Held(store.store)
            commands = [asyncio.ensure_future(store.append_unchecked(f"stream-{n}", [ReclaimCompleted(generation=2)]))
                        for n in range(4)]
            await until(lambda: group.queued == 2)
            for command in commands:
                command.cancel()
            outcomes = await asyncio.gather(*commands, return_exceptions=True)
            assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)
            held.gate.set()
            await until(lambda: group.queued == 0 and group.commands == 3)  # the gate's, then the two queued
            await store.run(held.release)
            assert await store.streams() == ["stream-0", "stream-1"]

    asyncio.run(main())


def cut_back(path: Path) -> None:
    """The rows after seq 2 deleted, as an older copy put back would leave the log."""
    conn = apsw.Connection(str(path))
    try:
        conn.set_busy_timeout(5000)
        conn.execute("DROP TRIGGER events_no_delete")
        conn.execute("DELETE FROM events WHERE seq > 2")
    finally:
        conn.close()


def cut_back_and_regrow(path: Path) -> None:
    """The rows after seq 2 deleted, then the log written past seq 4 again: its head is no longer behind."""
    conn = apsw.Connection(str(path))
    try:
        conn.set_busy_timeout(5000)
        (trigger,), = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'events_no_delete'").fetchall()
        conn.execute("DROP TRIGGER events_no_delete")
        conn.execute("DELETE FROM events WHERE seq > 2")
        conn.execute(trigger)
    finally:
        conn.close()
    with EventStore.open(path) as other:
        other.append_unchecked("z", [ReclaimCompleted(generation=generation) for generation in range(3, 7)])


def replace_file(path: Path) -> None:
    """Another store's file renamed over the followed one."""
    other = path.with_name("other.db")
    EventStore.open(other).close()
    os.replace(other, path)


@pytest.mark.parametrize(("change", "expected"), [(cut_back, IntegrityError), (cut_back_and_regrow, IntegrityError),
                                                  (replace_file, StoreFencedError)],
                         ids=["log-cut-back", "log-cut-back-and-regrown", "file-replaced"])
def test_follow_raises_when_the_log_is_cut_back_or_its_file_replaced(
        tmp_path: Path, change: Any, expected: type[Exception]) -> None:
    # As `EventStore.follow` does (through `EventStore.check_followed`), never waiting on for ever.
    async def main() -> None:
        path = tmp_path / "events.db"
        async with await AsyncEventStore.open(path) as store:
            for generation in range(1, 5):
                await store.append_unchecked("x", [ReclaimCompleted(generation=generation)])
            seen: list[int] = []

            async def follow() -> None:
                async for event in store.follow(poll_interval=0.001):
                    seen.append(event.seq)
                    if event.seq == 4:
                        change(path)

            with pytest.raises(expected) as caught:
                async with asyncio.timeout(GUARD_S):
                    await follow()
            assert seen == [1, 2, 3, 4]
            error = caught.value
            if change is cut_back:
                assert isinstance(error, IntegrityError) and error.seq == 3
                assert "went back from seq 4 to 2" in str(error)
            if change is cut_back_and_regrow:
                assert isinstance(error, IntegrityError) and error.seq == 4
                assert "changed while it was followed" in str(error)

    asyncio.run(main())


@pytest.mark.parametrize(("change", "told"), [(cut_back, "went back from seq 4 to 2"),
                                              (cut_back_and_regrow, "event at seq 4 changed while it was followed")],
                         ids=["cut-back", "cut-back-and-regrown"])
def test_a_follower_that_has_yielded_nothing_still_sees_the_log_changed_under_its_start(
        tmp_path: Path, change: Callable[[Path], None], told: str) -> None:
    # Started after the head (seq 4), which it holds (with its hash) from its first poll: a log then cut back to
    # seq 2, or cut back and written again past seq 4, no longer holds what it followed on from, and a follower
    # that waited on would yield the new history's events past seq 4 as if nothing happened.
    async def main() -> None:
        path = tmp_path / "events.db"
        async with await AsyncEventStore.open(path) as store:
            for generation in range(1, 5):
                await store.append_unchecked("x", [ReclaimCompleted(generation=generation)])
            polled, changed = threading.Event(), threading.Event()
            page = store._page

            def spy(after: int, stream: str | None, reached: int, reached_hash: bytes | None) -> list[RecordedEvent]:
                if polled.is_set():  # the next poll waits for the whole change: a rewrite is told by the hash alone
                    changed.wait(GUARD_S)
                found = page(after, stream, reached, reached_hash)
                polled.set()
                return found

            store._page = spy  # type: ignore[method-assign]

            async def follow() -> None:
                async for recorded in store.follow(after=4, poll_interval=0.001):
                    raise AssertionError(f"seq {recorded.seq} yielded from a log changed under the follower")

            async def change_after_a_poll() -> None:
                await asyncio.to_thread(polled.wait, GUARD_S)
                await asyncio.to_thread(change, path)
                changed.set()

            with pytest.raises(IntegrityError, match=told):
                async with asyncio.timeout(GUARD_S):
                    await asyncio.gather(follow(), change_after_a_poll())

    asyncio.run(main())


def test_the_seal_checkpoint_and_fence_of_the_synchronous_store_are_awaited_too(tmp_path: Path) -> None:
    from lifecycle_es.signing import generate_key, load_signer

    generate_key(tmp_path / "ops.key", name="ops")

    async def main() -> None:
        async with await AsyncEventStore.open(tmp_path / "events.db", now=FakeClock()) as store:
            assert store.path == str(tmp_path / "events.db") and store.keyed is False and store.fenced is None
            await runner(store, tmp_path, "runner-1").initialize()
            sealed = await store.seal()
            assert (await store.check_seal(tmp_path / "events.db.seal")) == sealed
            signed = await store.checkpoint(load_signer(tmp_path / "ops.key"))
            assert signed.seq == 1 and await store.schema_problems() == []
            assert (await store.verify(seal=tmp_path / "events.db.seal")).events == 1
            store.fence("the operator's")
            assert store.fenced is not None and "the operator's" in store.fenced
            with pytest.raises(StoreFencedError):
                await store.append_unchecked("runner-1", [ReclaimCompleted(generation=2)])
        report = lifecycle_es.audit(tmp_path / "events.db", trust=tmp_path / "ops.key.pub")
        assert report.ok, report.problems

    asyncio.run(main())


def test_a_follower_compares_a_hash_the_file_holds_as_it_is_whatever_its_length(tmp_path: Path) -> None:
    # A hash column edited to 31 bytes is the audit's to name; the follower that yielded the event compares the
    # event at its place with what it yielded, and does not refuse its own argument as a caller's bad input.
    path = tmp_path / "events.db"

    async def main() -> None:
        async with await AsyncEventStore.open(path) as store:
            for generation in range(1, 4):
                await store.append_unchecked("x", [ReclaimCompleted(generation=generation)])
            conn = apsw.Connection(str(path))
            try:
                triggers = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' AND "
                                        "tbl_name = 'events'").fetchall()
                for name, _ in triggers:
                    conn.execute(f"DROP TRIGGER {name}")
                conn.execute("UPDATE events SET hash = ? WHERE seq = 3", (b"x" * 31,))
                for _, sql in triggers:
                    conn.execute(sql)
            finally:
                conn.close()
            followed = store.follow(after=0, poll_interval=0.001)
            seen = [(await anext(followed)).seq for _ in range(3)]
            assert seen == [1, 2, 3]
            with pytest.raises(TimeoutError):  # it polls on, past the edited hash, raising nothing
                await asyncio.wait_for(anext(followed), 0.2)

    asyncio.run(main())
