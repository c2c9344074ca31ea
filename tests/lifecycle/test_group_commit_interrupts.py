"""Ctrl-C in the main thread while it writes a batch of other threads' commands, wherever it lands in the group
commit's bookkeeping: the interrupt is the main thread's alone, every other caller gets an answer (its outcome, or
StoreIOError saying nothing of it committed) and the store goes on taking commands. A signal's exception lands
where a C call returns or a function begins; the deterministic cases raise it as a function of the group commit
begins (a trace's call event), the storm lands real signals wherever they fall."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from holding import Held

from lifecycle_es import EventStore, StoreError, StoreIOError
from lifecycle_es import group_commit as group_commit_module
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.group_commit import GroupCommit

EVENT = ReclaimCompleted(generation=2)
GUARD_S = 20
SOURCE = group_commit_module.__file__


def appending(store: EventStore, stream: str) -> Any:
    return lambda: store.commit(stream, lambda tx: tx.append_unchecked(stream, [EVENT]) and stream)


def behind_the_main_thread(held: Held, store: EventStore, first: tuple[str, Any]) -> None:
    """In a thread of its own: once the main thread queues behind the held writer, `first` (a name and a call) and
    "two" queue behind it, then the held writer lets go, so that the main thread writes the batch of the three."""
    def later() -> None:
        deadline = time.monotonic() + GUARD_S
        while store.group_commit.queued < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        held.queue(*first)
        held.queue("two", appending(store, "two"))
        held.gate.set()

    threading.Thread(target=later, daemon=True).start()


@pytest.mark.parametrize("where", ["_serve", "_gather", "_each", "_hand_on"])
def test_an_interrupt_as_a_step_of_the_batch_begins_answers_every_other_caller(tmp_path: Path, where: str) -> None:
    store = EventStore.open(tmp_path / "events.db", durability="normal")
    try:
        held = Held(store)
        main: dict[str, Any] = {}
        fired: list[str] = []

        def trace(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "call" and frame.f_code.co_filename == SOURCE and frame.f_code.co_name == where \
                    and not fired:
                fired.append(where)
                raise KeyboardInterrupt(f"Ctrl-C as {where} began")
            return None

        behind_the_main_thread(held, store, ("one", appending(store, "one")))
        sys.settrace(trace)
        try:
            main["outcome"] = store.commit("main", lambda tx: tx.append_unchecked("main", [EVENT]) and "main")
        except KeyboardInterrupt as exc:
            main["outcome"] = exc
        finally:
            sys.settrace(None)
        outcomes = held.release()  # joins every thread, failing the test if one still waits
        assert fired == [where] and isinstance(main["outcome"], KeyboardInterrupt)
        for name in ("one", "two"):
            assert outcomes[name] == name or isinstance(outcomes[name], StoreIOError), (name, outcomes[name])
        assert appending(store, "after")() == "after"  # no writer was lost
        committed = set(store.streams())
        # An answer that says the work committed is one the log holds; one that says it did not, one it lacks.
        for name in ("one", "two"):
            assert (name in committed) == (outcomes[name] == name), (name, outcomes[name], committed)
    finally:
        store.close()


def test_a_second_interrupt_as_the_answers_begin_still_answers_every_caller(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C pressed twice: the first lands once the batch is gathered, outside its transaction, the second as the
    step that answers the batch's other callers begins; that step runs once more, so none is left waiting. (A trace
    function is unset by the exception it raises, so each step is wrapped to raise as it begins instead.) Only an
    interrupt in that second run is beyond it, as one in the hand-on's second run is."""
    steps = ("_batch_name", "_answer_rest")
    store = EventStore.open(tmp_path / "events.db", durability="normal")
    try:
        held = Held(store)
        main: dict[str, Any] = {}
        fired: list[str] = []
        armed = threading.Event()  # only the main thread's commit is interrupted, once the others queue

        def interrupting(name: str, step: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if armed.is_set() and threading.current_thread() is threading.main_thread() \
                        and len(fired) < len(steps) and steps[len(fired)] == name:
                    fired.append(name)
                    raise KeyboardInterrupt(f"Ctrl-C number {len(fired)}, as {name} began")
                return step(*args, **kwargs)
            return wrapper

        for name in set(steps):
            if name.startswith("_batch"):
                monkeypatch.setattr(group_commit_module, name, interrupting(name, getattr(group_commit_module, name)))
            else:
                monkeypatch.setattr(GroupCommit, name, interrupting(name, getattr(GroupCommit, name)))

        behind_the_main_thread(held, store, ("one", appending(store, "one")))
        armed.set()
        try:
            main["outcome"] = store.commit("main", lambda tx: tx.append_unchecked("main", [EVENT]) and "main")
        except KeyboardInterrupt as exc:
            main["outcome"] = exc
        outcomes = held.release()
        assert fired == list(steps) and isinstance(main["outcome"], KeyboardInterrupt)
        assert appending(store, "after")() == "after"
        committed = set(store.streams())
        for name in ("one", "two"):
            assert (name in committed) == (outcomes[name] == name), (name, outcomes[name], committed)
    finally:
        store.close()


def raising(kind: type[BaseException]) -> Any:
    def work(tx: Any) -> None:
        tx.append_unchecked("bad", [EVENT])
        raise kind("the work's own")
    return work


def caught(call: Any) -> Any:
    """`call`, returning what it raised, an exception that is no Exception included (`Held` keeps Exceptions)."""
    def run() -> Any:
        try:
            return call()
        except BaseException as exc:
            return exc
    return run


@pytest.mark.parametrize("kind", [SystemExit, GeneratorExit, asyncio.CancelledError])
def test_what_another_threads_work_raises_is_its_own_when_the_main_thread_writes_the_batch(
        tmp_path: Path, kind: type[BaseException]) -> None:
    """No signal raised it: the work did (sys.exit() in a worker, a task's cancellation). Its caller's alone,
    rolled back alone, whichever thread writes the batch; the main thread's own command and the others commit."""
    store = EventStore.open(tmp_path / "events.db", durability="normal")
    try:
        held = Held(store)

        behind_the_main_thread(held, store, ("bad", caught(lambda: store.commit("bad", raising(kind)))))
        mine = store.commit("main", lambda tx: tx.append_unchecked("main", [EVENT]) and "main")
        outcomes = held.release()
        assert mine == "main" and outcomes["two"] == "two"
        assert type(outcomes["bad"]) is kind and str(outcomes["bad"]) == "the work's own"
        assert set(store.streams()) == {"main", "two"}
    finally:
        store.close()


def exits(signum: int, frame: FrameType | None) -> None:
    sys.exit(7)


def restores_then_exits(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a common pattern: a second SIGTERM then ends the process at once
    sys.exit(7)


class Stopper:
    """A handler object whose ``__call__`` is a static method (its frames are the function's)."""

    __call__ = staticmethod(exits)


@pytest.mark.parametrize("handler", [exits, restores_then_exits, functools.lru_cache(exits), Stopper()],
                         ids=["function", "restores-then-exits", "lru-cached", "static-call"])
def test_a_signal_handlers_exit_while_the_main_thread_writes_is_the_main_threads(tmp_path: Path,
                                                                               handler: Any) -> None:
    """A SIGTERM handler's sys.exit() lands in the main thread, in whichever work it runs: that is an interrupt of
    the main thread, not the work's, so the batch is rolled back and every other caller told nothing committed;
    also when the handler put the default back before it exited, and is no longer installed when it is asked."""
    store = EventStore.open(tmp_path / "events.db", durability="normal")
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        held = Held(store)

        def signalled(tx: Any) -> None:
            tx.append_unchecked("signalled", [EVENT])
            os.kill(os.getpid(), signal.SIGTERM)  # handled in the main thread, where this work runs

        behind_the_main_thread(held, store, ("signalled", lambda: store.commit("signalled", signalled)))
        with pytest.raises(SystemExit) as exited:
            store.commit("main", lambda tx: tx.append_unchecked("main", [EVENT]) and "main")
        outcomes = held.release()
        assert exited.value.code == 7
        for name in ("signalled", "two"):
            assert isinstance(outcomes[name], StoreIOError) and "nothing of it was committed" in str(outcomes[name])
        assert store.streams() == []
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.close()


class DictBacked:
    """A handler object whose attributes come from a dict: looking one up that is not there raises KeyError."""

    def __init__(self) -> None:
        self.d = {"code": 7}

    def __getattr__(self, name: str) -> Any:
        return self.d[name]

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        sys.exit(self.code)


def test_a_handler_whose_attributes_raise_never_fails_a_batch_the_main_thread_writes(tmp_path: Path) -> None:
    """The writer looks into the installed handlers as a batch begins; one it cannot look into is not a reason to
    fail the batch: the main thread's command and the others commit."""
    store = EventStore.open(tmp_path / "events.db", durability="normal")
    previous = signal.signal(signal.SIGTERM, DictBacked())
    try:
        held = Held(store)
        behind_the_main_thread(held, store, ("one", appending(store, "one")))
        mine = store.commit("main", lambda tx: tx.append_unchecked("main", [EVENT]) and "main")
        outcomes = held.release()
        assert (mine, outcomes["one"], outcomes["two"]) == ("main", "one", "two")
        assert set(store.streams()) == {"main", "one", "two"}
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.close()


class Interrupted(BaseException):
    """The storm's Ctrl-C: raised only where it lands inside the group commit, in the main thread."""


def test_a_storm_of_interrupts_in_the_main_thread_never_wedges_the_store(tmp_path: Path) -> None:
    store = EventStore.open(tmp_path / "events.db", durability="normal")
    stop = threading.Event()
    counts = [0, 0, 0]
    landed = [0]

    def handler(signum: int, frame: FrameType | None) -> None:
        if frame is not None and frame.f_code.co_filename == SOURCE:
            landed[0] += 1
            raise Interrupted

    def background(index: int) -> None:
        while not stop.is_set():
            try:
                store.commit("bg", lambda tx: tx.append_unchecked(f"bg-{index}", [EVENT]))
                counts[index] += 1
            except StoreError:
                if store.fenced:
                    return  # a COMMIT the storm interrupted: its outcome unknown, the store fenced
                # else a batch the main thread wrote and the storm interrupted: nothing of it committed

    threads = [threading.Thread(target=background, args=(n,), daemon=True) for n in range(3)]
    for thread in threads:
        thread.start()
    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
    try:
        deadline = time.monotonic() + GUARD_S
        while landed[0] < 30 and not store.fenced and time.monotonic() < deadline:
            with contextlib.suppress(Interrupted, StoreError):
                store.commit("main", lambda tx: tx.append_unchecked("main", [EVENT]))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
    try:
        if not store.fenced:
            # No caller is left waiting for a writer that is gone: every thread's next command commits.
            before = list(counts)
            deadline = time.monotonic() + GUARD_S
            while not all(now > then for now, then in zip(counts, before, strict=True)):
                assert time.monotonic() < deadline, (f"background commands stopped: {before} -> {counts}, "
                                                     f"{store.group_commit!r}")
                time.sleep(0.01)
        stop.set()
        for thread in threads:
            thread.join(GUARD_S)
            assert not thread.is_alive(), store.group_commit
    finally:
        stop.set()
        store.close()
