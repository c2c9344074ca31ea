"""What the command line prints for people: aligned tables, and a progress bar on a terminal.

Machines get ``--json`` instead; nothing here is meant to be parsed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from .exits import printable

# A bar is worth drawing only when the work takes long enough to wonder about.
PROGRESS_MIN_TOTAL = 50_000
PROGRESS_EVERY_S = 0.2


def cell(value: Any) -> str:
    """A value as a table cell: ``-`` for nothing, thousands separators for integers."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    return printable(str(value))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, indent: str = "") -> str:
    """`rows` under `headers`, columns aligned (numbers to the right), one row a line."""
    cells = [[cell(value) for value in row] for row in rows]
    numeric = [any(_is_number(row[i]) for row in rows) and all(_is_number(row[i]) or row[i] is None for row in rows)
               for i in range(len(headers))]
    widths = [max([len(header)] + [len(row[i]) for row in cells]) for i, header in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [value.rjust(width) if right else value.ljust(width)
                 for value, width, right in zip(values, widths, numeric, strict=True)]
        return (indent + "  ".join(parts)).rstrip()

    return "\n".join([line(headers), line(["-" * width for width in widths]), *(line(row) for row in cells)])


def _is_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def pairs(items: Sequence[tuple[str, Any]], *, indent: str = "") -> str:
    """``name: value`` lines with the values aligned."""
    width = max((len(name) for name, _ in items), default=0)
    return "\n".join(f"{indent}{name + ':':<{width + 1}} {cell(value)}" for name, value in items)


def short(digest: str | None, length: int = 12) -> str | None:
    """A ``sha256:`` digest cut to its first hex characters, for a table."""
    if digest is None:
        return None
    return digest.removeprefix("sha256:")[:length]


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal and the work is long.

    Piped or redirected, it draws nothing, so logs and ``--json`` output stay clean.
    """

    def __init__(self, label: str, total: int, stream: TextIO | None = None, *, started: float | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = total >= PROGRESS_MIN_TOTAL and _is_terminal(self.stream)
        self._last = 0.0
        # When the work began (``time.monotonic()``), for the rate: now unless told earlier.
        self._started = time.monotonic() if started is None else started

    def update(self, done: int) -> None:
        """Show `done` of the total (at most a few times a second)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY_S and done < self.total:
            return
        self._last = now
        fraction = min(1.0, done / self.total) if self.total else 1.0
        filled = int(fraction * 30)
        rate = done / max(now - self._started, 1e-9)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {done:,}/{self.total:,} "
                          f"({fraction:.0%}, {rate:,.0f}/s) ")
        self.stream.flush()

    def close(self) -> None:
        """Erase the bar."""
        if self.enabled:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Bar:
    """A `Progress` drawn for a library call's ``progress(done, total)`` callback, made at the first call
    (when the total is known). Close it when the call returns."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Progress | None = None
        # The work began before its first call: a rate from then would show its first page done in no time.
        self._started = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        """Show `done` of `total`."""
        if self.bar is None:
            self.bar = Progress(self.label, total, started=self._started)
        self.bar.update(done)

    def close(self) -> None:
        """Erase the bar, if one was drawn."""
        if self.bar is not None:
            self.bar.close()
