"""The read side never sees another thread's batch in flight: every page it reads is read under the store's lock.

One connection serves every thread of a store, and a batch of `commit` is open on it while its writer runs the
works: a read on that connection without the lock would see the batch's rows, snapshots and read-model rows
before they commit (or though they never do), and could meet its rollback mid-page. So each read of the
backend below is checked to run while the calling thread holds the lock; and a reader started while another
thread holds a batch open that then rolls back is checked to see the log without it. On both backends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from holding import HeldRollback
from waiting import wait_for

from lifecycle_es import EventStore, RunnerLifecycle, audit
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import LeaseAcquired
from lifecycle_es.replay import load, stream_pages
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS, FakeClock, SequentialIds
from lifecycle_es.values import ProxyAuthority
from projections import (
    attach,
    fleet,
    read_lease_rows,
    read_runner_rows,
    replay,
    replay_all,
    runner_at,
    state_at,
    states_at,
)

HOUR = 3_600_000
# The backend's reads a fold or a read model query makes (a generator's checked at every page).
READS = ("pages", "stream_pages", "snapshot", "row_at", "read_model_rows", "lease_rows_of", "head", "streams",
         "stream_version", "snapshot_positions", "read_model_position", "seq_bounds", "schema_problems")


class LockWatch:
    """The store's lock, telling whether a thread ever had to wait for it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.waited = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._inner.acquire(False):
            return True
        if not blocking:
            return False
        self.waited.set()
        return bool(self._inner.acquire(True, timeout))

    def release(self) -> None:
        self._inner.release()

    def _is_owned(self) -> bool:
        return bool(self._inner._is_owned())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class BackendWatch:
    """The store's backend, noting every read made without the store's lock."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._inner = store._backend
        self.unlocked: list[str] = []

    def _check(self, name: str) -> None:
        if not self._store.lock._is_owned():  # type: ignore[attr-defined]
            self.unlocked.append(name)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name not in READS:
            return value

        def read(*args: Any, **kwargs: Any) -> Any:
            if name in ("pages", "stream_pages"):  # lazy: each page is read at its next()
                return self._pages(name, value(*args, **kwargs))
            self._check(name)
            return value(*args, **kwargs)

        return read

    def _pages(self, name: str, pages: Iterator[Any]) -> Iterator[Any]:
        while True:
            self._check(name)
            page = next(pages, None)
            if page is None:
                return
            yield page


def proxy() -> ProxyAuthority:
    return ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(START_MS), expires_at=iso_ms(START_MS + HOUR))


@pytest.fixture
def runners(store_target: str, tmp_path: Path) -> Iterator[EventStore]:
    """A store with read models attached and two runners, one with a lease, snapshots after every event."""
    with EventStore.open(store_target, now=FakeClock()) as store:
        attach(store)
        for runner_id in ("runner-a", "runner-b"):
            own = tmp_path / runner_id
            own.mkdir()
            handle = RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "runner_id": runner_id},  # type: ignore[arg-type]
                                     base_dir=str(own), now=FakeClock(), random_id=SequentialIds(),
                                     snapshot_every=1)
            handle.initialize()
        handle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy())
        yield store


def _progress(done: int, total: int) -> None:
    pass


READERS: dict[str, Callable[[EventStore], Any]] = {
    "state_at": lambda store: state_at(store, "runner-b"),
    "state_at with progress": lambda store: state_at(store, "runner-b", progress=_progress),
    "state_at a seq": lambda store: state_at(store, "runner-b", 2),
    "states_at": lambda store: states_at(store),
    "states_at with progress": lambda store: states_at(store, progress=_progress),
    "fleet": lambda store: fleet(store),
    "replay": lambda store: replay(store),
    "replay_all": lambda store: list(replay_all(store)),
    "runner_at": lambda store: runner_at(store, "runner-b"),
    "read_runner_rows": lambda store: read_runner_rows(store),
    "read_lease_rows": lambda store: read_lease_rows(store, "runner-b"),
    "load": lambda store: load(store, "runner-b"),
    "stream_pages": lambda store: list(stream_pages(store, "runner-b", 0)),
    "audit": lambda store: audit(store).ok,
}


@pytest.mark.parametrize("name", sorted(READERS))
def test_every_read_of_the_backend_holds_the_store_lock(runners: EventStore, name: str) -> None:
    store = runners
    watch = BackendWatch(store)
    store._backend = watch  # type: ignore[assignment]
    try:
        READERS[name](store)
    finally:
        store._backend = watch._inner
    assert watch.unlocked == []


def _without_snapshots(store: EventStore) -> None:
    with store.transaction("drop snapshots") as tx:
        tx.store.backend.clear_snapshots()


@pytest.mark.parametrize("name", ["state_at", "replay", "runner_at", "read_runner_rows", "read_lease_rows", "load"])
def test_a_read_beside_a_batch_that_rolls_back_never_sees_it(runners: EventStore, name: str) -> None:
    store = runners
    _without_snapshots(store)  # the fold reads the log from the start, the first thing it reads
    read = READERS[name]
    before = read(store)
    watch = LockWatch(store._lock)
    store._lock = watch  # type: ignore[assignment]
    version = store.stream_version("runner-b")
    lease = LeaseAcquired(lease_id="lease-x", session_id="s-x", lease_generation=1, issued_at=iso_ms(START_MS),
                          expires_at=iso_ms(START_MS + HOUR), proxy_authority=proxy())
    held = HeldRollback(store, "runner-b", [lease], expected_version=version)  # the read models follow it
    seen: list[Any] = []
    reader = threading.Thread(target=lambda: seen.append(read(store)))
    reader.start()
    # The reader either read the batch's rows (no lock) or waits for the lock the batch holds.
    assert wait_for(lambda: watch.waited.is_set() or not reader.is_alive())
    held.release()
    reader.join(20)
    assert not reader.is_alive()
    assert seen == [before]
