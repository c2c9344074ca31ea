"""What `EventStore.commit`, `GroupCommit.run`, `EventStore.transaction` and a write transaction's methods take.

A commit's work must do its work when called: one that hands back a coroutine, a generator or any other
iterator (an ``async def`` body, a ``yield`` in it, a lazy ``read_stream`` returned) would run after its
transaction ended, or never. It is refused with InvalidInputError("work") and whatever it appended is rolled
back, alone, in a batch, or in a transaction of its own. Every other argument is checked before anything
runs, as InvalidInputError naming it; and a refused `tune` changes nothing. On both backends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from holding import Held

from lifecycle_es import EventStore, InvalidInputError, RunnerLifecycle
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.store import WriteTransaction
from lifecycle_es.testing import RUNNER_DEFAULTS, FakeClock

EVENT = ReclaimCompleted(generation=2)


def log(store: EventStore) -> list[tuple[Any, ...]]:
    return [recorded.row() for recorded in store.read()]


@pytest.fixture
def runner(store: EventStore, tmp_path: Path, clock: FakeClock) -> EventStore:
    RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "base_dir": str(tmp_path)}, now=clock).initialize()  # type: ignore[arg-type]
    return store


def _append(tx: WriteTransaction) -> None:
    tx.append_unchecked("runner-1", [EVENT])


async def _coroutine(tx: WriteTransaction) -> None:
    _append(tx)


def _generator(tx: WriteTransaction) -> Iterator[None]:
    _append(tx)
    yield None


def _appends_then_returns_a_generator(tx: WriteTransaction) -> Iterator[None]:
    _append(tx)
    return (None for _ in range(1))


def _appends_then_returns_an_iterator(tx: WriteTransaction) -> Iterator[int]:
    _append(tx)
    return iter([1, 2])


def _appends_then_returns_its_read(tx: WriteTransaction) -> Any:
    _append(tx)
    return tx.read_stream("runner-1")  # lazy: read after the transaction ended


def _appends_then_returns_a_coroutine(tx: WriteTransaction) -> Any:
    _append(tx)
    return _coroutine(tx)


WORKS: dict[str, Callable[[WriteTransaction], Any]] = {
    "coroutine function": _coroutine,
    "generator function": _generator,
    "returns a generator": _appends_then_returns_a_generator,
    "returns an iterator": _appends_then_returns_an_iterator,
    "returns a lazy read": _appends_then_returns_its_read,
    "returns a coroutine": _appends_then_returns_a_coroutine,
}


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a coroutine left unawaited is closed, not warned about
@pytest.mark.parametrize("name", sorted(WORKS))
def test_work_that_returns_instead_of_working_is_refused_and_rolled_back(runner: EventStore, name: str) -> None:
    store = runner
    before = log(store)
    with pytest.raises(InvalidInputError) as alone:
        store.commit("work", WORKS[name])
    assert alone.value.field == "work"
    assert log(store) == before
    with store.lock, pytest.raises(InvalidInputError) as own:  # a transaction of its own, from the lock's holder
        store.commit("work", WORKS[name])
    assert own.value.field == "work"
    assert log(store) == before
    held = Held(store)  # in a batch, under a savepoint: rolled back alone, the others commit
    held.queue("bad", lambda: store.commit("bad", WORKS[name]))
    held.queue("good", lambda: store.commit("good", lambda tx: len(tx.append_unchecked("runner-1", [EVENT]))))
    outcomes = held.release()
    assert isinstance(outcomes["bad"], InvalidInputError) and outcomes["bad"].field == "work"
    assert outcomes["good"] == 1
    assert log(store)[:-1] == before and len(log(store)) == len(before) + 1


class Named(str):
    """A str subclass."""


BAD_COMMITS: list[tuple[str, dict[str, Any]]] = [
    ("action", {"action": None}),
    ("action", {"action": ""}),
    ("action", {"action": "x" * 257}),
    ("action", {"action": b"append"}),
    ("action", {"action": Named("append")}),
    ("work", {"work": None}),
    ("work", {"work": "tx.append"}),
    ("work", {"work": _coroutine}),
    ("stream", {"stream": "not an id"}),
    ("stream", {"stream": 7}),
    ("stream", {"stream": Named("runner-1")}),
]


@pytest.mark.parametrize(("field", "bad"), BAD_COMMITS,
                         ids=[f"{field}={bad[field]!r:.20}" for field, bad in BAD_COMMITS])
def test_commit_and_run_refuse_each_bad_argument_before_anything_runs(runner: EventStore, field: str,
                                                                      bad: dict[str, Any]) -> None:
    store = runner
    before = log(store)
    ran: list[str] = []

    def work(tx: WriteTransaction) -> None:
        ran.append("ran")
        _append(tx)

    arguments = {"action": "write", "work": work, "stream": "runner-1", **bad}
    for call in (lambda: store.commit(arguments["action"], arguments["work"], stream=arguments["stream"]),
                 lambda: store.group_commit.run(arguments["action"], arguments["work"], arguments["stream"])):
        with pytest.raises(InvalidInputError) as info:
            call()
        assert info.value.field == field
    assert ran == [] and log(store) == before


@pytest.mark.parametrize(("field", "action", "streams"), [
    ("action", None, ()), ("action", "", ()), ("action", Named("write"), ()),
    ("streams", "write", "runner-1"), ("streams", "write", ["not an id"]), ("streams", "write", [3]),
    ("streams", "write", iter(["runner-1"])), ("streams", "write", None),
])
def test_a_transaction_refuses_a_bad_action_or_streams(runner: EventStore, field: str, action: Any,
                                                       streams: Any) -> None:
    with pytest.raises(InvalidInputError) as info:
        runner.transaction(action, streams=streams)
    assert info.value.field == field


@pytest.mark.parametrize(("method", "arguments", "field"), [
    ("stream_version", ("not an id",), "stream"),
    ("stream_version", (None,), "stream"),
    ("host_lease", ("bad/id",), "stream"),
    ("lease_clock", ("now",), "now_ms"),
    ("lease_clock", (-1,), "now_ms"),
    ("put_host_lease", ("bad id", "host/boot/1", 1, 10), "stream"),
    ("put_host_lease", ("runner-1", "a holder", 1, 10), "holder"),
    ("put_host_lease", ("runner-1", "host/boot/1", 1.5, 10), "token"),
    ("put_host_lease", ("runner-1", "host/boot/1", 1, True), "expires_ms"),
    ("read_stream", ("not an id",), "stream"),
])
def test_a_transactions_methods_refuse_bad_arguments_and_write_nothing(runner: EventStore, method: str,
                                                                       arguments: tuple[Any, ...], field: str) -> None:
    store = runner
    before = log(store), store.host_lease("runner-1")
    with pytest.raises(InvalidInputError) as info, store.transaction("write") as tx:
        _append(tx)
        list(getattr(tx, method)(*arguments) or ())
    assert info.value.field == field
    assert (log(store), store.host_lease("runner-1")) == before


@pytest.mark.parametrize(("good", "bad", "field"), [
    ({"max_batch": 8}, {"linger_ms": -1}, "linger_ms"),
    ({"linger_ms": 7}, {"max_batch": 0}, "max_batch"),
    ({"max_batch": 8}, {"linger_ms": float("nan")}, "linger_ms"),
])
def test_a_refused_tune_changes_nothing(store: EventStore, good: dict[str, Any], bad: dict[str, Any],
                                        field: str) -> None:
    group = store.group_commit
    before = (group.max_batch, group.linger_ms)
    with pytest.raises(InvalidInputError) as info:
        group.tune(**good, **bad)
    assert info.value.field == field
    assert (group.max_batch, group.linger_ms) == before
    group.tune(**good)
    assert (group.max_batch, group.linger_ms) != before
