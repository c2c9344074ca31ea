"""Group commit as careless callers use it: a work that raises what is no Exception, a process forked while
commands are in flight; on a real file and on a real PostgreSQL server.

Each batch is held together as in ``test_group_commit.py``: a writer stopped inside a first command (a gate),
the next commands queued behind it, then the gate opened.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from holding import Held
from waiting import wait_child, wait_for

from lifecycle_es import EventStore, RunnerLifecycle, StoreBusyError, StoreError, StoreFencedError, StoreIOError
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.receipts import RunnerSnapshot
from lifecycle_es.store import WriteTransaction
from lifecycle_es.testing import RUNNER_DEFAULTS, FakeClock, SequentialIds
from lifecycle_es.values import MAX_ACTION_CHARS


class Interrupted(BaseException):
    """What a signal handler raises in the main thread (as KeyboardInterrupt does on Ctrl-C)."""


def handle(store: EventStore, tmp_path: Path, runner_id: str) -> RunnerLifecycle:
    own = tmp_path / "base" / runner_id
    own.mkdir(parents=True, exist_ok=True)
    return RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "runner_id": runner_id}, base_dir=str(own),
                           now=FakeClock(), random_id=SequentialIds())  # type: ignore[arg-type]


def caught(call: Callable[[], Any]) -> Callable[[], Any]:
    """`call`, returning what it raises, what is no Exception included (a thread would end on it)."""
    def run() -> Any:
        try:
            return call()
        except BaseException as exc:  # the outcome the test asserts on
            return exc
    return run


def test_what_a_work_raises_in_a_thread_no_signal_reaches_is_its_callers_alone(store_target: str,
                                                                              tmp_path: Path) -> None:
    # A work's sys.exit() or asyncio.CancelledError in a worker thread (an AsyncEventStore's pool) is its own:
    # given to the writer of its batch instead, it would end another caller's thread (or event loop), while its
    # own caller got a StoreIOError and every other command of the batch was rolled back for nothing.
    exit_ = SystemExit(3)

    def exits(tx: WriteTransaction) -> None:
        tx.stream_version("runner-b")
        raise exit_

    with EventStore.open(store_target, now=FakeClock()) as store:
        a, c = handle(store, tmp_path, "runner-a"), handle(store, tmp_path, "runner-c")
        held = Held(store)
        held.queue("a", caught(a.initialize))  # the next batch's writer
        held.queue("b", caught(lambda: store.commit("exits", exits)))
        held.queue("c", caught(c.initialize))
        outcomes = held.release()
        assert outcomes["b"] is exit_, outcomes
        assert isinstance(outcomes["a"], RunnerSnapshot) and isinstance(outcomes["c"], RunnerSnapshot), outcomes
        assert sorted(store.streams()) == ["runner-a", "runner-c"]
        assert store.fenced is None


def test_an_interrupt_in_a_batch_the_main_thread_writes_is_the_main_threads(store_target: str,
                                                                             tmp_path: Path) -> None:
    # In the main thread, where a signal's handler raises, Ctrl-C's KeyboardInterrupt in any command's work may be
    # the signal's: the main thread raises it, and the other callers learn that nothing of the batch committed.
    with EventStore.open(store_target, now=FakeClock()) as store:
        a, c = handle(store, tmp_path, "runner-a"), handle(store, tmp_path, "runner-c")

        def interrupted(tx: WriteTransaction) -> None:
            tx.stream_version("runner-b")
            raise KeyboardInterrupt

        held = Held(store)

        def queue_behind_the_main_thread() -> None:
            assert wait_for(lambda: store.group_commit.queued == 1)
            held.queue("b", caught(lambda: store.commit("interrupted", interrupted)))
            held.queue("c", caught(c.initialize))
            held.gate.set()

        others = threading.Thread(target=queue_behind_the_main_thread)
        others.start()
        with pytest.raises(KeyboardInterrupt):
            a.initialize()  # queued first: the main thread writes the next batch
        others.join(20)
        outcomes = held.release()
        assert all(type(outcomes[name]) is StoreIOError for name in ("b", "c")), outcomes
        assert all("nothing of it was committed" in str(outcomes[name]) for name in ("b", "c"))
        assert store.streams() == [] and store.fenced is None
        a.initialize()
        assert store.streams() == ["runner-a"]


def test_commands_named_with_the_longest_action_allowed_commit_in_one_batch(store_target: str) -> None:
    # A name the store takes for a lone command is no reason to fail a batch of them (the batch is named after
    # its first command, with its size).
    action = "a" * MAX_ACTION_CHARS
    with EventStore.open(store_target, now=FakeClock()) as store:
        held = Held(store)
        for name in ("a", "c"):
            held.queue(name, lambda name=name: store.commit(action, lambda tx: (name, tx.stream_version(name))))
        outcomes = held.release()
        assert outcomes == {"gate": None, "a": ("a", 0), "c": ("c", 0)}
        assert store.group_commit.batches == 2  # the gate's, and the two commands' together


def test_a_work_that_closes_the_store_fails_its_batch_with_store_errors_and_lands_nothing(store_target: str) -> None:
    # A careless work closes the store it writes through: every command of its batch fails with a StoreError
    # (no driver's own exception type), and nothing of the batch is in the log.
    with EventStore.open(store_target, now=FakeClock()) as store:
        head = store.head()
        held = Held(store)
        event = ReclaimCompleted(generation=2)
        held.queue("a", lambda: store.commit("a", lambda tx: tx.append_unchecked("a", [event])))
        held.queue("b", lambda: store.commit("b", lambda tx: store.close()))
        held.queue("c", lambda: store.commit("c", lambda tx: tx.append_unchecked("c", [event])))
        outcomes = held.release()
        assert all(isinstance(outcomes[name], StoreError) for name in "abc"), outcomes
    with EventStore.open(store_target) as reopened:
        assert reopened.head() == head


@pytest.mark.parametrize("batch", [False, True], ids=["alone", "in-a-batch"])
def test_a_child_forked_inside_a_work_never_ends_the_parents_transaction(store_target: str, batch: bool) -> None:
    # A work forks and its child leaves the work by an exception (sys.exit(), say): unwinding through the
    # transaction (and its savepoint, in a batch), the child must not roll back (nor commit) on the connection it
    # shares with the parent. On a server, its ROLLBACK ends the parent's transaction, whose lock is then gone.
    parent = os.getpid()
    event = ReclaimCompleted(generation=2)

    def forks(tx: WriteTransaction) -> str:
        tx.append_unchecked("forking", [event])
        pid = os.fork()
        if pid == 0:
            raise Interrupted  # the child leaves the work
        assert wait_child(pid) == 0
        # The parent's transaction still holds the write lock: another writer waits, and gives up.
        with EventStore.open(store_target, busy_timeout_ms=100) as other, pytest.raises(StoreBusyError):
            other.append_unchecked("other", [event])
        return "parent"

    def commits() -> str:
        try:
            return store.commit("forks", forks)
        except BaseException:
            if os.getpid() != parent:
                os._exit(0)  # the child, once it unwound through the transaction
            raise

    with EventStore.open(store_target, now=FakeClock()) as store:
        head = store.head()
        if batch:
            held = Held(store)
            held.queue("forks", commits)  # the batch's writer: the child is forked from its thread
            held.queue("next", lambda: store.commit("next", lambda tx: tx.append_unchecked("next", [event])))
            outcomes = held.release()
            assert outcomes == {"gate": None, "forks": "parent", "next": [store.event_at(head.seq + 2)]}, outcomes
        else:
            assert commits() == "parent"
        assert store.head().seq == head.seq + 1 + batch
    with EventStore.open(store_target) as reopened:  # what the parent's commit acknowledged is there
        assert [(recorded.stream, recorded.type) for recorded in reopened.read()] == [
            ("forking", "ReclaimCompleted"), *[("next", "ReclaimCompleted")] * batch]
        reopened.verify()


def test_a_child_forked_inside_a_work_unwinds_while_a_parent_thread_holds_the_queue(tmp_path: Path) -> None:
    # At the fork another thread of the parent holds the group commit's mutex (queueing its own command at that
    # instant): the child, unwinding out of the commit, must not wait for a mutex no thread of its own will free.
    parent = os.getpid()
    path = tmp_path / "events.db"
    with EventStore.open(path, now=FakeClock()) as store:
        holding, release = threading.Event(), threading.Event()

        def holds() -> None:
            with store.group_commit._mutex:
                holding.set()
                release.wait(30)

        def forks(tx: WriteTransaction) -> str:
            tx.append_unchecked("forking", [ReclaimCompleted(generation=2)])
            threading.Thread(target=holds).start()
            assert holding.wait(30)
            pid = os.fork()
            if pid == 0:
                return "child"  # leaves the work normally, and the commit unwinds in the child
            release.set()
            assert wait_child(pid) == 0
            return "parent"

        try:
            assert store.commit("forks", forks) == "parent"
        except BaseException:
            if os.getpid() != parent:
                os._exit(0)  # the child, once it unwound through the commit
            raise
        if os.getpid() != parent:
            os._exit(0)
        assert [recorded.stream for recorded in store.read()] == ["forking"]


@pytest.mark.parametrize("parent", ["writing", "idle", "reading"])
def test_a_child_forked_while_the_parent_writes_is_refused_writes_at_once_and_reads(tmp_path: Path,
                                                                                   parent: str) -> None:
    # SQLite's per-process record of the parent's write lock is copied into the child, where nothing will ever
    # release it: a store the child opens anew on that file would wait out its busy timeout on every write, for
    # as long as it lives. Refused at once, saying why and what to do; it reads. Forked while the parent was idle,
    # or while a thread of it was inside a read on the store's connection (which SQLite cannot be asked about
    # then), it writes.
    writing = parent == "writing"
    path = tmp_path / "events.db"
    with EventStore.open(path, now=FakeClock()) as store:
        store.append_unchecked("before", [RECLAIMED])
        inside, release = threading.Event(), threading.Event()

        def paused(tx: WriteTransaction) -> None:
            tx.append_unchecked("parent", [RECLAIMED])
            inside.set()
            assert release.wait(30)

        def pause() -> int:
            inside.set()
            return int(release.wait(30))

        def reads() -> None:
            conn = store.backend.conn  # type: ignore[attr-defined]
            conn.create_scalar_function("pause", pause, 0)
            with store.lock:
                conn.execute("SELECT pause() FROM events").fetchall()

        writer = threading.Thread(target=lambda: store.commit("paused", paused) if writing else reads())
        if parent != "idle":
            writer.start()
            assert inside.wait(30)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            outcome = "?"
            try:
                with EventStore.open(path, now=FakeClock(), busy_timeout_ms=30_000) as mine:
                    seqs = [recorded.seq for recorded in mine.read()]
                    try:
                        mine.append_unchecked("child", [RECLAIMED])
                        outcome = f"wrote after reading {seqs}"
                    except StoreFencedError as exc:
                        outcome = f"refused after reading {seqs}: {exc}"
            except BaseException as exc:  # the child reports whatever it met, and exits
                outcome = f"{type(exc).__name__}: {exc}"
            finally:
                os.write(write, outcome.encode())
                os._exit(0)
        os.close(write)
        try:
            assert wait_child(pid) == 0
            with os.fdopen(read, "rb") as pipe:
                outcome = pipe.read().decode()
        finally:
            release.set()
            if parent != "idle":
                writer.join(30)
        if writing:
            assert outcome.startswith("refused after reading [1]: "), outcome
            assert "forked while a thread of its parent was writing" in outcome and "'spawn'" in outcome
            assert [recorded.stream for recorded in store.read()] == ["before", "parent"]
        else:
            assert outcome == "wrote after reading [1]", outcome
            assert [recorded.stream for recorded in store.read()] == ["before", "child"]


RECLAIMED = ReclaimCompleted(generation=2)


def appends(tx: WriteTransaction) -> None:
    """A lone command's work: one event on runner-a's stream."""
    tx.append_unchecked("runner-a", [RECLAIMED])


def alone(store: EventStore, via: str, action: str, work: Callable[[WriteTransaction], None]) -> None:
    """`work` as a lone command: through `commit` (a batch of one) or a `transaction` of its own."""
    if via == "commit":
        store.commit(action, work)
    else:
        with store.transaction(action) as tx:
            work(tx)


@pytest.mark.parametrize("via", ["commit", "transaction"])
def test_an_interrupt_in_a_lone_commands_commit_fences_the_store_as_in_a_batch(tmp_path: Path, via: str) -> None:
    # Ctrl-C while a lone command's COMMIT runs: whether it landed is unknown, as in a batch's commit
    # (``test_group_commit.py``), so the store is fenced and the interrupt still reaches the caller. SQLite's
    # WAL hook raises it inside the COMMIT (a server runs no Python there).
    path = str(tmp_path / "events.db")

    def after_commit(conn: Any, name: str, pages: int) -> int:
        raise Interrupted  # SQLite calls it once the commit is in the WAL

    with EventStore.open(path, now=FakeClock()) as store:
        store.backend.conn.set_wal_hook(after_commit)  # type: ignore[attr-defined]
        with pytest.raises(Interrupted):
            alone(store, via, "appends", appends)
        store.backend.conn.set_wal_hook(None)  # type: ignore[attr-defined]
        cause = store.fenced
        assert cause is not None and "appends" in cause and "Interrupted" in cause, cause
        assert "outcome unknown" in cause and "reopen the store" in cause, cause
        with pytest.raises(StoreFencedError):
            store.append_unchecked("runner-b", [RECLAIMED])
    with EventStore.open(path) as reopened:  # it had landed: reopening is how to learn it
        assert [(recorded.stream, recorded.type) for recorded in reopened.read()] == [("runner-a", "ReclaimCompleted")]


@pytest.mark.parametrize("via", ["commit", "transaction"])
def test_an_interrupt_in_a_lone_commands_work_rolls_back_and_fences_nothing(tmp_path: Path, via: str) -> None:
    def interrupted(tx: WriteTransaction) -> None:
        appends(tx)
        raise Interrupted  # before COMMIT begins: nothing of it commits

    with EventStore.open(tmp_path / "events.db", now=FakeClock()) as store:
        with pytest.raises(Interrupted):
            alone(store, via, "interrupted", interrupted)
        assert store.fenced is None and store.streams() == []
        store.append_unchecked("runner-b", [RECLAIMED])
        assert store.streams() == ["runner-b"]


@pytest.mark.parametrize("via", ["commit", "transaction"])
def test_an_interrupt_just_after_begin_rolls_back_and_leaves_no_write_lock(tmp_path: Path, via: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C lands after BEGIN IMMEDIATE took the write lock, before the command's block began (here as the
    # connection's bookkeeping of the transaction starts): nothing may keep that lock, or this handle could never
    # begin again ("within a transaction") and every other writer would be busy while it lives.
    from lifecycle_es.sqlite_write import LogEnd

    path = str(tmp_path / "events.db")
    begin = LogEnd.begin
    fired: list[bool] = []

    def interrupted_begin(self: LogEnd) -> None:
        if not fired:
            fired.append(True)
            raise Interrupted
        begin(self)

    with EventStore.open(path, now=FakeClock()) as store:
        monkeypatch.setattr(LogEnd, "begin", interrupted_begin)
        with pytest.raises(Interrupted):
            alone(store, via, "appends", appends)
        assert fired and store.fenced is None and store.streams() == []
        with EventStore.open(path, now=FakeClock(), busy_timeout_ms=2_000) as other:
            other.append_unchecked("runner-b", [RECLAIMED])  # the write lock is free
        alone(store, via, "appends", appends)  # and this handle begins again
        assert store.streams() == ["runner-a", "runner-b"]


@pytest.mark.parametrize("stale", [False, True], ids=["read-current", "read-behind-another-write"])
@pytest.mark.parametrize("via", ["commit", "transaction"])
def test_a_write_refused_inside_a_callers_read_transaction_leaves_that_transaction_open(tmp_path: Path, via: str,
                                                                                       stale: bool) -> None:
    # A thread that holds store.lock and reads the backend in a read transaction of its own (as `lock` documents),
    # then writes: the write is refused as nested, and what is refused began nothing and took no lock, so nothing
    # of the caller's is rolled back (its reads go on seeing one state of the log, though another process may
    # have written since) and every other connection can write while the caller's read goes on.
    path = str(tmp_path / "events.db")
    with EventStore.open(path, now=FakeClock(), busy_timeout_ms=500) as store:
        store.append_unchecked("runner-a", [RECLAIMED])
        with store.lock, store.backend.read_tx("reads") as conn:  # type: ignore[attr-defined]
            before = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            if stale:
                with EventStore.open(path, now=FakeClock()) as other:
                    other.append_unchecked("runner-b", [RECLAIMED])
            with pytest.raises(StoreError, match="within a transaction"):
                alone(store, via, "appends", appends)
            assert not conn.getautocommit()
            assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == before == 1
            with EventStore.open(path, now=FakeClock(), busy_timeout_ms=500) as other:
                other.append_unchecked("runner-c", [RECLAIMED])
        assert store.streams() == (["runner-a", "runner-b", "runner-c"] if stale else ["runner-a", "runner-c"])
        alone(store, via, "appends", appends)
