"""Fixtures shared by every test: a fresh event store (on a real file, and again in a schema of its own on a
throwaway PostgreSQL cluster), a clock that moves when told, and the fleet logs the command-line, audit and
store tests read (built once per module that asks, never changed).

    def test_something(store, clock):
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=2)])
        clock.advance(1_000)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleets import KEY, build_long, fleet_in, long_in
from pg import NEED, Server, binaries, cluster
from targets import Places

from lifecycle_es import EventStore
from lifecycle_es.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at 2026-01-01T00:00:00Z."""
    return FakeClock()


BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where this test's store lives (none exists there yet), once per backend: a file in tmp_path, or a
    schema of the test's own on the throwaway cluster (``pg_url``: asked for only here, so a run of the
    SQLite cases alone never starts a server)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "events.db")


@pytest.fixture(params=BACKENDS)
def places(request: pytest.FixtureRequest) -> Iterator[Places]:
    """Fresh store targets for a test that makes many stores (a property test's examples, a state machine's
    runs), once per backend; every store made is removed after the test."""
    server: Server | None = request.getfixturevalue("pg_server") if request.param == "postgres" else None
    made = Places(request.param, server)
    try:
        yield made
    finally:
        made.clean()


@pytest.fixture
def store(store_target: str, clock: FakeClock) -> Iterator[EventStore]:
    """A fresh, unkeyed EventStore at `store_target` (each backend in turn), timestamped by the `clock`
    fixture."""
    opened = EventStore.open(store_target, now=clock.now)
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


@pytest.fixture(scope="module")
def interleaved_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log long enough for two audit walkers or rebuild processes, its runners' events interleaved from its
    start to its end (so that each share of the runners has events in every seq range)."""
    path = tmp_path_factory.mktemp("interleaved") / "interleaved.db"
    build_long(path, chunk=250, interleaved=True)
    return path


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
def pg_schema(pg_server: Server) -> Iterator[str]:
    """A schema of this test's own on the cluster, dropped afterwards."""
    schema = pg_server.new_schema()
    try:
        yield schema
    finally:
        pg_server.drop(schema)


@pytest.fixture
def pg_url(pg_server: Server, pg_schema: str) -> str:
    """The URL of a store of this test's own on the cluster (its schema dropped afterwards)."""
    return pg_server.url(pg_schema)
