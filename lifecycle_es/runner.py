"""The runner's state and its transition rules: pure, no I/O, no clock.

`apply(state, event, at_ms)` folds one event into a runner's state and checks, as it does, every rule
the event must have obeyed: the command path builds events from a caller's input and applies them (a
broken rule raises its error kind with a message naming the one cause and the way on, and nothing is
appended); the replay path applies recorded events (a broken rule is an IntegrityError at that seq,
with the same message). One set of rules serves both, so a log the commands could not have written
never replays clean: besides fences (``fences.py``) and transitions, every field is held to the
checks its command runs on its input (the same functions of ``values.py``), unit facts to what a host
driver writes (``units.py``), and no event may be stamped before its stream's previous one, nor in
another spelling than the canonical one.

Each rule checks an event against a `RunnerDraft` (``draft.py``) and then changes it: `apply` thaws a
frozen state, steps one event and freezes the result; a replay of many events thaws once (keyed),
`step`s every event through the very same rules and freezes once at the end.

Retention: the state holds at most 1024 leases, evicting the oldest lease that is no longer active
(never an active one; with 1024 active a new lease is refused), and keeps the last 256 after a
completed reclaim. The log itself keeps every lease forever.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from msgspec import UNSET

from .canonical import KNOWN_TIMES, canonical_ms, parse_iso_ms, receipt_digest, timestamp
from .draft import RunnerDraft, new_draft, thaw
from .errors import AuthorityError, InvalidInputError, LifecycleError, StaleFenceError
from .events import (
    FENCED_EVENTS,
    RUNNER_SCHEMA,
    DrainExpired,
    DrainRequested,
    Event,
    HookAuthorized,
    HostLeaseAcquired,
    LeaseAcquired,
    LeaseParked,
    LeaseSettled,
    ProxyRotated,
    ReclaimBegun,
    ReclaimCompleted,
    RunnerInitialized,
    RunnerParked,
)
from .fences import (
    DRAIN_NOT_READY,
    HOOK_STALE,
    MAX_PROXY_AGE_MS,
    MAX_PROXY_SKEW_MS,
    WAY_BACK,
    WAY_TO_PARK,
    bound_to,
    check_fresh,
    check_min_revision,
    held_lease,
    hook_refusal,
    named,
    session_lease,
    span,
    stale_generation,
    stale_state,
)
from .host_rules import check_host_token, fenced, host_lease_acquired
from .state import Drain, Lease, ProxyRef, RunnerState
from .units import UNIT_HANDLERS, forget_start
from .values import DIGEST_RE, ID_RE, ProxyAuthority, Resources, safe_digest, safe_id, safe_path, safe_target, shown

STATES = ("accepting", "draining", "parked", "reclaiming")
LEASE_STATUSES = ("active", "settled", "parked")
PARK_REASONS = ("checkout-failure", "lost-poll", "resource-limit")
MAX_RETAINED_LEASES = 1024
RETAINED_AFTER_RECLAIM = 256
MIN_TTL_MS = 1_000
MAX_TTL_MS = 24 * 60 * 60 * 1000
MIN_DRAIN_MS = 1
MAX_DRAIN_MS = 10 * 60 * 1000
HOOK_DOMAIN = "chainlesschain.execution-location.post-session-hook.v1\x00"

# The leading words of each fenced event's messages: what was refused.
NOT_ACCEPTING = "execution location runner is not accepting this generation"
ROTATION_STALE = "execution location proxy rotation fence is stale"
DRAIN_STALE = "execution location drain generation is stale"
SETTLE_STALE = "execution location result lease fence is stale"
PARK_STALE = "execution location park lease fence is stale"
RECLAIM_STALE = "execution location reclaim fence is stale"
COMPLETION_STALE = "execution location reclaim completion is stale"


_replace = msgspec.structs.replace
_ID_MATCH = ID_RE.fullmatch
_DIGEST_MATCH = DIGEST_RE.fullmatch


def hook_receipt_material(*, runner_id: str, runner_generation: int, lease_id: str, lease_generation: int,
                          result_digest: str, hook_digest: str) -> dict[str, object]:
    """A post-session hook receipt's material, with camelCase keys: its digest is the JavaScript original's."""
    return {
        "runnerId": runner_id,
        "runnerGeneration": runner_generation,
        "leaseId": lease_id,
        "leaseGeneration": lease_generation,
        "resultDigest": result_digest,
        "hookDigest": hook_digest,
    }


def start(event: Event, at: str, stream: str | None = None) -> RunnerDraft:
    """The draft of a runner that `event` (its first) creates: a RunnerInitialized, or LifecycleError.

    Every field is held to what `RunnerLifecycle` accepts (InvalidInputError naming it otherwise), and
    the runner id to `stream` when it is given: a runner is recorded in its own stream.
    """
    if not isinstance(event, RunnerInitialized):
        raise LifecycleError(f"runner is not initialized: its first event is {type(event).__name__} (a runner's "
                             "stream begins with RunnerInitialized)")
    if event.schema != RUNNER_SCHEMA:
        raise LifecycleError(f"runner lifecycle state schema is invalid: {shown(event.schema)}, not {RUNNER_SCHEMA}")
    _check_at(None, parse_iso_ms(at), at)
    safe_id(event.runner_id, "runner_id")
    if stream is not None and event.runner_id != stream:
        raise LifecycleError(f"runner {event.runner_id} is initialized in the stream of another ({named(stream)}); "
                             "a runner is recorded in the stream of its own id")
    safe_target(event.target)
    safe_path(event.base_dir, "base_dir", "runner base_dir")
    if type(event.resources) is not Resources:
        raise InvalidInputError("resources", f"resources must be Resources, got {type(event.resources).__name__}")
    safe_digest(event.post_session_hook_digest, "post_session_hook_digest")
    return new_draft(
        schema=event.schema, runner_id=event.runner_id, target=event.target, state="accepting", generation=1,
        policy_revision=1, base_dir=event.base_dir, resources=event.resources,
        proxy_authority=ProxyRef(id="unbound", revision=0),
        post_session_hook_digest=event.post_session_hook_digest, drain=None, updated_at=at, pending_park=None,
        last_at=at, units_starting=(), host_holder=None, host_token=0,
    )


def _check_at(last_at: str | None, at_ms: int, at: str) -> None:
    """LifecycleError unless `at` is a canonical timestamp (`at_ms` parsed from it) no earlier than `last_at`.

    Canonical timestamps of one shape sort as the times they name, so the order is a string comparison.
    """
    if canonical_ms(at) != at_ms:  # not canonical, out of range, or another time than at_ms
        raise LifecycleError(f"event time {shown(at)} is not a canonical timestamp (UTC, milliseconds, Z)")
    if last_at is not None and at < last_at:
        raise LifecycleError(f"time ran backwards: stamped {at}, before the stream's previous event at {last_at}")


def step(draft: RunnerDraft, event: Event, at_ms: int, at: str) -> None:
    """Fold `event` into `draft` in place, checking every rule first: a refused event changes nothing.

    Raises StaleFenceError, AuthorityError, InvalidInputError or LifecycleError, the message naming the
    one cause, when the event breaks a rule for this state, a field lies outside what its command
    accepts, or it is stamped before the stream's previous event.
    """
    if at != draft.last_at:
        # Events of one command share their stamp: only a new one needs a look.
        _check_at(draft.last_at, at_ms, at)
    step_timed(draft, event, at_ms, at)


def step_timed(draft: RunnerDraft, event: Event, at_ms: int, at: str) -> None:
    """`step` of an event whose time the caller has checked already: `at` canonical, `at_ms` its value, and
    no earlier than the draft's ``last_at`` (a replay that proved its row's time as it read it)."""
    if draft.pending_park is not None and not isinstance(event, RunnerParked):
        raise LifecycleError(f"runner must park ({draft.pending_park}) before {type(event).__name__}: its "
                             "RunnerParked is due in the same transaction")
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise LifecycleError(f"{type(event).__name__} does not apply to an initialized runner")
    handler(draft, event, at_ms, at)
    draft.last_at = at


def apply(state: RunnerState | None, event: Event, at_ms: int, at: str) -> RunnerState:
    """Fold `event`, stamped `at` (ISO) / `at_ms` (epoch ms), into `state`, checking every rule.

    Raises StaleFenceError, AuthorityError, InvalidInputError or LifecycleError (as `step` does) when
    the event breaks a rule for this state; `state` itself never changes.
    """
    if state is None:
        return start(event, at).freeze()
    draft = thaw(state)
    step(draft, event, at_ms, at)
    return draft.freeze()


def _initialized_again(draft: RunnerDraft, event: RunnerInitialized, at_ms: int, at: str) -> None:
    raise LifecycleError(f"runner {draft.runner_id} is already initialized: a stream holds one RunnerInitialized")


def _bound(draft: RunnerDraft, proxy: ProxyAuthority) -> ProxyRef:
    current: ProxyRef = draft.proxy_authority
    if current.id == proxy.id and current.revision == proxy.revision:
        return current  # the same value: spare making it again
    return ProxyRef(id=proxy.id, revision=proxy.revision)


def _lease_acquired(draft: RunnerDraft, event: LeaseAcquired, at_ms: int, at: str) -> None:
    # Half the events of a log: each value read once into a local, each check a test whose message is made
    # only when it fails (the same checks, in the same order, as the lifecycle's commands run).
    proxy = event.proxy_authority
    # First: a stale authority is refused before any fence, whatever else is wrong. `check_fresh`'s test, its
    # call spared when the authority passes: its times were made canonical when it was decoded, and recur.
    issued_ms, expires_ms = KNOWN_TIMES.get(proxy.issued_at), KNOWN_TIMES.get(proxy.expires_at)
    if (issued_ms is None or expires_ms is None or issued_ms > at_ms + MAX_PROXY_SKEW_MS
            or at_ms - issued_ms > MAX_PROXY_AGE_MS or expires_ms <= at_ms):
        check_fresh(proxy, at_ms)
    state = draft.state
    if state != "accepting":
        raise stale_state(NOT_ACCEPTING, state, "leases are granted only while it is accepting"
                          f"{WAY_BACK.get(state, '')}")
    generation = event.lease_generation
    if draft.generation != generation:
        raise stale_generation(NOT_ACCEPTING, "expected_generation", generation, draft.generation)
    lease_id, session_id = event.lease_id, event.session_id
    if draft.session_active(session_id):
        raise StaleFenceError(f"execution location session already has an active lease: session "
                              f"{named(session_id)} holds {session_lease(draft, session_id)} (settle "
                              "or park it first)")
    bound, proxy_id, revision = draft.proxy_authority, proxy.id, proxy.revision
    if bound.id != proxy_id and bound.id != "unbound":
        raise AuthorityError(f"execution location proxy authority identity drifted: proxy_authority.id {proxy_id} "
                             f"is not the runner's {bound.id} (a runner keeps the proxy id its first lease bound)")
    if revision < bound.revision:
        raise AuthorityError(f"execution location proxy authority revision rolled back: proxy_authority.revision "
                             f"{revision} is below the runner's {bound.revision} (get an authority of revision "
                             f"{bound.revision} or newer)")
    # safe_id's test, its call spared when the value passes (the checks run for every event replayed).
    if type(lease_id) is not str or _ID_MATCH(lease_id) is None:
        safe_id(lease_id, "lease_id")
    if type(session_id) is not str or _ID_MATCH(session_id) is None:
        safe_id(session_id, "session_id")
    expires_at = event.expires_at
    expires_ms = canonical_ms(expires_at)
    if expires_ms is None:
        expires_ms = _canonical(expires_at, "expires_at")
    issued_at = event.issued_at
    if issued_at != at:
        raise InvalidInputError("ttl_ms", f"lease ttl_ms is invalid: issued_at {named(issued_at)} is not the "
                                          f"time of its event, {at} (a lease's ttl runs from its grant)")
    ttl = expires_ms - at_ms
    if not MIN_TTL_MS <= ttl <= MAX_TTL_MS:
        raise InvalidInputError("ttl_ms", f"lease ttl_ms is invalid: {ttl} is outside {MIN_TTL_MS}..{MAX_TTL_MS}")
    taken = draft.lease(lease_id)
    if taken is not None:
        raise StaleFenceError(f"execution location lease id is already taken: lease {lease_id} is the "
                              f"runner's {taken.status} lease of session {taken.session_id} (random_id must give "
                              "each lease a new id)")
    draft.add_lease(Lease(id=lease_id, session_id=session_id, generation=generation, issued_at=issued_at,
                          expires_at=expires_at, status="active"),
                    MAX_RETAINED_LEASES)
    if bound.id != proxy_id or bound.revision != revision:  # `_bound`, its call spared when the runner's is kept
        draft.proxy_authority = ProxyRef(id=proxy_id, revision=revision)
    draft.updated_at = at


def _proxy_rotated(draft: RunnerDraft, event: ProxyRotated, at_ms: int, at: str) -> None:
    proxy = event.proxy_authority
    check_min_revision(proxy, draft.proxy_authority.revision + 1)
    check_fresh(proxy, at_ms)
    if draft.state not in ("accepting", "draining"):
        raise stale_state(ROTATION_STALE, draft.state, "a proxy authority is rotated while it is accepting or "
                                                       "draining (a parked runner takes its new one in begin_reclaim)")
    if event.generation != draft.generation + 1:
        raise stale_generation(ROTATION_STALE, "expected_generation", event.generation - 1, draft.generation)
    if proxy.id != draft.proxy_authority.id:
        raise StaleFenceError(f"{ROTATION_STALE}: proxy_authority.id {proxy.id} is not the runner's "
                              f"({bound_to(draft.proxy_authority)}; a rotation keeps the id and moves the revision)")
    if event.policy_revision != draft.policy_revision + 1:
        raise LifecycleError(f"policy revision must become {draft.policy_revision + 1}, not "
                             f"{named(event.policy_revision)} (a rotation moves it by one)")
    draft.generation = event.generation
    draft.policy_revision = event.policy_revision
    draft.proxy_authority = _bound(draft, proxy)
    draft.updated_at = at


def _drain_requested(draft: RunnerDraft, event: DrainRequested, at_ms: int, at: str) -> None:
    if event.signal != "SIGTERM":
        raise InvalidInputError("signal", f"runner drain requires SIGTERM, got {shown(event.signal)}")
    deadline_ms = _canonical(event.deadline_at, "deadline_at")
    if event.requested_at != at:
        raise InvalidInputError("timeout_ms", f"drain timeout_ms is invalid: requested_at {named(event.requested_at)} "
                                              f"is not the time of its event, {at} (a drain's timeout runs from its "
                                              "request)")
    timeout = deadline_ms - at_ms
    if not MIN_DRAIN_MS <= timeout <= MAX_DRAIN_MS:
        raise InvalidInputError("timeout_ms", f"drain timeout_ms is invalid: {timeout} is outside "
                                              f"{MIN_DRAIN_MS}..{MAX_DRAIN_MS}")
    if draft.state != "accepting":
        raise stale_state(DRAIN_STALE, draft.state, "a drain is requested only while it is accepting")
    if event.generation != draft.generation + 1:
        raise stale_generation(DRAIN_STALE, "expected_generation", event.generation - 1, draft.generation)
    draft.state = "draining"
    draft.generation = event.generation
    draft.drain = Drain(signal=event.signal, requested_at=event.requested_at, deadline_at=event.deadline_at)
    draft.updated_at = at
    draft.pending_park = "drain-idle" if draft.active_count() == 0 else None


def _lease_settled(draft: RunnerDraft, event: LeaseSettled, at_ms: int, at: str) -> None:
    # Half the events of a log: the host token check (`host_rules.fenced`, which `_HANDLERS` leaves to this
    # rule) and `held_lease` are called only when their tests, made here first, fail.
    if event.host_token is not UNSET or draft.host_token:
        check_host_token(draft, event)
    digest = event.result_digest
    if type(digest) is not str or _DIGEST_MATCH(digest) is None:
        safe_digest(digest, "result_digest")
    lease_id, generation = event.lease_id, event.lease_generation
    lease = draft.lease(lease_id) if type(lease_id) is str else None
    if lease is None or lease.status != "active" or lease.generation != generation:
        lease = held_lease(draft, lease_id, generation, SETTLE_STALE, "a lease ends once")
    if draft.units_starting:
        forget_start(draft, lease.id)
    draft.replace_lease(lease, _replace(lease, status="settled", result_digest=digest))
    draft.updated_at = at
    draft.pending_park = "drain-settled" if draft.state == "draining" and draft.active_count() == 0 else None


def _lease_parked(draft: RunnerDraft, event: LeaseParked, at_ms: int, at: str) -> None:
    if type(event.result_digest) is not str or _DIGEST_MATCH(event.result_digest) is None:
        safe_digest(event.result_digest, "result_digest")
    if event.reason not in PARK_REASONS:
        raise InvalidInputError("reason", f"execution location park reason is invalid: {shown(event.reason)} is not "
                                          f"one of {', '.join(PARK_REASONS)}")
    if draft.state not in ("accepting", "draining"):
        raise stale_state(PARK_STALE, draft.state, "leases are parked while it is accepting or draining (a parked "
                                                   "runner has no active lease)")
    lease = held_lease(draft, event.lease_id, event.lease_generation, PARK_STALE, "a lease ends once")
    if draft.units_starting:
        forget_start(draft, lease.id)
    draft.replace_lease(lease, _replace(lease, status="parked", result_digest=event.result_digest))
    draft.updated_at = at
    draft.pending_park = "lease-parked" if draft.active_count() == 0 else None


def _drain_expired(draft: RunnerDraft, event: DrainExpired, at_ms: int, at: str) -> None:
    drain = draft.drain
    if draft.state != "draining" or drain is None:
        raise stale_state(DRAIN_NOT_READY, draft.state, "an expired drain parks a draining runner")
    deadline = parse_iso_ms(drain.deadline_at)
    if deadline > at_ms:
        raise StaleFenceError(f"{DRAIN_NOT_READY}: its deadline {drain.deadline_at} is {span(deadline - at_ms)} "
                              f"after now ({at}): call park_expired_drain again then, or settle or park the active "
                              "leases")
    if event.deadline_at != drain.deadline_at:
        raise LifecycleError(f"drain deadline {named(event.deadline_at)} is not the runner's {drain.deadline_at}")
    if tuple(event.lease_ids) != draft.active_ids():
        raise LifecycleError(f"the leases parked by an expired drain are not the runner's active leases "
                             f"({len(event.lease_ids)} named, {len(draft.active_ids())} active)")
    draft.park_active()
    draft.units_starting = ()  # each was of a lease that was active
    draft.updated_at = at
    draft.pending_park = "drain-expired"


def _runner_parked(draft: RunnerDraft, event: RunnerParked, at_ms: int, at: str) -> None:
    if draft.pending_park is None:
        raise LifecycleError(f"runner cannot park for {shown(event.cause)}: no park is due (a runner parks in the "
                             "transaction where its last active lease ends, or its drain parks them)")
    if event.cause != draft.pending_park:
        raise LifecycleError(f"runner cannot park for {shown(event.cause)}: the park due is for "
                             f"{draft.pending_park!r}")
    if event.generation != draft.generation + 1:
        raise LifecycleError(f"parking must move generation to {draft.generation + 1}, not {named(event.generation)}")
    draft.state = "parked"
    draft.generation = event.generation
    draft.drain = None
    draft.updated_at = at
    draft.pending_park = None


def _reclaim_begun(draft: RunnerDraft, event: ReclaimBegun, at_ms: int, at: str) -> None:
    proxy = event.proxy_authority
    check_min_revision(proxy, draft.proxy_authority.revision + 1)
    check_fresh(proxy, at_ms)
    if draft.state != "parked":
        raise stale_state(RECLAIM_STALE, draft.state, "a reclaim begins once it is parked"
                          f"{WAY_TO_PARK.get(draft.state, '')}")
    if event.generation != draft.generation + 1:
        raise stale_generation(RECLAIM_STALE, "expected_generation", event.generation - 1, draft.generation)
    if proxy.id != draft.proxy_authority.id:
        raise StaleFenceError(f"{RECLAIM_STALE}: proxy_authority.id {proxy.id} is not the runner's "
                              f"({bound_to(draft.proxy_authority)}; a reclaim keeps the id and moves the revision)")
    draft.state = "reclaiming"
    draft.generation = event.generation
    draft.proxy_authority = _bound(draft, proxy)
    draft.updated_at = at


def _reclaim_completed(draft: RunnerDraft, event: ReclaimCompleted, at_ms: int, at: str) -> None:
    if draft.state != "reclaiming":
        raise stale_state(COMPLETION_STALE, draft.state, "a reclaim is completed while it is reclaiming (call "
                                                         "begin_reclaim on the parked runner first)")
    if event.generation != draft.generation + 1:
        raise stale_generation(COMPLETION_STALE, "expected_generation", event.generation - 1, draft.generation)
    draft.state = "accepting"
    draft.generation = event.generation
    draft.keep_last(RETAINED_AFTER_RECLAIM)
    draft.updated_at = at


def _hook_authorized(draft: RunnerDraft, event: HookAuthorized, at_ms: int, at: str) -> None:
    lease = draft.lease(event.lease_id)
    why = hook_refusal(draft, event, lease)
    if why is not None:
        raise StaleFenceError(f"{HOOK_STALE}: {why}")
    assert lease is not None
    material = hook_receipt_material(
        runner_id=draft.runner_id, runner_generation=draft.generation, lease_id=lease.id,
        lease_generation=lease.generation, result_digest=event.result_digest, hook_digest=event.hook_digest)
    expected = receipt_digest(HOOK_DOMAIN, material)
    if expected != event.receipt_digest:
        raise LifecycleError(f"post-session hook receipt digest {named(event.receipt_digest)} does not match its "
                             f"material, which digests to {expected}")
    draft.replace_lease(lease, _replace(lease, hook_receipt_digest=event.receipt_digest))
    draft.updated_at = at


def _canonical(value: str, field: str) -> int:
    """Epoch ms of `value`; InvalidInputError unless it is a timestamp in the one spelling the commands write."""
    millis = canonical_ms(value)
    if millis is not None:
        return millis
    if timestamp(value, field) != value:  # timestamp's InvalidInputError names a value that is no time at all
        raise InvalidInputError(field, f"{field} is invalid: {shown(value)} is not canonical (UTC, milliseconds, Z)")
    return parse_iso_ms(value)


_RULES: dict[type[Event], Callable[[RunnerDraft, Any, int, str], None]] = {
    RunnerInitialized: _initialized_again,
    LeaseAcquired: _lease_acquired,
    ProxyRotated: _proxy_rotated,
    DrainRequested: _drain_requested,
    LeaseSettled: _lease_settled,
    LeaseParked: _lease_parked,
    DrainExpired: _drain_expired,
    RunnerParked: _runner_parked,
    ReclaimBegun: _reclaim_begun,
    ReclaimCompleted: _reclaim_completed,
    HookAuthorized: _hook_authorized,
    HostLeaseAcquired: host_lease_acquired,
    **UNIT_HANDLERS,
}
# A host event is checked against the runner's host lease token before its own rule (the rules of
# `_CHECKING_TOKEN` check it first themselves).
_CHECKING_TOKEN = frozenset({LeaseSettled})
_HANDLERS = {kind: fenced(rule) if kind in FENCED_EVENTS and kind not in _CHECKING_TOKEN else rule
             for kind, rule in _RULES.items()}
RULES: Mapping[type[Event], Callable[[RunnerDraft, Any, int, str], None]] = _HANDLERS
"""The rule `step_timed` calls for each kind of event (the host token check included for host events), for a
replay that calls it directly: only on a draft with no park due (`step_timed` refuses any event but the
RunnerParked then), with `at` proved as `step_timed` requires, and setting ``draft.last_at = at`` after it."""
