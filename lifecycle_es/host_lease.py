"""A runner's host lease: which host driver may act for the runner, fenced by a token that only grows.

    grant = lifecycle.take_host_lease(holder="host-a/<boot id>/<instance>", ttl_ms=15_000)
    lifecycle.record_host_facts([...])      # refused (HostFencedError) once the lease is another's or expired
    grant = lifecycle.renew_host_lease(grant)   # every ttl/3, from a connection of its own; no event
    lifecycle.release_host_lease(grant)     # on a clean exit: a standby may act at once

A lease alone is no mutual exclusion (a paused process wakes up believing it still holds it), so the
log refuses a stale holder where the write happens: one row per runner (holder, token, expiry by the
store's clock), read under the write lock in the same transaction as every append of a holder
(`lifecycle_es.host_fence`). Taking the lease appends ``HostLeaseAcquired`` (holder, token, ttl) with a
token above every one before, and is refused while another holder's lease is unexpired
(HostLeaseHeldError, saying for how long). A taker waits until the previous holder's expiry plus a
grace before it touches units (`HostLeaseGrant.act_after_ms`): by then a holder that lost the lease
without knowing it has stopped by its own, earlier, local deadline. Renewals move the expiry and
append nothing. Expiry is always decided by the time the store's transaction stamps, never the
caller's say.
"""

from __future__ import annotations

from .canonical import iso_ms
from .errors import HostLeaseHeldError, InvalidInputError
from .events import MAX_HOST_LEASE_TTL_MS, MIN_HOST_LEASE_TTL_MS, HostLeaseAcquired, safe_holder
from .handle import RunnerHandle, UnknownRunnerError
from .host_fence import HostLeaseGrant, check_grant
from .replay import Folded
from .runner import apply
from .values import safe_int

DEFAULT_HOST_LEASE_TTL_MS = 15_000
DEFAULT_HOST_LEASE_GRACE_MS = 2_000


class HostLeaseCommands(RunnerHandle):
    """The host lease commands of a `RunnerLifecycle` (see the module)."""

    @property
    def host_grant(self) -> HostLeaseGrant | None:
        """The host lease this handle writes under, or None (then its writes are not fenced)."""
        return self._host_grant

    def hold_host_lease(self, grant: HostLeaseGrant | None) -> None:
        """Write under `grant` from now on (a second handle of the holder), or under none."""
        if grant is not None and (not isinstance(grant, HostLeaseGrant) or grant.runner_id != self.runner_id):
            raise InvalidInputError("grant", f"grant must be a HostLeaseGrant of runner {self.runner_id}")
        self._host_grant = grant

    def take_host_lease(self, *, holder: str, ttl_ms: int = DEFAULT_HOST_LEASE_TTL_MS,
                        grace_ms: int = DEFAULT_HOST_LEASE_GRACE_MS) -> HostLeaseGrant:
        """Take the runner's host lease: ``HostLeaseAcquired`` with the next token; this handle then writes under it.

        HostLeaseHeldError, appending nothing, while another holder's lease is unexpired. The grant's
        ``act_after_ms`` is when units may first be touched (the previous holder's expiry + `grace_ms`).
        """
        holder = safe_holder(holder)
        ttl_ms = safe_int(ttl_ms, "ttl_ms", MIN_HOST_LEASE_TTL_MS, MAX_HOST_LEASE_TTL_MS)
        grace_ms = safe_int(grace_ms, "grace_ms", 0, MAX_HOST_LEASE_TTL_MS)
        with self.store.transaction("take host lease") as tx:
            current = self._catch_up(tx)
            if current.state is None:
                raise UnknownRunnerError(f"runner {self.runner_id} is not initialized (call initialize() first)")
            self._check_identity(current.state)
            now_ms = self._stamp(tx, current.state)
            lease_ms = tx.lease_clock(now_ms)
            row = tx.host_lease(self.runner_id)
            act_after_ms = lease_ms
            if row is not None and row[0] != holder:
                if lease_ms < row[2]:
                    raise HostLeaseHeldError(self.runner_id, row[0], row[2] - lease_ms)
                act_after_ms = max(lease_ms, row[2] + grace_ms)
            token = max(row[1] if row is not None else 0, current.state.host_token) + 1
            at = iso_ms(now_ms)
            event = HostLeaseAcquired(holder=holder, token=token, ttl_ms=ttl_ms)
            state = apply(current.state, event, now_ms, at)
            recorded = tx.append_unchecked(self.runner_id, [event], expected_version=current.version, at=at)
            tx.put_host_lease(self.runner_id, holder, token, lease_ms + ttl_ms)
        self._folded = Folded(state, recorded[-1].version, recorded[-1].seq)
        grant = HostLeaseGrant(runner_id=self.runner_id, holder=holder, token=token, ttl_ms=ttl_ms, taken_ms=lease_ms,
                               expires_ms=lease_ms + ttl_ms, act_after_ms=act_after_ms)
        self._host_grant = grant
        return grant

    def renew_host_lease(self, grant: HostLeaseGrant) -> HostLeaseGrant:
        """Move the lease's expiry to the store's now + ttl; no event. HostFencedError when it is no longer held."""
        self._check_grant_arg(grant)
        with self.store.transaction("renew host lease") as tx:
            now_ms = tx.lease_clock(self._stamp(tx, None))
            check_grant(tx, grant, now_ms)
            tx.put_host_lease(self.runner_id, grant.holder, grant.token, now_ms + grant.ttl_ms)
        return HostLeaseGrant(runner_id=grant.runner_id, holder=grant.holder, token=grant.token, ttl_ms=grant.ttl_ms,
                              taken_ms=grant.taken_ms, expires_ms=now_ms + grant.ttl_ms,
                              act_after_ms=grant.act_after_ms)

    def release_host_lease(self, grant: HostLeaseGrant) -> bool:
        """Let the lease go (its holder stopped acting): a standby may take it and act at once.

        Whether it was still held by `grant`; a lease another took already is left alone. The token
        stays, so the next one is still greater. This handle no longer writes under `grant`.
        """
        self._check_grant_arg(grant)
        if self._host_grant == grant:
            self._host_grant = None
        with self.store.transaction("release host lease") as tx:
            row = tx.host_lease(self.runner_id)
            if row is None or row[:2] != (grant.holder, grant.token):
                return False
            tx.put_host_lease(self.runner_id, grant.holder, grant.token, 0)
        return True

    def _check_grant_arg(self, grant: object) -> None:
        if not isinstance(grant, HostLeaseGrant) or grant.runner_id != self.runner_id:
            raise InvalidInputError("grant", f"grant must be a HostLeaseGrant of runner {self.runner_id}")


__all__ = ["DEFAULT_HOST_LEASE_GRACE_MS", "DEFAULT_HOST_LEASE_TTL_MS", "HostLeaseCommands", "HostLeaseGrant",
           "safe_holder"]
