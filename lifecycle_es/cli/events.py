"""``lifecycle-es events``: the log's events as JSON lines or a readable listing, and ``--follow``.

    lifecycle-es events runners.db --json                    one JSON object a line
    lifecycle-es events runners.db --runner runner-7 --after 120
    lifecycle-es events runners.db --follow --json           then every event other processes commit

A JSON line is ``{"seq", "stream", "version", "type", "at", "event", "hash"}``: ``event`` is the body as
an object, ``hash`` the chain hash in hex. ``--follow`` ends, with exit 0, on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import msgspec

from lifecycle_es.errors import IntegrityError
from lifecycle_es.store import RecordedEvent

from .access import int_at_least, open_store
from .exits import EXIT_OK, json_printable, printable

MAX_FIELD_CHARS = 60


def register(subparsers: Any) -> None:
    """Add the ``events`` subcommand."""
    parser = subparsers.add_parser(
        "events", help="list the log's events (JSON lines or readable); --follow tails new ones",
        description="Print events in seq order, as JSON lines with --json. --follow keeps printing the events "
                    "other processes commit until SIGINT or SIGTERM (exit 0).")
    parser.add_argument("file", metavar="FILE", help="the store file")
    parser.add_argument("--runner", metavar="R", help="only this runner's events")
    parser.add_argument("--after", type=int_at_least(0), default=0, metavar="SEQ",
                        help="only events after this seq (default: 0, from the start)")
    parser.add_argument("--follow", action="store_true", help="keep printing events as they are committed")
    parser.add_argument("--json", action="store_true", help="one JSON object a line")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the events; with --follow, until a signal says stop."""
    stop = threading.Event()
    with open_store(args.file) as store:
        if args.follow:
            _stop_on_signals(stop)
            events: Iterator[RecordedEvent] = store.follow(after=args.after, stream=args.runner, stop=stop)
        else:
            events = store.read(after=args.after, stream=args.runner)
        out = sys.stdout
        for recorded in events:
            out.write(json_line(recorded) if args.json else text_line(recorded))
            out.write("\n")
            if args.follow:
                out.flush()  # a reader of the pipe sees each event as it is committed
    return EXIT_OK


def _stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def body_of(recorded: RecordedEvent) -> dict[str, Any]:
    """The event's body as an object (any JSON object, even one this version has no class for)."""
    try:
        body = msgspec.json.decode(recorded.body)
    except msgspec.DecodeError as exc:
        raise IntegrityError(recorded.seq, f"body is not JSON: {exc}", stream=recorded.stream) from None
    if not isinstance(body, dict):
        raise IntegrityError(recorded.seq, "body is not a JSON object", stream=recorded.stream)
    return body


def json_line(recorded: RecordedEvent) -> str:
    """One event as a JSON line (control and bidi characters as JSON escapes: safe on a terminal too)."""
    return json_printable(msgspec.json.encode({
        "seq": recorded.seq, "stream": recorded.stream, "version": recorded.version, "type": recorded.type,
        "at": recorded.at, "event": body_of(recorded), "hash": recorded.hash.hex(),
    }).decode())


def text_line(recorded: RecordedEvent) -> str:
    """One event as a readable line: seq, at, stream, version, type, then its fields."""
    fields = []
    for name, value in sorted(body_of(recorded).items()):
        if name == "type":
            continue
        shown = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        if len(shown) > MAX_FIELD_CHARS:
            shown = shown[:MAX_FIELD_CHARS - 3] + "..."
        fields.append(f"{name}={shown}")
    return printable(f"{recorded.seq:>8}  {recorded.at}  {recorded.stream}  v{recorded.version}  "
                     f"{recorded.type}  {' '.join(fields)}")
