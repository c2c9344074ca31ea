"""The fences the rules hold, as pure functions of a runner's state: whether a proxy authority is fresh,
whether a lease may poll or have its authority refreshed, whether a post-session hook may be authorized.

Each answers with the one cause that refuses, in words that name the values and the way on; the
clock's reading is a parameter, never read here. The transition rules (``runner.py``) and the
lifecycle's read-only commands both ask these, so a fence is written once.
"""

from __future__ import annotations

from .canonical import iso_ms, parse_iso_ms
from .draft import RunnerDraft
from .errors import AuthorityError, InvalidInputError, StaleFenceError
from .events import HookAuthorized
from .state import Lease, RunnerState
from .values import ProxyAuthority, shown

MAX_PROXY_AGE_MS = 5 * 60 * 1000
"""A proxy authority is fresh for at most this long after it was issued."""
MAX_PROXY_SKEW_MS = 30_000
"""A proxy authority may be issued at most this far ahead of the clock (the issuer's clock may run ahead)."""


def check_fresh(proxy: ProxyAuthority, now_ms: int) -> None:
    """AuthorityError unless the authority was issued at most 30 s ahead, at most 5 min ago, and lives."""
    issued = parse_iso_ms(proxy.issued_at)
    expires = parse_iso_ms(proxy.expires_at)
    if issued > now_ms + MAX_PROXY_SKEW_MS:
        miss = issued - now_ms - MAX_PROXY_SKEW_MS
        why = (f"it was issued {_span(issued - now_ms)} ahead of now ({iso_ms(now_ms)}); at most "
               f"{_span(MAX_PROXY_SKEW_MS)} ahead is allowed, so it misses by {_span(miss)} (check the issuer's clock)")
    elif now_ms - issued > MAX_PROXY_AGE_MS:
        miss = now_ms - issued - MAX_PROXY_AGE_MS
        why = (f"it was issued {_span(now_ms - issued)} before now ({iso_ms(now_ms)}); at most "
               f"{_span(MAX_PROXY_AGE_MS)} old is allowed, so it misses by {_span(miss)} (get a freshly issued "
               "authority)")
    elif expires <= now_ms:
        why = (f"it expired at {proxy.expires_at}, {_span(now_ms - expires)} before now ({iso_ms(now_ms)}) "
               "(get a freshly issued authority)")
    else:
        return
    raise AuthorityError(f"execution location proxy authority is not fresh (proxy_authority {proxy.id} revision "
                         f"{proxy.revision}, issued_at {proxy.issued_at}): {why}")


def _span(ms: int) -> str:
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
    """InvalidInputError when the revision is below the minimum (the original's safeInteger bound)."""
    if proxy.revision < max(1, minimum):
        raise InvalidInputError(
            "proxy_authority.revision",
            f"proxy authority revision is invalid: {proxy.revision} is below the minimum {max(1, minimum)}",
        )


def _lease_refusal(state: RunnerState, lease_id: str, lease_generation: int, now_ms: int) -> tuple[Lease | None, str]:
    lease = state.lease(lease_id)
    if lease is None:
        return None, f"the runner has no lease {lease_id} (it never had one, or retention dropped it)"
    if lease.status != "active":
        return lease, f"lease {lease_id} is {lease.status}, no longer active"
    if lease.generation != lease_generation:
        return lease, (f"lease {lease_id} was granted at generation {lease.generation}, not lease_generation "
                       f"{lease_generation}")
    expires = parse_iso_ms(lease.expires_at)
    if expires <= now_ms:
        return lease, (f"lease {lease_id} expired at {lease.expires_at}, {_span(now_ms - expires)} before now "
                       f"({iso_ms(now_ms)}); acquire a new lease")
    return lease, ""


def check_poll(state: RunnerState, *, lease_id: str, lease_generation: int, proxy_authority_id: str,
               proxy_authority_revision: int, now_ms: int) -> Lease:
    """The active lease a poll may go on under, or StaleFenceError naming the one cause it may not.

    A poll needs the lease active at its generation and unexpired at `now_ms`, the runner bound to the
    same proxy id and revision, and the runner neither parked nor reclaiming. Pure: the clock's reading
    is a parameter.
    """
    lease, why = _lease_refusal(state, lease_id, lease_generation, now_ms)
    if not why and state.state in ("parked", "reclaiming"):
        why = f"the runner is {state.state}; a lease polls only while it is accepting or draining"
    if not why and state.proxy_authority.id != proxy_authority_id:
        why = f"proxy_authority_id {proxy_authority_id} is not the runner's {state.proxy_authority.id}"
    if not why and state.proxy_authority.revision != proxy_authority_revision:
        why = (f"proxy_authority_revision {proxy_authority_revision} is not the runner's "
               f"{state.proxy_authority.revision} (the proxy rotated: refresh the lease's authority)")
    if why or lease is None:
        raise StaleFenceError(f"execution location poll lease is stale or parked (lease_id {lease_id}): {why}")
    return lease


def check_refresh(state: RunnerState, *, lease_id: str, lease_generation: int, expected_generation: int,
                  proxy: ProxyAuthority, now_ms: int) -> Lease:
    """The active lease whose authority may be re-issued under `proxy`, or StaleFenceError naming the cause.

    A refresh needs the runner accepting at `expected_generation` and bound to `proxy`'s id and
    revision, and the lease active at its generation and unexpired at `now_ms`. Pure, like `check_poll`.
    """
    why = ""
    if state.state != "accepting":
        why = f"the runner is {state.state}; lease authority is refreshed only while it is accepting"
    elif state.generation != expected_generation:
        why = (f"expected_generation is {expected_generation} but the runner is at generation {state.generation} "
               "(call snapshot() for the current generation)")
    elif state.proxy_authority.id != proxy.id or state.proxy_authority.revision != proxy.revision:
        why = (f"proxy_authority {proxy.id} revision {proxy.revision} is not the runner's "
               f"{state.proxy_authority.id} revision {state.proxy_authority.revision}")
    lease, lease_why = _lease_refusal(state, lease_id, lease_generation, now_ms)
    why = why or lease_why
    if why or lease is None:
        raise StaleFenceError(f"execution location lease refresh fence is stale (lease_id {lease_id}): {why}")
    return lease


def hook_refusal(draft: RunnerDraft, event: HookAuthorized, lease: Lease | None) -> str | None:
    """Why a post-session hook may not be authorized here, one cause at a time (None when it may)."""
    if draft.state not in ("parked", "draining"):
        return (f"the runner is {draft.state}; hooks are authorized while it is draining or parked "
                "(request_drain first, or wait for the park)")
    if draft.generation != event.runner_generation:
        return (f"expected_runner_generation is {event.runner_generation} but the runner is at generation "
                f"{draft.generation} (call snapshot() for the current generation)")
    if lease is None:
        return f"the runner has no lease {shown(event.lease_id)} (it never had one, or retention dropped it)"
    if lease.generation != event.lease_generation:
        return (f"lease {lease.id} was granted at generation {lease.generation}, not lease_generation "
                f"{event.lease_generation}")
    if lease.status == "active":
        return f"lease {lease.id} is still active; its hook is authorized once it is settled or parked"
    if lease.result_digest != event.result_digest:
        recorded = lease.result_digest or "none (a lease parked by an expired drain has no result digest)"
        return f"result_digest {event.result_digest} is not the lease's recorded result digest: {recorded}"
    if lease.hook_receipt_digest is not None:
        return f"lease {lease.id}'s hook is already authorized (receipt {lease.hook_receipt_digest})"
    if event.hook_digest != draft.post_session_hook_digest:
        return (f"hook_digest {event.hook_digest} is not the runner's post_session_hook_digest "
                f"{draft.post_session_hook_digest}")
    return None
