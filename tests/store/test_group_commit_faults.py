"""A fault at a batch's commit fails every command of the batch (issue 14, group commit).

Through `faultvfs.FaultVFS`, the commit of a known batch (held together by `holding.Held`) meets a
failed fsync or a full disk. A failed fsync leaves the outcome unknown: every command that had got
through raises its own StoreIOError with ``outcome_unknown``, the store fences itself as it does for
a lone commit, and a reopen shows the batch whole or not at all. A full disk fails every such command
with StoreFullError and changes nothing; no handle keeps the state it read inside the lost batch (a
second handle on the same runner had seen the first's lease there). A command refused in the batch
keeps its own refusal either way.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from faultvfs import FaultVFS
from holding import Held
from waiting import wait_for

import projections
from lifecycle_es import (
    EventStore,
    InvalidInputError,
    RunnerLifecycle,
    StaleFenceError,
    StoreError,
    StoreFencedError,
    StoreFullError,
    StoreIOError,
)
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import DrainExpired, ReclaimCompleted
from lifecycle_es.store import WriteTransaction
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS, FakeClock, SequentialIds
from lifecycle_es.values import ProxyAuthority

_names = itertools.count()
HOUR = 3_600_000


@pytest.fixture
def vfs() -> Iterator[FaultVFS]:
    made = FaultVFS(f"fault-group-{os.getpid()}-{next(_names)}")
    try:
        yield made
    finally:
        made.unregister()


def proxy() -> ProxyAuthority:
    return ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(START_MS), expires_at=iso_ms(START_MS + HOUR))


def handle(store: EventStore, tmp_path: Path, runner_id: str, first_id: int = 1) -> RunnerLifecycle:
    base_dir = tmp_path / "base" / runner_id
    base_dir.mkdir(parents=True, exist_ok=True)
    return RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "runner_id": runner_id}, base_dir=str(base_dir),
                           now=FakeClock(), random_id=SequentialIds(first_id))  # type: ignore[arg-type]


def rows(store: EventStore) -> list[tuple[object, ...]]:
    return [recorded.row() for recorded in store.read()]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    made = tmp_path / "events.db"
    with EventStore.open(made, now=FakeClock()) as store:
        for runner_id in ("runner-a", "runner-b"):
            handle(store, tmp_path, runner_id).initialize()
    return made


def test_an_unknown_commit_outcome_fails_every_command_of_the_batch_and_fences(
        path: Path, tmp_path: Path, vfs: FaultVFS) -> None:
    with EventStore.open(path, now=FakeClock(), vfs=vfs.name) as store:
        before = rows(store)
        a, b = handle(store, tmp_path, "runner-a"), handle(store, tmp_path, "runner-b")
        b_again = handle(store, tmp_path, "runner-b")
        held = Held(store)
        held.queue("a", lambda: a.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy()))
        held.queue("b", lambda: b.request_drain(expected_generation=1))
        held.queue("stale", lambda: b_again.request_drain(expected_generation=1))
        held.queue("append", lambda: store.append("runner-a", []))  # bad input: refused inside the batch
        vfs.inject("sync", apsw.SQLITE_IOERR_FSYNC, at=1)
        outcomes = held.release()
        assert isinstance(outcomes["stale"], StaleFenceError)
        assert isinstance(outcomes["append"], InvalidInputError) and outcomes["append"].field == "events"
        failed = [outcomes["a"], outcomes["b"]]
        assert all(type(error) is StoreIOError and error.outcome_unknown for error in failed), outcomes
        assert failed[0] is not failed[1]  # each caller raises its own
        assert store.fenced is not None
        with pytest.raises(StoreFencedError):
            a.acquire_lease(session_id="s-2", expected_generation=1, proxy_authority=proxy())
    with EventStore.open(path) as reopened:
        after = rows(reopened)
        reopened.verify()
    assert after[:len(before)] == before
    # The batch is there whole or not at all.
    assert [(row[1], row[3]) for row in after[len(before):]] in (
        [], [("runner-a", "LeaseAcquired"), ("runner-b", "DrainRequested"), ("runner-b", "RunnerParked")])


def test_a_full_disk_at_commit_fails_the_batch_and_no_handle_keeps_what_it_read_there(
        path: Path, tmp_path: Path, vfs: FaultVFS) -> None:
    with EventStore.open(path, now=FakeClock(), vfs=vfs.name) as store:
        before = rows(store)
        first, second = handle(store, tmp_path, "runner-a"), handle(store, tmp_path, "runner-a", 100)
        first.state(), second.state()
        held = Held(store)
        held.queue("first", lambda: first.acquire_lease(session_id="s-1", expected_generation=1,
                                                        proxy_authority=proxy()))
        held.queue("second", lambda: second.acquire_lease(session_id="s-2", expected_generation=1,
                                                          proxy_authority=proxy()))
        vfs.inject("write", apsw.SQLITE_FULL, at=1, count=None)
        outcomes = held.release()
        vfs.clear_faults()
        assert all(type(outcomes[name]) is StoreFullError for name in ("first", "second")), outcomes
        assert store.fenced is None and rows(store) == before
        replayed = projections.replay(store)["runner-a"]
        # The second handle had read the first's lease inside the lost batch: it must not keep it.
        assert first.state() == second.state() == replayed and replayed.leases == ()
        receipt = second.acquire_lease(session_id="s-2", expected_generation=1, proxy_authority=proxy())
        assert [lease.session_id for lease in second.state().leases] == ["s-2"] == [
            lease.session_id for lease in projections.replay(store)["runner-a"].leases]
        assert receipt.lease.session_id == "s-2"
        store.verify()


def test_a_store_fenced_while_a_batch_waited_fails_each_command_with_its_own_fence(path: Path, tmp_path: Path) -> None:
    with EventStore.open(path, now=FakeClock()) as store:
        a, b = handle(store, tmp_path, "runner-a"), handle(store, tmp_path, "runner-b")
        held = Held(store)
        held.queue("a", lambda: a.request_drain(expected_generation=1))
        held.queue("b", lambda: b.request_drain(expected_generation=1))
        store.fence("the test fenced it")
        outcomes = held.release()
        errors = [outcomes["a"], outcomes["b"]]
        assert all(type(error) is StoreFencedError for error in errors) and errors[0] is not errors[1]
        assert [str(error) for error in errors] == ["the store is fenced: the test fenced it"] * 2
        assert [error.cause for error in errors] == ["the test fenced it"] * 2


def test_a_disk_full_inside_a_batch_fails_every_command_with_store_full_and_lands_nothing(path: Path) -> None:
    # A real limit on the file (max_page_count): the second command's rows do not fit. SQLite ends the
    # whole transaction then, so every command of the batch fails, each with the full disk's own kind, as
    # a lone command's is (a caller that waits for space on StoreFullError must not see a bare I/O error).
    with EventStore.open(path, now=FakeClock()) as store:
        before = rows(store)
        conn = store.backend.conn  # type: ignore[attr-defined]
        (pages,), = conn.execute("PRAGMA page_count").fetchall()
        conn.execute(f"PRAGMA max_page_count = {pages + 2}")
        many = DrainExpired(lease_ids=tuple(f"lease-{n:0200d}" for n in range(200)),
                            deadline_at=iso_ms(START_MS))
        held = Held(store)
        held.queue("a", lambda: store.append_unchecked("stream-a", [ReclaimCompleted(generation=2)]))
        held.queue("many", lambda: store.append_unchecked("stream-b", [many]))  # about 40 KB: beyond the limit
        held.queue("c", lambda: store.append_unchecked("stream-c", [ReclaimCompleted(generation=2)]))
        outcomes = held.release()
        errors = [outcomes["a"], outcomes["many"], outcomes["c"]]
        assert all(type(error) is StoreFullError for error in errors), outcomes
        assert len({id(error) for error in errors}) == 3
        assert store.fenced is None and rows(store) == before
        with pytest.raises(StoreFullError):  # alone, the same command fails the same way
            store.append_unchecked("stream-b", [many])
        conn.execute(f"PRAGMA max_page_count = {1 << 30}")  # space again: the store writes on
        store.append_unchecked("stream-a", [ReclaimCompleted(generation=2)])
    with EventStore.open(path) as reopened:
        assert rows(reopened)[:len(before)] == before and len(rows(reopened)) == len(before) + 1
        reopened.verify()


@pytest.mark.parametrize("then", ["returns", "appends", "leases"])
def test_a_command_that_catches_the_full_disk_and_goes_on_loses_its_batch_whole(path: Path, then: str) -> None:
    # SQLite ended the transaction on the full disk, and the command's work caught the error and went on.
    # Outside a transaction, the commands after it began and committed one of their own each (SAVEPOINT,
    # RELEASE), and an append of its own committed by itself: their callers were told the batch failed.
    with EventStore.open(path, now=FakeClock()) as store:
        before = rows(store)
        conn = store.backend.conn  # type: ignore[attr-defined]
        (pages,), = conn.execute("PRAGMA page_count").fetchall()
        conn.execute(f"PRAGMA max_page_count = {pages + 2}")
        many = DrainExpired(lease_ids=tuple(f"lease-{n:0200d}" for n in range(200)), deadline_at=iso_ms(START_MS))

        def goes_on(tx: WriteTransaction) -> str:
            try:
                tx.append_unchecked("stream-b", [many])
            except Exception as exc:  # the caller's own mistake, under test
                caught = type(exc).__name__
            if then == "appends":
                tx.append_unchecked("stream-b", [ReclaimCompleted(generation=2)])
            if then == "leases":  # a write to a table of its own, which would commit by itself just as well
                tx.put_host_lease("stream-b", "host-x", 1, 2**40)
            return caught

        held = Held(store)
        held.queue("a", lambda: store.append_unchecked("stream-a", [ReclaimCompleted(generation=2)]))
        held.queue("goes_on", lambda: store.commit("goes on", goes_on))
        held.queue("c", lambda: store.append_unchecked("stream-c", [ReclaimCompleted(generation=2)]))
        held.queue("d", lambda: store.append_unchecked("stream-d", [ReclaimCompleted(generation=2)]))
        outcomes = held.release()
        assert all(type(outcomes[name]) is StoreIOError for name in ("a", "goes_on", "c", "d")), outcomes
        assert all("nothing of it was committed" in str(outcomes[name]) for name in ("a", "goes_on", "c", "d"))
        assert rows(store) == before and store.host_lease("stream-b") is None
        if then != "returns":  # alone, the same work commits nothing either
            with pytest.raises(StoreIOError, match="no longer open"):
                store.commit("goes on", goes_on)
            assert rows(store) == before and store.host_lease("stream-b") is None
        conn.execute(f"PRAGMA max_page_count = {1 << 30}")
        store.append_unchecked("stream-a", [ReclaimCompleted(generation=2)])
    with EventStore.open(path) as reopened:
        assert len(rows(reopened)) == len(before) + 1
        reopened.verify()


def swap_store_file(path: Path) -> None:
    """Put another store's file at `path` (a restore's rename), the open one's side files left as they were."""
    other = path.with_name("other.db")
    EventStore.open(other).close()
    os.replace(other, path)


def remove_side_files(path: Path) -> None:
    for suffix in ("-wal", "-shm"):
        os.unlink(f"{path}{suffix}")


@pytest.mark.parametrize("change", [swap_store_file, remove_side_files], ids=["store-file-renamed-over",
                                                                               "side-files-removed"])
def test_files_changed_during_a_batch_fail_every_command_with_outcome_unknown_and_fence(
        path: Path, tmp_path: Path, change: Any) -> None:
    with EventStore.open(path, now=FakeClock()) as store:
        a, b = handle(store, tmp_path, "runner-a"), handle(store, tmp_path, "runner-b")
        held = Held(store)
        held.queue("a", lambda: a.request_drain(expected_generation=1))
        # Inside the batch, after its BEGIN: the check made before it passed, and the commit goes where it goes.
        held.queue("change", lambda: store.commit("change", lambda tx: change(path)))
        held.queue("b", lambda: b.request_drain(expected_generation=1))
        outcomes = held.release()
        errors = [outcomes[name] for name in ("a", "change", "b")]
        assert all(type(error) is StoreIOError and error.outcome_unknown for error in errors), outcomes
        assert len({id(error) for error in errors}) == 3  # each caller raises its own
        cause = store.fenced
        assert cause is not None and "outcome unknown" in cause and "fsync" not in cause
        assert str(path) in cause and "reopen the store" in cause
        with pytest.raises(StoreFencedError) as fenced:
            a.request_drain(expected_generation=1)
        assert str(fenced.value).count("the store is fenced") == 1


def test_sixteen_threads_committing_while_the_store_file_is_renamed_over_none_acknowledged_is_lost(
        path: Path) -> None:
    # A command begun after the rename that is acknowledged must be in the file now at the path: none is,
    # since each is refused (fenced) or fails with its outcome unknown.
    acknowledged: list[tuple[str, int]] = []
    refused: list[BaseException] = []
    swapped = threading.Event()
    with EventStore.open(path) as store:
        def writer(name: str) -> None:
            for generation in range(1, 10_000):
                # Begun after the rename: its batch begins after it too, so it must commit to the file there now.
                after = swapped.is_set()
                try:
                    store.append_unchecked(name, [ReclaimCompleted(generation=generation)])
                except (StoreFencedError, StoreIOError) as exc:
                    refused.append(exc)
                    return
                if after:
                    acknowledged.append((name, generation))

        threads = [threading.Thread(target=writer, args=(f"w-{n}",)) for n in range(16)]
        for thread in threads:
            thread.start()
        assert wait_for(lambda: store.group_commit.commands > 200)
        swap_store_file(path)
        swapped.set()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
        assert store.fenced is not None and len(refused) == 16
    with EventStore.open(path) as reopened:
        held = {(recorded.stream, recorded.version) for recorded in reopened.read()}
    assert [ack for ack in acknowledged if ack not in held] == []


@pytest.mark.parametrize("fails", ["release", "release-and-rollback"])
def test_a_command_whose_release_fails_is_rolled_back_alone_or_loses_the_batch(tmp_path: Path, fails: str) -> None:
    # RELEASE can fail (an exec tracer or authorizer the embedder installed, no memory): the command is refused,
    # so its rows must not ride along in the batch's COMMIT. When not even the rollback goes through, the whole
    # batch fails: nothing of it is committed.
    store = EventStore.open(tmp_path / "events.db")
    conn = store.backend.conn  # type: ignore[attr-defined]
    held = Held(store)
    armed = {"RELEASE": False, "ROLLBACK": False}

    def refuse(cursor: Any, sql: str, bindings: Any) -> bool:
        verb = sql.split()[0]
        if armed.get(verb):
            armed[verb] = False
            return False  # apsw aborts the statement
        return True

    def first(tx: WriteTransaction) -> str:
        tx.append_unchecked("first", [ReclaimCompleted(generation=2)])
        armed["RELEASE"] = True
        armed["ROLLBACK"] = fails == "release-and-rollback"
        return "first"

    held.queue("first", lambda: store.commit("first", first))
    held.queue("second", lambda: store.commit("second", lambda tx: tx.append_unchecked(
        "second", [ReclaimCompleted(generation=2)]) and "second"))
    conn.exec_trace = refuse
    outcomes = held.release()
    conn.exec_trace = None
    store.close()
    assert isinstance(outcomes["first"], StoreIOError if fails == "release-and-rollback" else StoreError)
    with EventStore.open(tmp_path / "events.db") as reopened:
        streams = reopened.streams()
    if fails == "release":
        assert outcomes["second"] == "second" and streams == ["second"]
    else:
        assert isinstance(outcomes["second"], StoreIOError) and streams == []
