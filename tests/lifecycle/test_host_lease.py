"""The host lease (issue 13, item 1): one driver acts for a runner, fenced by a token checked where the write happens.

A driver takes the runner's lease (``HostLeaseAcquired``, a token above every one before), renews it
without events, and every command of its handle is checked under the write lock against the lease row:
another holder's token or an expiry by the store's clock refuses it (HostFencedError), nothing appended.
The log holds every host event to its runner's latest token, so the audit catches a stale writer that
got past a store (a forged or merged log).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from lifecycle_es import (
    EventStore,
    HostFencedError,
    HostLeaseHeldError,
    InvalidInputError,
    RunnerLifecycle,
    audit,
)
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import HostLeaseAcquired, UnitExited, UnitStarting, UnitStopped
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS, FakeClock, SequentialIds
from lifecycle_es.values import ProxyAuthority

HOUR = 3_600_000
DIGEST = "sha256:" + "1" * 64


@dataclass
class Runner:
    """A runner holding one active lease, and a second handle on the same file (another driver)."""

    path: Path
    store: EventStore
    mine: RunnerLifecycle
    theirs: RunnerLifecycle
    clock: FakeClock
    lease_id: str
    run_dir: str

    def fingerprint(self) -> tuple[str | None, ...]:
        return tuple(hashlib.sha256(Path(f"{self.path}{suffix}").read_bytes()).hexdigest()
                     if Path(f"{self.path}{suffix}").exists() else None for suffix in ("", "-wal"))

    def starting(self) -> UnitStarting:
        return UnitStarting(lease_id=self.lease_id, lease_generation=1, mode="child", run_dir=self.run_dir,
                            command=("/usr/bin/agent",))

    def types(self) -> list[str]:
        return [recorded.type for recorded in self.store.read(stream="runner-1")]


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    clock = FakeClock()
    path = tmp_path / "runners.db"
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    with EventStore.open(path, now=clock) as store, EventStore.open(path, now=clock) as other:
        mine = RunnerLifecycle(store, **RUNNER_DEFAULTS, base_dir=str(base_dir), now=clock, random_id=SequentialIds())
        mine.initialize()
        proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(START_MS), expires_at=iso_ms(START_MS + HOUR))
        lease = mine.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy).lease
        theirs = RunnerLifecycle(other, **RUNNER_DEFAULTS, base_dir=str(base_dir), now=clock)
        yield Runner(path, store, mine, theirs, clock, lease.id, f"{base_dir}/{lease.id}")


def test_the_first_holder_takes_token_1_and_its_events_carry_it(runner: Runner) -> None:
    grant = runner.mine.take_host_lease(holder="host-a/boot-1/i-1", ttl_ms=15_000)
    assert (grant.token, grant.expires_ms, grant.act_after_ms) == (1, START_MS + 15_000, START_MS)
    recorded = runner.mine.record_host_facts([runner.starting()])
    assert recorded[0].event.host_token == 1  # type: ignore[attr-defined]
    assert b'"host_token":1' in recorded[0].body
    last = list(runner.store.read(stream="runner-1"))[-2]
    assert last.event == HostLeaseAcquired(holder="host-a/boot-1/i-1", token=1, ttl_ms=15_000)
    assert runner.mine.state().host_token == 1 and runner.store.host_lease("runner-1") == (
        "host-a/boot-1/i-1", 1, START_MS + 15_000)


def test_a_live_holder_keeps_the_lease_and_a_standby_takes_it_once_expired_after_ttl_and_grace(runner: Runner) -> None:
    runner.mine.take_host_lease(holder="host-a/boot-1/i-1", ttl_ms=15_000)
    before = runner.fingerprint()
    runner.clock.advance(14_999)
    with pytest.raises(HostLeaseHeldError) as held:
        runner.theirs.take_host_lease(holder="host-b/boot-2/i-2", ttl_ms=15_000, grace_ms=2_000)
    assert (held.value.holder, held.value.expires_in_ms) == ("host-a/boot-1/i-1", 1)
    assert runner.fingerprint() == before, "a refused take changed the store file"
    runner.clock.advance(1)
    grant = runner.theirs.take_host_lease(holder="host-b/boot-2/i-2", ttl_ms=15_000, grace_ms=2_000)
    # The new holder touches no unit before the old one's expiry + grace: by then the old one stopped itself.
    assert (grant.token, grant.act_after_ms) == (2, START_MS + 15_000 + 2_000)


def test_a_stale_holder_is_fenced_in_the_write_transaction_and_appends_nothing(runner: Runner) -> None:
    runner.mine.take_host_lease(holder="host-a/boot-1/i-1", ttl_ms=15_000)
    runner.clock.advance(15_000)
    runner.theirs.take_host_lease(holder="host-b/boot-2/i-2", ttl_ms=15_000)
    before = runner.fingerprint()
    for command in (lambda: runner.mine.record_host_facts([runner.starting()]),
                    lambda: runner.mine.park_lease(lease_id=runner.lease_id, lease_generation=1,
                                                   result_digest=DIGEST, reason="lost-poll")):
        with pytest.raises(HostFencedError) as fenced:
            command()
        assert fenced.value.token == 1 and "host-b/boot-2/i-2 holds it now with token 2" in str(fenced.value)
    assert runner.fingerprint() == before, "a fenced write changed the store file"
    runner.theirs.record_host_facts([runner.starting()])
    assert runner.types()[-1] == "UnitStarting"


def test_an_expired_lease_is_fenced_by_the_store_clock_even_with_no_taker(runner: Runner) -> None:
    grant = runner.mine.take_host_lease(holder="host-a/boot-1/i-1", ttl_ms=15_000)
    runner.clock.advance(10_000)
    grant = runner.mine.renew_host_lease(grant)  # renewals move the expiry and append nothing
    assert grant.expires_ms == START_MS + 25_000 and runner.types()[-1] == "HostLeaseAcquired"
    runner.clock.advance(14_999)
    runner.mine.record_host_facts([runner.starting()])
    runner.clock.advance(1)
    with pytest.raises(HostFencedError, match="expired 0 ms ago by the store's clock"):
        runner.mine.record_host_facts([UnitStopped(lease_id=runner.lease_id, reason="stopped")])
    with pytest.raises(HostFencedError):
        runner.mine.renew_host_lease(grant)


def test_a_released_lease_is_taken_at_once_and_the_token_still_grows(runner: Runner) -> None:
    grant = runner.mine.take_host_lease(holder="host-a/boot-1/i-1", ttl_ms=15_000)
    assert runner.mine.release_host_lease(grant) and runner.mine.host_grant is None
    taken = runner.theirs.take_host_lease(holder="host-b/boot-2/i-2", ttl_ms=15_000, grace_ms=2_000)
    assert (taken.token, taken.act_after_ms) == (2, START_MS)
    assert not runner.mine.release_host_lease(grant)  # another's lease is left alone
    assert runner.store.host_lease("runner-1") == ("host-b/boot-2/i-2", 2, START_MS + 15_000)


def test_a_holder_name_and_ttl_out_of_bounds_are_refused(runner: Runner) -> None:
    for holder in ("", "host a", "x" * 256, 7):
        with pytest.raises(InvalidInputError) as info:
            runner.mine.take_host_lease(holder=holder)  # type: ignore[arg-type]
        assert info.value.field == "holder"
    for ttl in (999, 3_600_001):
        with pytest.raises(InvalidInputError) as info:
            runner.mine.take_host_lease(holder="h", ttl_ms=ttl)
        assert info.value.field == "ttl_ms"
    assert "HostLeaseAcquired" not in runner.types()


def test_the_rules_refuse_a_stale_token_a_token_that_does_not_grow_and_a_unit_fact_without_one(runner: Runner) -> None:
    runner.mine.take_host_lease(holder="host-a/boot-1/i-1", ttl_ms=15_000)
    runner.clock.advance(15_000)
    runner.theirs.take_host_lease(holder="host-b/boot-2/i-2", ttl_ms=15_000)
    stale = msgspec.structs.replace(runner.starting(), host_token=1)
    for events, words in (
            ([stale], "host lease token 1 is stale"),
            ([HostLeaseAcquired(holder="host-c", token=2, ttl_ms=15_000)], "token must grow"),
            ([runner.starting()], "without a host lease token"),
            ([msgspec.structs.replace(runner.starting(), host_token=3)], "no such lease")):
        with pytest.raises(InvalidInputError) as refused:
            runner.store.append("runner-1", events)
        assert words in str(refused.value), refused.value
    # A lease event without a token is still a caller's own (it settles its session's lease).
    runner.store.append("runner-1", [UnitExited(lease_id=runner.lease_id, code=0, signal=None, outcome="settled",
                                                host_token=2)])
    runner.mine.hold_host_lease(None)
    runner.mine.park_lease(lease_id=runner.lease_id, lease_generation=1, result_digest=DIGEST, reason="lost-poll")


def test_the_audit_reports_a_host_event_written_with_an_older_token(runner: Runner) -> None:
    runner.mine.take_host_lease(holder="host-a/boot-1/i-1", ttl_ms=15_000)
    runner.clock.advance(15_000)
    runner.theirs.take_host_lease(holder="host-b/boot-2/i-2", ttl_ms=15_000)
    assert audit(runner.store).ok
    seq = runner.store.append_unchecked("runner-1", [msgspec.structs.replace(runner.starting(), host_token=1)])[0].seq
    report = audit(runner.store)
    assert not report.ok and report.first_problem is not None
    assert report.first_problem.seq == seq and "host lease token 1 is stale" in report.first_problem.reason
