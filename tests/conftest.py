"""Fixtures shared by every test: a fresh event store on a real file, and a clock that moves when told.

    def test_something(store, clock):
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=2)])
        clock.advance(1_000)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lifecycle_es import EventStore

# 2026-01-01T00:00:00.000Z: a fixed start, so `at` columns and receipts are the same on every run.
START_MS = 1_767_225_600_000


class FakeClock:
    """An epoch-millisecond clock that stands still until `advance` moves it (a negative step models skew).

    Pass ``clock.now`` (or the clock itself: it is callable) wherever the code takes ``now=``.
    """

    def __init__(self, start_ms: int = START_MS) -> None:
        self.ms = start_ms

    def now(self) -> int:
        """The current time in epoch milliseconds."""
        return self.ms

    __call__ = now

    def advance(self, ms: int) -> int:
        """Move the clock by `ms` milliseconds and return the new time."""
        self.ms += ms
        return self.ms

    def __repr__(self) -> str:
        return f"FakeClock(ms={self.ms})"


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at 2026-01-01T00:00:00Z."""
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[EventStore]:
    """A fresh, unkeyed EventStore on a real file in tmp_path, timestamped by the `clock` fixture."""
    opened = EventStore.open(tmp_path / "events.db", now=clock.now)
    try:
        yield opened
    finally:
        opened.close()
