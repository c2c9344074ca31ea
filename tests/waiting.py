"""Bounded waits for tests that watch real processes (``from waiting import returns_within, wait_for``)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def wait_for(predicate: Callable[[], object], timeout_s: float = 20.0, *, interval_s: float = 0.02) -> bool:
    """Poll until `predicate` holds or `timeout_s` passes; a bound on a wait, never an assertion on time."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def returns_within(call: Callable[[], T], timeout_s: float = 20.0, *, fifo: str | os.PathLike[str] | None = None) -> T:
    """`call()`'s result (or its exception), failing the test when it has not returned in `timeout_s`.

    For code that could block for ever (an open or read of a FIFO): a regression fails instead of
    hanging the suite. `fifo`, when given, is opened at both ends after a timeout so that a reader or
    writer blocked on opening it returns and its thread ends.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        for flags in ((os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK) if fifo is not None else ()):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, flags))  # type: ignore[arg-type]
        pytest.fail(f"{getattr(call, '__name__', 'the call')} did not return within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def wait_child(pid: int) -> int:
    """The exit code of child `pid`, which is killed (and the test failed) when it has not exited in 30 s."""
    for _ in range(300):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        threading.Event().wait(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung")
