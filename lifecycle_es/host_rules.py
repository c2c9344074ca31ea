"""The rules of the host lease in the log: tokens only grow, and a host event carries the current one.

A host driver acts for a runner only while it holds the runner's host lease. Taking it appends
``HostLeaseAcquired`` (holder, token, ttl); every event the driver appends after that carries the
token in ``host_token`` (``events.FENCED_EVENTS``). The store refuses a stale or expired token when it
appends (`lifecycle_es.host_lease`); these rules are what a replay, and so the audit, holds the log to:

- a ``HostLeaseAcquired`` names a holder (1-255 printable ASCII characters), a ttl of 1 s .. 1 h, and a
  token greater than every token of the runner before it;
- a host event's ``host_token`` is the token of the latest ``HostLeaseAcquired`` before it: an older
  one is a stale holder writing after a takeover (StaleFenceError), a newer one names no lease;
- once a runner's host lease was taken, a unit fact without a token is refused (StaleFenceError): only
  the lease's holder drives units, so a driver without the lease could be a second one. Lease and
  drain events may still come without a token (a caller settling its own session's lease).

Each check is an attribute read and an integer comparison, run for the events that can carry a token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from msgspec import UNSET

from .draft import RunnerDraft
from .errors import InvalidInputError, StaleFenceError
from .events import HOST_LABEL_RE, MAX_HOST_LEASE_TTL_MS, MIN_HOST_LEASE_TTL_MS, UNIT_EVENTS, Event, HostLeaseAcquired
from .values import MAX_SAFE_INTEGER, safe_int, shown

Handler = Callable[[RunnerDraft, Any, int, str], None]


def host_lease_acquired(draft: RunnerDraft, event: HostLeaseAcquired, at_ms: int, at: str) -> None:
    """The rule of ``HostLeaseAcquired``: a holder's name, a ttl in bounds, a token above every one before."""
    holder = event.holder
    if type(holder) is not str or HOST_LABEL_RE.fullmatch(holder) is None:
        raise InvalidInputError("holder", f"holder is invalid: {shown(holder)} is not a host lease holder "
                                          "(1-255 printable ASCII characters, no space)")
    token = safe_int(event.token, "token", 1, MAX_SAFE_INTEGER)
    safe_int(event.ttl_ms, "ttl_ms", MIN_HOST_LEASE_TTL_MS, MAX_HOST_LEASE_TTL_MS)
    if token <= draft.host_token:
        raise StaleFenceError(f"host lease token must grow: token {token} is not above {draft.host_token}, the "
                              f"runner's token before (taken by {draft.host_holder})")
    draft.host_holder = holder
    draft.host_token = token


def check_host_token(draft: RunnerDraft, event: Event) -> None:
    """Refuse a host event whose token is not the runner's current host lease token (see the module)."""
    token = event.host_token  # type: ignore[attr-defined]  # FENCED_EVENTS only
    if token is UNSET:
        if draft.host_token and type(event) in _UNIT_EVENTS:
            raise StaleFenceError(f"{type(event).__name__} without a host lease token: runner {draft.runner_id}'s "
                                  f"units are driven under its host lease (token {draft.host_token}, held by "
                                  f"{draft.host_holder}); take the lease first")
        return
    if type(token) is not int or token == draft.host_token:
        if type(token) is not int:
            raise InvalidInputError("host_token", f"host_token is invalid: {shown(token)} is not an int")
        return
    if token < draft.host_token:
        raise StaleFenceError(f"host lease token {token} is stale: {draft.host_holder} took runner "
                              f"{draft.runner_id}'s host lease with token {draft.host_token} since (this host "
                              "lost its lease and must stop acting)")
    raise InvalidInputError("host_token", f"host_token is invalid: {token} is above {draft.host_token}, the "
                                          "runner's latest host lease token (no such lease was taken)")


_UNIT_EVENTS = frozenset(UNIT_EVENTS)


def fenced(handler: Handler) -> Handler:
    """`handler` with the host token check before it (for the events that carry one)."""

    def rule(draft: RunnerDraft, event: Any, at_ms: int, at: str) -> None:
        # No token on the event and none taken on the runner passes `check_host_token` untouched: its call
        # spared then (the events of a runner no host drives, or a caller's own).
        if event.host_token is not UNSET or draft.host_token:
            check_host_token(draft, event)
        handler(draft, event, at_ms, at)

    rule.__doc__ = handler.__doc__
    return rule
