"""`RunnerLifecycle`: a runner's lifecycle, with every transition an event in the log.

    lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir="/srv/runner",
                                resources=Resources(cpu_seconds=600, memory_bytes=2 << 30),
                                post_session_hook_digest="sha256:" + "0" * 64)
    lifecycle.initialize()
    receipt = lifecycle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=proxy)

A command validates its input (InvalidInputError, nothing appended), runs the base directory
preflight before a lease is granted or refreshed, then decides in the handle's transaction
(``handle.py``): under the store's write lock, against the runner's state caught up with the log,
through the rules in ``runner.py`` and the fences in ``fences.py``, each refusal naming its one cause.
The state stays in memory between commands, so a command costs the same however long the log is.
Read-only commands (`snapshot`, `state`, `assert_poll`, `refresh_lease_authority`) append nothing.
"""

from __future__ import annotations

from typing import Any

from .canonical import iso_ms, parse_iso_ms, receipt_digest
from .errors import InvalidInputError
from .events import (
    RUNNER_SCHEMA,
    UNIT_EVENTS,
    DrainExpired,
    DrainRequested,
    Event,
    HookAuthorized,
    LeaseAcquired,
    LeaseParked,
    LeaseSettled,
    ProxyRotated,
    ReclaimBegun,
    ReclaimCompleted,
    RunnerInitialized,
)
from .fences import check_drain_park, check_fresh, check_poll, check_refresh
from .handle import UnknownRunnerError
from .host_lease import HostLeaseCommands
from .log import RecordedEvent
from .receipts import (
    DrainParkSnapshot,
    HookReceipt,
    LeaseParkSnapshot,
    LeaseReceipt,
    PollResult,
    RunnerSnapshot,
    lease_receipt,
    project,
)
from .replay import Folded
from .runner import (
    HOOK_DOMAIN,
    MAX_DRAIN_MS,
    MAX_TTL_MS,
    MIN_DRAIN_MS,
    MIN_TTL_MS,
    PARK_REASONS,
    apply,
    hook_receipt_material,
)
from .state import RunnerState
from .store import WriteTransaction
from .values import ProxyAuthority, safe_choice, safe_digest, safe_id, safe_int, shown

DEFAULT_TTL_MS = 10 * 60 * 1000
DEFAULT_DRAIN_MS = 30_000

__all__ = ["DEFAULT_DRAIN_MS", "DEFAULT_TTL_MS", "RunnerLifecycle", "UnknownRunnerError"]


def _generation(value: object, field: str) -> int:
    return safe_int(value, field, 1)


class RunnerLifecycle(HostLeaseCommands):
    """One runner's lifecycle on an event store (one stream: the runner id).

    A handle is cheap: it validates its arguments at once (InvalidInputError naming the field) and
    reads nothing until its first command. Several handles, in one process or many, may drive the same
    runner: every command decides under the store's write lock against the log as it is then.

    `store`: the `EventStore` the runner's events go to. `runner_id`: the runner's id, also its stream
    (1-256 of ``A-Z a-z 0-9 . _ : @ + -``, starting alphanumeric). `target`: where it runs, one of
    ``local``, ``wsl``, ``ssh``, ``container``. `base_dir`: the absolute directory its sessions work
    under (normalized; up to 4096 characters); it is checked by a preflight (a real directory, not a
    link, a probe file created, written, fsynced and removed) before every lease is granted or
    refreshed, not when the handle is made. `resources`: `Resources` (or a mapping with exactly
    ``cpu_seconds`` 1..86400 and ``memory_bytes`` 64 MiB..64 GiB), the limits every unit of the runner
    runs under. `post_session_hook_digest`: ``sha256:<64 hex>`` of the post-session hook program's file,
    the one hook `authorize_post_session_hook` may authorize. `target`, `base_dir`, `resources` and the
    hook digest are recorded by `initialize`; a later handle naming another target or base dir for the
    same runner is refused ("identity drifted"), and the recorded resources and hook digest are the
    ones that apply. `now`: a zero-argument callable returning epoch milliseconds (default: the system
    clock); an event is never stamped before the log's head, whatever it says. `random_id`: a
    zero-argument callable returning the random part of a new lease id (default: a UUID's hex).
    `preflight_base_dir`: replaces the base directory preflight (tests; a host that checks otherwise).
    `snapshot_every`: take a snapshot of the runner's state every this many of its events (>= 1); by default every
    64, or every 128, 256, ... while the runner retains more than four times as many leases (``snapshot_interval``).

    A host driver writes under the runner's host lease (`take_host_lease`, ``host_lease.py``): every
    command of a handle that holds one is refused (HostFencedError) once the lease is another's or
    has expired, and its events carry the lease's token.
    """

    def initialize(self) -> RunnerSnapshot:
        """Create the runner (accepting, generation 1) or, when it exists, check its identity.

        Appends nothing when the runner exists; a different target or base dir for the same id is a
        LifecycleError ("identity drifted").
        """
        def work(tx: WriteTransaction) -> Folded:
            current = self._catch_up(tx)
            if current.state is None:
                at = iso_ms(self._stamp(tx, None))
                event = RunnerInitialized(schema=RUNNER_SCHEMA, runner_id=self.runner_id, target=self.target,
                                          base_dir=self.base_dir, resources=self.resources,
                                          post_session_hook_digest=self.post_session_hook_digest)
                state = apply(None, event, parse_iso_ms(at), at)
                recorded = tx.append_unchecked(self.runner_id, [event], expected_version=0, at=at)  # applied just above
                current = Folded(state, recorded[-1].version, recorded[-1].seq)
            return current

        current = self.store.commit("initialize", work)
        self._keep(current)
        made = current.state
        assert made is not None
        self._check_identity(made)
        return project(made)

    def snapshot(self) -> RunnerSnapshot:
        """The runner's current snapshot (counts, not leases), caught up with the log."""
        return project(self._state())

    def state(self) -> RunnerState:
        """The runner's whole current state (leases included), caught up with the log."""
        return self._state()

    def acquire_lease(self, *, session_id: str, expected_generation: int, ttl_ms: int = DEFAULT_TTL_MS,
                      proxy_authority: ProxyAuthority | dict[str, Any]) -> LeaseReceipt:
        """Grant a lease to a session at the runner's current generation, under a fresh proxy authority.

        Fences: the runner accepting at `expected_generation` (StaleFenceError), no active lease for
        the session (StaleFenceError), the proxy authority fresh (AuthorityError), the same proxy id
        as the runner's and no revision rollback (AuthorityError). The base directory preflight runs
        first (PreflightError).
        """
        session_id = safe_id(session_id, "session_id")
        expected_generation = _generation(expected_generation, "expected_generation")
        proxy = ProxyAuthority.coerce(proxy_authority)
        # The proxy authority, freshness included, is checked before the ttl and every fence: a stale
        # authority is an AuthorityError even when the generation is stale too.
        check_fresh(proxy, self._clock())
        ttl_ms = safe_int(ttl_ms, "ttl_ms", MIN_TTL_MS, MAX_TTL_MS)
        lease_id = self._lease_id()
        self._preflight_base_dir()

        def decide(state: RunnerState, now_ms: int, at: str) -> list[Event]:
            return [LeaseAcquired(lease_id=lease_id, session_id=session_id, lease_generation=expected_generation,
                                  issued_at=at, expires_at=iso_ms(now_ms + ttl_ms), proxy_authority=proxy)]

        state, _ = self._commit("acquire_lease", decide)
        lease = state.lease(lease_id)
        assert lease is not None
        return lease_receipt(state=state, authority_file=self.store.path, runner_generation=expected_generation,
                             lease=lease, proxy=proxy)

    def assert_poll(self, *, lease_id: str, lease_generation: int, proxy_authority_id: str,
                    proxy_authority_revision: int) -> PollResult:
        """Check that a lease may still poll: active, unexpired, same proxy, runner not parked/reclaiming."""
        lease_id = safe_id(lease_id, "lease_id")
        lease_generation = _generation(lease_generation, "lease_generation")
        proxy_authority_id = safe_id(proxy_authority_id, "proxy_authority_id")
        proxy_authority_revision = safe_int(proxy_authority_revision, "proxy_authority_revision")
        state = self._state()
        now_ms = self._clock()
        lease = check_poll(state, lease_id=lease_id, lease_generation=lease_generation,
                           proxy_authority_id=proxy_authority_id, proxy_authority_revision=proxy_authority_revision,
                           now_ms=now_ms)
        return PollResult(runner_id=state.runner_id, runner_generation=state.generation, lease_id=lease.id,
                          lease_generation=lease.generation, state=state.state, proxy_authority=state.proxy_authority)

    def rotate_proxy_authority(self, *, expected_generation: int,
                               proxy_authority: ProxyAuthority | dict[str, Any]) -> RunnerSnapshot:
        """Move to a newer proxy revision (at least current + 1); generation and policy revision +1."""
        expected_generation = _generation(expected_generation, "expected_generation")
        proxy = ProxyAuthority.coerce(proxy_authority)

        def decide(state: RunnerState, now_ms: int, at: str) -> list[Event]:
            return [ProxyRotated(proxy_authority=proxy, generation=expected_generation + 1,
                                 policy_revision=state.policy_revision + 1)]

        return project(self._commit("rotate_proxy_authority", decide)[0])

    def refresh_lease_authority(self, *, lease_id: str, lease_generation: int, expected_generation: int,
                                proxy_authority: ProxyAuthority | dict[str, Any]) -> LeaseReceipt:
        """Re-issue an active lease's receipt under the current proxy authority; appends nothing."""
        lease_id = safe_id(lease_id, "lease_id")
        lease_generation = _generation(lease_generation, "lease_generation")
        expected_generation = _generation(expected_generation, "expected_generation")
        proxy = ProxyAuthority.coerce(proxy_authority)
        state = self._state()
        now_ms = self._clock()
        lease = check_refresh(state, lease_id=lease_id, lease_generation=lease_generation,
                              expected_generation=expected_generation, proxy=proxy, now_ms=now_ms)
        self._preflight_base_dir()
        return lease_receipt(state=state, authority_file=self.store.path, runner_generation=state.generation,
                             lease=lease, proxy=proxy)

    def request_drain(self, *, expected_generation: int, timeout_ms: int = DEFAULT_DRAIN_MS,
                      signal: str = "SIGTERM") -> RunnerSnapshot:
        """Stop accepting and ask units to finish by a deadline; generation +1.

        With no active lease the runner parks at once (a drain has nothing to wait for then).
        """
        if signal != "SIGTERM":
            raise InvalidInputError("signal", f"runner drain requires SIGTERM, got {shown(signal)}")
        expected_generation = _generation(expected_generation, "expected_generation")
        timeout_ms = safe_int(timeout_ms, "timeout_ms", MIN_DRAIN_MS, MAX_DRAIN_MS)

        def decide(state: RunnerState, now_ms: int, at: str) -> list[Event]:
            return [DrainRequested(signal=signal, requested_at=at, deadline_at=iso_ms(now_ms + timeout_ms),
                                   generation=expected_generation + 1)]

        return project(self._commit("request_drain", decide)[0])

    def settle_lease(self, *, lease_id: str, lease_generation: int, result_digest: str) -> RunnerSnapshot:
        """End an active lease with a result; the last one settled during a drain parks the runner."""
        result_digest = safe_digest(result_digest, "result_digest")
        lease_id = safe_id(lease_id, "lease_id")
        lease_generation = _generation(lease_generation, "lease_generation")

        def decide(state: RunnerState, now_ms: int, at: str) -> list[Event]:
            return [LeaseSettled(lease_id=lease_id, lease_generation=lease_generation, result_digest=result_digest)]

        return project(self._commit("settle_lease", decide)[0])

    def park_lease(self, *, lease_id: str, lease_generation: int, result_digest: str,
                   reason: str) -> LeaseParkSnapshot:
        """End an active lease without finishing (checkout-failure, lost-poll, resource-limit)."""
        result_digest = safe_digest(result_digest, "result_digest")
        safe_choice(reason, "reason", PARK_REASONS, "execution location park reason")
        lease_id = safe_id(lease_id, "lease_id")
        lease_generation = _generation(lease_generation, "lease_generation")

        def decide(state: RunnerState, now_ms: int, at: str) -> list[Event]:
            return [LeaseParked(lease_id=lease_id, lease_generation=lease_generation, result_digest=result_digest,
                                reason=reason)]

        snapshot = project(self._commit("park_lease", decide)[0])
        return LeaseParkSnapshot(**_fields(snapshot), park_reason=reason)

    def park_expired_drain(self, *, expected_generation: int) -> DrainParkSnapshot:
        """Past the drain deadline: park every lease still active, then the runner; generation +1."""
        expected_generation = _generation(expected_generation, "expected_generation")
        parked: list[int] = []

        def decide(state: RunnerState, now_ms: int, at: str) -> list[Event]:
            check_drain_park(state, expected_generation)
            assert state.drain is not None
            active = tuple(lease.id for lease in state.leases if lease.status == "active")
            parked.append(len(active))
            return [DrainExpired(lease_ids=active, deadline_at=state.drain.deadline_at)]

        snapshot = project(self._commit("park_expired_drain", decide)[0])
        return DrainParkSnapshot(**_fields(snapshot), newly_parked_lease_count=parked[-1])

    def begin_reclaim(self, *, expected_generation: int,
                      proxy_authority: ProxyAuthority | dict[str, Any]) -> RunnerSnapshot:
        """Start reclaiming a parked runner under a newer proxy revision; generation +1."""
        expected_generation = _generation(expected_generation, "expected_generation")
        proxy = ProxyAuthority.coerce(proxy_authority)

        def decide(state: RunnerState, now_ms: int, at: str) -> list[Event]:
            return [ReclaimBegun(proxy_authority=proxy, generation=expected_generation + 1)]

        return project(self._commit("begin_reclaim", decide)[0])

    def complete_reclaim(self, *, expected_generation: int) -> RunnerSnapshot:
        """Finish a reclaim: accepting again, generation +1, the state keeping its last 256 leases."""
        expected_generation = _generation(expected_generation, "expected_generation")

        def decide(state: RunnerState, now_ms: int, at: str) -> list[Event]:
            return [ReclaimCompleted(generation=expected_generation + 1)]

        return project(self._commit("complete_reclaim", decide)[0])

    def record_host_facts(self, events: list[Event]) -> list[RecordedEvent]:
        """For host drivers: append the unit facts of this runner's units (``UnitStarting`` ... ``UnitWakeRecorded``).

        Decided like any command, under the write lock against the current state, all in one
        transaction, through the rules of ``lifecycle_es.units``: the lease is one the runner holds; a
        start needs it active at the generation named, and ``UnitStarted`` the ``UnitStarting`` it
        follows (same mode and run directory); the run directory is absolute, normalized and the
        lease's; pid, start ticks, unit name, exit code, signal, outcome and reason lie within what a
        host writes. A refused fact raises InvalidInputError naming its field (or StaleFenceError) and
        nothing is appended. Only a host driver has these facts to tell: anyone else recording them
        would make the host act on units it never started.
        """
        facts = _unit_facts(events)
        return self._commit("record_host_facts", lambda state, now_ms, at: list(facts))[1]

    def authorize_post_session_hook(self, *, expected_runner_generation: int, lease_id: str, lease_generation: int,
                                    result_digest: str, hook_digest: str) -> HookReceipt:
        """Authorize the post-session hook of an ended lease; its receipt digest is recorded on the lease."""
        result_digest = safe_digest(result_digest, "result_digest")
        hook_digest = safe_digest(hook_digest, "hook_digest")
        expected_runner_generation = _generation(expected_runner_generation, "expected_runner_generation")
        lease_id = safe_id(lease_id, "lease_id")
        lease_generation = _generation(lease_generation, "lease_generation")
        material = hook_receipt_material(runner_id=self.runner_id, runner_generation=expected_runner_generation,
                                         lease_id=lease_id, lease_generation=lease_generation,
                                         result_digest=result_digest, hook_digest=hook_digest)
        digest = receipt_digest(HOOK_DOMAIN, material)

        def decide(state: RunnerState, now_ms: int, at: str) -> list[Event]:
            return [HookAuthorized(lease_id=lease_id, lease_generation=lease_generation,
                                   runner_generation=expected_runner_generation, result_digest=result_digest,
                                   hook_digest=hook_digest, receipt_digest=digest)]

        self._commit("authorize_post_session_hook", decide)
        return HookReceipt(runner_id=self.runner_id, runner_generation=expected_runner_generation,
                           lease_id=lease_id, lease_generation=lease_generation, result_digest=result_digest,
                           hook_digest=hook_digest, receipt_digest=digest)


def _fields(snapshot: RunnerSnapshot) -> dict[str, Any]:
    return {name: getattr(snapshot, name) for name in snapshot.__struct_fields__}


def _unit_facts(events: object) -> list[Event]:
    if isinstance(events, Event) or not isinstance(events, list | tuple) or not events:
        raise InvalidInputError("events", "events must be a non-empty list of unit events")
    for event in events:
        if type(event) not in UNIT_EVENTS:
            raise InvalidInputError("events", f"only unit events are recorded by hosts, not {type(event).__name__}")
    return list(events)
