"""The host drivers: child processes and systemd units for real, run directories, parking, hostile units.

Shared fixtures: `run` (a held run directory for one lease) and `units` (a child-mode driver that stops
and reaps every unit a test started, whatever the test did).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hosts.child import ChildUnits
from hosts.rundir import RunDir, open_run_dir
from lifecycle_es.events import UnitRecord


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RunDir]:
    """A run directory for lease-1, held for the test."""
    with open_run_dir(tmp_path / "runs", "lease-1") as held:
        yield held


@pytest.fixture
def units() -> Iterator[ChildUnits]:
    """A child-mode driver; every unit started through it is stopped and reaped after the test."""
    made = ChildUnits(stop_timeout_ms=5_000, poll_ms=10)
    started: list[UnitRecord] = []
    original = made.start

    def tracked(*args: Any, **kwargs: Any) -> UnitRecord:
        handle = original(*args, **kwargs)
        started.append(handle)
        return handle

    made.start = tracked  # type: ignore[method-assign]
    yield made
    for handle in started:  # leave nothing running whatever a test did
        made.stop(handle, timeout_ms=0)
        made.reap(handle, timeout_ms=5_000)
