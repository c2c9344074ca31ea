"""Time never runs backwards in the log (issue 10, item 10).

A command stamps its events at its clock's time, but never before the log's head nor the stream's last
event: a clock stepped back (a year here) neither stops the commands nor writes a log whose times go
backwards. The rules refuse, on replay, an event stamped before its stream's previous event, unit
facts included, so a ``LeaseSettled`` dated a year before its lease was issued fails the audit. On both
backends (the `store` fixture's file, and its schema on a PostgreSQL server).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from forging import forge
from hypothesis import given
from hypothesis import strategies as st

import projections
from lifecycle_es import AuthorityError, EventStore, IntegrityError, InvalidInputError, RunnerLifecycle
from lifecycle_es.canonical import KNOWN_TIMES, MAX_EPOCH_MS, canonical_ms, iso_ms, parse_iso_ms, timestamp
from lifecycle_es.events import LeaseSettled, UnitStarting
from lifecycle_es.replay import load
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS, FakeClock, SequentialIds
from lifecycle_es.values import ProxyAuthority

YEAR = 365 * 24 * 3_600_000
HOUR = 3_600_000
DIGEST = "sha256:" + "0" * 64


def runner(store: EventStore, clock: FakeClock, tmp_path: Path, runner_id: str = "runner-1",
           **options: object) -> RunnerLifecycle:
    base_dir = tmp_path / "base"
    base_dir.mkdir(exist_ok=True)
    lifecycle = RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "runner_id": runner_id}, base_dir=str(base_dir),
                                now=clock, random_id=SequentialIds(), **options)  # type: ignore[arg-type]
    lifecycle.initialize()
    return lifecycle


def proxy(at_ms: int, revision: int = 1) -> ProxyAuthority:
    return ProxyAuthority(id="proxy-1", revision=revision, issued_at=iso_ms(at_ms), expires_at=iso_ms(at_ms + HOUR))


def stamps(store: EventStore) -> list[str]:
    return [recorded.at for recorded in store.read()]


def test_commands_go_on_when_the_clock_steps_back_a_year(store: EventStore, clock: FakeClock,
                                                         tmp_path: Path) -> None:
    lifecycle = runner(store, clock, tmp_path)
    lease = lifecycle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy(clock())).lease
    before = store.head().at
    clock.advance(-YEAR)
    snapshot = lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=DIGEST)
    # Stamped at the head's time, not the clock's: the settle is never dated before the lease it ends.
    assert store.head().at == before and snapshot.updated_at == before
    lifecycle.request_drain(expected_generation=1, timeout_ms=1_000)
    clock.advance(YEAR + 5_000)
    lifecycle.begin_reclaim(expected_generation=3, proxy_authority=proxy(clock(), revision=2))
    assert stamps(store) == sorted(stamps(store)) and stamps(store)[-1] == iso_ms(clock())
    with EventStore.open(store.path, read_only=True) as reader:
        assert reader.verify().events == store.head().seq
        assert projections.replay(reader)["runner-1"] == lifecycle.state()


def test_a_lease_granted_after_the_clock_stepped_back_needs_an_authority_fresh_at_its_stamp(
        store: EventStore, clock: FakeClock, tmp_path: Path) -> None:
    lifecycle = runner(store, clock, tmp_path)
    head = parse_iso_ms(store.head().at)
    # The rules judge freshness at the event's stamp (the one time a replay can check it at), the
    # command at its clock as well: a step back within the 5 minutes an authority stays fresh grants...
    clock.advance(-4 * 60_000)
    receipt = lifecycle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy(clock()))
    assert receipt.lease.issued_at == iso_ms(head)
    # ... a year back, no authority is fresh at both times, and the grant waits for the clock to catch up.
    clock.advance(-YEAR)
    for issued in (clock(), head):
        with pytest.raises(AuthorityError):
            lifecycle.acquire_lease(session_id="s-2", expected_generation=1, proxy_authority=proxy(issued))
    assert store.head().at == iso_ms(head)


def test_a_stamp_is_never_before_the_head_another_runner_wrote(store: EventStore, clock: FakeClock,
                                                              tmp_path: Path) -> None:
    ahead = FakeClock(START_MS + HOUR)
    runner(store, ahead, tmp_path, "runner-ahead")
    lifecycle = runner(store, clock, tmp_path)
    assert store.head().at == iso_ms(START_MS + HOUR)
    assert stamps(store) == sorted(stamps(store))
    lifecycle.request_drain(expected_generation=1)
    assert store.head().at == iso_ms(START_MS + HOUR)


def test_a_settle_stamped_a_year_before_its_lease_was_issued_fails_replay(store: EventStore, clock: FakeClock,
                                                                         tmp_path: Path) -> None:
    lifecycle = runner(store, clock, tmp_path)
    lease = lifecycle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy(clock())).lease
    store.close()
    (seq,) = forge(store.path, "runner-1", [LeaseSettled(lease_id=lease.id, lease_generation=1, result_digest=DIGEST)],
                   iso_ms(clock() - YEAR))
    with EventStore.open(store.path, read_only=True) as reader, pytest.raises(IntegrityError) as refused:
        projections.replay(reader)
    assert (refused.value.seq, refused.value.stream) == (seq, "runner-1")
    assert "time ran backwards" in refused.value.reason and lease.issued_at in refused.value.reason


def test_a_unit_fact_moves_the_streams_time_too(store: EventStore, clock: FakeClock, tmp_path: Path) -> None:
    # snapshot_every=1: the replay below starts from a snapshot taken at the unit fact, so the time it
    # was stamped must travel in the state (updated_at stays the lease's: a unit fact leaves it alone).
    lifecycle = runner(store, clock, tmp_path, snapshot_every=1)
    lease = lifecycle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy(clock())).lease
    clock.advance(60_000)
    lifecycle.record_host_facts([UnitStarting(lease_id=lease.id, lease_generation=1, mode="child",
                                              run_dir=f"{lifecycle.base_dir}/{lease.id}", command=("/bin/true",))])
    state = lifecycle.state()
    assert (state.updated_at, state.last_at) == (lease.issued_at, iso_ms(clock()))
    store.close()
    (seq,) = forge(store.path, "runner-1", [LeaseSettled(lease_id=lease.id, lease_generation=1, result_digest=DIGEST)],
                   iso_ms(clock() - 1))
    with EventStore.open(store.path, read_only=True) as reader:
        for use_snapshot in (True, False):
            with pytest.raises(IntegrityError) as refused:
                load(reader, "runner-1", use_snapshot=use_snapshot)
            assert refused.value.seq == seq and "time ran backwards" in refused.value.reason


def test_a_time_in_another_spelling_fails_replay(store: EventStore, clock: FakeClock, tmp_path: Path) -> None:
    lifecycle = runner(store, clock, tmp_path)
    lease = lifecycle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy(clock())).lease
    store.close()
    # The same instant as the head's, spelled with an offset: the store never writes it so, and only the
    # canonical spelling sorts as time does.
    (seq,) = forge(store.path, "runner-1", [LeaseSettled(lease_id=lease.id, lease_generation=1, result_digest=DIGEST)],
                   iso_ms(clock() + 1000)[:-1] + "+00:00")
    with EventStore.open(store.path, read_only=True) as reader, pytest.raises(IntegrityError) as refused:
        projections.replay(reader)
    assert refused.value.seq == seq and "canonical" in refused.value.reason


def _spelled_canonically(text: str) -> int | None:
    """The slow, obvious answer canonical_ms must give: parse it, and spell the result back."""
    try:
        millis = parse_iso_ms(text)
    except (ValueError, OverflowError):
        return None
    return millis if 0 <= millis <= MAX_EPOCH_MS and iso_ms(millis) == text else None


@given(st.integers(min_value=-10**6, max_value=MAX_EPOCH_MS))
def test_canonical_ms_reads_every_time_the_store_writes(millis: int) -> None:
    if 0 <= millis <= MAX_EPOCH_MS:
        assert canonical_ms(iso_ms(millis)) == millis
    else:
        assert canonical_ms(iso_ms(millis)) is None


@given(st.integers(min_value=0, max_value=MAX_EPOCH_MS), st.integers(min_value=0, max_value=23),
       st.text(alphabet="0123456789:.-+TZz \u0663\uff10", max_size=3))
def test_canonical_ms_refuses_every_other_spelling(millis: int, position: int, patch: str) -> None:
    text = iso_ms(millis)
    edited = text[:position] + patch + text[position + len(patch) or position + 1:]
    assert canonical_ms(edited) == _spelled_canonically(edited)
    for other in (text.replace("Z", "+00:00"), text.lower(), text[:-1], text + " ", text.replace("T", " ")):
        assert canonical_ms(other) is None


@given(st.integers(min_value=0, max_value=MAX_EPOCH_MS), st.integers(min_value=0, max_value=23),
       st.text(alphabet="0123456789:.-+TZz \u0663\uff10", max_size=3))
def test_timestamp_keeps_a_canonical_time_and_respells_any_other(millis: int, position: int, patch: str) -> None:
    text = iso_ms(millis)
    edited = text[:position] + patch + text[position + len(patch) or position + 1:]
    KNOWN_TIMES.pop(edited, None)
    canonical = _spelled_canonically(edited)
    if canonical is not None:
        assert timestamp(edited, "at") is edited
        assert KNOWN_TIMES[edited] == canonical
        return
    try:
        moment = parse_iso_ms(edited) if edited.isascii() and len(edited) <= 64 else None
    except (ValueError, OverflowError):
        moment = None
    if moment is not None and 0 <= moment <= MAX_EPOCH_MS:
        assert timestamp(edited, "at") == iso_ms(moment)
    else:
        with pytest.raises(InvalidInputError):
            timestamp(edited, "at")
    assert edited not in KNOWN_TIMES
