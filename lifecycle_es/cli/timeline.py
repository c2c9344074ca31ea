"""``lifecycle-es timeline``: a picture of what happened to runners, as one self-contained SVG file.

    lifecycle-es timeline runners.db -o timeline.svg                       the last 50 leases of the log
    lifecycle-es timeline runners.db --runner runner-7 --since 2026-03-02T10:00 --until 2026-03-02T10:30 -o x.svg

A row per lease (a bar from acquisition to settle or park, coloured by outcome) and per unit under it,
the runner's state along the top of its rows, marks for drains, parks, reclaims, proxy rotations and
hook authorizations; hover any of them for its seq. The log is read once, in pages, and only the
window's last ``--last`` leases are kept, so a log of millions of events draws in seconds in flat memory.
It is drawn as it is, not proved: ``lifecycle-es audit`` proves it. A row the store cannot read (edited
outside it) ends the picture there: it is written, saying so, and the exit code is 65.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from lifecycle_es.errors import LifecycleError
from lifecycle_es.log import RecordedEvent
from lifecycle_es.store import PAGE, EventStore

from .access import open_store
from .exits import EXIT_DATAERR, EXIT_OK, EXIT_USAGE, CommandError, no_runner, one_line
from .options import int_at_least, runner_id, since, when, window_order

DEFAULT_LAST = 50  # as projections.timeline.DEFAULT_LAST, without importing projections to build the parser


def register(subparsers: Any) -> None:
    """Add the ``timeline`` subcommand."""
    parser = subparsers.add_parser(
        "timeline", help="draw what happened to runners over a window as one self-contained SVG",
        description="Draw leases (and their units) as bars from acquisition to settle or park, coloured by outcome, "
                    "under each runner's state band, with marks for drains, parks, reclaims, proxy rotations and "
                    "hook authorizations; every shape's tooltip names its seq. Without --since/--until: the last "
                    "--last leases of the log.")
    parser.add_argument("file", metavar="FILE", help="the store file")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.svg", help="where to write the SVG ('-': stdout)")
    parser.add_argument("-r", "--runner", action="append", type=runner_id, metavar="R",
                        help="only this runner (repeat for more; default: every runner)")
    parser.add_argument("--since", type=since, metavar="T", help="window start: ISO-8601 time (UTC unless it names "
                                                                  "an offset), e.g. 2026-03-02T10:00")
    parser.add_argument("--until", type=when, metavar="T", help="window end, as --since")
    parser.add_argument("-n", "--last", type=int_at_least(1), default=DEFAULT_LAST, metavar="N",
                        help="at most the last N leases that overlap the window (default: %(default)s)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Draw the timeline and write it."""
    from projections.timeline import collect  # the read side: only when a picture is drawn
    from projections.timeline_svg import draw

    empty = window_order(args.since, args.until)
    if empty is not None:
        raise CommandError(EXIT_USAGE, empty)
    runners = args.runner
    with open_store(args.file, seal=False) as store:
        # One runner reads its own stream only; several, or all, read the log once and keep theirs.
        stream = runners[0] if runners and len(set(runners)) == 1 else None
        timeline = collect(readable(store, stream), runners=runners, since_ms=args.since, until_ms=args.until,
                           last=args.last)
    missing = sorted(set(runners or ()) - timeline.runners_seen)
    if missing:
        raise no_runner(missing[0], args.file)
    who = ", ".join(runners) if runners else "every runner"
    svg = draw(timeline, title=f"{os.path.basename(args.file)}: {who}")
    write_output(args.output, svg)
    if timeline.stopped is not None:  # the picture is written, and says so too; the exit code tells a script
        sys.stderr.write(f"lifecycle-es timeline: drawn up to a row that cannot be read: "
                         f"{one_line(timeline.stopped)}\n")
        return EXIT_DATAERR
    return EXIT_OK


def readable(store: EventStore, stream: str | None = None) -> Iterator[RecordedEvent]:
    """The log's events (of one stream), as ``store.read`` yields them; a page holding a row the store cannot
    read (edited outside it) is read again row by row, so that every row before that one is yielded before
    its error is raised."""
    last = 0
    while True:
        try:
            for recorded in store.read(after=last, stream=stream):
                last = recorded.seq
                yield recorded
            return
        except LifecycleError:
            pass
        for _ in range(PAGE):  # the error ends the pass here, unless it has gone (then pages again)
            rows = list(store.read(after=last, stream=stream, limit=1))
            if not rows:
                return
            last = rows[0].seq
            yield rows[0]


def write_output(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all (a temporary file renamed over it); '-' is stdout."""
    if path == "-":
        sys.stdout.write(text)
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".timeline-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
