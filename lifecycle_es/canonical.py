"""Canonical bytes, timestamps and receipt digests.

Canonical bytes are msgspec JSON with sorted keys and no whitespace. One module-level encoder makes
them, so the bytes an event is stored as are always the bytes it is hashed as, and verification never
re-encodes. Floats are refused: a value that is not an integer has no single canonical spelling.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, cast

import msgspec

from .errors import InvalidInputError

_ENCODER = msgspec.json.Encoder(order="sorted")

# The latest instant a timestamp may name; beyond it ISO-8601 needs more than four year digits.
MAX_EPOCH_MS = 253_402_300_799_999
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Parsing is pure, and a replay parses the same strings over and over (a proxy authority's two
# timestamps on every lease it fronts, one `at` for all the events of a command): remember the last few
# thousand. Errors are not remembered; they are raised afresh each time.
_PARSED_CACHE = 4096


def canonical_bytes(value: Any) -> bytes:
    """The canonical JSON bytes of `value`: sorted keys, no whitespace, no floats."""
    _refuse_floats(value)
    return _ENCODER.encode(value)


def _refuse_floats(value: Any) -> None:
    if isinstance(value, float):
        raise InvalidInputError("value", f"canonical JSON holds integers only, got float {value!r}")
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list | tuple):
        items = value
    else:
        return
    # Most containers hold only plain values (a receipt's material is dicts of strings and integers):
    # one pass over their types in C, and a look into each item only when one is not plain.
    if set(map(type, items)) <= PLAIN_TYPES:
        return
    for item in items:
        if type(item) not in PLAIN_TYPES:
            _refuse_floats(item)


# The types whose values are never floats, nor hold one: what `struct_bytes` lets by without a look.
PLAIN_TYPES: frozenset[type] = frozenset({str, int, bool, type(None)})


def struct_bytes(value: msgspec.Struct, float_free: frozenset[type] = PLAIN_TYPES) -> bytes:
    """``canonical_bytes(msgspec.to_builtins(value))``, byte for byte, without building the builtins.

    The sorted encoder writes a Struct's fields in the same order as the dict `to_builtins` makes of
    it, so only the float refusal needs the fields. A Struct does not check its field types when it is
    built, so they are looked at here: one pass over the field values' types, in C, where every type
    is in `float_free` (plain values, and Struct types the caller knows refuse floats when they are
    built); a field of any other type is looked into as `canonical_bytes` would.
    """
    _refuse_floats_in(msgspec.structs.astuple(value), float_free)
    return _ENCODER.encode(value)


def structs_bytes(values: Iterable[Any], float_free: frozenset[type] = PLAIN_TYPES, kind: type = msgspec.Struct,
                  refuse: Callable[[object], None] | None = None) -> list[bytes]:
    """`struct_bytes` of each value, in one pass (a batch pays the calls per value once, not thrice).

    A value that is not a `kind` is passed to `refuse` (which raises) before anything after it is
    looked at, so a batch fails at its first bad value whichever way it is bad.
    """
    astuple, encode, look = msgspec.structs.astuple, _ENCODER.encode, _refuse_floats_in
    out: list[bytes] = []
    for value in values:
        if not isinstance(value, kind):
            if refuse is not None:
                refuse(value)
            raise InvalidInputError("value", f"expected a {kind.__name__}, got {type(value).__name__}")
        fields = astuple(cast(msgspec.Struct, value))
        if not set(map(type, fields)) <= float_free:
            look(fields, float_free)
        out.append(encode(value))
    return out


def _refuse_floats_in(values: tuple[Any, ...], float_free: frozenset[type]) -> None:
    if set(map(type, values)) <= float_free:
        return
    for value in values:
        if type(value) in float_free:
            continue
        if isinstance(value, msgspec.Struct):
            _refuse_floats_in(msgspec.structs.astuple(value), float_free)
        elif type(value) is tuple:
            _refuse_floats_in(value, float_free)
        else:
            _refuse_floats(msgspec.to_builtins(value))


def receipt_digest(domain: str, material: Any) -> str:
    """A receipt digest as the original computes it: ``sha256:`` over a domain string and canonical JSON.

    The domain string ends in NUL, so no receipt of one kind can be replayed as another kind.
    """
    digest = hashlib.sha256()
    digest.update(domain.encode())
    digest.update(canonical_bytes(material))
    return "sha256:" + digest.hexdigest()


def iso_ms(epoch_ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC with milliseconds and ``Z`` (JavaScript's ``toISOString``)."""
    seconds, millis = divmod(epoch_ms, 1000)
    return f"{_second_text(seconds)}.{millis:03d}Z"


# Formatting the date costs ten times the rest, and the times a runner stamps share a few seconds (now,
# and a lease's expiry or a drain's deadline a fixed while later): remember the last few hundred.
@functools.lru_cache(maxsize=256)
def _second_text(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def canonical_ms(text: object) -> int | None:
    """Epoch milliseconds of `text` when it is a time in the one spelling the store writes (`iso_ms`'s:
    ``YYYY-MM-DDTHH:MM:SS.mmmZ``, between 1970 and 9999), else None.

    The same answer as ``iso_ms(parse_iso_ms(text)) == text`` and the range check, several times cheaper
    (every event replayed asks it of its time): the tail ``.mmmZ`` is one look-up among the thousand
    spellings there are, and the date part, which a log's times share with their neighbours, is proved
    once per second and remembered (`_SECONDS`).
    """
    if type(text) is not str or len(text) != 24:
        return None
    millis = _MILLIS.get(text[19:])
    if millis is None:
        return None
    second = _SECONDS.get(text[:19])
    if second is None:
        second = _canonical_seconds(text[:19])
    return second + millis if second >= 0 else None


# Every ``.mmmZ`` tail there is, with its milliseconds (ASCII digits only: other digits are no spelling).
_MILLIS = {f".{millis:03d}Z": millis for millis in range(1000)}
# ``YYYY-MM-DDTHH:MM:SS`` prefixes proved, with the epoch milliseconds of their second (-1: not `iso_ms`'s
# spelling of a second). A plain dict, emptied when full: a look-up costs a third of a cached call's.
_SECONDS: dict[str, int] = {}


def _canonical_seconds(prefix: str) -> int:
    """Epoch milliseconds of the second ``YYYY-MM-DDTHH:MM:SS`` when it is spelled as `iso_ms` spells that
    second, else -1; remembered in `_SECONDS`.

    A log's seconds share their minute with their neighbours: the minute ``YYYY-MM-DDTHH:MM:`` is proved
    once (`_MINUTES`) and the second's ``SS`` is one look-up among the sixty spellings there are.
    """
    minute = _MINUTES.get(prefix[:17])
    if minute is None:
        minute = _canonical_minute(prefix[:17])
    offset = _SECOND_OF_MINUTE.get(prefix[17:])
    second = minute + offset if minute >= 0 and offset is not None else -1
    if len(_SECONDS) >= _PARSED_CACHE:
        _SECONDS.clear()
    _SECONDS[prefix] = second
    return second


# ``SS`` for every second of a minute, with its milliseconds (no leap second: `iso_ms` never spells one).
_SECOND_OF_MINUTE = {f"{second:02d}": second * 1000 for second in range(60)}
# ``YYYY-MM-DDTHH:MM:`` prefixes proved, with the epoch milliseconds of their minute (-1: not `iso_ms`'s
# spelling of a minute between 1970 and 9999); emptied when full.
_MINUTES: dict[str, int] = {}


def _canonical_minute(prefix: str) -> int:
    """Epoch milliseconds of the minute ``YYYY-MM-DDTHH:MM:`` when `iso_ms` spells it so, else -1; remembered."""
    try:
        moment = datetime.fromisoformat(prefix + "00+00:00")
    except ValueError:
        seconds = -1
    else:
        delta = moment - _EPOCH
        seconds = delta.days * 86_400 + delta.seconds
        # The spelling checked against the parsed moment's own (a strftime costs several times this).
        if not 0 <= seconds <= MAX_EPOCH_MS // 1000 or moment.isoformat()[:17] != prefix:
            seconds = -1
    minute = seconds * 1000 if seconds >= 0 else -1
    if len(_MINUTES) >= _PARSED_CACHE:
        _MINUTES.clear()
    _MINUTES[prefix] = minute
    return minute


def parse_iso_ms(value: str) -> int:
    """Epoch milliseconds of an ISO-8601 timestamp that names its offset; raises ValueError otherwise."""
    if type(value) is str:
        return _parsed(value)
    return _parse(value)


def _parse(value: str) -> int:
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError("timestamp has no UTC offset")
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


_parsed = functools.lru_cache(maxsize=_PARSED_CACHE)(_parse)


@functools.lru_cache(maxsize=_PARSED_CACHE)
def _canonical_text(millis: int) -> str:
    return iso_ms(millis)


def timestamp(value: object, field: str) -> str:
    """Normalize an input timestamp (ISO string or aware datetime) to the canonical ISO form.

    Naive datetimes and strings with no offset are refused: a runner's authority must not depend on
    the local time zone of whoever wrote the value.
    """
    if type(value) is str:
        if value in KNOWN_TIMES:
            return value
        # A string already in the canonical spelling is its own normal form: `canonical_ms` proves it without
        # the parse and format `_timestamp` costs (a replay meets each proxy authority's new times here).
        millis = canonical_ms(value)
        if millis is not None:
            if len(KNOWN_TIMES) >= _PARSED_CACHE:
                KNOWN_TIMES.clear()
            KNOWN_TIMES[value] = millis
            return value
        return _text_timestamp(value, field)
    return _timestamp(value, field)


def _timestamp(value: object, field: str) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidInputError(field, f"{field} is invalid: a naive datetime has no time zone")
        # Exact integer arithmetic: value.timestamp() * 1000 is a float, and floors 536870.911 s to ...910 ms.
        delta = value - _EPOCH
        millis = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    elif isinstance(value, str):
        if len(value) > 64 or not value.isascii():
            raise InvalidInputError(field, f"{field} is invalid: not an ISO-8601 timestamp")
        try:
            millis = parse_iso_ms(value)
        except (ValueError, OverflowError):
            raise InvalidInputError(field, f"{field} is invalid: {value!r} is not an ISO-8601 UTC timestamp") from None
    else:
        raise InvalidInputError(field, f"{field} is invalid: expected an ISO-8601 string or aware datetime")
    if not 0 <= millis <= MAX_EPOCH_MS:
        raise InvalidInputError(field, f"{field} is invalid: {value!r} is out of range")
    return _canonical_text(millis)


# The answer for a string is pure, so the last few thousand are remembered (errors are not: they are
# raised afresh each time).
_text_timestamp = functools.lru_cache(maxsize=_PARSED_CACHE)(_timestamp)
KNOWN_TIMES: dict[str, int] = {}
"""Strings `timestamp` found canonical, with their epoch milliseconds (the last few thousand; emptied when
full). Every proxy authority a replay decodes holds two times that recur for each event it fronts: a
look-up here spares both their normalizing (``ProxyAuthority``) and their parsing (``fences.check_fresh``)."""
