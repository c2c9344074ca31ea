"""Value types and the validation of every value a caller can pass.

Bounds: ids ``^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,255}$``, digests ``^sha256:[a-f0-9]{64}$``,
cpu_seconds 1..86400, memory_bytes 64 MiB..64 GiB. A refused value raises `InvalidInputError` naming
the field and the value (cut short when long); booleans and floats are never integers here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from .canonical import KNOWN_TIMES, timestamp
from .errors import InvalidInputError

ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,255}")
DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}")
_force_setattr = msgspec.structs.force_setattr
TARGETS = ("local", "wsl", "ssh", "container")
MAX_SAFE_INTEGER = 2**53 - 1
MAX_PATH_CHARS = 4096
MIB = 1024 * 1024
GIB = 1024 * MIB


def shown(value: object) -> str:
    """A value as an error message may show it: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def not_plain(value: object, field: str) -> InvalidInputError | None:
    """The InvalidInputError of a value of a subclass of str, int or float (None for any other value).

    A subclass can answer ``==``, ``hash``, ``str()`` and ``encode()`` otherwise than its characters or its
    number do: one that passed a check as one id, choice or bound could be stored, hashed or compared as
    another. So where a plain value is asked for, only that type itself is taken (a bool, which cannot be
    subclassed, is left to the caller's own check). The message shows the
    type's name only: the value's own ``repr`` is the subclass's to answer.
    """
    kind = type(value)
    # bool cannot be subclassed, and answers as its own value: the callers' own messages refuse it.
    if kind in (str, int, float, bool) or not isinstance(value, str | int | float):
        return None
    base = "str" if isinstance(value, str) else ("int" if isinstance(value, int) else "float")
    return InvalidInputError(field, f"{field} is invalid: a {kind.__name__} (a subclass of {base}) is not a plain "
                                    f"{base}: pass a plain {base}")


def safe_id(value: object, field: str) -> str:
    """An identifier: 1-256 of ``A-Z a-z 0-9 . _ : @ + -``, starting alphanumeric, as a plain str; or
    InvalidInputError."""
    if type(value) is not str or ID_RE.fullmatch(value) is None:
        raise not_plain(value, field) or InvalidInputError(
            field, f"{field} is invalid: {shown(value)} is not an id (1-256 of A-Z a-z 0-9 . _ : @ + -, starting "
                   "alphanumeric)")
    return value


def safe_digest(value: object, field: str) -> str:
    """A ``sha256:<64 hex>`` digest as a plain str, or InvalidInputError."""
    if type(value) is not str or DIGEST_RE.fullmatch(value) is None:
        raise not_plain(value, field) or InvalidInputError(
            field, f"{field} is invalid: {shown(value)} is not sha256:<64 lowercase hex>")
    return value


def safe_choice(value: object, field: str, choices: tuple[str, ...], what: str | None = None) -> str:
    """One of `choices`, as a plain str, or InvalidInputError naming `field` (`what`: the value's name in the
    message, default the field) and the choices."""
    if type(value) is not str or value not in choices:
        raise not_plain(value, field) or InvalidInputError(
            field, f"{what or field} is invalid: {shown(value)} is not one of {', '.join(choices)}")
    return value


def safe_number(value: object, field: str, minimum: float, maximum: float, *, above: bool = False) -> float:
    """A plain int or float, finite, within [minimum, maximum] (above `minimum` when `above`), as a float; or
    InvalidInputError. Bools and subclasses are refused."""
    if type(value) is not int and type(value) is not float:
        raise not_plain(value, field) or InvalidInputError(
            field, f"{field} is invalid: {shown(value)} is not a number")
    number = float(value)
    if not (minimum < number if above else minimum <= number) or not number <= maximum:  # NaN fails both
        raise InvalidInputError(field, f"{field} is invalid: {shown(value)} is outside "
                                       f"{minimum:g}{' (excluded)' if above else ''}..{maximum:g}")
    return number


def safe_int(value: object, field: str, minimum: int = 0, maximum: int = MAX_SAFE_INTEGER) -> int:
    """An integer within [minimum, maximum]; bools, floats and strings are refused."""
    if type(value) is not int:
        raise not_plain(value, field) or InvalidInputError(field, f"{field} is invalid: {shown(value)} is not an "
                                                                  "integer")
    if not minimum <= value <= maximum:
        raise InvalidInputError(field, f"{field} is invalid: {value} is outside {minimum}..{maximum}")
    return value


MAX_ACTION_CHARS = 256


def safe_action(value: object, field: str = "action") -> str:
    """What a write is called in messages and errors: a plain str of 1..256 characters, or InvalidInputError."""
    if type(value) is not str or not 0 < len(value) <= MAX_ACTION_CHARS:
        raise not_plain(value, field) or InvalidInputError(
            field, f"{field} is invalid: {shown(value)} is not a name of 1..{MAX_ACTION_CHARS} characters for the "
                   "write (a plain str)")
    return value


def safe_callable(value: object, field: str, takes: str) -> None:
    """InvalidInputError naming `field` unless `value` is callable (`takes`: what it is called with, for the
    message): refused at the call, not as a TypeError when it is first called."""
    if not callable(value):
        raise InvalidInputError(field, f"{field} is invalid: a {type(value).__name__} is not callable (pass a "
                                       f"function taking {takes})")


def safe_progress(value: object, field: str = "progress", takes: str = "(done, total)") -> Any:
    """`value` when it is None or callable, else InvalidInputError naming `field`: a progress callback that cannot
    be called is refused at the call, not as a TypeError in the middle of the work it was to report on."""
    if value is not None:
        safe_callable(value, field, takes)
    return value


def safe_stop(value: object, field: str = "stop") -> Any:
    """`value` when it is an event a loop can watch (``is_set()`` and ``wait(timeout)``, as ``threading.Event``
    has), else InvalidInputError naming `field`."""
    if not callable(getattr(value, "is_set", None)) or not callable(getattr(value, "wait", None)):
        raise InvalidInputError(field, f"{field} is invalid: a {type(value).__name__} is not an event to watch "
                                       "(pass a threading.Event)")
    return value


def safe_path(value: object, field: str, what: str | None = None) -> str:
    """An absolute, normalized path (1..4096 characters, no NUL, text UTF-8 can hold), or InvalidInputError.

    Normalized as ``os.path.abspath`` leaves a path: no ``.`` or ``..`` part, no doubled or trailing
    slash. `what` names the value in the message (default: the field).
    """
    what = what or field
    if type(value) is not str:
        raise InvalidInputError(field, f"{what} is invalid: {type(value).__name__} is not a path")
    if not 1 <= len(value) <= MAX_PATH_CHARS or "\0" in value:
        raise InvalidInputError(field, f"{what} is invalid: empty, longer than {MAX_PATH_CHARS} characters, "
                                       "or holds NUL")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            # A lone surrogate (an undecodable byte smuggled through surrogateescape) has no UTF-8 form.
            raise InvalidInputError(field, f"{what} is invalid: {shown(value)} is not valid text "
                                           "(a lone surrogate)") from None
    if value[0] != "/" or os.path.normpath(value) != value:
        raise InvalidInputError(field, f"{what} is invalid: {shown(value)} is not an absolute, normalized path")
    return value


def safe_target(value: object, field: str = "target") -> str:
    """One of the targets a runner may run on: local, wsl, ssh, container (a plain str)."""
    return safe_choice(value, field, TARGETS, f"runner {field}")


def exact_mapping(value: object, fields: tuple[str, ...], field: str) -> Mapping[str, Any]:
    """A mapping with exactly `fields` as keys: none missing, none more."""
    if not isinstance(value, Mapping):
        raise InvalidInputError(field, f"{field} must be an object, got {type(value).__name__}")
    if sorted(value.keys(), key=str) != sorted(fields):
        keys = set(map(str, value.keys()))
        missing, unexpected = sorted(set(fields) - keys), sorted(keys - set(fields))
        extra = ", ".join(shown(key) for key in unexpected[:5]) + (", ..." if len(unexpected) > 5 else "")
        raise InvalidInputError(field, f"{field} has an invalid schema: missing {', '.join(missing) or 'none'}, "
                                       f"unexpected {extra or 'none'} (it takes exactly {', '.join(sorted(fields))})")
    return value


class Resources(msgspec.Struct, frozen=True, kw_only=True):
    """A runner's resource limits: CPU seconds (1..86400) and memory bytes (64 MiB..64 GiB)."""

    cpu_seconds: int
    memory_bytes: int

    def __post_init__(self) -> None:
        safe_int(self.cpu_seconds, "resources.cpu_seconds", 1, 86_400)
        safe_int(self.memory_bytes, "resources.memory_bytes", 64 * MIB, 64 * GIB)

    @classmethod
    def coerce(cls, value: object, field: str = "resources") -> Resources:
        """A Resources from itself or from a mapping with exactly its two keys."""
        if isinstance(value, Resources):
            return cls(cpu_seconds=value.cpu_seconds, memory_bytes=value.memory_bytes)
        data = exact_mapping(value, ("cpu_seconds", "memory_bytes"), field)
        return cls(cpu_seconds=data["cpu_seconds"], memory_bytes=data["memory_bytes"])


# Proxy ids `safe_id` passed (the last few thousand): a runner's authority is decoded again for every event
# it fronts, and a look-up costs a fifth of the pattern's match.
_PROXY_IDS: set[str] = set()
_PROXY_IDS_KEPT = 4096


class ProxyAuthority(msgspec.Struct, frozen=True, kw_only=True):
    """The proxy authority fronting a runner: its id, revision, and when it was issued and expires.

    Timestamps are ISO-8601 UTC strings (aware datetimes are normalized to them); freshness is not a
    property of the value but of the value at a time, so the lifecycle checks it against its clock.
    """

    id: str
    revision: int
    issued_at: str
    expires_at: str

    def __post_init__(self) -> None:
        # Each check's test first, its call (and message) only for a value that fails it: every authority a
        # replay decodes passes through here.
        proxy_id = self.id
        if type(proxy_id) is not str or proxy_id not in _PROXY_IDS:
            safe_id(proxy_id, "proxy_authority.id")
            if len(_PROXY_IDS) >= _PROXY_IDS_KEPT:
                _PROXY_IDS.clear()
            _PROXY_IDS.add(proxy_id)
        if type(self.revision) is not int or not 1 <= self.revision <= MAX_SAFE_INTEGER:
            safe_int(self.revision, "proxy_authority.revision", 1)
        # An aware datetime becomes the canonical string, so equal authorities compare and hash alike. A string
        # `timestamp` already found canonical is its own normal form: nothing to set.
        issued, expires = self.issued_at, self.expires_at
        if type(issued) is not str or issued not in KNOWN_TIMES:
            _force_setattr(self, "issued_at", timestamp(issued, "proxy_authority.issued_at"))
        if type(expires) is not str or expires not in KNOWN_TIMES:
            _force_setattr(self, "expires_at", timestamp(expires, "proxy_authority.expires_at"))

    @classmethod
    def coerce(cls, value: object, field: str = "proxy_authority") -> ProxyAuthority:
        """A ProxyAuthority from itself or a mapping with exactly id, revision, issued_at, expires_at."""
        if type(value) is ProxyAuthority:
            # Checked and normalized when it was built (or decoded, or replaced): nothing to do again.
            return value
        if isinstance(value, ProxyAuthority):
            data: Mapping[str, Any] = msgspec.structs.asdict(value)
        else:
            data = exact_mapping(value, ("id", "revision", "issued_at", "expires_at"), field)
        return cls(
            id=safe_id(data["id"], f"{field}.id"),
            revision=safe_int(data["revision"], f"{field}.revision", 1),
            issued_at=timestamp(data["issued_at"], f"{field}.issued_at"),
            expires_at=timestamp(data["expires_at"], f"{field}.expires_at"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The authority as a plain dict with snake_case keys."""
        return msgspec.structs.asdict(self)
