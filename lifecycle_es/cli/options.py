"""Option types shared by the commands, so that one flag reads the same everywhere.

``-r/--runner R`` is a runner id, refused as bad usage (64) before any file is opened when it cannot
be one; ``--since/--until T`` is an ISO-8601 time, UTC unless it names an offset (`since`, `when`);
``-n/--lines N`` is a count of events or ``all``. Every number the command line reads goes through
`integer` or `seconds`: ASCII digits only, as a person types them (Python's ``int`` and ``float`` also
take other scripts' digits, Arabic-Indic or full-width ones, underscores and spaces, which no option means).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import datetime

from lifecycle_es.canonical import iso_ms, parse_iso_ms
from lifecycle_es.values import MAX_SAFE_INTEGER, safe_id, shown

__all__ = [
    "ALL",
    "ascii_int",
    "int_at_least",
    "integer",
    "lines",
    "runner_id",
    "seconds",
    "since",
    "when",
    "window_order",
]

ALL = -1  # what ``-n all`` parses to: no limit


def runner_id(text: str) -> str:
    """An argparse type: a runner id (the rules' id syntax)."""
    try:
        return safe_id(text, "runner")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# The times ISO-8601 spells with four-digit years, in UTC: 0001-01-01T00:00:00.000Z to 9999-12-31T23:59:59.999Z.
FIRST_MS, LAST_MS = -62_135_596_800_000, 253_402_300_799_999


def when(text: str) -> int:
    """An argparse type: epoch ms of an ISO-8601 time; one without an offset is UTC, a date alone its midnight.

    Its offset may not take it outside the years 0001 to 9999 in UTC, which no time can be spelled in. A time
    finer than a millisecond is cut down to the millisecond it falls in (what ``--until`` wants; ``--since``
    takes `since`).
    """
    return _epoch_ms(text, ceiling=False)


def since(text: str) -> int:
    """`when` for the start of a window: a time finer than a millisecond is raised to the next one, so that an
    event stamped the millisecond before it (the store writes no finer time) is not taken as at or after it."""
    return _epoch_ms(text, ceiling=True)


def _epoch_ms(text: str, *, ceiling: bool) -> int:
    value = text.strip()
    if len(value) <= 64 and value.isascii():
        for candidate in (value, value + "Z", value + "T00:00:00Z"):
            try:
                epoch_ms = parse_iso_ms(candidate)
                finer = ceiling and _finer_than_ms(candidate)
            except (ValueError, OverflowError):
                continue
            if not FIRST_MS <= epoch_ms <= LAST_MS:
                raise argparse.ArgumentTypeError(f"{text!r} is outside the years 0001 to 9999 in UTC: give a time "
                                                 "inside them")
            return epoch_ms + finer
    raise argparse.ArgumentTypeError(f"{text[:64]!r} is not an ISO-8601 time (like 2026-03-02T10:00:00Z)")


def _finer_than_ms(candidate: str) -> bool:
    """Whether a time `parse_iso_ms` read names part of a millisecond (its offset's seconds included)."""
    moment = datetime.fromisoformat(candidate[:-1] + "+00:00" if candidate.endswith(("Z", "z")) else candidate)
    offset = moment.utcoffset()
    return bool(moment.microsecond % 1000 or (offset is not None and offset.microseconds % 1000))


def window_order(since_ms: int | None, until_ms: int | None) -> str | None:
    """Why ``--since``/``--until`` select nothing, when the first is after the second (else None)."""
    if since_ms is None or until_ms is None or since_ms <= until_ms:
        return None
    # A --since raised to the next millisecond can pass the last one of 9999, which no time is spelled in.
    low = iso_ms(since_ms) if since_ms <= LAST_MS else "a time past the last millisecond of 9999"
    return f"--since {low} is after --until {iso_ms(until_ms)}: the window holds nothing; give --since the earlier time"


def lines(text: str) -> int:
    """An argparse type: a count of events (0 or more), or ``all`` (`ALL`) for no limit."""
    if text.strip().lower() == "all":
        return ALL
    value = integer(text, "a count of events (a number, or 'all')")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a count of events (0 or more, or 'all')")
    return value


# A '-' is read so that a negative number is refused by its bound ("-1 is not at least 1"), not as no number.
_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")
# More digits than any bound here has: refused by the bound without making the int (Python will not make
# one of over 4300 digits from text).
_MAX_DIGITS = 30
_PAST_EVERY_BOUND: int = 10**_MAX_DIGITS


def ascii_int(text: str) -> int | None:
    """`text` as an int when it is ASCII digits (a leading '-' allowed), else None: the one reading of a
    number the command line is given. More than 30 digits read as 10**30 (or its negative): past every bound."""
    if _INTEGER.fullmatch(text) is None:
        return None
    if len(text.lstrip("-")) > _MAX_DIGITS:
        return -_PAST_EVERY_BOUND if text.startswith("-") else _PAST_EVERY_BOUND
    return int(text, 10)


def integer(text: str, what: str = "an integer") -> int:
    """`ascii_int` for argparse: argparse.ArgumentTypeError saying `text` is not `what` when it is None."""
    value = ascii_int(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not {what}: write it in the digits 0-9")
    return value


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an `integer` of at least `minimum` (0 for a seq, 1 for a count of workers), and at
    most `maximum` when given, else the largest seq a store holds (`values.MAX_SAFE_INTEGER`)."""

    def parse(text: str) -> int:
        value = integer(text)
        shown_value = shown(value) if len(text.lstrip("-")) <= _MAX_DIGITS else shown(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{shown_value} is not at least {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{shown_value} is more than {maximum}")
        # Refused here, naming the option, rather than deeper down as a field the command line never named
        # (or not at all: events -n 5 --after 10**20 printed nothing).
        if value > MAX_SAFE_INTEGER:
            raise argparse.ArgumentTypeError(f"{shown_value} is more than {MAX_SAFE_INTEGER}, the largest seq "
                                             "or count a store holds")
        return value

    return parse


def seconds(text: str) -> float:
    """An argparse type: a number of seconds, 0 or more, in ASCII digits with an optional fraction (``0.2``);
    argparse.ArgumentTypeError otherwise. Its bounds are the option's own, checked where it is used."""
    if len(text) > 64 or _DECIMAL.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number of seconds: write it in the digits 0-9, "
                                         "with a '.' before a fraction")
    return float(text)
