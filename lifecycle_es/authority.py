"""Lease profiles and the lease authority check a session runs against the log.

`lifecycle_profile_from_lease(receipt)` cuts the profile a session carries from its lease receipt.
`assert_lease_authority(profile, target)` opens the authority file the profile names, read-only,
rebuilds the runner from its events and checks that the profile still holds (the fences of
``fences.py``: the identity first, then what may have moved on since the receipt was issued).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from .backends import is_url
from .canonical import MAX_EPOCH_MS
from .errors import InvalidInputError, LifecycleError, StaleFenceError
from .fences import AUTHORITY_STALE, check_identity, check_lease_authority, named
from .receipts import LeaseAuthority, LeaseProfile, LeaseReceipt, LeaseRef
from .replay import load
from .store import EventStore
from .values import safe_id, safe_target, shown


def lifecycle_profile_from_lease(receipt: LeaseReceipt) -> LeaseProfile:
    """The lifecycle profile of a lease receipt: what a session carries to prove its authority."""
    if not isinstance(receipt, LeaseReceipt):
        raise InvalidInputError("receipt", f"runner lease receipt is required, got {type(receipt).__name__}")
    return LeaseProfile(
        runner_id=receipt.runner_id, authority_file=receipt.authority_file, state=receipt.state,
        generation=receipt.runner_generation,
        lease=LeaseRef(id=receipt.lease.id, generation=receipt.lease.generation, expires_at=receipt.lease.expires_at),
        proxy_authority=receipt.proxy_authority, base_dir=receipt.base_dir, resources=receipt.resources,
        post_session_hook=receipt.post_session_hook,
    )


def _profile(profile: LeaseProfile | Mapping[str, Any]) -> LeaseProfile:
    if isinstance(profile, LeaseProfile):
        return profile
    if not isinstance(profile, Mapping):
        raise InvalidInputError("profile", f"runner lifecycle authority is required, got {type(profile).__name__}")
    try:
        return msgspec.convert(profile, LeaseProfile)
    except (msgspec.ValidationError, LifecycleError) as exc:
        raise InvalidInputError("profile", f"runner lifecycle authority is invalid: {exc}") from None


def assert_lease_authority(profile: LeaseProfile | Mapping[str, Any], target: str, *,
                           now: Callable[[], int] | None = None) -> LeaseAuthority:
    """Check that `profile` still holds authority on `target`, reading its authority file read-only.

    Raises StaleFenceError ("runner lease authority is stale", and the one cause) when the runner
    moved on: not accepting, another generation, other resources, proxy authority or hook, or the
    lease ended, was replaced or expired. A different runner, target or base dir is a LifecycleError
    ("identity drifted"). `now`: a zero-argument callable returning epoch milliseconds (default: the
    system clock).
    """
    profile = _profile(profile)
    target = safe_target(target)
    path = profile.authority_file
    # A store on a server is named by its URL (a receipt's authority_file is the store's path).
    if (type(path) is not str or not (is_url(path) or os.path.isabs(path)) or len(path) > 4096
            or "\0" in path):
        raise InvalidInputError("profile.authority_file", f"runner authority file is invalid: {shown(path)} is not "
                                                          "an absolute path or a store URL (take the profile from a "
                                                          "lease receipt)")
    safe_id(profile.runner_id, "profile.runner_id")
    if now is not None and not callable(now):
        raise InvalidInputError("now", f"now must be a callable returning epoch milliseconds, got "
                                       f"{type(now).__name__}")
    with EventStore.open(path if is_url(path) else os.path.normpath(path), read_only=True) as store:
        state = load(store, profile.runner_id).state
    if state is None:
        raise StaleFenceError(f"{AUTHORITY_STALE} (lease_id {named(profile.lease.id)}): runner {profile.runner_id} "
                              f"has no events in {shown(path)} (the profile names another store, or a runner never "
                              "initialized)")
    check_identity(state, profile.runner_id, target, profile.base_dir.path)
    now_ms = (now or (lambda: time.time_ns() // 1_000_000))()
    if type(now_ms) is not int or not 0 <= now_ms <= MAX_EPOCH_MS:
        raise InvalidInputError("now", f"now() must return epoch milliseconds as an int, got {shown(now_ms)}")
    lease = check_lease_authority(state, profile, now_ms)
    return LeaseAuthority(runner_id=state.runner_id, target=state.target, state=state.state,
                          generation=state.generation, lease_id=lease.id, lease_generation=lease.generation,
                          proxy_authority=state.proxy_authority)
