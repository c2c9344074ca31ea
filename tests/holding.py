"""A writer held inside a first command, so that the commands queued behind it form one known batch.

    held = Held(store)                       # a thread's command now waits inside the writer
    held.queue("a", lambda: lifecycle.acquire_lease(...))   # queued, in this order
    outcomes = held.release()                # {"gate": ..., "a": receipt or the exception raised}
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from waiting import wait_for

from lifecycle_es import EventStore
from lifecycle_es.store import WriteTransaction


class Held:
    """A writer stopped inside a first command until `release`; the commands queued meanwhile form one batch."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.threads: list[threading.Thread] = []
        self.outcomes: dict[str, Any] = {}
        self.run("gate", lambda: store.commit("gate", self._wait))
        assert self.entered.wait(20)

    def _wait(self, tx: WriteTransaction) -> None:
        # Writes nothing, so its commit neither writes nor syncs: a fault injected meanwhile meets the next batch.
        self.entered.set()
        assert self.gate.wait(20)

    def run(self, name: str, call: Callable[[], Any]) -> None:
        def target() -> None:
            try:
                self.outcomes[name] = call()
            except Exception as exc:  # the outcome the test asserts on
                self.outcomes[name] = exc

        thread = threading.Thread(target=target, name=name)
        self.threads.append(thread)
        thread.start()

    def queue(self, name: str, call: Callable[[], Any]) -> None:
        """Start `call` in a thread and wait until it waits in the queue (so the batch's order is known)."""
        queued = self.store.group_commit.queued
        self.run(name, call)
        assert wait_for(lambda: self.store.group_commit.queued == queued + 1)

    def release(self) -> dict[str, Any]:
        self.gate.set()
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive()
        return self.outcomes


class HeldRollback:
    """A batch held open after appending `events` to `stream`, rolled back by `release`: a reader running
    meanwhile must see neither its rows nor its read models' changes."""

    def __init__(self, store: EventStore, stream: str, events: list[Any], *, expected_version: int) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.failed: list[BaseException] = []

        def appends_then_fails(tx: WriteTransaction) -> None:
            tx.append(stream, events, expected_version=expected_version)  # in the transaction, not committed
            self.entered.set()
            assert self.gate.wait(20)
            raise RuntimeError("rolled back")

        def write() -> None:
            try:
                store.commit("write", appends_then_fails)
            except RuntimeError as exc:
                self.failed.append(exc)

        self.writer = threading.Thread(target=write)
        self.writer.start()
        assert self.entered.wait(20)

    def release(self) -> None:
        """Let the batch fail, and check that it did, alone."""
        self.gate.set()
        self.writer.join(20)
        assert not self.writer.is_alive() and len(self.failed) == 1
