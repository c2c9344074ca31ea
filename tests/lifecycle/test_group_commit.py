"""Group commit (issue 14): commands of many threads on one store share transactions, on a real file and on
a real PostgreSQL server.

Real threads drive `RunnerLifecycle` handles on one `EventStore` (read models attached, a snapshot
after every event). Every command that returned is in the log, the chain verifies and the audit
proves the snapshots and read models. To hold a batch together the tests stop the writer inside a
first command (a gate), queue the next ones behind it, then open the gate: those queued form the
next batch. In it, each command decides against the ones before it (a second drain of the same
generation is stale), a refused one raises its own error and the others commit, and the log is byte
for byte the log of the same commands run one by one without the refused one (on a server, whose second
store has an id of its own, every column but the chain's links).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from holding import Held, HeldRollback
from targets import Places
from waiting import wait_child, wait_for

import projections
from lifecycle_es import (
    EventStore,
    RunnerLifecycle,
    StaleFenceError,
    StoreError,
    StoreFencedError,
    StoreIOError,
    audit,
)
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import LeaseAcquired
from lifecycle_es.store import WriteTransaction
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS, FakeClock, SequentialIds
from lifecycle_es.values import ProxyAuthority

HOUR = 3_600_000
DIGEST = "sha256:" + "c" * 64
RUNNERS = ("runner-a", "runner-b", "runner-c")


def proxy() -> ProxyAuthority:
    return ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(START_MS), expires_at=iso_ms(START_MS + HOUR))


def handle(store: EventStore, base_dir: Path, runner_id: str) -> RunnerLifecycle:
    """A handle whose clock stands still and whose lease ids count from 1: two stores fed alike log alike."""
    own = base_dir / runner_id  # the preflight's probe names count from 1 too: one directory per runner
    own.mkdir(exist_ok=True)
    return RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "runner_id": runner_id}, base_dir=str(own),
                           now=FakeClock(), random_id=SequentialIds(), snapshot_every=1)  # type: ignore[arg-type]


def log_rows(store: EventStore) -> list[tuple[Any, ...]]:
    return [recorded.row() for recorded in store.read()]


def caches(store: EventStore) -> tuple[Any, ...]:
    """The snapshots and read-model rows, as stored."""
    backend = store.backend
    snapshots = [backend.snapshot(stream) for stream in store.streams()]
    return snapshots, backend.read_model_rows("runners"), backend.read_model_rows("leases")


def proved(path: Path | str) -> None:
    report = audit(path)
    assert report.ok, report.problems
    assert report.checks["chain"] and report.checks["rules"] and report.checks["snapshots"]
    assert report.checks["read_models"]


@pytest.fixture
def base_dir(tmp_path: Path) -> Path:
    made = tmp_path / "base"
    made.mkdir()
    return made


def initialized(target: str, base_dir: Path) -> str:
    """`target` made a store with the read models attached and the three runners initialized, cleanly closed."""
    with EventStore.open(target, now=FakeClock()) as store:
        projections.attach(store)
        for runner_id in RUNNERS:
            handle(store, base_dir, runner_id).initialize()
    return target


@pytest.fixture
def made(places: Places, base_dir: Path) -> str:
    """A store with the read models attached and the three runners initialized (each backend in turn)."""
    return initialized(places.new(), base_dir)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_n_threads_times_m_commands_all_land_and_the_caches_stay_proved(request: pytest.FixtureRequest, backend: str,
                                                                       tmp_path: Path, base_dir: Path) -> None:
    threads, pairs = 8, 6
    path = request.getfixturevalue("pg_url") if backend == "postgres" else str(tmp_path / "events.db")
    with EventStore.open(path, now=FakeClock()) as store:
        projections.attach(store)
        lifecycles = [handle(store, base_dir, f"runner-{n}") for n in range(threads)]
        receipts: list[list[str]] = [[] for _ in range(threads)]
        errors: list[BaseException] = []

        def drive(index: int) -> None:
            lifecycle = lifecycles[index]
            try:
                lifecycle.initialize()
                for pair in range(pairs):
                    lease = lifecycle.acquire_lease(session_id=f"s-{pair}", expected_generation=1,
                                                    proxy_authority=proxy()).lease
                    receipts[index].append(lease.id)
                    lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=DIGEST)
            except BaseException as exc:  # reported below
                errors.append(exc)

        workers = [threading.Thread(target=drive, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
        assert errors == [] and not any(worker.is_alive() for worker in workers)
        assert store.verify().events == threads * (1 + 2 * pairs)
        assert store.group_commit.commands == threads * (1 + 2 * pairs)
        replayed = projections.replay(store)
        for index, lifecycle in enumerate(lifecycles):
            state = lifecycle.state()
            assert state == replayed[lifecycle.runner_id]
            assert [lease.id for lease in state.leases] == receipts[index]
            assert all(lease.status == "settled" for lease in state.leases)
    proved(path)


def test_a_batch_decides_in_order_and_a_refused_command_rolls_back_alone(made: str, base_dir: Path,
                                                                        places: Places) -> None:
    same_id = places.backend == "sqlite"
    if same_id:  # a copy: the same store id, so the same chain
        alone = places.new()
        shutil.copyfile(made, alone)
    else:
        alone = initialized(places.new(), base_dir)

    def alike(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return rows if same_id else [row[:6] for row in rows]

    def alike_caches(found: tuple[Any, ...]) -> tuple[Any, ...]:
        snapshots, *models = found
        return found if same_id else ([snapshot[:2] for snapshot in snapshots], *models)

    with EventStore.open(made, now=FakeClock()) as store:
        projections.attach(store)
        a, b, c = (handle(store, base_dir, runner_id) for runner_id in RUNNERS)
        b_again = handle(store, base_dir, "runner-b")  # a second handle on runner-b: it sees the first's drain
        batches = store.group_commit.batches
        held = Held(store)
        held.queue("a", lambda: a.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy()))
        held.queue("b", lambda: b.request_drain(expected_generation=1))
        held.queue("b_again", lambda: b_again.request_drain(expected_generation=1))
        held.queue("c", lambda: c.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy()))
        outcomes = held.release()
        assert store.group_commit.batches == batches + 2  # the gate alone, then the four together
        assert isinstance(outcomes["b_again"], StaleFenceError)  # generation 1 was drained just before it
        assert not isinstance(outcomes["a"], Exception) and not isinstance(outcomes["c"], Exception)
        assert outcomes["b"].generation == 3 and outcomes["b"].state == "parked"  # no lease: drained, parked at once
        batched, batched_caches = alike(log_rows(store)), alike_caches(caches(store))
        assert b_again.state().generation == 3
    with EventStore.open(alone, now=FakeClock()) as store:
        projections.attach(store)
        a, b, c = (handle(store, base_dir, runner_id) for runner_id in RUNNERS)
        a.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy())
        b.request_drain(expected_generation=1)
        c.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy())
        assert alike(log_rows(store)) == batched  # byte for byte: the refused command left nothing
        assert alike_caches(caches(store)) == batched_caches
    proved(made)


@pytest.mark.parametrize("last", [False, True], ids=["between", "last"])
def test_a_command_that_wrote_and_then_raised_leaves_no_trace_in_its_batch(made: str, base_dir: Path,
                                                                          last: bool) -> None:
    with EventStore.open(made, now=FakeClock()) as store:
        if not last:  # last, and without read models, its insert is the last write of the batch
            projections.attach(store)
        before, cached = log_rows(store), caches(store)
        a, c = handle(store, base_dir, "runner-a"), handle(store, base_dir, "runner-c")
        lease = LeaseAcquired(lease_id="lease-x", session_id="s-x", lease_generation=1, issued_at=iso_ms(START_MS),
                              expires_at=iso_ms(START_MS + HOUR), proxy_authority=proxy())

        def writes_then_fails(tx: WriteTransaction) -> None:
            # Through the rules and the read models (runner-b's rows change), then a failure of its own.
            tx.append("runner-b", [lease], expected_version=1)
            raise RuntimeError("the caller's own failure")

        held = Held(store)
        held.queue("a", lambda: a.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy()))
        held.queue("fails", lambda: store.commit("fails", writes_then_fails))
        if not last:
            held.queue("c", lambda: c.acquire_lease(session_id="s-1", expected_generation=1,
                                                    proxy_authority=proxy()))
        outcomes = held.release()
        assert isinstance(outcomes["fails"], RuntimeError) and str(outcomes["fails"]) == "the caller's own failure"
        after = log_rows(store)
        assert after[:len(before)] == before
        assert [(row[1], row[3]) for row in after[len(before):]] == [("runner-a", "LeaseAcquired")] + (
            [] if last else [("runner-c", "LeaseAcquired")])
        assert store.streams() == list(RUNNERS)
        assert caches(store)[0][1] == cached[0][1]  # runner-b's snapshot, as it was
        assert store.backend.lease_rows_of("runner-b") == []
        # The next append chains onto what was committed, not onto the rolled back rows.
        tx_rows = store.append("runner-b", [lease], expected_version=1)
        assert tx_rows[0].seq == after[-1][0] + 1 and tx_rows[0].prev == after[-1][7]
    if not last:
        proved(made)


def test_a_write_inside_a_batch_is_refused_not_deadlocked(lifecycle_store: EventStore) -> None:
    with pytest.raises(StoreError, match="transaction"):
        lifecycle_store.commit("outer", lambda tx: lifecycle_store.commit("inner", lambda inner: None))
    assert lifecycle_store.commit("after", lambda tx: tx.stream_version("runner-a")) == 1


@pytest.mark.parametrize("places", ["sqlite"], indirect=True)  # a deadlock would hold the schema teardown drops
@pytest.mark.parametrize("holds", ["transaction", "lock"])
def test_a_command_from_a_thread_holding_the_stores_lock_never_waits_for_another_writer(made: str, base_dir: Path,
                                                                                        holds: str) -> None:
    # With another thread's command in flight, that thread is the writer, waiting for the lock this thread
    # holds (in a transaction, or around reads of its own): queued behind it, this command waited for it for
    # ever, and every later command of the store with them. Inside a transaction it is refused as nested (as
    # it is alone); holding the lock only, it commits in a transaction of its own.
    store = EventStore.open(made, now=FakeClock())  # closed at the end only: a deadlock holds its lock
    a, c = handle(store, base_dir, "runner-a"), handle(store, base_dir, "runner-c")
    inside, go = threading.Event(), threading.Event()
    outcomes: dict[str, Any] = {}

    def nests() -> None:
        try:
            with store.transaction("outer") if holds == "transaction" else store.lock:
                inside.set()
                assert go.wait(20)
                a.request_drain(expected_generation=1)
        except StoreError as exc:
            outcomes["nests"] = exc

    nesting = threading.Thread(target=nests, daemon=True)
    nesting.start()
    assert inside.wait(20)
    writer = threading.Thread(target=lambda: outcomes.update(c=c.request_drain(expected_generation=1)),
                              daemon=True)
    writer.start()
    assert wait_for(lambda: "writing" in repr(store.group_commit))  # the writer waits for the lock
    go.set()
    nesting.join(20)
    writer.join(20)
    assert not nesting.is_alive() and not writer.is_alive()
    assert outcomes["c"].state == "parked"
    if holds == "transaction":
        assert "within a transaction" in str(outcomes["nests"]) and a.state().generation == 1
    else:
        assert "nests" not in outcomes and a.state().state == "parked"
    store.close()


def test_a_lone_command_is_its_own_batch(made: str, base_dir: Path) -> None:
    with EventStore.open(made, now=FakeClock()) as store:
        a = handle(store, base_dir, "runner-a")
        batches, commands = store.group_commit.batches, store.group_commit.commands
        a.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy())
        a.request_drain(expected_generation=1)
        assert (store.group_commit.batches, store.group_commit.commands) == (batches + 2, commands + 2)


@pytest.fixture
def lifecycle_store(made: str) -> Iterator[EventStore]:
    with EventStore.open(made, now=FakeClock()) as store:
        yield store


def test_tune_refuses_bounds_it_cannot_keep(lifecycle_store: EventStore) -> None:
    from lifecycle_es import InvalidInputError

    group = lifecycle_store.group_commit
    for field, value in (("max_batch", 0), ("max_batch", True), ("linger_ms", -1), ("linger_ms", 101.0),
                         ("linger_ms", "1")):
        with pytest.raises(InvalidInputError) as caught:
            group.tune(**{field: value})
        assert caught.value.field == field
    group.tune(max_batch=1, linger_ms=0)
    assert (group.max_batch, group.linger_ms) == (1, 0.0)


def test_a_reader_in_another_thread_never_sees_a_batch_in_flight(made: str, base_dir: Path) -> None:
    with EventStore.open(made, now=FakeClock()) as store:
        head = store.head()
        b = handle(store, base_dir, "runner-b")
        state = b.state()
        lease = LeaseAcquired(lease_id="lease-x", session_id="s-x", lease_generation=1, issued_at=iso_ms(START_MS),
                              expires_at=iso_ms(START_MS + HOUR), proxy_authority=proxy())
        held = HeldRollback(store, "runner-b", [lease], expected_version=1)
        seen: dict[str, Any] = {}
        reader = threading.Thread(target=lambda: seen.update(
            head=store.head(), events=len(list(store.read())), state=handle(store, base_dir, "runner-b").state()))
        reader.start()
        # Without the store's lock the reader returns at once with the uncommitted lease; with it, it waits.
        reader.join(0.5)
        held.release()
        reader.join(20)
        assert seen == {"head": head, "events": head.seq, "state": state}
        assert b.state() == state


def test_threads_racing_on_one_runner_lose_no_update_and_fence_one_generation(made: str, base_dir: Path) -> None:
    racers = 8
    with EventStore.open(made, now=FakeClock()) as store:
        projections.attach(store)
        handles = [RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "runner_id": "runner-a"},  # type: ignore[arg-type]
                                   base_dir=str(base_dir / "runner-a"), now=FakeClock(),
                                   random_id=SequentialIds(1000 * (n + 1)), snapshot_every=1)
                   for n in range(racers)]

        def race(command: Callable[[RunnerLifecycle, int], Any]) -> list[Any]:
            start = threading.Barrier(racers)
            outcomes: list[Any] = [None] * racers

            def run(index: int) -> None:
                start.wait()
                try:
                    outcomes[index] = command(handles[index], index)
                except Exception as exc:  # the outcome the test asserts on
                    outcomes[index] = exc

            threads = [threading.Thread(target=run, args=(n,)) for n in range(racers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            return outcomes

        # Distinct sessions do not conflict: every lease is granted, none lost.
        leases = race(lambda lifecycle, n: lifecycle.acquire_lease(session_id=f"s-{n}", expected_generation=1,
                                                                   proxy_authority=proxy()))
        assert not any(isinstance(outcome, Exception) for outcome in leases), leases
        # One generation: exactly one drain wins, every other raises its own StaleFenceError.
        drains = race(lambda lifecycle, n: lifecycle.request_drain(expected_generation=1))
        refused = [outcome for outcome in drains if isinstance(outcome, Exception)]
        assert len(refused) == racers - 1 and all(type(error) is StaleFenceError for error in refused)
        assert len({id(error) for error in refused}) == racers - 1
        state = projections.replay(store)["runner-a"]
        assert sorted(lease.session_id for lease in state.leases) == sorted(f"s-{n}" for n in range(racers))
        assert state.state == "draining" and state.generation == 2
        assert all(lifecycle.state() == state for lifecycle in handles)
    proved(made)


@pytest.mark.parametrize("places", ["sqlite"], indirect=True)  # it counts the file's statements (exec_trace)
def test_a_batch_reads_no_tail_once_the_connection_knows_its_streams(made: str, base_dir: Path) -> None:
    # The writer holds the lock and saw every row of the batch land (each insert read back), so the
    # commands after the first decide against the log's end without reading it from the file, their
    # snapshots included; the log is still the one their commands made one by one, and it verifies.
    from lifecycle_es.sqlite import _HEAD_AT, _STREAM_VERSION, _TAIL

    with EventStore.open(made, now=FakeClock()) as store:
        handles = {runner_id: handle(store, base_dir, runner_id) for runner_id in RUNNERS}
        for each in handles.values():  # each stream read once, and written, by this connection
            each.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy())
        statements: list[str] = []
        conn: Any = store.backend.conn  # type: ignore[attr-defined]
        held = Held(store)
        conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True
        for runner_id, each in handles.items():
            held.queue(runner_id, lambda each=each: each.acquire_lease(session_id="s-2", expected_generation=1,
                                                                      proxy_authority=proxy()))
        outcomes = held.release()
        conn.exec_trace = None
        assert not [outcome for outcome in outcomes.values() if isinstance(outcome, Exception)]
        assert [sql for sql in statements if sql in (_TAIL, _HEAD_AT, _STREAM_VERSION)] == []
        assert sum(sql.startswith("INSERT INTO events") for sql in statements) == len(RUNNERS)
        assert sum(sql.startswith("INSERT INTO snapshots") for sql in statements) == len(RUNNERS)
    proved(made)


class Interrupted(BaseException):
    """What a signal handler raises in the main thread (as KeyboardInterrupt does on Ctrl-C)."""


@pytest.mark.parametrize("places", ["sqlite"], indirect=True)  # the queue is the same on every backend
def test_a_caller_interrupted_while_queued_leaves_the_queue_and_the_store_keeps_writing(made: str,
                                                                                       base_dir: Path) -> None:
    # The main thread waits in the queue behind a held writer; a signal's handler raises there. Its command
    # never ran, so it must leave the queue: were the writer to hand the queue to it, nobody would take it
    # and every later command of the store would wait for ever.

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with EventStore.open(made, now=FakeClock()) as store:
            head = store.head()
            a = handle(store, base_dir, "runner-a")
            held = Held(store)
            main = threading.get_ident()

            def poke() -> None:
                assert wait_for(lambda: store.group_commit.queued == 1)
                signal.pthread_kill(main, signal.SIGUSR1)

            poker = threading.Thread(target=poke)
            poker.start()
            with pytest.raises(Interrupted):
                a.request_drain(expected_generation=1)
            poker.join(20)
            assert store.group_commit.queued == 0
            held.release()
            assert store.head() == head  # the interrupted command never ran
            later: list[Any] = []
            writer = threading.Thread(target=lambda: later.append(a.request_drain(expected_generation=1)), daemon=True)
            writer.start()
            writer.join(20)
            assert [snapshot.generation for snapshot in later] == [3]  # drained and parked: the store still writes
    finally:
        signal.signal(signal.SIGUSR1, previous)


def caught(call: Callable[[], Any]) -> Callable[[], Any]:
    """`call`, returning what it raises, an interrupt included (a thread would end on it)."""
    def run() -> Any:
        try:
            return call()
        except BaseException as exc:  # the outcome the test asserts on
            return exc
    return run


def test_an_interrupt_in_a_batchs_commit_is_the_writers_and_the_others_get_a_store_error(made: str, base_dir: Path,
                                                                                         places: Places) -> None:
    # An interrupt raised in the writer's thread while it commits: the writer raises it, and no other caller's
    # thread gets a copy of it (one would end each, a SystemExit silently); the outcome is unknown. (One raised
    # in a command's work: ``test_group_commit_callers.py``.)
    if places.backend != "sqlite":
        pytest.skip("the interrupt is raised inside the commit by SQLite's WAL hook; a server runs no Python there")
    with EventStore.open(made, now=FakeClock()) as store:
        before = log_rows(store)
        a, c = handle(store, base_dir, "runner-a"), handle(store, base_dir, "runner-c")
        lease = LeaseAcquired(lease_id="lease-x", session_id="s-x", lease_generation=1, issued_at=iso_ms(START_MS),
                              expires_at=iso_ms(START_MS + HOUR), proxy_authority=proxy())

        def appends(tx: WriteTransaction) -> None:
            tx.append("runner-b", [lease], expected_version=1)

        def after_commit(conn: Any, name: str, pages: int) -> int:
            raise Interrupted  # SQLite calls it once the commit is in the WAL

        held = Held(store)
        held.queue("a", caught(lambda: a.acquire_lease(session_id="s-1", expected_generation=1,
                                                       proxy_authority=proxy())))
        held.queue("b", caught(lambda: store.commit("appends", appends)))
        held.queue("c", caught(lambda: c.acquire_lease(session_id="s-1", expected_generation=1,
                                                       proxy_authority=proxy())))
        store.backend.conn.set_wal_hook(after_commit)  # type: ignore[attr-defined]
        outcomes = held.release()
        assert isinstance(outcomes["a"], Interrupted)  # the batch's writer: the first queued
        others = [outcomes["b"], outcomes["c"]]
        assert all(type(error) is StoreIOError for error in others), outcomes
        assert others[0] is not others[1]
        assert all(error.outcome_unknown for error in others)
        assert store.fenced is not None
        with pytest.raises(StoreFencedError):
            a.acquire_lease(session_id="s-2", expected_generation=1, proxy_authority=proxy())
    with EventStore.open(made) as reopened:  # the commit had landed: every command of the batch is there
        assert [(row[1], row[3]) for row in log_rows(reopened)[len(before):]] == [
            ("runner-a", "LeaseAcquired"), ("runner-b", "LeaseAcquired"), ("runner-c", "LeaseAcquired")]
    proved(made)


def test_a_state_read_inside_a_batch_that_rolls_back_is_not_kept_by_the_handle(made: str, base_dir: Path) -> None:
    # A commit's work asks a runner's state, which holds the batch's uncommitted writes, then is rolled
    # back. Kept, the rolled-back lease stayed in the handle's state: its next command met a ConcurrencyError,
    # and once the stream had moved on it decided against a lease the log never held (an event the audit refuses).
    with EventStore.open(made, now=FakeClock()) as store:
        projections.attach(store)
        b, c = handle(store, base_dir, "runner-b"), handle(store, base_dir, "runner-c")
        b_other = RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "runner_id": "runner-b"},  # type: ignore[arg-type]
                                  base_dir=str(base_dir / "runner-b"), now=FakeClock(), random_id=SequentialIds(100))
        lease = LeaseAcquired(lease_id="lease-x", session_id="s-x", lease_generation=1, issued_at=iso_ms(START_MS),
                              expires_at=iso_ms(START_MS + HOUR), proxy_authority=proxy())
        seen: list[list[str]] = []

        def peeks_then_fails(tx: WriteTransaction) -> None:
            tx.append("runner-b", [lease], expected_version=1)
            seen.append([each.id for each in b.state().leases])  # its own uncommitted write, as it should
            raise RuntimeError("rolled back")

        held = Held(store)
        held.queue("peeks", lambda: store.commit("peeks", peeks_then_fails))
        held.queue("c", lambda: c.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy()))
        outcomes = held.release()
        assert isinstance(outcomes["peeks"], RuntimeError) and not isinstance(outcomes["c"], Exception)
        assert seen == [["lease-x"]]
        b_other.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy())  # the stream moves on
        assert b.state() == projections.replay(store)["runner-b"]
        assert [each.id for each in b.state().leases] == ["lease-000100"]
        with pytest.raises(StaleFenceError, match="no lease lease-x"):
            b.settle_lease(lease_id="lease-x", lease_generation=1, result_digest=DIGEST)
        b.settle_lease(lease_id="lease-000100", lease_generation=1, result_digest=DIGEST)
    proved(made)


def test_a_forked_child_finds_every_inherited_store_fenced_and_waits_for_no_lock_of_the_parent(
        made: str, base_dir: Path) -> None:
    with EventStore.open(made, now=FakeClock()) as store:
        a, b = handle(store, base_dir, "runner-a"), handle(store, base_dir, "runner-b")
        held = Held(store)  # a thread of the parent holds the writer and the store's lock as it forks
        pid = os.fork()
        if pid == 0:  # the child: each call must raise the fence at once, touching no connection and no lock
            code = 1
            try:
                for call in (lambda: a.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy()),
                             store.head, lambda: list(store.read()), lambda: store.backend.head()):
                    try:
                        call()
                    except StoreFencedError as exc:
                        assert "forked" in str(exc) and "open the store again" in str(exc)
                    else:
                        raise AssertionError(f"{call} was not fenced")
                store.close()  # leaves the parent's connection alone
                code = 0
            finally:
                os._exit(code)
        status = wait_child(pid)
        outcomes = held.release()
        assert status == 0
        assert outcomes["gate"] is None
        # The parent goes on writing, on its connection, and the log proves whole.
        b.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy())
    proved(made)

