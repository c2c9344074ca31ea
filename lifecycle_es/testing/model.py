"""`ReferenceRunner`: the original's commands, each running the original's checks in the original's order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ..canonical import iso_ms, parse_iso_ms, receipt_digest
from ..errors import AuthorityError, InvalidInputError, StaleFenceError
from ..events import (
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
from ..receipts import DrainParkSnapshot, HookReceipt, LeaseParkSnapshot, LeaseReceipt, PollResult, RunnerSnapshot
from ..state import ProxyRef
from ..values import ProxyAuthority, Resources
from .bounds import (
    DRAIN_BOUNDS,
    HOOK_DOMAIN,
    PARK_REASONS,
    SCHEMA,
    TTL_BOUNDS,
    _digest,
    _fresh,
    _id,
    _integer,
    _min_revision,
    _proxy,
)
from .model_state import _ModelState, _proxy_struct

COMMANDS = (
    "initialize", "acquire_lease", "assert_poll", "rotate_proxy_authority", "refresh_lease_authority",
    "request_drain", "settle_lease", "park_lease", "park_expired_drain", "begin_reclaim", "complete_reclaim",
    "authorize_post_session_hook",
)
"""Every command `ReferenceRunner` and `RunnerLifecycle` share, by name."""


class ReferenceRunner(_ModelState):
    """An independent in-memory model of the original's runner lifecycle, and a generator of valid event logs.

    The state is a dict shaped like the original's JSON file (camelCase keys). Each command runs the original's
    checks in the original's order, raises the error kind `RunnerLifecycle` raises, returns what it returns,
    and sets `last_events` to the events it should append (`log` holds every ``(at_ms, event)`` so far).
    DESIGN.md's improvements on the original hold: retention evicts the oldest lease that is no longer
    active and never an active one (a full table of active leases refuses with RunnerCapacityError),
    and a drain with no active lease parks the runner at once.

    As in the original, a lease receipt names this handle's resources and hook digest (the original checks
    only runner id, target and base dir against the recorded ones); the library's name the recorded
    ones. They agree whenever the handles are built alike, as they should be.
    """

    def handle(self, **identity: Any) -> ReferenceRunner:
        """Another handle on the same runner state (as a second process opening the same file)."""
        settings = {"runner_id": self.runner_id, "target": self.target, "base_dir": self.base_dir,
                    "resources": {"cpu_seconds": self.resources["cpuSeconds"],
                                  "memory_bytes": self.resources["memoryBytes"]},
                    "post_session_hook_digest": self.post_session_hook_digest, "now": self._now,
                    "random_id": self._random_id, "authority_file": self.authority_file,
                    "max_retained_leases": self.max_retained_leases,
                    "retained_after_reclaim": self.retained_after_reclaim}
        other = ReferenceRunner(**{**settings, **identity})
        other._shared = self._shared
        return other

    # --- commands (the original's methods, in its order of checks) ---------------------------------------

    def initialize(self) -> RunnerSnapshot:
        """Create the runner, or check the identity of the one that exists (LifecycleError if it drifted)."""
        self.last_events = []
        now_ms = self._now()
        if self._shared.doc is None:
            draft = {
                "schema": SCHEMA, "runnerId": self.runner_id, "target": self.target, "state": "accepting",
                "generation": 1, "policyRevision": 1, "baseDir": self.base_dir, "resources": dict(self.resources),
                "proxyAuthority": {"id": "unbound", "revision": 0},
                "postSessionHookDigest": self.post_session_hook_digest, "drain": None, "leases": [],
            }
            self._commit(draft, now_ms, [RunnerInitialized(
                schema=SCHEMA, runner_id=self.runner_id, target=self.target, base_dir=self.base_dir,
                resources=Resources(cpu_seconds=self.resources["cpuSeconds"],
                                    memory_bytes=self.resources["memoryBytes"]),
                post_session_hook_digest=self.post_session_hook_digest)])
        return self._project(self._draft())

    def acquire_lease(self, *, session_id: str, expected_generation: int, ttl_ms: int = 10 * 60 * 1000,
                      proxy_authority: ProxyAuthority | Mapping[str, Any]) -> LeaseReceipt:
        """Grant a lease at the current generation under a fresh proxy authority."""
        self.last_events = []
        now_ms = self._now()
        session = _id(session_id, "session_id")
        expected = _integer(expected_generation, "expected_generation", 1)
        proxy = _proxy(proxy_authority)
        _fresh(proxy, now_ms)
        ttl = _integer(ttl_ms, "ttl_ms", *TTL_BOUNDS)
        # The original draws the id before checking ttl; the library after. Either way one id per attempt
        # that gets this far, and the model draws where the library does so their ids stay in step.
        lease_id = _id(f"lease-{self._random_id()}", "random_id")
        draft = self._draft()
        if draft["state"] != "accepting" or draft["generation"] != expected:
            raise StaleFenceError("execution location runner is not accepting this generation")
        if any(lease["sessionId"] == session and lease["status"] == "active" for lease in draft["leases"]):
            raise StaleFenceError("execution location session already has an active lease")
        if draft["proxyAuthority"]["id"] not in ("unbound", proxy["id"]):
            raise AuthorityError("execution location proxy authority identity drifted")
        if proxy["revision"] < draft["proxyAuthority"]["revision"]:
            raise AuthorityError("execution location proxy authority revision rolled back")
        if self._find(draft, lease_id) is not None:
            # Not in the original (its ids are random UUIDs); the library refuses a reused id as stale.
            raise StaleFenceError("execution location lease id is already taken")
        lease = {"id": lease_id, "sessionId": session, "generation": draft["generation"], "issuedAt": iso_ms(now_ms),
                 "expiresAt": iso_ms(now_ms + ttl), "status": "active", "resultDigest": None,
                 "hookReceiptDigest": None}
        draft["proxyAuthority"] = {"id": proxy["id"], "revision": proxy["revision"]}
        draft["leases"] = [*self._retain(draft["leases"], self.max_retained_leases - 1), lease]
        self._commit(draft, now_ms, [LeaseAcquired(
            lease_id=lease_id, session_id=session, lease_generation=expected, issued_at=lease["issuedAt"],
            expires_at=lease["expiresAt"], proxy_authority=_proxy_struct(proxy))])
        return self._lease_receipt(draft, expected, lease, proxy)

    def assert_poll(self, *, lease_id: str, lease_generation: int, proxy_authority_id: str,
                    proxy_authority_revision: int) -> PollResult:
        """Check that a lease may still poll; appends nothing."""
        self.last_events = []
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        proxy_authority_id = _id(proxy_authority_id, "proxy_authority_id")
        proxy_authority_revision = _integer(proxy_authority_revision, "proxy_authority_revision")
        doc = self._draft()
        lease = self._find(doc, lease_id)
        if (lease is None or lease["status"] != "active" or lease["generation"] != lease_generation
                or parse_iso_ms(lease["expiresAt"]) <= self._now()
                or doc["proxyAuthority"]["id"] != proxy_authority_id
                or doc["proxyAuthority"]["revision"] != proxy_authority_revision
                or doc["state"] in ("parked", "reclaiming")):
            raise StaleFenceError("execution location poll lease is stale or parked")
        return PollResult(runner_id=doc["runnerId"], runner_generation=doc["generation"], lease_id=lease["id"],
                          lease_generation=lease["generation"], state=doc["state"],
                          proxy_authority=ProxyRef(**doc["proxyAuthority"]))

    def rotate_proxy_authority(self, *, expected_generation: int,
                               proxy_authority: ProxyAuthority | Mapping[str, Any]) -> RunnerSnapshot:
        """Move to a newer proxy revision (at least current + 1); generation and policy revision +1."""
        self.last_events = []
        expected = _integer(expected_generation, "expected_generation", 1)
        proxy = _proxy(proxy_authority)
        now_ms = self._now()
        draft = self._draft()
        _min_revision(proxy, draft["proxyAuthority"]["revision"] + 1)
        _fresh(proxy, now_ms)
        if (draft["state"] not in ("accepting", "draining") or draft["generation"] != expected
                or proxy["id"] != draft["proxyAuthority"]["id"]):
            raise StaleFenceError("execution location proxy rotation fence is stale")
        draft["generation"] += 1
        draft["policyRevision"] += 1
        draft["proxyAuthority"] = {"id": proxy["id"], "revision": proxy["revision"]}
        self._commit(draft, now_ms, [ProxyRotated(proxy_authority=_proxy_struct(proxy),
                                                  generation=draft["generation"],
                                                  policy_revision=draft["policyRevision"])])
        return self._project(draft)

    def refresh_lease_authority(self, *, lease_id: str, lease_generation: int, expected_generation: int,
                                proxy_authority: ProxyAuthority | Mapping[str, Any]) -> LeaseReceipt:
        """Re-issue an active lease's receipt under the current proxy authority; appends nothing."""
        self.last_events = []
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        expected = _integer(expected_generation, "expected_generation", 1)
        proxy = _proxy(proxy_authority)
        doc = self._draft()
        now_ms = self._now()
        _min_revision(proxy, doc["proxyAuthority"]["revision"])
        _fresh(proxy, now_ms)
        lease = self._find(doc, lease_id)
        if (doc["state"] != "accepting" or doc["generation"] != expected
                or doc["proxyAuthority"]["id"] != proxy["id"] or doc["proxyAuthority"]["revision"] != proxy["revision"]
                or lease is None or lease["status"] != "active" or lease["generation"] != lease_generation
                or parse_iso_ms(lease["expiresAt"]) <= now_ms):
            raise StaleFenceError("execution location lease refresh fence is stale")
        return self._lease_receipt(doc, doc["generation"], lease, proxy)

    def request_drain(self, *, expected_generation: int, timeout_ms: int = 30_000,
                      signal: str = "SIGTERM") -> RunnerSnapshot:
        """Stop accepting, generation +1; with no active lease the runner parks at once (generation +1)."""
        self.last_events = []
        if signal != "SIGTERM":
            raise InvalidInputError("signal", "runner drain requires SIGTERM")
        expected = _integer(expected_generation, "expected_generation", 1)
        timeout = _integer(timeout_ms, "timeout_ms", *DRAIN_BOUNDS)
        now_ms = self._now()
        draft = self._draft()
        if draft["state"] != "accepting" or draft["generation"] != expected:
            raise StaleFenceError("execution location drain generation is stale")
        drain = {"signal": signal, "requestedAt": iso_ms(now_ms), "deadlineAt": iso_ms(now_ms + timeout)}
        draft.update(state="draining", generation=draft["generation"] + 1, drain=drain)
        events: list[Event] = [DrainRequested(signal=signal, requested_at=drain["requestedAt"],
                                              deadline_at=drain["deadlineAt"], generation=draft["generation"])]
        if all(lease["status"] != "active" for lease in draft["leases"]):
            self._park(draft, "drain-idle", events)
        self._commit(draft, now_ms, events)
        return self._project(draft)

    def settle_lease(self, *, lease_id: str, lease_generation: int, result_digest: str) -> RunnerSnapshot:
        """End an active lease with a result; the last one settled during a drain parks the runner."""
        self.last_events = []
        result_digest = _digest(result_digest, "result_digest")
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        lease = self._find(draft, lease_id)
        if lease is None or lease["status"] != "active" or lease["generation"] != lease_generation:
            raise StaleFenceError("execution location result lease fence is stale")
        lease.update(status="settled", resultDigest=result_digest)
        events: list[Event] = [LeaseSettled(lease_id=lease_id, lease_generation=lease_generation,
                                            result_digest=result_digest)]
        if draft["state"] == "draining" and all(other["status"] != "active" for other in draft["leases"]):
            self._park(draft, "drain-settled", events)
        self._commit(draft, now_ms, events)
        return self._project(draft)

    def park_lease(self, *, lease_id: str, lease_generation: int, result_digest: str,
                   reason: str) -> LeaseParkSnapshot:
        """End an active lease without finishing; the last active lease parked parks the runner."""
        self.last_events = []
        result_digest = _digest(result_digest, "result_digest")
        if reason not in PARK_REASONS:
            raise InvalidInputError("reason", "execution location park reason is invalid")
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        lease = self._find(draft, lease_id)
        if (draft["state"] not in ("accepting", "draining") or lease is None or lease["status"] != "active"
                or lease["generation"] != lease_generation):
            raise StaleFenceError("execution location park lease fence is stale")
        lease.update(status="parked", resultDigest=result_digest)
        events: list[Event] = [LeaseParked(lease_id=lease_id, lease_generation=lease_generation,
                                           result_digest=result_digest, reason=reason)]
        if all(other["status"] != "active" for other in draft["leases"]):
            self._park(draft, "lease-parked", events)
        self._commit(draft, now_ms, events)
        return LeaseParkSnapshot(**msgspec.structs.asdict(self._project(draft)), park_reason=reason)

    def park_expired_drain(self, *, expected_generation: int) -> DrainParkSnapshot:
        """Past the drain deadline: park every active lease, then the runner; generation +1."""
        self.last_events = []
        expected = _integer(expected_generation, "expected_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        if (draft["state"] != "draining" or draft["generation"] != expected
                or parse_iso_ms(draft["drain"]["deadlineAt"]) > now_ms):
            raise StaleFenceError("execution location drain is not ready to park")
        active = [lease for lease in draft["leases"] if lease["status"] == "active"]
        for lease in active:
            lease["status"] = "parked"
        events: list[Event] = [DrainExpired(lease_ids=tuple(lease["id"] for lease in active),
                                            deadline_at=draft["drain"]["deadlineAt"])]
        self._park(draft, "drain-expired", events)
        self._commit(draft, now_ms, events)
        return DrainParkSnapshot(**msgspec.structs.asdict(self._project(draft)), newly_parked_lease_count=len(active))

    def begin_reclaim(self, *, expected_generation: int,
                      proxy_authority: ProxyAuthority | Mapping[str, Any]) -> RunnerSnapshot:
        """Start reclaiming a parked runner under a newer proxy revision; generation +1."""
        self.last_events = []
        expected = _integer(expected_generation, "expected_generation", 1)
        proxy = _proxy(proxy_authority)
        now_ms = self._now()
        draft = self._draft()
        _min_revision(proxy, draft["proxyAuthority"]["revision"] + 1)
        _fresh(proxy, now_ms)
        if (draft["state"] != "parked" or draft["generation"] != expected
                or proxy["id"] != draft["proxyAuthority"]["id"]):
            raise StaleFenceError("execution location reclaim fence is stale")
        draft.update(state="reclaiming", generation=draft["generation"] + 1,
                     proxyAuthority={"id": proxy["id"], "revision": proxy["revision"]})
        self._commit(draft, now_ms, [ReclaimBegun(proxy_authority=_proxy_struct(proxy),
                                                  generation=draft["generation"])])
        return self._project(draft)

    def complete_reclaim(self, *, expected_generation: int) -> RunnerSnapshot:
        """Accept again, generation +1, keeping the newest 256 leases."""
        self.last_events = []
        expected = _integer(expected_generation, "expected_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        if draft["state"] != "reclaiming" or draft["generation"] != expected:
            raise StaleFenceError("execution location reclaim completion is stale")
        draft.update(state="accepting", generation=draft["generation"] + 1,
                     leases=self._retain(draft["leases"], self.retained_after_reclaim))
        self._commit(draft, now_ms, [ReclaimCompleted(generation=draft["generation"])])
        return self._project(draft)

    def authorize_post_session_hook(self, *, expected_runner_generation: int, lease_id: str, lease_generation: int,
                                    result_digest: str, hook_digest: str) -> HookReceipt:
        """Authorize the post-session hook of an ended lease, once; its receipt digest goes on the lease."""
        self.last_events = []
        result_digest = _digest(result_digest, "result_digest")
        hook_digest = _digest(hook_digest, "hook_digest")
        expected = _integer(expected_runner_generation, "expected_runner_generation", 1)
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        lease = self._find(draft, lease_id)
        if (draft["generation"] != expected or draft["state"] not in ("parked", "draining") or lease is None
                or lease["generation"] != lease_generation or lease["status"] == "active"
                or lease["resultDigest"] != result_digest or lease["hookReceiptDigest"] is not None
                or hook_digest != draft["postSessionHookDigest"]):
            raise StaleFenceError("execution location post-session hook fence is stale")
        material = {"runnerId": draft["runnerId"], "runnerGeneration": draft["generation"], "leaseId": lease_id,
                    "leaseGeneration": lease_generation, "resultDigest": result_digest, "hookDigest": hook_digest}
        digest = receipt_digest(HOOK_DOMAIN, material)
        lease["hookReceiptDigest"] = digest
        self._commit(draft, now_ms, [HookAuthorized(
            lease_id=lease_id, lease_generation=lease_generation, runner_generation=expected,
            result_digest=result_digest, hook_digest=hook_digest, receipt_digest=digest)])
        return HookReceipt(runner_id=draft["runnerId"], runner_generation=expected, lease_id=lease_id,
                           lease_generation=lease_generation, result_digest=result_digest, hook_digest=hook_digest,
                           receipt_digest=digest)
