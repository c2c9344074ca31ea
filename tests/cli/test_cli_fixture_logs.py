"""The logs the command-line tests share replay clean: a failure elsewhere is then the command's, not the log's."""

from __future__ import annotations

import pytest
from fleets import LONG_EVENTS, fleet_in, long_in

from lifecycle_es import EventStore
from projections import replay


def test_the_fixture_logs_replay_clean(tmp_path_factory: pytest.TempPathFactory) -> None:
    path, marks = fleet_in(tmp_path_factory)
    long_log = long_in(tmp_path_factory)
    with EventStore.open(path, read_only=True) as store:
        states = replay(store)
        assert store.verify().events == marks["head"]
    assert {state.state for state in states.values()} == {"accepting", "parked"}
    assert states["runner-0"].generation == 5  # drained, parked, reclaimed
    with EventStore.open(long_log, read_only=True) as store:
        assert store.head().seq == LONG_EVENTS
        assert all(state.state == "accepting" for state in replay(store).values())
