"""What the lifecycle's commands return: frozen snapshots, receipts and authorities.

Receipt digests are sha256 over a domain string and the canonical JSON of the receipt's material,
whose keys are camelCase: a receipt from this library digests the same as one from the JavaScript
runner lifecycle it follows, so a host being ported can compare them.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from .canonical import receipt_digest
from .state import Drain, Lease, ProxyRef, RunnerState, lease_counts
from .values import ProxyAuthority, Resources

LEASE_DOMAIN = "chainlesschain.execution-location.runner-lease.v1\x00"
BASE_DIR_DOMAIN = "chainlesschain.execution-location.base-dir.v1\x00"


class RunnerSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A runner as callers see it: its fields and lease counts, not its leases."""

    schema: str
    runner_id: str
    target: str
    state: str
    accepting: bool
    generation: int
    policy_revision: int
    base_dir_digest: str
    resources: Resources
    proxy_authority: ProxyRef
    drain: Drain | None
    active_lease_count: int
    parked_lease_count: int
    settled_lease_count: int
    updated_at: str


class LeaseParkSnapshot(RunnerSnapshot, frozen=True, kw_only=True):
    """`park_lease`'s result: the snapshot and the reason the lease was parked."""

    park_reason: str


class DrainParkSnapshot(RunnerSnapshot, frozen=True, kw_only=True):
    """`park_expired_drain`'s result: the snapshot and how many active leases it parked."""

    newly_parked_lease_count: int


class BaseDirClaim(msgspec.Struct, frozen=True, kw_only=True):
    """The base directory a lease may write in (always required writable)."""

    path: str
    writable_required: bool = True


class PostSessionHook(msgspec.Struct, frozen=True, kw_only=True):
    """The post-session hook a lease is bound to: its digest and the lease generation."""

    digest: str
    generation: int


class LeaseReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """What `acquire_lease` and `refresh_lease_authority` return: the lease and everything it binds."""

    runner_id: str
    target: str
    authority_file: str
    state: str
    runner_generation: int
    lease: Lease
    proxy_authority: ProxyAuthority
    base_dir: BaseDirClaim
    resources: Resources
    post_session_hook: PostSessionHook
    lease_receipt_digest: str


class PollResult(msgspec.Struct, frozen=True, kw_only=True):
    """What `assert_poll` returns when the lease may still poll."""

    runner_id: str
    runner_generation: int
    lease_id: str
    lease_generation: int
    state: str
    proxy_authority: ProxyRef


class HookReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """What `authorize_post_session_hook` returns; ``receipt_digest`` is recorded on the lease."""

    runner_id: str
    runner_generation: int
    lease_id: str
    lease_generation: int
    result_digest: str
    hook_digest: str
    receipt_digest: str


class LeaseRef(msgspec.Struct, frozen=True, kw_only=True):
    """A lease as a profile names it: id, generation, expiry."""

    id: str
    generation: int
    expires_at: str


class LeaseProfile(msgspec.Struct, frozen=True, kw_only=True):
    """The lifecycle profile a session carries, cut from its lease receipt by `lifecycle_profile_from_lease`."""

    runner_id: str
    authority_file: str
    state: str
    generation: int
    lease: LeaseRef
    proxy_authority: ProxyAuthority
    base_dir: BaseDirClaim
    resources: Resources
    post_session_hook: PostSessionHook


class LeaseAuthority(msgspec.Struct, frozen=True, kw_only=True):
    """What `assert_lease_authority` returns when the profile still holds authority."""

    runner_id: str
    target: str
    state: str
    generation: int
    lease_id: str
    lease_generation: int
    proxy_authority: ProxyRef


def base_dir_digest(base_dir: str) -> str:
    """The digest of a base directory path a snapshot shows (the path itself stays out of it)."""
    if type(base_dir) is str:
        return _base_dir_digest(base_dir)
    return receipt_digest(BASE_DIR_DOMAIN, base_dir)


# Every snapshot of a runner digests the same base dir: a sha256 over canonical JSON, once.
@functools.lru_cache(maxsize=256)
def _base_dir_digest(base_dir: str) -> str:
    return receipt_digest(BASE_DIR_DOMAIN, base_dir)


def project(state: RunnerState) -> RunnerSnapshot:
    """A runner's public snapshot from its state."""
    # The counts come from the state's lease index (kept as events are folded), not a scan of its leases.
    active, parked, settled = lease_counts(state)
    return RunnerSnapshot(
        schema=state.schema, runner_id=state.runner_id, target=state.target, state=state.state,
        accepting=state.state == "accepting", generation=state.generation, policy_revision=state.policy_revision,
        base_dir_digest=base_dir_digest(state.base_dir), resources=state.resources,
        proxy_authority=state.proxy_authority, drain=state.drain, active_lease_count=active,
        parked_lease_count=parked, settled_lease_count=settled, updated_at=state.updated_at,
    )


def lease_material(lease: Lease) -> dict[str, Any]:
    """A lease as a receipt's material holds it (camelCase keys)."""
    return {
        "id": lease.id,
        "sessionId": lease.session_id,
        "generation": lease.generation,
        "issuedAt": lease.issued_at,
        "expiresAt": lease.expires_at,
        "status": lease.status,
        "resultDigest": lease.result_digest,
        "hookReceiptDigest": lease.hook_receipt_digest,
    }


def lease_receipt(*, state: RunnerState, authority_file: str, runner_generation: int, lease: Lease,
                  proxy: ProxyAuthority) -> LeaseReceipt:
    """Build a lease receipt and its digest over its camelCase material."""
    material = {
        "runnerId": state.runner_id,
        "target": state.target,
        "authorityFile": authority_file,
        "state": state.state,
        "runnerGeneration": runner_generation,
        "lease": lease_material(lease),
        "proxyAuthority": {"id": proxy.id, "revision": proxy.revision, "issuedAt": proxy.issued_at,
                           "expiresAt": proxy.expires_at},
        "baseDir": {"path": state.base_dir, "writableRequired": True},
        "resources": {"cpuSeconds": state.resources.cpu_seconds, "memoryBytes": state.resources.memory_bytes},
        "postSessionHook": {"digest": state.post_session_hook_digest, "generation": lease.generation},
    }
    return LeaseReceipt(
        runner_id=state.runner_id, target=state.target, authority_file=authority_file, state=state.state,
        runner_generation=runner_generation, lease=lease, proxy_authority=proxy,
        base_dir=BaseDirClaim(path=state.base_dir), resources=state.resources,
        post_session_hook=PostSessionHook(digest=state.post_session_hook_digest, generation=lease.generation),
        lease_receipt_digest=receipt_digest(LEASE_DOMAIN, material),
    )
