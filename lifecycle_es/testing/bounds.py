"""The original's constants and value checks, transliterated from its source.

The checks raise the library's errors, so the model and the library can be compared error for error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from ..canonical import MAX_EPOCH_MS, parse_iso_ms
from ..errors import AuthorityError, InvalidInputError
from ..values import ProxyAuthority

# The original's constants, copied from its source rather than imported: the model must not share a
# mistake with the code it checks.
SCHEMA = "cc-execution-location-runner-lifecycle/v1"
TARGETS = ("local", "wsl", "ssh", "container")
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,255}")
_DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}")
_ID_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_ID_CHARS = _ID_FIRST + "._:@+-"
MAX_SAFE_INTEGER = 2**53 - 1
MAX_PROXY_AGE_MS = 5 * 60 * 1000
MAX_PROXY_SKEW_MS = 30_000
MAX_RETAINED_LEASES = 1024
RETAINED_AFTER_RECLAIM = 256
TTL_BOUNDS = (1_000, 24 * 60 * 60 * 1000)
DRAIN_BOUNDS = (1, 10 * 60 * 1000)
PARK_REASONS = ("checkout-failure", "lost-poll", "resource-limit")
LEASE_DOMAIN = "chainlesschain.execution-location.runner-lease.v1\0"
BASE_DIR_DOMAIN = "chainlesschain.execution-location.base-dir.v1\0"
HOOK_DOMAIN = "chainlesschain.execution-location.post-session-hook.v1\0"
MIB = 1024 * 1024


# --- the original's value checks (raising the library's error kinds) -----------------------------------


def _id(value: object, field: str) -> str:
    if not isinstance(value, str) or _ID_RE.fullmatch(value) is None:
        raise InvalidInputError(field, f"{field} is invalid")
    return value


def _digest(value: object, field: str) -> str:
    if not isinstance(value, str) or _DIGEST_RE.fullmatch(value) is None:
        raise InvalidInputError(field, f"{field} is invalid")
    return value


def _integer(value: object, field: str, minimum: int = 0, maximum: int = MAX_SAFE_INTEGER) -> int:
    # The original's Number() would take "3" or true; the library refuses anything but an int, and so do we.
    if type(value) is not int or not minimum <= value <= maximum:
        raise InvalidInputError(field, f"{field} is invalid")
    return value


def _timestamp_ms(value: object, field: str) -> int:
    if isinstance(value, datetime) and value.utcoffset() is not None:
        millis = int(value.timestamp() * 1000)
    elif isinstance(value, str) and len(value) <= 64 and value.isascii():
        try:
            millis = parse_iso_ms(value)
        except (ValueError, OverflowError):
            raise InvalidInputError(field, f"{field} is invalid") from None
    else:
        raise InvalidInputError(field, f"{field} is invalid")
    if not 0 <= millis <= MAX_EPOCH_MS:
        raise InvalidInputError(field, f"{field} is invalid")
    return millis


def _proxy(value: object) -> dict[str, Any]:
    """The original's validateProxyAuthority, value part: shape, id, revision >= 1, timestamps."""
    data = msgspec.structs.asdict(value) if isinstance(value, ProxyAuthority) else value
    if not isinstance(data, Mapping) or sorted(map(str, data)) != ["expires_at", "id", "issued_at", "revision"]:
        raise InvalidInputError("proxy_authority", "proxy authority has an invalid schema")
    # The library validates the id with the rest of the value (a ProxyAuthority cannot even be built
    # with a bad one), where the original checks it after freshness.
    return {"id": _id(data["id"], "proxy_authority.id"),
            "revision": _integer(data["revision"], "proxy_authority.revision", 1),
            "issuedAt": _timestamp_ms(data["issued_at"], "proxy_authority.issued_at"),
            "expiresAt": _timestamp_ms(data["expires_at"], "proxy_authority.expires_at")}


def _min_revision(proxy: dict[str, Any], minimum: int) -> None:
    if proxy["revision"] < max(1, minimum):
        raise InvalidInputError("proxy_authority.revision", "proxy authority revision is invalid")


def _fresh(proxy: dict[str, Any], now_ms: int) -> None:
    if (proxy["issuedAt"] > now_ms + MAX_PROXY_SKEW_MS or now_ms - proxy["issuedAt"] > MAX_PROXY_AGE_MS
            or proxy["expiresAt"] <= now_ms):
        raise AuthorityError("execution location proxy authority is not fresh")
