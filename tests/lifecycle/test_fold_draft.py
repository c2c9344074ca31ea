"""A replay's fold (`replay.Fold`: one draft, leases keyed, frozen at the end) equals `apply` event by event.

Both run the same rules (``runner.py``) over a `RunnerDraft`; they differ only in how the draft keeps
its leases (``draft.py``). These tests hold the keyed way to the shared one: the same state after
every event of any log the model writes, the same error at the same event of a broken log, the same
eviction and capacity refusal, and the old semantics on a state with duplicate lease ids (which only a
damaged snapshot holds). The lease index a state carries must always equal a fresh count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle_es import IntegrityError, LifecycleError, RunnerCapacityError
from lifecycle_es import runner as rules
from lifecycle_es.canonical import iso_ms, parse_iso_ms
from lifecycle_es.draft import thaw
from lifecycle_es.events import (
    FENCED_EVENTS,
    Event,
    HostLeaseAcquired,
    LeaseAcquired,
    LeaseSettled,
    RunnerInitialized,
    UnitRecord,
    decode,
    encode,
    type_of,
)
from lifecycle_es.log import RecordedEvent
from lifecycle_es.receipts import project
from lifecycle_es.replay import EMPTY, Fold, Folded
from lifecycle_es.runner import apply
from lifecycle_es.state import RunnerState, _LeaseIndex, decode_state, encode_state, index_of
from lifecycle_es.testing.clock import START_MS
from lifecycle_es.testing.logs import event_logs, invalid_event_logs
from lifecycle_es.values import ProxyAuthority, Resources

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
DIGEST = "sha256:" + "ab" * 32


def at_ms(at: str) -> int:
    return parse_iso_ms(at)


def recorded(log: list[tuple[int, Event]]) -> Iterator[RecordedEvent]:
    for seq, (at_ms, event) in enumerate(log, 1):
        stream = log[0][1].runner_id if isinstance(log[0][1], RunnerInitialized) else "runner-1"
        yield RecordedEvent(seq, stream, seq, type_of(event), iso_ms(at_ms), encode(event), bytes(32),
                            bytes(32), event=event)


def assert_index_is_a_fresh_count(state: RunnerState) -> None:
    index, fresh = index_of(state), _LeaseIndex.of(state.leases)
    assert (index.active, index.parked, index.settled, index.other, index.sessions, index.unique) == (
        fresh.active, fresh.parked, fresh.settled, fresh.other, fresh.sessions, fresh.unique)
    assert fresh.ids <= index.ids


def assert_same(folded: RunnerState | None, applied: RunnerState | None) -> None:
    assert folded == applied
    if folded is not None and applied is not None:
        assert encode_state(folded) == encode_state(applied)
        assert_index_is_a_fresh_count(folded)
        assert_index_is_a_fresh_count(applied)
        assert project(folded) == project(applied)


@SETTINGS
@given(log=event_logs(max_commands=60), every=st.integers(1, 50))
def test_a_fold_equals_apply_after_every_event(log: list[tuple[int, Event]], every: int) -> None:
    folding, state = Fold(), None
    for position, event in enumerate(recorded(log), 1):
        state = apply(state, event.event, at_ms(event.at), event.at)
        folding.add(event)
        if position % every == 0:  # freezing mid-way and folding on must change nothing
            assert_same(folding.state(), state)
    assert_same(folding.state(), state)
    assert folding.folded() == Folded(state, len(log), len(log))


@SETTINGS
@given(log=event_logs(max_commands=40), cut=st.integers(0, 40))
def test_a_fold_from_a_state_equals_apply(log: list[tuple[int, Event]], cut: int) -> None:
    events = list(recorded(log))
    cut = min(cut, len(events))
    state = None
    for event in events[:cut]:
        state = apply(state, event.event, at_ms(event.at), event.at)
    base = Folded(state, cut, cut) if state is not None else EMPTY
    folding = Fold(base)
    for event in events[cut:]:
        state = apply(state, event.event, at_ms(event.at), event.at)
        folding.add(event)
    assert_same(folding.state(), state)


@SETTINGS
@given(broken=invalid_event_logs(max_commands=40))
def test_a_fold_refuses_a_broken_log_at_the_same_event_as_apply(broken: tuple[list[tuple[int, Event]], int]) -> None:
    log, index = broken
    events = list(recorded(log))
    state = None
    with pytest.raises(LifecycleError) as applied:
        for event in events:
            state = apply(state, event.event, at_ms(event.at), event.at)
    folding = Fold()
    with pytest.raises(IntegrityError) as folded:
        for event in events:
            folding.add(event)
    assert folded.value.seq == index + 1
    assert str(applied.value) in str(folded.value)


# --- retention: eviction and the capacity refusal, with a small capacity ----------------------------

AT = START_MS
PROXY = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(AT), expires_at=iso_ms(AT + 60_000))


def acquire(n: int) -> LeaseAcquired:
    return LeaseAcquired(lease_id=f"lease-{n}", session_id=f"session-{n}", lease_generation=1, issued_at=iso_ms(AT),
                         expires_at=iso_ms(AT + 10_000), proxy_authority=PROXY)


def settle(n: int) -> LeaseSettled:
    return LeaseSettled(lease_id=f"lease-{n}", lease_generation=1, result_digest=DIGEST)


INITIALIZED = RunnerInitialized(schema=rules.RUNNER_SCHEMA, runner_id="runner-1", target="local", base_dir="/srv/r",
                                resources=Resources(cpu_seconds=60, memory_bytes=1 << 30),
                                post_session_hook_digest=DIGEST)


@pytest.fixture
def capacity_4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules, "MAX_RETAINED_LEASES", 4)


def run_both(events: list[Event]) -> tuple[Any, Any]:
    """(folded, applied) after `events`, or the exception each raised."""
    log = [(AT, event) for event in events]
    outcomes = []
    for folding in (True, False):
        try:
            if folding:
                fold = Fold()
                for event in recorded(log):
                    fold.add(event)
                outcomes.append(fold.state())
            else:
                state = None
                for event in recorded(log):
                    state = apply(state, event.event, AT, event.at)
                outcomes.append(state)
        except (IntegrityError, LifecycleError) as exc:
            outcomes.append(exc)
    return outcomes[0], outcomes[1]


def test_eviction_takes_the_oldest_lease_no_longer_active_in_both_ways(capacity_4: None) -> None:
    events: list[Event] = [INITIALIZED, acquire(1), acquire(2), settle(2), acquire(3), acquire(4), settle(1)]
    events += [acquire(5), acquire(6), settle(5), acquire(7)]
    folded, applied = run_both(events)
    assert_same(folded, applied)
    assert [lease.id for lease in folded.leases] == ["lease-3", "lease-4", "lease-6", "lease-7"]


def test_a_full_runner_of_active_leases_refuses_another_in_both_ways(capacity_4: None) -> None:
    events: list[Event] = [INITIALIZED, acquire(1), acquire(2), acquire(3), acquire(4), settle(4), acquire(5),
                           acquire(6)]
    folded, applied = run_both(events)
    assert isinstance(applied, RunnerCapacityError)
    assert isinstance(folded, IntegrityError) and folded.seq == len(events)
    assert str(applied) in str(folded)


@given(st.lists(st.booleans(), min_size=1, max_size=12), st.integers(0, 14))
def test_keeping_the_last_leases_counts_alike_in_both_ways(settled: list[bool], count: int) -> None:
    # A reclaim keeps the last leases of a parked runner; a draft of any state, active leases and shared
    # sessions included, must keep the same leases and count them afresh either way.
    events: list[Event] = [INITIALIZED]
    for n, ended in enumerate(settled, 1):
        events.append(LeaseAcquired(lease_id=f"lease-{n}", session_id=f"session-{n % 3}-{n if ended else 0}",
                                    lease_generation=1, issued_at=iso_ms(AT), expires_at=iso_ms(AT + 10_000),
                                    proxy_authority=PROXY))
        if ended:
            events.append(settle(n))
    state = None
    for event in events:
        try:
            state = apply(state, event, AT, iso_ms(AT))
        except LifecycleError:  # a session that already holds an active lease: that grant is left out
            continue
    assert state is not None
    kept = []
    for keyed in (True, False):
        draft = thaw(state, keyed=keyed)
        draft.keep_last(count)
        kept.append(draft.freeze())
    assert_same(kept[0], kept[1])
    assert kept[0].leases == (state.leases[-count:] if count else state.leases)


# --- a state with duplicate lease ids keeps the old scanning semantics --------------------------------


def duplicated() -> RunnerState:
    state = None
    for event in (INITIALIZED, acquire(1), acquire(2)):
        state = apply(state, event, AT, iso_ms(AT))
    assert state is not None
    data = msgspec.json.decode(encode_state(state))
    data["leases"].append(dict(data["leases"][0]))  # lease-1 twice, both active (only forgery makes this)
    return decode_state(msgspec.json.encode(data))


def test_a_state_with_duplicate_ids_folds_alike_in_both_ways() -> None:
    state = duplicated()
    assert not index_of(state).unique
    events = [settle(1), acquire(3), settle(2)]
    folding = Fold(Folded(state, 3, 3))
    applied = state
    for event in recorded([(AT, event) for event in events]):
        folding.add(event)
        applied = apply(applied, event.event, AT, event.at)
    assert_same(folding.state(), applied)
    # Every lease of the id was settled, as the scan always did.
    assert [lease.status for lease in applied.leases if lease.id == "lease-1"] == ["settled", "settled"]


def test_a_status_the_seed_does_not_know_is_an_error_to_project() -> None:
    data = msgspec.json.decode(encode_state(duplicated()))
    data["leases"][0]["status"] = "lost"
    with pytest.raises(KeyError):
        project(decode_state(msgspec.json.encode(data)))


@SETTINGS
@given(log=event_logs(max_commands=60))
def test_with_a_small_retention_a_fold_and_apply_agree_on_every_log(log: list[tuple[int, Event]]) -> None:
    # The model's logs retain up to 1024 leases; with room for 4 (2 after reclaim) the rules evict, and
    # refuse a fifth active lease, on the way: both ways must do so alike.
    saved = rules.MAX_RETAINED_LEASES, rules.RETAINED_AFTER_RECLAIM
    rules.MAX_RETAINED_LEASES, rules.RETAINED_AFTER_RECLAIM = 4, 2
    try:
        fold, state, failed = Fold(), None, None
        for event in recorded(log):
            try:
                state = apply(state, event.event, at_ms(event.at), event.at)
            except LifecycleError as exc:
                failed = exc
            try:
                fold.add(event)
            except IntegrityError as exc:
                assert failed is not None and str(failed) in str(exc)
                return
            assert failed is None
            assert_same(fold.state(), state)
    finally:
        rules.MAX_RETAINED_LEASES, rules.RETAINED_AFTER_RECLAIM = saved


# --- the row path (`Fold.add_row`: every replay of the log) against `apply` ---------------------------
# `add_row` proves a row's time once and calls each event's rule directly when no park is due, and the
# hot rules test before they call (`check_fresh`, `held_lease`, the host token check); these hold that
# path to `apply` on every log the model writes and every way the model breaks one.


def rows(log: list[tuple[int, Event]]) -> list[tuple[int, str, int, str, str, bytes, bytes, bytes]]:
    return [(event.seq, event.stream, event.version, event.type, event.at, event.body, event.prev, event.hash)
            for event in recorded(log)]


@SETTINGS
@given(log=event_logs(max_commands=60), every=st.integers(1, 50))
def test_a_fold_of_rows_equals_apply_after_every_event(log: list[tuple[int, Event]], every: int) -> None:
    folding, state = Fold(), None
    for position, row in enumerate(rows(log), 1):
        state = apply(state, decode(row[5]), at_ms(row[4]), row[4])
        folding.add_row(row)
        if position % every == 0:
            assert_same(folding.state(), state)
    assert_same(folding.state(), state)
    assert folding.folded() == Folded(state, len(log), len(log))


@SETTINGS
@given(broken=invalid_event_logs(max_commands=40))
def test_a_fold_of_rows_refuses_a_broken_log_at_the_same_event_as_apply(
        broken: tuple[list[tuple[int, Event]], int]) -> None:
    log, index = broken
    state = None
    with pytest.raises(LifecycleError) as applied:
        for _, event in log:
            state = apply(state, event, at_ms(iso_ms(_)), iso_ms(_))
    folding = Fold()
    with pytest.raises(IntegrityError) as folded:
        for row in rows(log):
            folding.add_row(row)
    assert folded.value.seq == index + 1
    assert str(applied.value) in str(folded.value)


@pytest.mark.parametrize("kind", sorted(FENCED_EVENTS, key=lambda kind: kind.__name__))
@pytest.mark.parametrize(("token", "words"), [(3, "host lease token 3 is stale"), (9, "9 is above 5"),
                                             ("5", "'5' is not an int")])
def test_every_host_event_is_held_to_the_host_token_before_its_own_rule(kind: type[Event], token: object,
                                                                         words: str) -> None:
    # A runner whose host lease was taken with token 5, and a host event of any kind carrying another token:
    # refused for the token (the first check), whatever else the event holds, by `apply` and by the rows.
    taken = HostLeaseAcquired(holder="host-a", token=5, ttl_ms=10_000)
    required = kind.__struct_fields__[:len(kind.__struct_fields__) - len(kind.__struct_defaults__)]
    event = kind(**{name: _filler(name) for name in required}, host_token=token)  # type: ignore[arg-type]
    log = [(AT, INITIALIZED), (AT, acquire(1)), (AT, taken), (AT, event)]
    state = None
    with pytest.raises(LifecycleError, match=words) as applied:
        for _, each in log:
            state = apply(state, each, AT, iso_ms(AT))
    folding = Fold()
    with pytest.raises(IntegrityError) as folded:
        for each in recorded(log):
            folding.add(each)
    assert folded.value.seq == 4 and str(applied.value) in str(folded.value)
    if type(token) is int:  # a body holds no other (its decoding refuses one)
        folding = Fold()
        with pytest.raises(IntegrityError) as folded:
            for row in rows(log):
                folding.add_row(row)
        assert folded.value.seq == 4 and str(applied.value) in str(folded.value)


def _filler(name: str) -> object:
    """A value for a field of a host event: lease-1's where it names a lease, else a plain one of its type."""
    values: dict[str, object] = {"lease_id": "lease-1", "lease_generation": 1, "result_digest": DIGEST,
                                 "reason": "lost-poll", "lease_ids": ("lease-1",), "deadline_at": iso_ms(AT),
                                 "cause": "lease-parked", "generation": 2, "mode": "child", "run_dir": "/srv/r/u",
                                 "signal": "SIGTERM", "code": 0, "outcome": "settled", "wake_at": AT}
    if name == "handle":
        return UnitRecord(mode="child", host="host-a", boot_id="boot-1", run_dir="/srv/r/u", pid=42, start_ticks=7)
    return values[name]
