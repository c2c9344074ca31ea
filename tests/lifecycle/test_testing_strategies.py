"""The property-testing kit (`lifecycle_es.testing`) keeps its promises.

Every `event_logs` log replays clean through the rules and equals the model; every
`invalid_event_logs` log is refused exactly at the index it reports; command programs give the same
outcomes on the model and on a real `RunnerLifecycle`; the model's deliberate improvements on the
seed (capacity, drain with no active lease, retention) agree with the library's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from forging import forge_stamped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import projections
from lifecycle_es import EventStore, IntegrityError, LifecycleError, RunnerCapacityError, RunnerLifecycle
from lifecycle_es.canonical import iso_ms, parse_iso_ms
from lifecycle_es.events import RunnerParked
from lifecycle_es.fences import check_fresh
from lifecycle_es.preflight import preflight_writable_directory
from lifecycle_es.runner import apply
from lifecycle_es.state import RunnerState
from lifecycle_es.testing import (
    RUNNER_DEFAULTS,
    START_MS,
    Command,
    FakeClock,
    ReferenceRunner,
    SequentialIds,
    command_programs,
    digests,
    event_logs,
    ids,
    invalid_event_logs,
    proxy_authorities,
    resources,
    run_program,
)
from lifecycle_es.values import DIGEST_RE, ID_RE, ProxyAuthority

# Each example opens a store on a real file; hypothesis must not count that against a deadline.
STORE_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def replay_events(log: list) -> RunnerState | None:
    """Fold a log of (at_ms, event) through the library's rules, as the store's replay does."""
    state = None
    for at_ms, event in log:
        at = iso_ms(at_ms)
        state = apply(state, event, parse_iso_ms(at), at)
    return state


def first_refused(log: list) -> int | None:
    """The index of the first event the rules refuse (len(log) when the log ends owing a park)."""
    state = None
    for index, (at_ms, event) in enumerate(log):
        at = iso_ms(at_ms)
        try:
            state = apply(state, event, parse_iso_ms(at), at)
        except (LifecycleError, ValueError):
            return index
    return len(log) if state is not None and state.pending_park is not None else None


def fresh_store(directory: Path, clock: FakeClock) -> EventStore:
    path = directory / f"events-{os.urandom(6).hex()}.db"
    return EventStore.open(path, now=clock)


# --- values ----------------------------------------------------------------------------------------


def test_fake_clock_stands_still_until_advanced() -> None:
    clock = FakeClock()
    assert clock() == clock() == START_MS
    assert clock.advance(1_500) == START_MS + 1_500 == clock()
    assert clock.advance(-500) == START_MS + 1_000


def test_sequential_ids_count_up() -> None:
    ids_ = SequentialIds()
    assert [ids_(), ids_(), ids_()] == ["000001", "000002", "000003"]


@given(ids(max_size=256), digests(), resources())
def test_value_strategies_stay_in_the_seeds_bounds(identifier: str, digest: str, limits: object) -> None:
    assert ID_RE.fullmatch(identifier) and len(identifier) <= 256
    assert DIGEST_RE.fullmatch(digest)
    assert limits is not None  # Resources validates its own bounds on construction


@given(st.integers(0, 2**41), st.data())
def test_proxy_authorities_are_fresh_at_the_time_given(now_ms: int, data: st.DataObject) -> None:
    proxy = data.draw(proxy_authorities(now_ms, id="proxy-7", min_revision=3, max_revision=5))
    assert isinstance(proxy, ProxyAuthority) and proxy.id == "proxy-7" and 3 <= proxy.revision <= 5
    check_fresh(proxy, now_ms)


# --- event logs ------------------------------------------------------------------------------------


@given(event_logs())
def test_every_event_log_replays_clean_through_the_rules(log: list) -> None:
    state, generations = None, []
    for at_ms, event in log:
        at = iso_ms(at_ms)
        state = apply(state, event, parse_iso_ms(at), at)
        generations.append(state.generation)
    assert state is not None and state.pending_park is None
    assert generations == sorted(generations)


@given(invalid_event_logs())
def test_every_invalid_log_is_refused_exactly_where_it_says(case: tuple[list, int]) -> None:
    log, index = case
    assert first_refused(log) == index
    replay_events(log[:index])  # everything before the reported event is legal


@STORE_SETTINGS
@given(st.data())
def test_logs_in_a_real_store_replay_to_the_models_state(tmp_path: Path, data: st.DataObject) -> None:
    clock = FakeClock()
    model = ReferenceRunner(**RUNNER_DEFAULTS, base_dir=tmp_path, now=clock)
    program = data.draw(command_programs(max_commands=20))
    run_program(model, clock, program)
    with fresh_store(tmp_path, clock) as store:
        for at_ms, event in model.log:
            store.append_unchecked(model.runner_id, [event], at=iso_ms(at_ms))
        assert projections.replay(store) == {model.runner_id: model.runner_state()}


@STORE_SETTINGS
@given(invalid_event_logs(runner_id="runner-x"))
def test_invalid_logs_in_a_real_store_fail_replay_at_their_seq(tmp_path: Path, case: tuple[list, int]) -> None:
    log, index = case
    path = tmp_path / f"events-{os.urandom(6).hex()}.db"
    EventStore.open(path).close()
    # Written as whoever holds the file could (the store's own append refuses a time before its head's).
    forge_stamped(path, "runner-x", [(iso_ms(at_ms), event) for at_ms, event in log])
    with EventStore.open(path, read_only=True) as store, pytest.raises(IntegrityError) as refused:
        projections.replay(store)
    assert refused.value.seq == index + 1


# --- command programs: the model and the library agree ----------------------------------------------


def real_lifecycle(store: EventStore, base_dir: Path, clock: FakeClock) -> RunnerLifecycle:
    # The default preflight called with no random_id names its probe with uuid4, so the lease ids
    # drawn from SequentialIds stay in step with the model's.
    return RunnerLifecycle(store, **RUNNER_DEFAULTS, base_dir=base_dir, now=clock, random_id=SequentialIds(),
                           preflight_base_dir=preflight_writable_directory, snapshot_every=4)


@STORE_SETTINGS
@given(command_programs(invalid=True))
def test_programs_give_the_same_outcomes_on_the_model_and_the_library(tmp_path: Path, program: list) -> None:
    model_clock, real_clock = FakeClock(), FakeClock()
    with fresh_store(tmp_path, real_clock) as store:
        model = ReferenceRunner(**RUNNER_DEFAULTS, base_dir=tmp_path, now=model_clock, authority_file=store.path)
        expected = run_program(model, model_clock, program)
        actual = run_program(real_lifecycle(store, tmp_path, real_clock), real_clock, program)
        assert [error for _, error in expected] == [command.expect for command in program]
        assert actual == expected
        assert [(recorded.at, recorded.event) for recorded in store.read()] == [
            (iso_ms(at_ms), event) for at_ms, event in model.log]


@given(command_programs())
def test_valid_programs_are_valid(program: list) -> None:
    assert all(command.expect is None for command in program)


def test_commands_before_initialize_are_refused_alike(tmp_path: Path) -> None:
    clock = FakeClock()
    with fresh_store(tmp_path, clock) as store:
        model = ReferenceRunner(**RUNNER_DEFAULTS, base_dir=tmp_path, now=clock)
        program = [Command(0, "snapshot", {}), Command(0, "request_drain", {"expected_generation": 1}),
                   Command(0, "settle_lease", {"lease_id": "lease-1", "lease_generation": 1,
                                               "result_digest": "sha256:" + "0" * 64})]
        refused = [(None, "UnknownRunnerError")] * 3
        assert run_program(model, clock, program) == refused
        assert run_program(real_lifecycle(store, tmp_path, clock), clock, program) == refused
        assert store.head().seq == 0
        assert "not initialized" in repr(model)


# --- the deliberate improvements on the seed -------------------------------------------------------


def test_drain_with_no_active_lease_parks_at_once(tmp_path: Path) -> None:
    clock = FakeClock()
    with fresh_store(tmp_path, clock) as store:
        model = ReferenceRunner(**RUNNER_DEFAULTS, base_dir=tmp_path, now=clock)
        real = real_lifecycle(store, tmp_path, clock)
        model.initialize()
        real.initialize()
        expected = model.request_drain(expected_generation=1)
        assert expected.state == "parked" and expected.generation == 3 and expected.drain is None
        assert real.request_drain(expected_generation=1) == expected
        assert [type(event) for event in model.last_events][-1] is RunnerParked
        assert [recorded.event for recorded in store.read(after=1)] == model.last_events


def test_capacity_and_retention_agree_with_the_library(tmp_path: Path) -> None:
    """1024 active leases refuse a new one; retention evicts the oldest ended lease; 256 after reclaim."""
    clock = FakeClock()
    with EventStore.open(tmp_path / "capacity.db", now=clock, durability="normal") as store:
        model = ReferenceRunner(**RUNNER_DEFAULTS, base_dir=tmp_path, now=clock, authority_file=store.path)
        real = RunnerLifecycle(store, **RUNNER_DEFAULTS, base_dir=tmp_path, now=clock, random_id=SequentialIds(),
                               preflight_base_dir=lambda path: None, snapshot_every=4096)

        def both(name: str, **kwargs: object) -> object:
            outcome = run_program(model, clock, [_command(name, kwargs)])
            assert run_program(real, clock, [_command(name, kwargs)]) == outcome
            return outcome[0]

        both("initialize")
        proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(clock()), expires_at=iso_ms(clock() + 10**7))
        for n in range(1024):
            both("acquire_lease", session_id=f"s-{n}", expected_generation=1, proxy_authority=proxy)
        assert both("acquire_lease", session_id="s-extra", expected_generation=1,
                    proxy_authority=proxy) == (None, "RunnerCapacityError")
        both("settle_lease", lease_id="lease-000005", lease_generation=1, result_digest="sha256:" + "1" * 64)
        both("acquire_lease", session_id="s-extra", expected_generation=1, proxy_authority=proxy)
        assert model.runner_state() == real.state()
        assert real.state().lease("lease-000005") is None and len(real.state().leases) == 1024
        both("request_drain", expected_generation=1)
        for lease in real.state().active_leases():
            both("settle_lease", lease_id=lease.id, lease_generation=1, result_digest="sha256:" + "2" * 64)
        assert real.snapshot().state == "parked"
        proxy = ProxyAuthority(id="proxy-1", revision=2, issued_at=iso_ms(clock()), expires_at=iso_ms(clock() + 10**7))
        both("begin_reclaim", expected_generation=3, proxy_authority=proxy)
        both("complete_reclaim", expected_generation=4)
        assert model.runner_state() == real.state()
        assert len(real.state().leases) == 256
    assert issubclass(RunnerCapacityError, LifecycleError)


def _command(name: str, kwargs: dict) -> Command:
    return Command(0, name, dict(kwargs))
