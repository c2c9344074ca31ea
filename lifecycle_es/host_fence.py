"""The fence a host driver's writes pass: its host lease grant, checked in the write transaction.

    grant = lifecycle.take_host_lease(holder=holder_name(), ttl_ms=15_000)   # see `lifecycle_es.host_lease`
    lifecycle.record_host_facts([...])   # checked against the lease row, each event carrying grant.token

A `HostLeaseGrant` is what a driver holds: the runner, its holder name, the fencing token and when the
lease expires by the store's clock. A handle holding one (`RunnerLifecycle.take_host_lease` binds it)
runs `check_grant` in every command's write transaction, under the lock, before it appends: the row
must still name this holder and token, and the time the transaction stamps must be before the lease's
expiry. Otherwise HostFencedError and nothing is appended. The events that can carry a token
(``events.FENCED_EVENTS``) are stamped with it (`stamped`), so the log shows who wrote them and the
audit holds every one to the runner's latest ``HostLeaseAcquired`` (``host_rules``).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .errors import HostFencedError
from .events import FENCED_EVENTS, Event
from .store import WriteTransaction


class HostLeaseGrant(msgspec.Struct, frozen=True, kw_only=True):
    """A runner's host lease as its holder got it: who, the token, the ttl, and the store-clock times.

    `expires_ms`: when the lease lapses unless renewed (store clock). `act_after_ms`: when the holder
    may first touch units (store clock): the previous holder's expiry plus the grace, so a holder that
    lost the lease without knowing it has stopped by its own deadline first; `taken_ms` when no one held
    it, or its holder let it go. `taken_ms`: when this grant was written (store clock).
    """

    runner_id: str
    holder: str
    token: int
    ttl_ms: int
    taken_ms: int
    expires_ms: int
    act_after_ms: int


def check_grant(tx: WriteTransaction, grant: HostLeaseGrant, now_ms: int) -> None:
    """HostFencedError unless `grant` is the runner's current host lease, unexpired at `now_ms` (the time the
    transaction judges leases at: `WriteTransaction.lease_clock`)."""
    row = tx.host_lease(grant.runner_id)
    if row is None:
        raise HostFencedError(grant.runner_id, grant.holder, grant.token, "the runner has no host lease")
    holder, token, expires_ms = row
    if token != grant.token or holder != grant.holder:
        raise HostFencedError(grant.runner_id, grant.holder, grant.token,
                              f"{holder} holds it now with token {token}")
    if now_ms >= expires_ms:
        raise HostFencedError(grant.runner_id, grant.holder, grant.token,
                              f"it expired {now_ms - expires_ms} ms ago by the store's clock (not renewed in time)")


def stamped(events: Sequence[Event], token: int) -> list[Event]:
    """`events`, each that can carry a host lease token carrying `token`."""
    replace = msgspec.structs.replace
    return [replace(event, host_token=token) if type(event) in FENCED_EVENTS else event
            for event in events]


__all__ = ["HostLeaseGrant", "check_grant", "stamped"]
