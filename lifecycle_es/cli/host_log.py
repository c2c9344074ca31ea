"""What ``lifecycle-es host`` prints: a line per happening, as text for people or one JSON object per line.

    log = HostLog("json")
    log.report("lease-taken", {"runner": "runner-1", "token": 3, ...})

Text lines keep the host's long-standing shape (``lifecycle-es host: serving ...``, then one line per
reconcile action: ``kind lease detail``), every value escaped for the terminal. JSON lines carry the
time (``ts``, UTC, milliseconds), the ``event`` and its fields. Reconcile passes are not printed (one a
second is noise); observers (the metrics) see every report.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from lifecycle_es.canonical import iso_ms

from .exits import json_printable, printable

_ENCODER = msgspec.json.Encoder()
_QUIET = frozenset({"reconciled", "renewed"})


def _text(kind: str, fields: dict[str, Any]) -> str | None:
    runner = fields.get("runner", "")
    if kind == "serving":
        return (f"lifecycle-es host: serving {fields['runners']} ({fields['mode']} mode) from {fields['file']} as "
                f"{fields['holder']}; SIGTERM stops")
    if kind == "action":
        return f"{fields['kind']} {fields['lease']} {fields['detail']}".rstrip()
    if kind == "standby":
        return (f"lifecycle-es host: {runner}: standby, its host lease is held by {fields['holder']} "
                f"({fields['expires_in_ms']} ms left unless renewed)")
    if kind == "held":
        return f"lifecycle-es host: {runner}: host lease held by {fields['holder']}; not waiting (--no-wait)"
    if kind == "lease-taken":
        return (f"lifecycle-es host: {runner}: host lease taken, token {fields['token']}; acting in "
                f"{fields['wait_ms']} ms")
    if kind == "acting":
        return f"lifecycle-es host: {runner}: acting under token {fields['token']}"
    if kind == "adopted":
        return f"lifecycle-es host: {runner}: adopted the running units of {', '.join(fields['leases'])}"
    if kind == "fenced":
        return f"lifecycle-es host: {runner}: fenced (token {fields['token']}): {fields['reason']}; stopped acting"
    if kind == "released":
        return f"lifecycle-es host: {runner}: host lease released (token {fields['token']})"
    if kind == "busy":
        return f"lifecycle-es host: {runner}: store busy, trying again: {fields['error']}"
    if kind == "renew-failed":
        return f"lifecycle-es host: {runner}: renewal failed: {fields['error']}"
    if kind == "checkpoint":
        return f"checkpoint seq {fields['seq']} signed"
    if kind == "checkpoint-failed":
        return f"lifecycle-es host: cannot sign a checkpoint: {fields['error']}"
    if kind == "stopped":
        return "lifecycle-es host: stopped" + (f" (exit {fields['exit']})" if fields["exit"] else "")
    return None


class HostLog:
    """Prints the host's reports in one format, and hands each to the observers."""

    def __init__(self, log_format: str = "text", *, write: Callable[[str], None] | None = None,
                 now: Callable[[], int] | None = None) -> None:
        self.format = log_format
        self.observers: list[Callable[[str, dict[str, Any]], None]] = []
        self._write = write or self._print
        self._now = now or (lambda: time.time_ns() // 1_000_000)
        # Reports come from the serving loop and the renewer's thread: one line is one write, whole.
        self._lock = threading.Lock()

    @staticmethod
    def _print(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def report(self, kind: str, fields: dict[str, Any]) -> None:
        """Print one happening (unless it is only for observers) and tell the observers."""
        with self._lock:
            for observer in self.observers:
                observer(kind, fields)
            if kind in _QUIET:
                return
            if self.format == "json":
                line = _ENCODER.encode({"ts": iso_ms(self._now()), "event": kind, **fields}).decode()
                self._write(json_printable(line))
                return
            text = _text(kind, fields)
            if text is not None:
                self._write(printable(text))


__all__ = ["HostLog"]
