"""The fences the rules hold, as pure functions of a runner's state: whether a proxy authority is fresh,
whether a lease is held, may poll or have its authority refreshed, whether a drain may park, whether
a post-session hook may be authorized, whether a session's lease profile still holds authority.

Each answers with the one cause that refuses, in words that name the values given and found and the
way on, on one line; the clock's reading is a parameter, never read here. The transition rules
(``runner.py``), the lifecycle's read-only commands and `assert_lease_authority` all ask these, so a
fence is written once. Values read from a recorded event are shown through `named`, so an audit's
message stays one line whatever a forged event holds. Each check is a sequence of single
comparisons, so a command that passes pays what one combined condition would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .canonical import KNOWN_TIMES, iso_ms, parse_iso_ms
from .draft import RunnerDraft
from .errors import AuthorityError, InvalidInputError, LifecycleError, StaleFenceError
from .events import HookAuthorized
from .state import Lease, ProxyRef, RunnerState
from .values import DIGEST_RE, ID_RE, ProxyAuthority, Resources, shown

if TYPE_CHECKING:
    from .receipts import LeaseProfile

MAX_PROXY_AGE_MS = 5 * 60 * 1000
"""A proxy authority is fresh for at most this long after it was issued."""
MAX_PROXY_SKEW_MS = 30_000
"""A proxy authority may be issued at most this far ahead of the clock (the issuer's clock may run ahead)."""

# The leading words of each fence's messages: what was refused.
POLL_STALE = "execution location poll lease is stale or parked"
REFRESH_STALE = "execution location lease refresh fence is stale"
DRAIN_NOT_READY = "execution location drain is not ready to park"
HOOK_STALE = "execution location post-session hook fence is stale"
AUTHORITY_STALE = "execution location runner lease authority is stale"
IDENTITY_DRIFTED = "runner lifecycle identity drifted"

_ID_MATCH = ID_RE.fullmatch
_DIGEST_MATCH = DIGEST_RE.fullmatch


def check_fresh(proxy: ProxyAuthority, now_ms: int) -> None:
    """AuthorityError unless the authority was issued at most 30 s ahead, at most 5 min ago, and lives."""
    # An authority's times were made canonical when it was built or decoded, and recur for every event it
    # fronts: mostly a look-up (`KNOWN_TIMES`), parsed otherwise.
    issued = KNOWN_TIMES.get(proxy.issued_at) if type(proxy.issued_at) is str else None
    if issued is None:
        issued = parse_iso_ms(proxy.issued_at)
    expires = KNOWN_TIMES.get(proxy.expires_at) if type(proxy.expires_at) is str else None
    if expires is None:
        expires = parse_iso_ms(proxy.expires_at)
    if issued > now_ms + MAX_PROXY_SKEW_MS:
        miss = issued - now_ms - MAX_PROXY_SKEW_MS
        why = (f"it was issued {span(issued - now_ms)} ahead of now ({iso_ms(now_ms)}); at most "
               f"{span(MAX_PROXY_SKEW_MS)} ahead is allowed, so it misses by {span(miss)} (check the issuer's clock)")
    elif now_ms - issued > MAX_PROXY_AGE_MS:
        miss = now_ms - issued - MAX_PROXY_AGE_MS
        why = (f"it was issued {span(now_ms - issued)} before now ({iso_ms(now_ms)}); at most "
               f"{span(MAX_PROXY_AGE_MS)} old is allowed, so it misses by {span(miss)} (get a freshly issued "
               "authority)")
    elif expires <= now_ms:
        why = (f"it expired at {proxy.expires_at}, {span(now_ms - expires)} before now ({iso_ms(now_ms)}) "
               "(get a freshly issued authority)")
    else:
        return
    raise AuthorityError(f"execution location proxy authority is not fresh (proxy_authority {proxy.id} revision "
                         f"{proxy.revision}, issued_at {proxy.issued_at}): {why}")


def span(ms: int) -> str:
    """A duration as people say it: ``42 ms``, ``31.5 s``, ``6 min 5 s``, ``2 h 3 min``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:g} s"
    minutes, seconds = divmod(ms // 1000, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def check_min_revision(proxy: ProxyAuthority, minimum: int) -> None:
    """InvalidInputError (field ``proxy_authority.revision``) when the revision is below `minimum` (at least 1)."""
    minimum = max(1, minimum)
    if proxy.revision < minimum:
        raise InvalidInputError(
            "proxy_authority.revision",
            f"proxy authority revision is invalid: {proxy.revision} is below the minimum {minimum} (get an "
            f"authority of revision {minimum} or newer)",
        )


def named(value: object) -> str:
    """A value as a message names it: an id, a digest or an integer as it is, anything else quoted and cut short.

    Values read from a recorded event go through here: a forged one cannot stretch or break the line.
    """
    if type(value) is int or (type(value) is str and (_ID_MATCH(value) or _DIGEST_MATCH(value))):
        return str(value)
    return shown(value)


def bound_to(ref: ProxyRef) -> str:
    """The proxy authority a runner is bound to, in words."""
    if ref.id == "unbound":
        return "the runner is bound to no proxy authority yet (its first lease binds one)"
    return f"the runner is bound to {ref.id}"


# From each state, the way to a parked runner (which a reclaim begins from).
WAY_TO_PARK = {
    "accepting": " (request_drain first)",
    "draining": " (settle or park its leases, or call park_expired_drain after the deadline)",
    "reclaiming": " (it is reclaiming already: call complete_reclaim)",
}
# From each state, the way back to accepting (where leases are granted).
WAY_BACK = {
    "draining": " (a drained runner parks, then begin_reclaim and complete_reclaim accept again)",
    "parked": " (begin_reclaim and complete_reclaim accept again)",
    "reclaiming": " (complete_reclaim accepts again)",
}


def session_lease(draft: RunnerDraft, session_id: str) -> str:
    """The id of the active lease `session_id` holds (a scan: only a refusal needs it)."""
    for lease_id in draft.active_ids():
        lease = draft.lease(lease_id)
        if lease is not None and lease.session_id == session_id:
            return lease_id
    return "a lease"


def stale_generation(phrase: str, field: str, given: object, current: int) -> StaleFenceError:
    """The refusal of a generation the runner is not at: `field` is the argument that named it."""
    return StaleFenceError(f"{phrase}: {field} is {named(given)} but the runner is at generation {current} "
                           "(call snapshot() for the current generation)")


def stale_state(phrase: str, state: str, rule: str) -> StaleFenceError:
    """The refusal of a command the runner's state does not allow: `rule` says in which states it may run."""
    return StaleFenceError(f"{phrase}: the runner is {state}; {rule}")


def held_lease(holder: RunnerDraft | RunnerState, lease_id: Any, lease_generation: Any, phrase: str,
               ended: str) -> Lease:
    """The active lease `lease_id` of generation `lease_generation`, or StaleFenceError naming the one cause.

    `ended` says what to do about a lease that is no longer active.
    """
    lease = holder.lease(lease_id) if type(lease_id) is str else None
    if lease is None:
        raise StaleFenceError(f"{phrase} (lease_id {named(lease_id)}): the runner has no lease {named(lease_id)} "
                              "(it never had one, or retention dropped it; check the lease_id of its receipt)")
    if lease.status != "active":
        raise StaleFenceError(f"{phrase} (lease_id {lease.id}): lease {lease.id} is {lease.status}, no longer "
                              f"active ({ended})")
    if lease.generation != lease_generation:
        raise StaleFenceError(f"{phrase} (lease_id {lease.id}): lease {lease.id} was granted at generation "
                              f"{lease.generation}, not lease_generation {named(lease_generation)} (pass the "
                              "lease_generation of its receipt)")
    return lease


def _unexpired(lease: Lease, now_ms: int, phrase: str, what_to_do: str) -> None:
    expires = parse_iso_ms(lease.expires_at)
    if expires <= now_ms:
        raise StaleFenceError(f"{phrase} (lease_id {lease.id}): lease {lease.id} expired at {lease.expires_at}, "
                              f"{span(now_ms - expires)} before now ({iso_ms(now_ms)}); {what_to_do}")


def check_poll(state: RunnerState, *, lease_id: str, lease_generation: int, proxy_authority_id: str,
               proxy_authority_revision: int, now_ms: int) -> Lease:
    """The active lease a poll may go on under, or StaleFenceError naming the one cause it may not.

    A poll needs the runner accepting or draining, the lease active at its generation and unexpired at
    `now_ms`, and the runner bound to the same proxy id and revision. Pure: the clock's reading is a
    parameter.
    """
    if state.state in ("parked", "reclaiming"):
        raise stale_state(f"{POLL_STALE} (lease_id {lease_id})", state.state,
                          "a lease polls only while it is accepting or draining (its leases ended: stop polling)")
    lease = held_lease(state, lease_id, lease_generation, POLL_STALE, "stop polling under it")
    _unexpired(lease, now_ms, POLL_STALE, "stop polling under it, and settle or park it")
    bound = state.proxy_authority
    if bound.id != proxy_authority_id:
        raise StaleFenceError(f"{POLL_STALE} (lease_id {lease_id}): proxy_authority_id {proxy_authority_id} is not "
                              f"the runner's ({bound_to(bound)}; poll under the authority of the lease's receipt)")
    if bound.revision != proxy_authority_revision:
        raise StaleFenceError(f"{POLL_STALE} (lease_id {lease_id}): proxy_authority_revision "
                              f"{proxy_authority_revision} is not the runner's {bound.revision} (the proxy rotated: "
                              "refresh the lease's authority)")
    return lease


def check_refresh(state: RunnerState, *, lease_id: str, lease_generation: int, expected_generation: int,
                  proxy: ProxyAuthority, now_ms: int) -> Lease:
    """The active lease whose authority may be re-issued under `proxy` at `now_ms`, or the error naming the cause.

    InvalidInputError for a revision below the runner's, AuthorityError for an authority that is not
    fresh, StaleFenceError unless the runner is accepting at `expected_generation` and bound to
    `proxy`'s id and revision, and the lease active at its generation and unexpired. Pure, like
    `check_poll`.
    """
    check_min_revision(proxy, state.proxy_authority.revision)
    check_fresh(proxy, now_ms)
    phrase = f"{REFRESH_STALE} (lease_id {lease_id})"
    if state.state != "accepting":
        raise stale_state(phrase, state.state, "lease authority is refreshed only while it is accepting")
    if state.generation != expected_generation:
        raise stale_generation(phrase, "expected_generation", expected_generation, state.generation)
    bound = state.proxy_authority
    if bound.id != proxy.id:
        raise StaleFenceError(f"{phrase}: proxy_authority.id {proxy.id} is not the runner's ({bound_to(bound)}; "
                              "refresh under its authority)")
    if bound.revision != proxy.revision:
        raise StaleFenceError(f"{phrase}: proxy_authority.revision {proxy.revision} is not the runner's "
                              f"{bound.revision} (rotate_proxy_authority first, or refresh under revision "
                              f"{bound.revision})")
    lease = held_lease(state, lease_id, lease_generation, REFRESH_STALE, "acquire a new lease")
    _unexpired(lease, now_ms, REFRESH_STALE, "acquire a new lease")
    return lease


def check_drain_park(state: RunnerState, expected_generation: int) -> None:
    """StaleFenceError unless the runner is draining at `expected_generation` (the deadline is the rules' to check)."""
    if state.state != "draining" or state.drain is None:
        raise stale_state(DRAIN_NOT_READY, state.state, "park_expired_drain parks a draining runner past its deadline")
    if state.generation != expected_generation:
        raise stale_generation(DRAIN_NOT_READY, "expected_generation", expected_generation, state.generation)


def check_identity(state: RunnerState, runner_id: str, target: str, base_dir: str) -> None:
    """LifecycleError unless the recorded runner is the one a handle or a lease profile names.

    Checked on every read and command, not only by `initialize`: a handle configured with another
    target or base dir must not grant leases whose receipts name the recorded ones.
    """
    if state.runner_id != runner_id:
        raise LifecycleError(f"{IDENTITY_DRIFTED}: the stream of runner {runner_id} holds runner "
                             f"{named(state.runner_id)} (the log is damaged: audit it)")
    if state.target != target:
        raise LifecycleError(f"{IDENTITY_DRIFTED}: runner {runner_id} was initialized with target {state.target}, "
                             f"not {target} (use the recorded target, or another runner_id)")
    if state.base_dir != base_dir:
        raise LifecycleError(f"{IDENTITY_DRIFTED}: runner {runner_id} was initialized with base_dir "
                             f"{shown(state.base_dir)}, not {shown(base_dir)} (use the recorded base_dir, or another "
                             "runner_id)")


def check_lease_authority(state: RunnerState, profile: LeaseProfile, now_ms: int) -> Lease:
    """The lease a session's profile names, if the profile still holds authority at `now_ms`.

    StaleFenceError naming the one thing that moved on: the runner no longer accepting, another
    generation, other resources, proxy authority or hook, or the lease ended, replaced or expired.
    The identity (runner, target, base dir) is `check_identity`'s to check first.
    """
    phrase = f"{AUTHORITY_STALE} (lease_id {named(profile.lease.id)})"
    renew = "get a current receipt with refresh_lease_authority"
    if state.state != "accepting":
        raise stale_state(phrase, state.state, "a lease holds authority only while its runner is accepting (stop "
                                               "the session)")
    if state.generation != profile.generation:
        raise StaleFenceError(f"{phrase}: the profile's generation is {named(profile.generation)} but the runner is "
                              f"at generation {state.generation} ({renew})")
    if state.resources != profile.resources:
        raise StaleFenceError(f"{phrase}: the profile's resources ({_resources(profile.resources)}) are not the "
                              f"runner's ({_resources(state.resources)}; take the profile from the runner's receipt)")
    bound, held = state.proxy_authority, profile.proxy_authority
    if bound.id != held.id:
        raise StaleFenceError(f"{phrase}: the profile's proxy_authority.id {named(held.id)} is not the runner's "
                              f"({bound_to(bound)}; {renew})")
    if bound.revision != held.revision:
        raise StaleFenceError(f"{phrase}: the profile's proxy_authority.revision {named(held.revision)} is not the "
                              f"runner's {bound.revision} (the proxy rotated: {renew})")
    if state.post_session_hook_digest != profile.post_session_hook.digest:
        raise StaleFenceError(f"{phrase}: the profile's post_session_hook digest "
                              f"{named(profile.post_session_hook.digest)} is not the runner's "
                              f"{state.post_session_hook_digest} (take the profile from the runner's receipt)")
    ref = profile.lease
    lease = held_lease(state, ref.id, ref.generation, AUTHORITY_STALE, "stop the session")
    if lease.expires_at != ref.expires_at:
        raise StaleFenceError(f"{phrase}: the profile's lease expires_at {named(ref.expires_at)} is not lease "
                              f"{lease.id}'s {lease.expires_at} (take the profile from the lease's receipt)")
    _unexpired(lease, now_ms, AUTHORITY_STALE, "stop the session")
    return lease


def _resources(resources: object) -> str:
    if isinstance(resources, Resources):
        return f"cpu_seconds {resources.cpu_seconds}, memory_bytes {resources.memory_bytes}"
    return shown(resources)


def hook_refusal(draft: RunnerDraft, event: HookAuthorized, lease: Lease | None) -> str | None:
    """Why a post-session hook may not be authorized here, one cause at a time (None when it may)."""
    if draft.state not in ("parked", "draining"):
        return (f"the runner is {draft.state}; hooks are authorized while it is draining or parked "
                "(request_drain first, or wait for the park)")
    if draft.generation != event.runner_generation:
        return (f"expected_runner_generation is {named(event.runner_generation)} but the runner is at generation "
                f"{draft.generation} (call snapshot() for the current generation)")
    if lease is None:
        return (f"the runner has no lease {named(event.lease_id)} (it never had one, or retention dropped it; "
                "check the lease_id of its receipt)")
    if lease.generation != event.lease_generation:
        return (f"lease {lease.id} was granted at generation {lease.generation}, not lease_generation "
                f"{named(event.lease_generation)} (pass the lease_generation of its receipt)")
    if lease.status == "active":
        return f"lease {lease.id} is still active; its hook is authorized once it is settled or parked"
    if lease.result_digest != event.result_digest:
        recorded = lease.result_digest or "none (a lease parked by an expired drain has no result digest)"
        return (f"result_digest {named(event.result_digest)} is not the lease's recorded result digest: {recorded} "
                "(pass the digest it was settled or parked with)")
    if lease.hook_receipt_digest is not None:
        return (f"lease {lease.id}'s hook is already authorized (receipt {lease.hook_receipt_digest}); a hook is "
                "authorized once per lease")
    if event.hook_digest != draft.post_session_hook_digest:
        return (f"hook_digest {named(event.hook_digest)} is not the runner's post_session_hook_digest "
                f"{draft.post_session_hook_digest} (authorize the hook the runner was initialized with)")
    return None
