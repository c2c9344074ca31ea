"""Option types shared by the commands, so that one flag reads the same everywhere.

``-r/--runner R`` is a runner id, refused as bad usage (64) before any file is opened when it cannot
be one; ``--since/--until T`` is an ISO-8601 time, UTC unless it names an offset (`since`, `when`);
``-n/--lines N`` is a count of events or ``all``.
"""

from __future__ import annotations

import argparse
from datetime import datetime

from lifecycle_es.canonical import iso_ms, parse_iso_ms
from lifecycle_es.values import safe_id

__all__ = ["ALL", "lines", "runner_id", "since", "when", "window_order"]

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
    return (f"--since {iso_ms(since_ms)} is after --until {iso_ms(until_ms)}: the window holds nothing; give "
            "--since the earlier time")


def lines(text: str) -> int:
    """An argparse type: a count of events (0 or more), or ``all`` (`ALL`) for no limit."""
    if text.strip().lower() == "all":
        return ALL
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:64]!r} is not a count of events (a number, or 'all')") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a count of events (0 or more, or 'all')")
    return value
