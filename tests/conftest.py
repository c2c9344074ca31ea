"""Fixtures shared by every test: a fresh event store on a real file, a clock that moves when told, and the
fleet logs the command-line, audit and store tests read (built once per module that asks, never changed).

    def test_something(store, clock):
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=2)])
        clock.advance(1_000)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleets import KEY, fleet_in, long_in
from pg import NEED, Server, binaries, cluster

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


@pytest.fixture(scope="module")
def fleet_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """A fleet log written by the lifecycle itself (read models, snapshots, a seal), and its marks."""
    return fleet_in(tmp_path_factory)


@pytest.fixture(scope="module")
def keyed_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet log of a keyed store (its key: ``fleets.KEY``)."""
    return fleet_in(tmp_path_factory, key=KEY)[0]


@pytest.fixture(scope="module")
def long_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log long enough for the audit's worker processes (two ranges and a bit)."""
    return long_in(tmp_path_factory)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    """A throwaway PostgreSQL cluster for the whole run (see ``pg.py``); skipped, saying how to get one,
    where the machine has no PostgreSQL binaries, unless LIFECYCLE_ES_REQUIRE_POSTGRES is set (CI)."""
    if binaries() is None:
        if os.environ.get("LIFECYCLE_ES_REQUIRE_POSTGRES"):
            pytest.fail(NEED)
        pytest.skip(NEED)
    with cluster() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: Server) -> Iterator[str]:
    """The URL of a store of this test's own on the cluster (its schema dropped afterwards)."""
    schema = pg_server.new_schema()
    try:
        yield pg_server.url(schema)
    finally:
        pg_server.drop(schema)
