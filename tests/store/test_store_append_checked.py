"""EventStore.append holds every event to the rules: a log written through it is one the commands could
have written. A refused event raises InvalidInputError naming it and leaves the file byte-identical;
append_unchecked is the one named way around, for tools that must write what the rules refuse. On both
backends (the property tests make a fresh store per example: a file, or a schema dropped after it)."""

from __future__ import annotations

from itertools import groupby

import pytest
from hypothesis import HealthCheck, given, settings
from targets import Places, durable_state

from lifecycle_es import EventStore, InvalidInputError, audit
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import Event, LeaseSettled, RunnerParked
from lifecycle_es.testing import event_logs, invalid_event_logs

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def commands(log: list[tuple[int, Event]]) -> list[tuple[int, int, list[Event]]]:
    """The log cut where its time moves: (index of the first event, at_ms, events), one append each (a
    command's events and their consequences share a time, as the lifecycle stamps them)."""
    out, index = [], 0
    for at_ms, group in groupby(log, key=lambda item: item[0]):
        events = [event for _, event in group]
        out.append((index, at_ms, events))
        index += len(events)
    return out


@SETTINGS
@given(log=event_logs(max_commands=12))
def test_a_valid_log_goes_in_through_append_and_audits_whole(places: Places, log: list[tuple[int, Event]]) -> None:
    path = places.new()
    with EventStore.open(path) as store:
        for _, at_ms, events in commands(log):
            store.append(log[0][1].runner_id, events, at=iso_ms(at_ms))  # type: ignore[attr-defined]
        assert store.head().seq == len(log)
    assert audit(path).ok


@SETTINGS
@given(broken=invalid_event_logs(max_commands=12))
def test_the_first_refused_event_appends_nothing(places: Places, broken: tuple[list[tuple[int, Event]], int]) -> None:
    log, bad = broken
    path = places.new()
    stream = "runner-under-test"
    with EventStore.open(path) as store:
        for start, at_ms, events in commands(log):
            stream = getattr(events[0], "runner_id", stream) if start == 0 else stream
            before, head = durable_state(path), store.head()
            try:
                store.append(stream, events, at=iso_ms(at_ms))
            except InvalidInputError as exc:
                assert exc.field in ("events", "at")  # "at": stamped before the log's head, refused as such
                assert start <= bad, (start, bad, str(exc))
                assert durable_state(path) == before and store.head() == head
                break
        else:
            pytest.fail(f"the log broken at event {bad} was appended whole")
    assert audit(path).ok  # what went in before the refusal is a log the commands could have written


def test_a_park_the_rules_require_must_come_in_the_same_append(store: EventStore) -> None:
    from lifecycle_es import ProxyAuthority, Resources, RunnerLifecycle
    from lifecycle_es.canonical import iso_ms as at

    now = store.now()
    runner = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir="/srv/r",
                             resources=Resources(cpu_seconds=60, memory_bytes=1 << 30),
                             post_session_hook_digest="sha256:" + "0" * 64, now=store.now,
                             preflight_base_dir=lambda path: None)
    runner.initialize()
    lease = runner.acquire_lease(session_id="s", expected_generation=1, proxy_authority=ProxyAuthority(
        id="p", revision=1, issued_at=at(now), expires_at=at(now + 600_000))).lease
    runner.request_drain(expected_generation=1)
    settle = LeaseSettled(lease_id=lease.id, lease_generation=1, result_digest="sha256:" + "1" * 64)
    before = durable_state(store.path)
    with pytest.raises(InvalidInputError, match="park pending"):
        store.append("runner-1", [settle])
    assert durable_state(store.path) == before
    store.append("runner-1", [settle, RunnerParked(cause="drain-settled", generation=3)])
    assert runner.snapshot().state == "parked"


def test_append_unchecked_is_the_named_way_around_and_the_audit_still_sees_it(store: EventStore) -> None:
    forged = LeaseSettled(lease_id="lease-never-acquired", lease_generation=1, result_digest="sha256:" + "1" * 64)
    with pytest.raises(InvalidInputError, match=r"events\[0\] \(LeaseSettled\) is refused by the rules"):
        store.append("runner-1", [forged])
    assert store.head().seq == 0
    store.append_unchecked("runner-1", [forged])
    report = audit(store)
    assert not report.ok and report.first_problem is not None
    assert (report.first_problem.seq, report.first_problem.kind) == (1, "rules")
