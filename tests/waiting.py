"""Bounded waits for tests that watch real processes (imported as ``from waiting import wait_for``)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout_s: float = 20.0, *, interval_s: float = 0.02) -> bool:
    """Poll until `predicate` holds or `timeout_s` passes; a bound on a wait, never an assertion on time."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True
