"""Every rule of seed 000 (the JavaScript runner lifecycle), one test per rule, named after it.

Each test drives `RunnerLifecycle` on a real store (a file, and again a schema on a PostgreSQL server)
with a fake clock and a tmp_path base directory, and checks three things the seed and DESIGN.md ask for
together: the outcome (or the error kind of DESIGN.md's Clarifications), the seed's message wording plus
the offending field or value, and that a refused command appended nothing. Receipt digests are recomputed here from the
seed's algorithm (sha256 over a domain string and canonical JSON of the camelCase material) with
hashlib and json, not with the library's own helpers, so a drift in either shows.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest

from lifecycle_es import (
    AuthorityError,
    EventStore,
    InvalidInputError,
    LeaseReceipt,
    LifecycleError,
    PreflightError,
    ProxyAuthority,
    Resources,
    RunnerCapacityError,
    RunnerLifecycle,
    StaleFenceError,
    UnknownRunnerError,
    assert_lease_authority,
    lifecycle_profile_from_lease,
)
from lifecycle_es.testing import FakeClock

T0 = 1_700_000_000_000
MIB = 1024 * 1024
GIB = 1024 * MIB
HOOK = "sha256:" + "a" * 64
RESULT = "sha256:" + "b" * 64
OTHER = "sha256:" + "c" * 64
RESOURCES = Resources(cpu_seconds=600, memory_bytes=GIB)
LEASE_DOMAIN = "chainlesschain.execution-location.runner-lease.v1\0"
HOOK_DOMAIN = "chainlesschain.execution-location.post-session-hook.v1\0"
BASE_DIR_DOMAIN = "chainlesschain.execution-location.base-dir.v1\0"


# --- the seed's algorithms, written out independently ---------------------------------------------------


def seed_iso(epoch_ms: int) -> str:
    """JavaScript's ``new Date(ms).toISOString()``."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=epoch_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def seed_receipt_digest(domain: str, material: object) -> str:
    """The seed's ``receiptDigest``: sha256 over the domain string, then canonical JSON of the material."""
    canonical = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(domain.encode() + canonical.encode()).hexdigest()


# --- the world a test runs in ---------------------------------------------------------------------------


@dataclass
class World:
    """One store, one clock and one base directory shared by the runners of a test."""

    store: EventStore
    clock: FakeClock
    base_dir: Path
    tmp: Path
    target: str
    """Where the store is, as the test opened it: what receipts name as the authority file."""

    def runner(self, runner_id: str = "runner-1", **overrides: Any) -> RunnerLifecycle:
        ids = itertools.count(1)
        options: dict[str, Any] = {
            "runner_id": runner_id, "target": "local", "base_dir": str(self.base_dir), "resources": RESOURCES,
            "post_session_hook_digest": HOOK, "now": self.clock, "random_id": lambda: f"{next(ids):04d}",
        }
        options.update(overrides)
        return RunnerLifecycle(self.store, **options)

    def started(self, runner_id: str = "runner-1", **overrides: Any) -> RunnerLifecycle:
        lifecycle = self.runner(runner_id, **overrides)
        lifecycle.initialize()
        return lifecycle

    def proxy(self, revision: int = 1, *, id: str = "proxy-1", issued: int = 0, expires: int = 120_000,
              ) -> ProxyAuthority:
        """A proxy authority issued and expiring at offsets (ms) from the clock's now."""
        return ProxyAuthority(id=id, revision=revision, issued_at=seed_iso(self.clock.ms + issued),
                              expires_at=seed_iso(self.clock.ms + expires))

    def types_after(self, seq: int) -> list[str]:
        return [recorded.type for recorded in self.store.read(after=seq)]


@pytest.fixture
def world(tmp_path: Path, store_target: str) -> Iterator[World]:
    clock = FakeClock(T0)
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    with EventStore.open(store_target, now=clock) as store:
        yield World(store, clock, base_dir, tmp_path, store_target)


@contextlib.contextmanager
def refused(world: World, kind: type[BaseException], *words: str) -> Iterator[pytest.ExceptionInfo[Any]]:
    """Expect `kind` with the seed's wording and the offending value in its message, and nothing appended."""
    before = world.store.head()
    with pytest.raises(kind) as info:
        yield info
    assert world.store.head() == before, "a refused command appended events"
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def one_cause(error: pytest.ExceptionInfo[Any], causes: dict[str, str], broken: str) -> None:
    """The message names the `broken` cause in its words, and no other cause's: one cause, one message, one line."""
    message = str(error.value)
    assert causes[broken] in message, f"{causes[broken]!r} not in {message!r}"
    assert not [words for cause, words in causes.items() if cause != broken and words in message], message
    assert "\n" not in message


def acquire(world: World, lifecycle: RunnerLifecycle, session: str = "session-1", **kwargs: Any) -> LeaseReceipt:
    snapshot = lifecycle.snapshot()
    kwargs.setdefault("proxy_authority", world.proxy(max(1, snapshot.proxy_authority.revision)))
    return lifecycle.acquire_lease(session_id=session, expected_generation=snapshot.generation, **kwargs)


def drain(lifecycle: RunnerLifecycle, timeout_ms: int = 1_000) -> None:
    lifecycle.request_drain(expected_generation=lifecycle.snapshot().generation, timeout_ms=timeout_ms)


def park(world: World, lifecycle: RunnerLifecycle) -> None:
    """Bring the runner to parked: drain, and past the deadline park what is still active."""
    if lifecycle.snapshot().state == "accepting":
        drain(lifecycle)
    if lifecycle.snapshot().state == "draining":
        world.clock.advance(1_000)
        lifecycle.park_expired_drain(expected_generation=lifecycle.snapshot().generation)
    assert lifecycle.snapshot().state == "parked"


def reclaim(world: World, lifecycle: RunnerLifecycle) -> None:
    """Bring a parked runner to reclaiming under the next proxy revision."""
    snapshot = lifecycle.snapshot()
    lifecycle.begin_reclaim(expected_generation=snapshot.generation,
                            proxy_authority=world.proxy(snapshot.proxy_authority.revision + 1))


# --- bounds ---------------------------------------------------------------------------------------------

BAD_IDS = [
    pytest.param("", id="empty"),
    pytest.param("-leading-dash", id="leading-dash"),
    pytest.param(".hidden", id="leading-dot"),
    pytest.param("..", id="dot-dot"),
    pytest.param("a/b", id="slash"),
    pytest.param("a b", id="space"),
    pytest.param("a\nb", id="newline-inside"),
    pytest.param("ab\n", id="trailing-newline"),
    pytest.param("a\0b", id="nul"),
    pytest.param("r\u0430nner", id="cyrillic-a"),
    pytest.param("a" * 257, id="257-chars"),
    pytest.param(7, id="not-a-string"),
]
GOOD_IDS = ["a", "0", "A" * 256, "a._:@+-Z9", "a..b"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_ids_follow_the_seed_pattern(world: World, bad: object) -> None:
    lifecycle = world.started()
    receipt = acquire(world, lifecycle)
    lease = receipt.lease
    calls: list[tuple[str, Callable[[], object]]] = [
        ("runner_id", lambda: world.runner(bad)),  # type: ignore[arg-type]
        ("session_id", lambda: lifecycle.acquire_lease(session_id=bad, expected_generation=1,
                                                       proxy_authority=world.proxy())),
        ("lease_id", lambda: lifecycle.settle_lease(lease_id=bad, lease_generation=1, result_digest=RESULT)),
        ("lease_id", lambda: lifecycle.assert_poll(lease_id=bad, lease_generation=1, proxy_authority_id="proxy-1",
                                                   proxy_authority_revision=1)),
        ("proxy_authority_id", lambda: lifecycle.assert_poll(lease_id=lease.id, lease_generation=1,
                                                             proxy_authority_id=bad, proxy_authority_revision=1)),
        ("proxy_authority.id", lambda: lifecycle.rotate_proxy_authority(
            expected_generation=1, proxy_authority={"id": bad, "revision": 2, "issued_at": seed_iso(T0),
                                                    "expires_at": seed_iso(T0 + 60_000)})),
    ]
    for field, call in calls:
        with refused(world, InvalidInputError, f"{field} is invalid", repr(bad)[:40]) as info:
            call()
        assert info.value.field == field


@pytest.mark.parametrize("good", GOOD_IDS)
def test_ids_up_to_256_characters_are_accepted(world: World, good: str) -> None:
    lifecycle = world.started(good)
    receipt = acquire(world, lifecycle, session=good, proxy_authority=world.proxy(id=good))
    assert (receipt.runner_id, receipt.lease.session_id, receipt.proxy_authority.id) == (good, good, good)


BAD_DIGESTS = [
    pytest.param("sha256:" + "A" * 64, id="uppercase-hex"),
    pytest.param("sha256:" + "a" * 63, id="63-hex"),
    pytest.param("sha256:" + "a" * 65, id="65-hex"),
    pytest.param("sha512:" + "a" * 64, id="other-algorithm"),
    pytest.param("a" * 64, id="no-prefix"),
    pytest.param("sha256:" + "g" * 64, id="not-hex"),
    pytest.param("sha256:" + "a" * 64 + "\n", id="trailing-newline"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("bad", BAD_DIGESTS)
def test_digests_follow_the_seed_pattern(world: World, bad: object) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    calls: list[tuple[str, Callable[[], object]]] = [
        ("post_session_hook_digest", lambda: world.runner("runner-2", post_session_hook_digest=bad)),
        ("result_digest", lambda: lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=bad)),
        ("result_digest", lambda: lifecycle.park_lease(lease_id=lease.id, lease_generation=1, result_digest=bad,
                                                       reason="lost-poll")),
        ("hook_digest", lambda: lifecycle.authorize_post_session_hook(
            expected_runner_generation=1, lease_id=lease.id, lease_generation=1, result_digest=RESULT,
            hook_digest=bad)),
    ]
    for field, call in calls:
        with refused(world, InvalidInputError, f"{field} is invalid") as info:
            call()
        assert info.value.field == field


@pytest.mark.parametrize(("field", "value", "ok"), [
    ("cpu_seconds", 0, False), ("cpu_seconds", 1, True), ("cpu_seconds", 86_400, True),
    ("cpu_seconds", 86_401, False),
    ("memory_bytes", 64 * MIB - 1, False), ("memory_bytes", 64 * MIB, True), ("memory_bytes", 64 * GIB, True),
    ("memory_bytes", 64 * GIB + 1, False),
])
def test_resource_bounds(world: World, field: str, value: int, ok: bool) -> None:
    fields = {"cpu_seconds": 600, "memory_bytes": GIB, field: value}
    if ok:
        snapshot = world.started(resources=fields).initialize()
        assert getattr(snapshot.resources, field) == value
        return
    with refused(world, InvalidInputError, str(value)) as info:
        world.runner(resources=fields)
    assert info.value.field == f"resources.{field}"


def test_resources_need_exactly_their_two_fields(world: World) -> None:
    for shape in ({"cpu_seconds": 600}, {"cpu_seconds": 600, "memory_bytes": GIB, "extra": 1},
                  {"cpuSeconds": 600, "memoryBytes": GIB}):
        with refused(world, InvalidInputError, "resources has an invalid schema") as info:
            world.runner(resources=shape)
        assert info.value.field == "resources"


@pytest.mark.parametrize(("ttl_ms", "ok"), [(999, False), (1_000, True), (86_400_000, True), (86_400_001, False),
                                            (0, False)])
def test_lease_ttl_is_1s_to_24h(world: World, ttl_ms: int, ok: bool) -> None:
    lifecycle = world.started()
    if ok:
        assert acquire(world, lifecycle, ttl_ms=ttl_ms).lease.expires_at == seed_iso(T0 + ttl_ms)
        return
    with refused(world, InvalidInputError, "ttl_ms is invalid", str(ttl_ms)) as info:
        acquire(world, lifecycle, ttl_ms=ttl_ms)
    assert info.value.field == "ttl_ms"


def test_lease_ttl_defaults_to_10_minutes(world: World) -> None:
    assert acquire(world, world.started()).lease.expires_at == seed_iso(T0 + 600_000)


@pytest.mark.parametrize(("timeout_ms", "ok"), [(0, False), (1, True), (600_000, True), (600_001, False)])
def test_drain_timeout_is_1ms_to_10min(world: World, timeout_ms: int, ok: bool) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    if ok:
        snapshot = lifecycle.request_drain(expected_generation=1, timeout_ms=timeout_ms)
        assert snapshot.drain is not None
        assert snapshot.drain.deadline_at == seed_iso(T0 + timeout_ms)
        return
    with refused(world, InvalidInputError, "timeout_ms is invalid", str(timeout_ms)) as info:
        lifecycle.request_drain(expected_generation=1, timeout_ms=timeout_ms)
    assert info.value.field == "timeout_ms"


def test_drain_timeout_defaults_to_30s(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    drain_info = lifecycle.request_drain(expected_generation=1).drain
    assert drain_info is not None
    assert (drain_info.signal, drain_info.requested_at, drain_info.deadline_at) == (
        "SIGTERM", seed_iso(T0), seed_iso(T0 + 30_000))


@pytest.mark.parametrize("signal", ["SIGKILL", "SIGINT", "sigterm", "TERM", 15])
def test_drain_signal_is_sigterm_only(world: World, signal: object) -> None:
    lifecycle = world.started()
    with refused(world, InvalidInputError, "runner drain requires SIGTERM", repr(signal)) as info:
        lifecycle.request_drain(expected_generation=1, signal=signal)  # type: ignore[arg-type]
    assert info.value.field == "signal"


@pytest.mark.parametrize("reason", ["checkout-failure", "lost-poll", "resource-limit"])
def test_park_reasons_are_the_seeds_three(world: World, reason: str) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    parked = lifecycle.park_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT, reason=reason)
    assert parked.park_reason == reason


@pytest.mark.parametrize("reason", ["timeout", "Lost-Poll", "", None])
def test_other_park_reasons_are_refused(world: World, reason: object) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    with refused(world, InvalidInputError, "execution location park reason is invalid", repr(reason)) as info:
        lifecycle.park_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT,
                             reason=reason)  # type: ignore[arg-type]
    assert info.value.field == "reason"


@pytest.mark.parametrize("target", ["local", "wsl", "ssh", "container"])
def test_targets_are_the_seeds_four(world: World, target: str) -> None:
    assert world.started(target=target).snapshot().target == target


def test_other_targets_are_refused(world: World) -> None:
    for target in ("docker", "LOCAL", "", None):
        with refused(world, InvalidInputError, "runner target is invalid", repr(target)) as info:
            world.runner(target=target)
        assert info.value.field == "target"


def test_base_dir_is_resolved_and_bounded(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(world.tmp)
    # The seed's normalizeBaseDir is path.resolve: a relative dir is resolved against the cwd.
    assert world.runner(base_dir="base").base_dir == str(world.base_dir)
    assert world.runner(base_dir=str(world.base_dir) + "/./sub/..").base_dir == str(world.base_dir)
    # A lone surrogate (an undecodable byte smuggled in by surrogateescape) has no UTF-8 form to record.
    # Each refused path, and the one cause its message names.
    for bad, cause in (("", "it is empty"), ("/a\0b", "holds NUL"),
                       ("/" + "a" * 4096, "4097 characters, more than 4096"),
                       ("/srv/\udc80", "is not valid text"), ("rel\ud800", "is not valid text")):
        with refused(world, InvalidInputError, "runner base_dir is invalid: ", cause) as info:
            world.runner(base_dir=bad)
        assert info.value.field == "base_dir"


# --- proxy authority ------------------------------------------------------------------------------------

FRESHNESS = [
    pytest.param(30_000, 60_000, True, id="issued-exactly-30s-ahead"),
    pytest.param(30_001, 60_000, False, id="issued-30s-and-1ms-ahead"),
    pytest.param(-300_000, 60_000, True, id="issued-exactly-5min-ago"),
    pytest.param(-300_001, 60_000, False, id="issued-5min-and-1ms-ago"),
    pytest.param(0, 1, True, id="expires-1ms-from-now"),
    pytest.param(0, 0, False, id="expires-exactly-now"),
    pytest.param(0, -1, False, id="expired"),
]


def _fresh_setup(world: World, command: str) -> tuple[RunnerLifecycle, Callable[[ProxyAuthority], object], int]:
    """A runner ready for `command`, the call that feeds it a proxy, and the revision that call needs."""
    lifecycle = world.started()
    if command == "acquire":
        return lifecycle, lambda proxy: lifecycle.acquire_lease(
            session_id="session-9", expected_generation=1, proxy_authority=proxy), 1
    lease = acquire(world, lifecycle).lease
    if command == "rotate":
        return lifecycle, lambda proxy: lifecycle.rotate_proxy_authority(
            expected_generation=1, proxy_authority=proxy), 2
    if command == "refresh":
        return lifecycle, lambda proxy: lifecycle.refresh_lease_authority(
            lease_id=lease.id, lease_generation=1, expected_generation=1, proxy_authority=proxy), 1
    park(world, lifecycle)
    generation = lifecycle.snapshot().generation
    return lifecycle, lambda proxy: lifecycle.begin_reclaim(expected_generation=generation, proxy_authority=proxy), 2


@pytest.mark.parametrize("command", ["acquire", "rotate", "refresh", "reclaim"])
@pytest.mark.parametrize(("issued", "expires", "fresh"), FRESHNESS)
def test_proxy_authority_must_be_fresh(world: World, command: str, issued: int, expires: int, fresh: bool) -> None:
    _, call, revision = _fresh_setup(world, command)
    proxy = world.proxy(revision, issued=issued, expires=expires)
    if fresh:
        call(proxy)
        return
    with refused(world, AuthorityError, "execution location proxy authority is not fresh", "proxy-1",
                 proxy.issued_at):
        call(proxy)


def test_acquire_refuses_a_drifted_proxy_id(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    with refused(world, AuthorityError, "execution location proxy authority identity drifted", "proxy-2",
                 "proxy-1"):
        acquire(world, lifecycle, session="session-2", proxy_authority=world.proxy(id="proxy-2"))


def test_first_acquire_binds_any_proxy_id(world: World) -> None:
    lifecycle = world.started()
    assert lifecycle.snapshot().proxy_authority.id == "unbound"
    acquire(world, lifecycle, proxy_authority=world.proxy(4, id="proxy-9"))
    assert (lifecycle.snapshot().proxy_authority.id, lifecycle.snapshot().proxy_authority.revision) == ("proxy-9", 4)


def test_rotate_refuses_a_drifted_proxy_id(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    with refused(world, StaleFenceError, "execution location proxy rotation fence is stale", "proxy-2"):
        lifecycle.rotate_proxy_authority(expected_generation=1, proxy_authority=world.proxy(2, id="proxy-2"))


def test_reclaim_refuses_a_drifted_proxy_id(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    park(world, lifecycle)
    generation = lifecycle.snapshot().generation
    with refused(world, StaleFenceError, "execution location reclaim fence is stale", "proxy-2"):
        lifecycle.begin_reclaim(expected_generation=generation, proxy_authority=world.proxy(2, id="proxy-2"))


def test_acquire_refuses_a_rolled_back_revision(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle, proxy_authority=world.proxy(3))
    with refused(world, AuthorityError, "execution location proxy authority revision rolled back",
                 "proxy_authority.revision 2 is below the runner's 3", "revision 3 or newer"):
        acquire(world, lifecycle, session="session-2", proxy_authority=world.proxy(2))
    # The same revision, or a newer one, is no rollback; the runner takes the newer revision.
    acquire(world, lifecycle, session="session-2", proxy_authority=world.proxy(3))
    acquire(world, lifecycle, session="session-3", proxy_authority=world.proxy(7))
    assert lifecycle.snapshot().proxy_authority.revision == 7


@pytest.mark.parametrize("command", ["rotate", "reclaim"])
def test_rotate_and_reclaim_need_at_least_the_next_revision(world: World, command: str) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle, proxy_authority=world.proxy(3))
    if command == "reclaim":
        park(world, lifecycle)

    def call(revision: int) -> object:
        generation = lifecycle.snapshot().generation
        if command == "rotate":
            return lifecycle.rotate_proxy_authority(expected_generation=generation,
                                                    proxy_authority=world.proxy(revision))
        return lifecycle.begin_reclaim(expected_generation=generation, proxy_authority=world.proxy(revision))

    for below in (3, 2):
        # The seed's safeInteger minimum (current + 1): a value error, not an authority one.
        with refused(world, InvalidInputError, "proxy authority revision is invalid", f"{below}", "minimum 4") as info:
            call(below)
        assert info.value.field == "proxy_authority.revision"
    # "At least", not "exactly": current + 5 is accepted.
    call(8)
    assert lifecycle.snapshot().proxy_authority.revision == 8


def test_rotate_moves_generation_and_policy_revision(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    before = world.store.head().seq
    snapshot = lifecycle.rotate_proxy_authority(expected_generation=1, proxy_authority=world.proxy(2))
    assert (snapshot.generation, snapshot.policy_revision, snapshot.proxy_authority.revision) == (2, 2, 2)
    assert world.types_after(before) == ["ProxyRotated"]


def test_rotate_is_allowed_while_draining_only_besides_accepting(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    drain(lifecycle)
    assert lifecycle.rotate_proxy_authority(expected_generation=2, proxy_authority=world.proxy(2)).state == "draining"
    park(world, lifecycle)
    for state_name in ("parked", "reclaiming"):
        snapshot = lifecycle.snapshot()
        assert snapshot.state == state_name
        with refused(world, StaleFenceError, "execution location proxy rotation fence is stale",
                     f"the runner is {state_name}; a proxy authority is rotated while it is accepting or draining"):
            lifecycle.rotate_proxy_authority(expected_generation=snapshot.generation,
                                             proxy_authority=world.proxy(snapshot.proxy_authority.revision + 1))
        if state_name == "parked":
            reclaim(world, lifecycle)


def test_proxy_authority_needs_exactly_its_four_fields(world: World) -> None:
    lifecycle = world.started()
    good = {"id": "proxy-1", "revision": 1, "issued_at": seed_iso(T0), "expires_at": seed_iso(T0 + 60_000)}
    # Each shape, and what its message says is missing and unexpected.
    for shape, words in (
            ({k: v for k, v in good.items() if k != "expires_at"}, "missing expires_at, unexpected none"),
            ({**good, "extra": 1}, "missing none, unexpected 'extra'"),
            ({"id": "proxy-1", "revision": 1, "issuedAt": seed_iso(T0), "expiresAt": seed_iso(T0 + 1)},
             "missing expires_at, issued_at, unexpected 'expiresAt', 'issuedAt'")):
        with refused(world, InvalidInputError, "proxy_authority has an invalid schema: ", words,
                     "(it takes exactly expires_at, id, issued_at, revision)") as info:
            lifecycle.acquire_lease(session_id="s", expected_generation=1, proxy_authority=shape)
        assert info.value.field == "proxy_authority"
    assert lifecycle.acquire_lease(session_id="s", expected_generation=1, proxy_authority=good).lease.generation == 1


def test_proxy_timestamps_accept_aware_datetimes_and_refuse_naive_ones(world: World) -> None:
    lifecycle = world.started()
    now = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=T0)
    plus_two = timezone(timedelta(hours=2))
    aware = ProxyAuthority(id="proxy-1", revision=1, issued_at=now.astimezone(plus_two),
                           expires_at=now + timedelta(minutes=1))
    # Normalized to the seed's toISOString form whatever the offset given.
    assert (aware.issued_at, aware.expires_at) == (seed_iso(T0), seed_iso(T0 + 60_000))
    receipt = lifecycle.acquire_lease(session_id="s", expected_generation=1, proxy_authority=aware)
    assert receipt.proxy_authority.issued_at == seed_iso(T0)
    as_dict = {"id": "proxy-1", "revision": 1, "issued_at": now.replace(tzinfo=None), "expires_at": now}
    with refused(world, InvalidInputError, "naive datetime") as info:
        lifecycle.acquire_lease(session_id="s2", expected_generation=1, proxy_authority=as_dict)
    assert info.value.field == "proxy_authority.issued_at"
    for naive_text in ("2023-11-14T22:13:20", "2023-11-14T22:13:20.000"):
        with refused(world, InvalidInputError, "proxy_authority.expires_at is invalid") as info:
            lifecycle.acquire_lease(session_id="s2", expected_generation=1,
                                    proxy_authority={**as_dict, "issued_at": now, "expires_at": naive_text})
        assert info.value.field == "proxy_authority.expires_at"


# --- sessions, generations and leases -------------------------------------------------------------------


def test_one_active_lease_per_session(world: World) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    with refused(world, StaleFenceError, "execution location session already has an active lease", "session-1"):
        acquire(world, lifecycle)
    acquire(world, lifecycle, session="session-2")
    lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT)
    # Once its lease ended the session may take another.
    assert acquire(world, lifecycle).lease.session_id == "session-1"


def _generation_fences(world: World) -> list[tuple[str, str, RunnerLifecycle, Callable[[int], object]]]:
    """One runner per fenced command, each in the state the command needs, and the call with a generation."""
    fences: list[tuple[str, str, RunnerLifecycle, Callable[[int], object]]] = []
    accepting = world.started("runner-acquire")
    fences.append(("acquire_lease", "execution location runner is not accepting this generation", accepting,
                   lambda g: accepting.acquire_lease(session_id="s-new", expected_generation=g,
                                                     proxy_authority=world.proxy())))
    rotating = world.started("runner-rotate")
    acquire(world, rotating)
    fences.append(("rotate_proxy_authority", "execution location proxy rotation fence is stale", rotating,
                   lambda g: rotating.rotate_proxy_authority(expected_generation=g, proxy_authority=world.proxy(2))))
    refreshing = world.started("runner-refresh")
    lease = acquire(world, refreshing).lease
    fences.append(("refresh_lease_authority", "execution location lease refresh fence is stale", refreshing,
                   lambda g: refreshing.refresh_lease_authority(lease_id=lease.id, lease_generation=1,
                                                                expected_generation=g, proxy_authority=world.proxy())))
    draining = world.started("runner-drain")
    acquire(world, draining)
    fences.append(("request_drain", "execution location drain generation is stale", draining,
                   lambda g: draining.request_drain(expected_generation=g)))
    expiring = world.started("runner-expire")
    acquire(world, expiring)
    drain(expiring, timeout_ms=1)
    fences.append(("park_expired_drain", "execution location drain is not ready to park", expiring,
                   lambda g: expiring.park_expired_drain(expected_generation=g)))
    parked = world.started("runner-reclaim")
    acquire(world, parked)
    park(world, parked)
    fences.append(("begin_reclaim", "execution location reclaim fence is stale", parked,
                   lambda g: parked.begin_reclaim(expected_generation=g, proxy_authority=world.proxy(2))))
    reclaiming = world.started("runner-complete")
    acquire(world, reclaiming)
    park(world, reclaiming)
    reclaim(world, reclaiming)
    fences.append(("complete_reclaim", "execution location reclaim completion is stale", reclaiming,
                   lambda g: reclaiming.complete_reclaim(expected_generation=g)))
    hooked = world.started("runner-hook")
    hook_lease = acquire(world, hooked).lease
    hooked.park_lease(lease_id=hook_lease.id, lease_generation=1, result_digest=RESULT, reason="lost-poll")
    fences.append(("authorize_post_session_hook", "execution location post-session hook fence is stale", hooked,
                   lambda g: hooked.authorize_post_session_hook(expected_runner_generation=g, lease_id=hook_lease.id,
                                                                lease_generation=1, result_digest=RESULT,
                                                                hook_digest=HOOK)))
    world.clock.advance(1)  # past the 1 ms drain deadline, so only the generation can be stale
    return fences


def test_stale_generation_is_refused_on_every_transition(world: World) -> None:
    fences = _generation_fences(world)
    assert len(fences) == 8
    for name, message, lifecycle, call in fences:
        current = lifecycle.snapshot().generation
        field = "expected_runner_generation" if name == "authorize_post_session_hook" else "expected_generation"
        for stale in (current - 1, current + 1):
            if stale < 1:
                continue
            # The one cause: the generation named, the runner's, and where to read the current one.
            with refused(world, StaleFenceError, message, f": {field} is {stale} but the runner is at generation "
                         f"{current} (call snapshot() for the current generation)"):
                call(stale)
        call(current)  # the same call at the current generation goes through


@pytest.mark.parametrize("wrong", ["unknown", "generation", "settled", "parked"])
@pytest.mark.parametrize("command", ["settle_lease", "park_lease", "assert_poll", "refresh_lease_authority"])
def test_lease_fences(world: World, command: str, wrong: str) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    acquire(world, lifecycle, session="session-2")  # keeps the runner accepting when the first one ends
    lease_id, lease_generation = lease.id, 1
    if wrong == "unknown":
        lease_id = "lease-nobody"
    elif wrong == "generation":
        lease_generation = 2
    elif wrong == "settled":
        lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT)
    else:
        lifecycle.park_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT, reason="lost-poll")
    calls: dict[str, tuple[str, Callable[[], object]]] = {
        "settle_lease": ("execution location result lease fence is stale", lambda: lifecycle.settle_lease(
            lease_id=lease_id, lease_generation=lease_generation, result_digest=RESULT)),
        "park_lease": ("execution location park lease fence is stale", lambda: lifecycle.park_lease(
            lease_id=lease_id, lease_generation=lease_generation, result_digest=RESULT, reason="lost-poll")),
        "assert_poll": ("execution location poll lease is stale or parked", lambda: lifecycle.assert_poll(
            lease_id=lease_id, lease_generation=lease_generation, proxy_authority_id="proxy-1",
            proxy_authority_revision=1)),
        "refresh_lease_authority": ("execution location lease refresh fence is stale",
                                    lambda: lifecycle.refresh_lease_authority(
                                        lease_id=lease_id, lease_generation=lease_generation, expected_generation=1,
                                        proxy_authority=world.proxy())),
    }
    message, call = calls[command]
    causes = {"unknown": "the runner has no lease lease-nobody (it never had one, or retention dropped it",
              "generation": f"lease {lease.id} was granted at generation 1, not lease_generation 2",
              "settled": f"lease {lease.id} is settled, no longer active",
              "parked": f"lease {lease.id} is parked, no longer active"}
    with refused(world, StaleFenceError, f"{message} (lease_id {lease_id}): ") as caught:
        call()
    one_cause(caught, causes, wrong)


def test_lease_generation_is_the_lease_own_not_the_runners(world: World) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    lifecycle.rotate_proxy_authority(expected_generation=1, proxy_authority=world.proxy(2))
    second = acquire(world, lifecycle, session="session-2").lease
    assert (lease.generation, second.generation) == (1, 2)
    with refused(world, StaleFenceError, "execution location result lease fence is stale"):
        lifecycle.settle_lease(lease_id=lease.id, lease_generation=2, result_digest=RESULT)
    lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT)


def test_settle_works_in_any_state_holding_an_active_lease(world: World) -> None:
    lifecycle = world.started()
    first = acquire(world, lifecycle).lease
    acquire(world, lifecycle, session="session-2")
    before = world.store.head().seq
    snapshot = lifecycle.settle_lease(lease_id=first.id, lease_generation=1, result_digest=RESULT)
    # Settling while accepting never parks, even the last lease: the seed parks only a draining runner.
    assert (snapshot.state, snapshot.generation, snapshot.settled_lease_count) == ("accepting", 1, 1)
    assert world.types_after(before) == ["LeaseSettled"]
    assert lifecycle.state().lease(first.id).result_digest == RESULT  # type: ignore[union-attr]


def test_settling_the_last_lease_while_accepting_keeps_accepting(world: World) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    snapshot = lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT)
    assert (snapshot.state, snapshot.generation, snapshot.active_lease_count) == ("accepting", 1, 0)


# --- parking, draining, reclaiming ----------------------------------------------------------------------


def test_parking_the_last_active_lease_parks_the_runner_even_while_accepting(world: World) -> None:
    lifecycle = world.started()
    first = acquire(world, lifecycle).lease
    second = acquire(world, lifecycle, session="session-2").lease
    kept = lifecycle.park_lease(lease_id=first.id, lease_generation=1, result_digest=RESULT,
                                reason="checkout-failure")
    assert (kept.state, kept.generation, kept.parked_lease_count, kept.park_reason) == (
        "accepting", 1, 1, "checkout-failure")
    before = world.store.head().seq
    parked = lifecycle.park_lease(lease_id=second.id, lease_generation=1, result_digest=OTHER,
                                  reason="resource-limit")
    assert (parked.state, parked.generation, parked.drain, parked.park_reason) == (
        "parked", 2, None, "resource-limit")
    assert world.types_after(before) == ["LeaseParked", "RunnerParked"]
    assert lifecycle.state().lease(second.id).result_digest == OTHER  # type: ignore[union-attr]


def test_parking_the_last_active_lease_while_draining_parks_the_runner(world: World) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    drain(lifecycle)
    parked = lifecycle.park_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT, reason="lost-poll")
    assert (parked.state, parked.generation, parked.drain) == ("parked", 3, None)


def test_settling_the_last_lease_of_a_drain_parks_the_runner(world: World) -> None:
    lifecycle = world.started()
    first = acquire(world, lifecycle).lease
    second = acquire(world, lifecycle, session="session-2").lease
    drain(lifecycle)
    still = lifecycle.settle_lease(lease_id=first.id, lease_generation=1, result_digest=RESULT)
    assert (still.state, still.generation) == ("draining", 2)
    before = world.store.head().seq
    parked = lifecycle.settle_lease(lease_id=second.id, lease_generation=1, result_digest=RESULT)
    assert (parked.state, parked.generation, parked.drain, parked.settled_lease_count) == ("parked", 3, None, 2)
    assert world.types_after(before) == ["LeaseSettled", "RunnerParked"]


def test_drain_stops_accepting_and_moves_the_generation(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    snapshot = lifecycle.request_drain(expected_generation=1, timeout_ms=5_000)
    assert (snapshot.state, snapshot.accepting, snapshot.generation) == ("draining", False, 2)
    with refused(world, StaleFenceError, "execution location runner is not accepting this generation",
                 "the runner is draining; leases are granted only while it is accepting"):
        acquire(world, lifecycle, session="session-2")
    with refused(world, StaleFenceError, "execution location drain generation is stale",
                 "the runner is draining; a drain is requested only while it is accepting"):
        lifecycle.request_drain(expected_generation=2)


def test_park_expired_drain_waits_for_the_deadline(world: World) -> None:
    lifecycle = world.started()
    first = acquire(world, lifecycle).lease
    second = acquire(world, lifecycle, session="session-2").lease
    third = acquire(world, lifecycle, session="session-3").lease
    lifecycle.settle_lease(lease_id=third.id, lease_generation=1, result_digest=RESULT)
    lifecycle.request_drain(expected_generation=1, timeout_ms=10_000)
    world.clock.advance(9_999)
    with refused(world, StaleFenceError, "execution location drain is not ready to park",
                 "its deadline 2023-11-14T22:13:30.000Z is 1 ms after now (2023-11-14T22:13:29.999Z)"):
        lifecycle.park_expired_drain(expected_generation=2)
    world.clock.advance(1)  # exactly at the deadline: the seed parks (deadline > now is "not ready")
    before = world.store.head().seq
    parked = lifecycle.park_expired_drain(expected_generation=2)
    assert (parked.state, parked.generation, parked.drain, parked.newly_parked_lease_count) == ("parked", 3, None, 2)
    assert (parked.parked_lease_count, parked.settled_lease_count, parked.active_lease_count) == (2, 1, 0)
    assert world.types_after(before) == ["DrainExpired", "RunnerParked"]
    state = lifecycle.state()
    # An expired drain parks leases with no result (the seed keeps resultDigest as it was: null).
    assert [state.lease(lease.id).result_digest for lease in (first, second)] == [None, None]  # type: ignore[union-attr]


def test_park_expired_drain_needs_a_draining_runner(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    with refused(world, StaleFenceError, "execution location drain is not ready to park",
                 "the runner is accepting; park_expired_drain parks a draining runner"):
        lifecycle.park_expired_drain(expected_generation=1)


def test_reclaim_needs_a_parked_runner(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    with refused(world, StaleFenceError, "execution location reclaim fence is stale",
                 "the runner is accepting; a reclaim begins once it is parked (request_drain first)"):
        lifecycle.begin_reclaim(expected_generation=1, proxy_authority=world.proxy(2))
    drain(lifecycle)
    with refused(world, StaleFenceError, "execution location reclaim fence is stale",
                 "the runner is draining; a reclaim begins once it is parked (settle or park its leases"):
        lifecycle.begin_reclaim(expected_generation=2, proxy_authority=world.proxy(2))
    park(world, lifecycle)
    before = world.store.head().seq
    snapshot = lifecycle.begin_reclaim(expected_generation=3, proxy_authority=world.proxy(2))
    assert (snapshot.state, snapshot.generation, snapshot.policy_revision) == ("reclaiming", 4, 1)
    assert (snapshot.proxy_authority.id, snapshot.proxy_authority.revision) == ("proxy-1", 2)
    assert world.types_after(before) == ["ReclaimBegun"]


def test_complete_reclaim_needs_a_reclaiming_runner(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    park(world, lifecycle)
    with refused(world, StaleFenceError, "execution location reclaim completion is stale",
                 "the runner is parked; a reclaim is completed while it is reclaiming"):
        lifecycle.complete_reclaim(expected_generation=3)
    reclaim(world, lifecycle)
    snapshot = lifecycle.complete_reclaim(expected_generation=4)
    assert (snapshot.state, snapshot.accepting, snapshot.generation) == ("accepting", True, 5)
    # Accepting again: a new lease is granted at the new generation.
    assert acquire(world, lifecycle, session="session-2").lease.generation == 5
    with refused(world, StaleFenceError, "execution location reclaim completion is stale",
                 "the runner is accepting; a reclaim is completed while it is reclaiming"):
        lifecycle.complete_reclaim(expected_generation=5)


# --- post-session hook ----------------------------------------------------------------------------------

# Each cause of a refused hook, and the words only its message says (one message per cause).
HOOK_FENCES = {
    "runner-generation": "expected_runner_generation is",
    "runner-accepting": "the runner is accepting; hooks are authorized while it is draining or parked",
    "unknown-lease": "the runner has no lease lease-nobody",
    "lease-generation": "was granted at generation 1, not lease_generation 2",
    "lease-active": "is still active; its hook is authorized once it is settled or parked",
    "result-digest": "is not the lease's recorded result digest",
    "already-authorized": "hook is already authorized",
    "hook-digest": "is not the runner's post_session_hook_digest",
}


@pytest.mark.parametrize("broken", HOOK_FENCES)
def test_hook_authorization_fences(world: World, broken: str) -> None:
    lifecycle = world.started()
    ended = acquire(world, lifecycle).lease
    active = acquire(world, lifecycle, session="session-2").lease
    lifecycle.settle_lease(lease_id=ended.id, lease_generation=1, result_digest=RESULT)
    if broken != "runner-accepting":
        drain(lifecycle)  # draining, with `ended` settled and `active` still active
    generation = lifecycle.snapshot().generation
    call = {"expected_runner_generation": generation, "lease_id": ended.id, "lease_generation": 1,
            "result_digest": RESULT, "hook_digest": HOOK}
    if broken == "runner-generation":
        call["expected_runner_generation"] = generation - 1
    elif broken == "unknown-lease":
        call["lease_id"] = "lease-nobody"
    elif broken == "lease-generation":
        call["lease_generation"] = 2
    elif broken == "lease-active":
        call["lease_id"] = active.id
    elif broken == "result-digest":
        call["result_digest"] = OTHER
    elif broken == "already-authorized":
        lifecycle.authorize_post_session_hook(**call)
    elif broken == "hook-digest":
        call["hook_digest"] = OTHER
    with refused(world, StaleFenceError, "execution location post-session hook fence is stale: ",
                 HOOK_FENCES[broken]) as caught:
        lifecycle.authorize_post_session_hook(**call)
    others = [words for cause, words in HOOK_FENCES.items() if cause != broken]
    assert not [words for words in others if words in str(caught.value)], "one cause, one message"


@pytest.mark.parametrize("runner_state", ["draining", "parked"])
def test_hook_authorization_records_the_seed_receipt(world: World, runner_state: str) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    acquire(world, lifecycle, session="session-2")
    drain(lifecycle)
    lifecycle.park_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT, reason="lost-poll")
    if runner_state == "parked":
        park(world, lifecycle)
    generation = lifecycle.snapshot().generation
    assert lifecycle.snapshot().state == runner_state
    before = world.store.head().seq
    receipt = lifecycle.authorize_post_session_hook(expected_runner_generation=generation, lease_id=lease.id,
                                                    lease_generation=1, result_digest=RESULT, hook_digest=HOOK)
    material = {"runnerId": "runner-1", "runnerGeneration": generation, "leaseId": lease.id, "leaseGeneration": 1,
                "resultDigest": RESULT, "hookDigest": HOOK}
    assert receipt.receipt_digest == seed_receipt_digest(HOOK_DOMAIN, material)
    assert (receipt.runner_id, receipt.runner_generation, receipt.lease_id, receipt.lease_generation,
            receipt.result_digest, receipt.hook_digest) == tuple(material.values())
    assert lifecycle.state().lease(lease.id).hook_receipt_digest == receipt.receipt_digest  # type: ignore[union-attr]
    assert world.types_after(before) == ["HookAuthorized"]
    assert lifecycle.snapshot().generation == generation  # authorizing a hook moves no generation


def test_a_lease_parked_by_an_expired_drain_has_no_result_to_authorize(world: World) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    park(world, lifecycle)
    with refused(world, StaleFenceError, "execution location post-session hook fence is stale"):
        lifecycle.authorize_post_session_hook(expected_runner_generation=3, lease_id=lease.id, lease_generation=1,
                                              result_digest=RESULT, hook_digest=HOOK)


# --- receipts -------------------------------------------------------------------------------------------


def _seed_lease_material(world: World, receipt: LeaseReceipt, *, state: str, runner_generation: int,
                         proxy: ProxyAuthority, issued_ms: int, ttl_ms: int) -> dict[str, Any]:
    """The seed's lease receipt material, from what the test itself chose (not from the receipt's fields)."""
    return {
        "runnerId": "runner-1",
        "target": "local",
        "authorityFile": world.target,
        "state": state,
        "runnerGeneration": runner_generation,
        "lease": {"id": receipt.lease.id, "sessionId": "session-1", "generation": 1, "issuedAt": seed_iso(issued_ms),
                  "expiresAt": seed_iso(issued_ms + ttl_ms), "status": "active", "resultDigest": None,
                  "hookReceiptDigest": None},
        "proxyAuthority": {"id": proxy.id, "revision": proxy.revision, "issuedAt": proxy.issued_at,
                           "expiresAt": proxy.expires_at},
        "baseDir": {"path": str(world.base_dir), "writableRequired": True},
        "resources": {"cpuSeconds": 600, "memoryBytes": GIB},
        "postSessionHook": {"digest": HOOK, "generation": 1},
    }


def test_lease_receipt_digest_is_the_seeds(world: World) -> None:
    lifecycle = world.started()
    proxy = world.proxy(2, issued=-1_000)
    receipt = lifecycle.acquire_lease(session_id="session-1", expected_generation=1, ttl_ms=90_000,
                                      proxy_authority=proxy)
    material = _seed_lease_material(world, receipt, state="accepting", runner_generation=1, proxy=proxy,
                                    issued_ms=T0, ttl_ms=90_000)
    assert receipt.lease.id == "lease-0001"  # the seed's `lease-${randomId()}`
    assert receipt.lease_receipt_digest == seed_receipt_digest(LEASE_DOMAIN, material)


def test_refreshed_lease_receipt_digest_is_the_seeds(world: World) -> None:
    lifecycle = world.started()
    receipt = lifecycle.acquire_lease(session_id="session-1", expected_generation=1, ttl_ms=90_000,
                                      proxy_authority=world.proxy())
    world.clock.advance(5_000)
    lifecycle.rotate_proxy_authority(expected_generation=1, proxy_authority=world.proxy(2))
    proxy = world.proxy(2)
    before = world.store.head()
    refreshed = lifecycle.refresh_lease_authority(lease_id=receipt.lease.id, lease_generation=1,
                                                  expected_generation=2, proxy_authority=proxy)
    assert world.store.head() == before  # refresh is read-only
    # The refreshed receipt names the runner's current generation and the lease's own generation.
    material = _seed_lease_material(world, receipt, state="accepting", runner_generation=2, proxy=proxy,
                                    issued_ms=T0, ttl_ms=90_000)
    assert refreshed.runner_generation == 2
    assert refreshed.lease_receipt_digest == seed_receipt_digest(LEASE_DOMAIN, material)


def test_base_dir_digest_is_the_seeds(world: World) -> None:
    snapshot = world.started().snapshot()
    assert snapshot.base_dir_digest == seed_receipt_digest(BASE_DIR_DOMAIN, str(world.base_dir))


def test_lifecycle_profile_from_lease_is_the_seeds(world: World) -> None:
    lifecycle = world.started()
    receipt = acquire(world, lifecycle)
    profile = lifecycle_profile_from_lease(receipt)
    assert (profile.runner_id, profile.authority_file, profile.state, profile.generation) == (
        "runner-1", world.target, "accepting", 1)
    assert (profile.lease.id, profile.lease.generation, profile.lease.expires_at) == (
        receipt.lease.id, 1, receipt.lease.expires_at)
    assert (profile.base_dir.path, profile.post_session_hook.digest, profile.resources) == (
        str(world.base_dir), HOOK, RESOURCES)
    with pytest.raises(InvalidInputError, match="runner lease receipt is required") as info:
        lifecycle_profile_from_lease({"runner_id": "runner-1"})  # type: ignore[arg-type]
    assert info.value.field == "receipt"


# --- read-only checks -----------------------------------------------------------------------------------

# Each cause a poll is refused for, and the words only its message says.
POLL_CONDITIONS = {
    "unknown-lease": "the runner has no lease lease-nobody (it never had one, or retention dropped it",
    "lease-settled": "lease lease-0001 is settled, no longer active (stop polling under it)",
    "lease-generation": "lease lease-0001 was granted at generation 1, not lease_generation 2",
    "lease-expired": "lease lease-0001 expired at 2023-11-14T22:14:20.000Z, 0 ms before now "
                     "(2023-11-14T22:14:20.000Z)",
    "proxy-id": "proxy_authority_id proxy-2 is not the runner's (the runner is bound to proxy-1",
    "proxy-revision": "proxy_authority_revision 2 is not the runner's 1 (the proxy rotated: refresh",
    "runner-parked": "the runner is parked; a lease polls only while it is accepting or draining",
    "runner-reclaiming": "the runner is reclaiming; a lease polls only while it is accepting or draining",
}


@pytest.mark.parametrize("broken", POLL_CONDITIONS)
def test_assert_poll_conditions(world: World, broken: str) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle, ttl_ms=60_000).lease
    call = {"lease_id": lease.id, "lease_generation": 1, "proxy_authority_id": "proxy-1",
            "proxy_authority_revision": 1}
    assert lifecycle.assert_poll(**call).lease_id == lease.id
    if broken == "unknown-lease":
        call["lease_id"] = "lease-nobody"
    elif broken == "lease-settled":
        lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT)
    elif broken == "lease-generation":
        call["lease_generation"] = 2
    elif broken == "lease-expired":
        world.clock.advance(60_000)  # exactly at expiry: the seed's `expiresAt <= now` is stale
    elif broken == "proxy-id":
        call["proxy_authority_id"] = "proxy-2"
    elif broken == "proxy-revision":
        call["proxy_authority_revision"] = 2
    else:
        # A parked runner holds no active lease, so the lease is no longer active either: the runner's
        # state is the cause named, being the one to act on.
        park(world, lifecycle)
        call["proxy_authority_revision"] = 1
        if broken == "runner-reclaiming":
            reclaim(world, lifecycle)
            call["proxy_authority_revision"] = 2
    with refused(world, StaleFenceError, f"execution location poll lease is stale or parked (lease_id "
                 f"{call['lease_id']}): ") as caught:
        lifecycle.assert_poll(**call)
    one_cause(caught, POLL_CONDITIONS, broken)


def test_assert_poll_holds_while_draining(world: World) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    world.clock.advance(599_999)  # one millisecond before expiry is still live
    drain(lifecycle)
    before = world.store.head()
    poll = lifecycle.assert_poll(lease_id=lease.id, lease_generation=1, proxy_authority_id="proxy-1",
                                 proxy_authority_revision=1)
    assert (poll.state, poll.runner_generation, poll.lease_generation) == ("draining", 2, 1)
    assert world.store.head() == before


# Each cause a refresh is refused for, and the words only its message says.
REFRESH_CONDITIONS = {
    "runner-draining": "the runner is draining; lease authority is refreshed only while it is accepting",
    "runner-generation": "expected_generation is 2 but the runner is at generation 1",
    "proxy-id": "proxy_authority.id proxy-2 is not the runner's (the runner is bound to proxy-1",
    "proxy-revision-above": "proxy_authority.revision 2 is not the runner's 1 (rotate_proxy_authority first",
    "unknown-lease": "the runner has no lease lease-nobody (it never had one, or retention dropped it",
    "lease-settled": "lease lease-0001 is settled, no longer active (acquire a new lease)",
    "lease-generation": "lease lease-0001 was granted at generation 1, not lease_generation 2",
    "lease-expired": "lease lease-0001 expired at 2023-11-14T22:14:20.000Z, 0 ms before now",
}


@pytest.mark.parametrize("broken", REFRESH_CONDITIONS)
def test_refresh_lease_authority_conditions(world: World, broken: str) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle, ttl_ms=60_000).lease
    acquire(world, lifecycle, session="session-2")
    call: dict[str, Any] = {"lease_id": lease.id, "lease_generation": 1, "expected_generation": 1,
                            "proxy_authority": world.proxy()}
    if broken == "runner-draining":
        drain(lifecycle)
        call["expected_generation"] = 2
    elif broken == "runner-generation":
        call["expected_generation"] = 2
    elif broken == "proxy-id":
        call["proxy_authority"] = world.proxy(id="proxy-2")
    elif broken == "proxy-revision-above":
        call["proxy_authority"] = world.proxy(2)
    elif broken == "unknown-lease":
        call["lease_id"] = "lease-nobody"
    elif broken == "lease-settled":
        lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT)
    elif broken == "lease-generation":
        call["lease_generation"] = 2
    elif broken == "lease-expired":
        world.clock.advance(60_000)
        call["proxy_authority"] = world.proxy()
    with refused(world, StaleFenceError, f"execution location lease refresh fence is stale (lease_id "
                 f"{call['lease_id']}): ") as caught:
        lifecycle.refresh_lease_authority(**call)
    one_cause(caught, REFRESH_CONDITIONS, broken)


def test_refresh_refuses_a_revision_below_the_runners(world: World) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle, proxy_authority=world.proxy(3)).lease
    with refused(world, InvalidInputError, "proxy authority revision is invalid", "minimum 3") as info:
        lifecycle.refresh_lease_authority(lease_id=lease.id, lease_generation=1, expected_generation=1,
                                          proxy_authority=world.proxy(2))
    assert info.value.field == "proxy_authority.revision"


AUTHORITY_MUTATIONS: dict[str, Callable[[Any], Any]] = {
    "generation": lambda p: msgspec.structs.replace(p, generation=p.generation + 1),
    "resources": lambda p: msgspec.structs.replace(p, resources=Resources(cpu_seconds=601, memory_bytes=GIB)),
    "proxy-id": lambda p: msgspec.structs.replace(
        p, proxy_authority=msgspec.structs.replace(p.proxy_authority, id="proxy-2")),
    "proxy-revision": lambda p: msgspec.structs.replace(
        p, proxy_authority=msgspec.structs.replace(p.proxy_authority, revision=2)),
    "hook-digest": lambda p: msgspec.structs.replace(
        p, post_session_hook=msgspec.structs.replace(p.post_session_hook, digest=OTHER)),
    "unknown-lease": lambda p: msgspec.structs.replace(p, lease=msgspec.structs.replace(p.lease, id="lease-nobody")),
    "lease-generation": lambda p: msgspec.structs.replace(p, lease=msgspec.structs.replace(p.lease, generation=2)),
    "lease-expires-at": lambda p: msgspec.structs.replace(
        p, lease=msgspec.structs.replace(p.lease, expires_at=seed_iso(T0 + 1))),
}


# Each cause a lease profile no longer holds authority for, and the words only its message says.
AUTHORITY_CAUSES = {
    "generation": "the profile's generation is 2 but the runner is at generation 1",
    "resources": "the profile's resources (cpu_seconds 601, memory_bytes 1073741824) are not the runner's "
                 "(cpu_seconds 600, memory_bytes 1073741824",
    "proxy-id": "the profile's proxy_authority.id proxy-2 is not the runner's (the runner is bound to proxy-1",
    "proxy-revision": "the profile's proxy_authority.revision 2 is not the runner's 1 (the proxy rotated",
    "hook-digest": f"the profile's post_session_hook digest {OTHER} is not the runner's {HOOK}",
    "unknown-lease": "the runner has no lease lease-nobody (it never had one, or retention dropped it",
    "lease-generation": "lease lease-0001 was granted at generation 1, not lease_generation 2",
    "lease-expires-at": "the profile's lease expires_at 2023-11-14T22:13:20.001Z is not lease lease-0001's "
                        "2023-11-14T22:14:20.000Z",
    "runner-draining": "the runner is draining; a lease holds authority only while its runner is accepting",
    "lease-settled": "lease lease-0001 is settled, no longer active (stop the session)",
    "lease-expired": "lease lease-0001 expired at 2023-11-14T22:14:20.000Z, 0 ms before now",
}


@pytest.mark.parametrize("broken", AUTHORITY_CAUSES)
def test_assert_lease_authority_conditions(world: World, broken: str) -> None:
    lifecycle = world.started()
    receipt = acquire(world, lifecycle, ttl_ms=60_000)
    acquire(world, lifecycle, session="session-2")
    profile = lifecycle_profile_from_lease(receipt)
    now = world.clock
    authority = assert_lease_authority(profile, "local", now=now)
    assert (authority.runner_id, authority.state, authority.generation, authority.lease_id) == (
        "runner-1", "accepting", 1, receipt.lease.id)
    if broken in AUTHORITY_MUTATIONS:
        profile = AUTHORITY_MUTATIONS[broken](profile)
    elif broken == "runner-draining":
        drain(lifecycle)
    elif broken == "lease-settled":
        lifecycle.settle_lease(lease_id=receipt.lease.id, lease_generation=1, result_digest=RESULT)
    else:
        world.clock.advance(60_000)
    with refused(world, StaleFenceError, f"execution location runner lease authority is stale (lease_id "
                 f"{profile.lease.id}): ") as caught:
        assert_lease_authority(profile, "local", now=now)
    one_cause(caught, AUTHORITY_CAUSES, broken)


@pytest.mark.parametrize("drift", ["target", "base-dir"])
def test_assert_lease_authority_refuses_identity_drift(world: World, drift: str) -> None:
    lifecycle = world.started()
    profile = lifecycle_profile_from_lease(acquire(world, lifecycle))
    target = "local"
    if drift == "target":
        target = "ssh"
    else:
        profile = msgspec.structs.replace(
            profile, base_dir=msgspec.structs.replace(profile.base_dir, path=str(world.tmp / "elsewhere")))
    with refused(world, LifecycleError, "runner lifecycle identity drifted") as info:
        assert_lease_authority(profile, target, now=world.clock)
    assert not isinstance(info.value, StaleFenceError | AuthorityError | InvalidInputError)


def test_assert_lease_authority_accepts_the_profile_as_a_mapping(world: World) -> None:
    lifecycle = world.started()
    profile = lifecycle_profile_from_lease(acquire(world, lifecycle))
    as_mapping = msgspec.to_builtins(profile)
    assert assert_lease_authority(as_mapping, "local", now=world.clock).lease_id == profile.lease.id


# --- initialize and identity ----------------------------------------------------------------------------


def test_initialize_twice_appends_nothing(world: World) -> None:
    lifecycle = world.runner()
    first = lifecycle.initialize()
    before = world.store.head()
    assert (first.state, first.generation, first.policy_revision, first.proxy_authority.id) == (
        "accepting", 1, 1, "unbound")
    assert lifecycle.initialize() == first
    assert world.runner().initialize() == first  # another handle on the same runner too
    assert world.store.head() == before


@pytest.mark.parametrize("drift", ["target", "base-dir"])
def test_initialize_refuses_identity_drift(world: World, drift: str) -> None:
    world.started()
    other_dir = world.tmp / "other"
    other_dir.mkdir()
    changed = {"target": "ssh"} if drift == "target" else {"base_dir": str(other_dir)}
    # The one value that differs, recorded and given, and the way on.
    words = ("runner runner-1 was initialized with target local, not ssh (use the recorded target" if drift == "target"
             else f"runner runner-1 was initialized with base_dir {str(world.base_dir)!r}, not {str(other_dir)!r}")
    with refused(world, LifecycleError, "runner lifecycle identity drifted: ", words) as info:
        world.runner(**changed).initialize()
    assert not isinstance(info.value, StaleFenceError | AuthorityError | InvalidInputError)


@pytest.mark.parametrize("drift", ["target", "base-dir"])
def test_every_command_refuses_identity_drift(world: World, drift: str) -> None:
    # The seed validates the stored state against the handle's identity on every read and mutation
    # (`validateState(draft, this)`), not only in initialize.
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    other_dir = world.tmp / "other"
    other_dir.mkdir()
    drifted = world.runner(**({"target": "ssh"} if drift == "target" else {"base_dir": str(other_dir)}))
    commands: list[Callable[[], object]] = [
        drifted.snapshot,
        lambda: drifted.acquire_lease(session_id="session-2", expected_generation=1, proxy_authority=world.proxy()),
        lambda: drifted.assert_poll(lease_id=lease.id, lease_generation=1, proxy_authority_id="proxy-1",
                                    proxy_authority_revision=1),
        lambda: drifted.refresh_lease_authority(lease_id=lease.id, lease_generation=1, expected_generation=1,
                                                proxy_authority=world.proxy()),
        lambda: drifted.rotate_proxy_authority(expected_generation=1, proxy_authority=world.proxy(2)),
        lambda: drifted.request_drain(expected_generation=1),
        lambda: drifted.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT),
        lambda: drifted.park_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT, reason="lost-poll"),
        lambda: drifted.park_expired_drain(expected_generation=1),
        lambda: drifted.begin_reclaim(expected_generation=1, proxy_authority=world.proxy(2)),
        lambda: drifted.complete_reclaim(expected_generation=1),
        lambda: drifted.authorize_post_session_hook(expected_runner_generation=1, lease_id=lease.id,
                                                    lease_generation=1, result_digest=RESULT, hook_digest=HOOK),
    ]
    for command in commands:
        with refused(world, LifecycleError, "runner lifecycle identity drifted") as info:
            command()
        assert not isinstance(info.value, StaleFenceError | AuthorityError | InvalidInputError)
    assert lifecycle.snapshot().active_lease_count == 1


def test_initialize_keeps_the_recorded_resources_and_hook(world: World) -> None:
    world.started()
    # The seed's identity is runner id, target and base dir; other settings do not re-initialize.
    again = world.runner(resources=Resources(cpu_seconds=1, memory_bytes=64 * MIB),
                         post_session_hook_digest=OTHER)
    before = world.store.head()
    assert again.initialize().resources == RESOURCES
    assert again.state().post_session_hook_digest == HOOK
    assert world.store.head() == before


def test_commands_need_an_initialized_runner(world: World) -> None:
    lifecycle = world.runner()
    with refused(world, UnknownRunnerError, "runner runner-1 is not initialized (call initialize() first)"):
        lifecycle.snapshot()
    with refused(world, UnknownRunnerError, "runner runner-1 is not initialized (call initialize() first)"):
        lifecycle.request_drain(expected_generation=1)


# --- base directory preflight ---------------------------------------------------------------------------


def _assert_preflight_refuses(world: World, base_dir: Path, *words: str) -> None:
    lifecycle = world.started(base_dir=str(base_dir))
    with refused(world, PreflightError, "execution location base directory", str(base_dir), *words):
        acquire(world, lifecycle)
    assert lifecycle.snapshot().active_lease_count == 0


def test_preflight_refuses_a_symlinked_base_dir(world: World) -> None:
    link = world.tmp / "link"
    link.symlink_to(world.base_dir, target_is_directory=True)
    _assert_preflight_refuses(world, link, "must be a real directory")


def test_preflight_refuses_a_missing_base_dir(world: World) -> None:
    _assert_preflight_refuses(world, world.tmp / "missing", "must be a real directory")


def test_preflight_refuses_a_file_as_base_dir(world: World) -> None:
    path = world.tmp / "file"
    path.write_text("not a directory\n")
    _assert_preflight_refuses(world, path, "must be a real directory")


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody may write in: a read-only tmpfs as root (root ignores mode bits), 0555 otherwise."""
    path = tmp_path / "read-only"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"root without mount rights cannot make a read-only directory: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_preflight_refuses_an_unwritable_base_dir(world: World, read_only_dir: Path) -> None:
    _assert_preflight_refuses(world, read_only_dir, "is not writable")


def test_preflight_refuses_when_an_injected_preflight_raises(world: World) -> None:
    def failing(path: str) -> None:
        raise OSError(30, "Read-only file system", path)

    lifecycle = world.started(preflight_base_dir=failing)
    with refused(world, PreflightError, "execution location base directory preflight failed",
                 str(world.base_dir), "Read-only file system"):
        acquire(world, lifecycle)


def test_preflight_leaves_no_probe_behind(world: World) -> None:
    lifecycle = world.started()
    acquire(world, lifecycle)
    assert list(world.base_dir.iterdir()) == []


def test_refresh_runs_the_preflight_too(world: World) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    world.base_dir.rmdir()
    with refused(world, PreflightError, "must be a real directory"):
        lifecycle.refresh_lease_authority(lease_id=lease.id, lease_generation=1, expected_generation=1,
                                          proxy_authority=world.proxy())


# --- retention: DESIGN.md's three improvements on the seed ----------------------------------------------


@pytest.fixture
def fast_world(tmp_path: Path, store_target: str) -> Iterator[World]:
    """A world for a thousand commands: no fsync per commit, no probe file per lease (not what is tested)."""
    clock = FakeClock(T0)
    with EventStore.open(store_target, now=clock, durability="normal") as store:
        yield World(store, clock, tmp_path, tmp_path, store_target)


def _bulk_acquire(world: World, lifecycle: RunnerLifecycle, sessions: range) -> list[str]:
    generation = lifecycle.snapshot().generation
    proxy = world.proxy()
    return [lifecycle.acquire_lease(session_id=f"session-{n}", expected_generation=generation,
                                    proxy_authority=proxy).lease.id for n in sessions]


def test_retention_never_evicts_an_active_lease(fast_world: World) -> None:
    world = fast_world
    lifecycle = world.started(preflight_base_dir=lambda path: None)
    oldest_active = _bulk_acquire(world, lifecycle, range(1))[0]
    first_settled, second_settled = _bulk_acquire(world, lifecycle, range(1, 3))
    for lease_id in (first_settled, second_settled):
        lifecycle.settle_lease(lease_id=lease_id, lease_generation=1, result_digest=RESULT)
    _bulk_acquire(world, lifecycle, range(3, 1024))
    full = lifecycle.snapshot()
    assert (full.active_lease_count, full.settled_lease_count) == (1022, 2)
    # At capacity the oldest lease that is no longer active goes, never the older active one.
    _bulk_acquire(world, lifecycle, range(1024, 1025))
    state = lifecycle.state()
    assert (len(state.leases), state.lease(first_settled), state.leases[0].id) == (1024, None, oldest_active)
    assert state.lease(second_settled) is not None
    _bulk_acquire(world, lifecycle, range(1025, 1026))
    assert lifecycle.snapshot().active_lease_count == 1024
    with refused(world, RunnerCapacityError, "1024 active leases"):
        _bulk_acquire(world, lifecycle, range(1026, 1027))
    assert lifecycle.state().leases[0].id == oldest_active


def test_retention_keeps_256_leases_after_reclaim_while_the_log_keeps_all(fast_world: World) -> None:
    world = fast_world
    lifecycle = world.started(preflight_base_dir=lambda path: None)
    lease_ids = _bulk_acquire(world, lifecycle, range(300))
    for lease_id in lease_ids[:-1]:
        lifecycle.settle_lease(lease_id=lease_id, lease_generation=1, result_digest=RESULT)
    lifecycle.park_lease(lease_id=lease_ids[-1], lease_generation=1, result_digest=RESULT, reason="lost-poll")
    reclaim(world, lifecycle)
    assert len(lifecycle.state().leases) == 300  # reclaiming alone trims nothing
    snapshot = lifecycle.complete_reclaim(expected_generation=lifecycle.snapshot().generation)
    assert (snapshot.settled_lease_count, snapshot.parked_lease_count) == (255, 1)
    assert [lease.id for lease in lifecycle.state().leases] == lease_ids[-256:]
    logged = [recorded.event for recorded in world.store.read(stream="runner-1") if recorded.type == "LeaseAcquired"]
    assert [event.lease_id for event in logged] == lease_ids  # type: ignore[attr-defined]
    # A lease the projection no longer retains is unknown to the fences, as in the seed.
    with refused(world, StaleFenceError, "execution location result lease fence is stale", lease_ids[0]):
        lifecycle.settle_lease(lease_id=lease_ids[0], lease_generation=1, result_digest=RESULT)


def test_drain_with_no_active_lease_parks_at_once(world: World) -> None:
    lifecycle = world.started()
    lease = acquire(world, lifecycle).lease
    lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT)
    before = world.store.head().seq
    snapshot = lifecycle.request_drain(expected_generation=1, timeout_ms=60_000)
    assert (snapshot.state, snapshot.generation, snapshot.drain) == ("parked", 3, None)
    assert world.types_after(before) == ["DrainRequested", "RunnerParked"]
    parked = [recorded.event for recorded in world.store.read(after=before)][-1]
    assert (parked.cause, parked.generation) == ("drain-idle", 3)  # type: ignore[attr-defined]


# --- error kinds and many runners ----------------------------------------------------------------------


def test_error_kinds_follow_the_design(world: World) -> None:
    assert issubclass(InvalidInputError, LifecycleError) and issubclass(InvalidInputError, ValueError)
    for kind in (StaleFenceError, AuthorityError, PreflightError, RunnerCapacityError, UnknownRunnerError):
        assert issubclass(kind, LifecycleError)
        assert not issubclass(kind, ValueError)


def test_runners_sharing_a_store_stay_independent(world: World) -> None:
    a = world.started("runner-a")
    b = world.started("runner-b", target="container")
    lease_a = acquire(world, a).lease
    lease_b = acquire(world, b, proxy_authority=world.proxy(5, id="proxy-b")).lease
    drain(a)
    b.rotate_proxy_authority(expected_generation=1, proxy_authority=world.proxy(6, id="proxy-b"))
    acquire(world, b, session="session-2", proxy_authority=world.proxy(6, id="proxy-b"))
    # Lease ids come from each handle's own random_id, so both runners hold a lease-0001.
    assert lease_a.id == lease_b.id == "lease-0001"
    a.settle_lease(lease_id=lease_a.id, lease_generation=1, result_digest=RESULT)
    snap_a, snap_b = a.snapshot(), b.snapshot()
    assert (snap_a.state, snap_a.generation, snap_a.proxy_authority.id, snap_a.settled_lease_count) == (
        "parked", 3, "proxy-1", 1)
    assert (snap_b.state, snap_b.generation, snap_b.proxy_authority.id, snap_b.active_lease_count) == (
        "accepting", 2, "proxy-b", 2)
    # A's fences know nothing of B's generation, and B's lease is still active after A settled its own.
    with refused(world, StaleFenceError, "execution location reclaim completion is stale"):
        a.complete_reclaim(expected_generation=2)
    assert b.assert_poll(lease_id=lease_b.id, lease_generation=1, proxy_authority_id="proxy-b",
                         proxy_authority_revision=6).state == "accepting"
    # A fresh handle on each stream rebuilds the same state from the shared file.
    assert world.runner("runner-a").snapshot() == snap_a
    assert world.runner("runner-b", target="container").snapshot() == snap_b
    assert world.store.streams() == ["runner-a", "runner-b"]


@pytest.mark.parametrize(("issued_s", "expires_s", "words"), [
    (42, 600, ["issued 42 s ahead of now (2026-01-01T00:00:00.000Z)", "at most 30 s ahead", "misses by 12 s"]),
    (-361, 600, ["issued 6 min 1 s before now", "at most 5 min old", "misses by 1 min 1 s"]),
    (-10, -3, ["expired at 2025-12-31T23:59:57.000Z, 3 s before now (2026-01-01T00:00:00.000Z)"]),
])
def test_a_stale_authority_says_now_the_bound_and_the_miss(issued_s: int, expires_s: int, words: list[str]) -> None:
    from lifecycle_es import AuthorityError
    from lifecycle_es.canonical import iso_ms
    from lifecycle_es.fences import check_fresh
    from lifecycle_es.testing import START_MS

    proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(START_MS + issued_s * 1000),
                           expires_at=iso_ms(START_MS + expires_s * 1000))
    with pytest.raises(AuthorityError) as caught:
        check_fresh(proxy, START_MS)
    for word in words:
        assert word in str(caught.value)
