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
from lifecycle_es.testing import FakeClock


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
