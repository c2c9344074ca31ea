"""The injected clock and id source, under the test's control."""

from __future__ import annotations

START_MS = 1_767_225_600_000
"""2026-01-01T00:00:00.000Z: where a `FakeClock` starts unless told otherwise."""


class FakeClock:
    """An epoch-millisecond clock that stands still until `advance` moves it; pass it as ``now=``."""

    def __init__(self, start_ms: int = START_MS) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        """The current time in epoch milliseconds."""
        return self.ms

    def now(self) -> int:
        """The current time in epoch milliseconds (the clock itself, called, says the same)."""
        return self.ms

    def advance(self, ms: int) -> int:
        """Move the clock by `ms` milliseconds (negative models skew) and return the new time."""
        self.ms += ms
        return self.ms

    def __repr__(self) -> str:
        return f"FakeClock(ms={self.ms})"


class SequentialIds:
    """A ``random_id`` stand-in: ``000001``, ``000002``, ...; two runners fed alike name leases alike."""

    def __init__(self, start: int = 1) -> None:
        self.next = start

    def __call__(self) -> str:
        """The next id."""
        value = f"{self.next:06d}"
        self.next += 1
        return value
