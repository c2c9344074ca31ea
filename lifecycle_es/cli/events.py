"""``lifecycle-es events``: the log's events as JSON lines or a readable listing; the last N; ``-f`` follows.

    lifecycle-es events runners.db -j                        every event, one JSON object a line
    lifecycle-es events runners.db -r runner-7 --after 120   one runner's events after seq 120
    lifecycle-es events runners.db -n 20                     the last 20 events
    lifecycle-es events runners.db --since 2026-03-02T10:00 --until 2026-03-02T10:30
    lifecycle-es events runners.db -f                        the last 10, then every event committed later

A JSON line is ``{"seq", "stream", "version", "type", "at", "event", "hash"}``: ``event`` is the body as
an object, ``hash`` the chain hash in hex. ``-n N`` keeps the last N of the events the other options
select, found by reading back from the head (the log's, or the runner's stream's) in growing chunks,
never from the start. ``-f`` works as ``journalctl -f``: alone it prints the last 10 events and then
follows; ``-n`` says how many to print first (``-n 0``: none, ``-n all``: every one), and ``--after`` or
``--since`` without ``-n`` start there instead; it ends, with exit 0, on SIGINT or SIGTERM. ``--since``
and ``--until`` find the seqs of their window by bisection (an event is never stamped before the one
before it), so a window costs what it holds. A runner the log does not have is refused with exit 66,
as by every command that takes one (`exits.no_runner`).
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import msgspec

from lifecycle_es.canonical import iso_ms
from lifecycle_es.errors import IntegrityError
from lifecycle_es.log import RecordedEvent
from lifecycle_es.store import EventStore

from .access import open_store
from .exits import EXIT_OK, EXIT_USAGE, CommandError, json_printable, no_runner, printable
from .options import ALL, int_at_least, lines, runner_id, since, when, window_order

MAX_FIELD_CHARS = 60
FOLLOW_LINES = 10  # what -f alone prints before following, as journalctl -f
# The times an event's `at` can be: the store writes it as ISO-8601 UTC with milliseconds, which sorts as
# text within these years; a bound outside them is held to them, so it still compares as a time.
EARLIEST_MS, LATEST_MS = 0, 253_402_300_799_999  # 1970-01-01 and 9999-12-31, the end of its last ms


def register(subparsers: Any) -> None:
    """Add the ``events`` subcommand."""
    parser = subparsers.add_parser(
        "events", help="list the log's events (JSON lines or readable); -n the last N; -f follows new ones",
        description="Print events in seq order, as JSON lines with -j. -n N prints only the last N of the events "
                    "selected, read back from the head. -f then keeps printing the events other processes commit, "
                    "until SIGINT or SIGTERM (exit 0); as journalctl -f, -f alone starts with the last 10 events "
                    "unless -n, --after or --since says where to start.")
    parser.add_argument("file", metavar="FILE", help="the store file")
    parser.add_argument("-r", "--runner", type=runner_id, metavar="R",
                        help="only this runner's events (exit 66 when the log has none)")
    parser.add_argument("--after", type=int_at_least(0), metavar="SEQ", help="only events after this seq")
    parser.add_argument("--since", type=since, metavar="T", help="only events at or after this time: ISO-8601, UTC "
                                                                  "unless it names an offset, e.g. 2026-03-02T10:00")
    parser.add_argument("--until", type=when, metavar="T", help="only events at or before this time, as --since "
                                                                  "(not with -f)")
    parser.add_argument("-n", "--lines", type=lines, metavar="N",
                        help="only the last N of those events; 'all' for every one (default: all, with -f the last "
                             f"{FOLLOW_LINES} unless --after or --since is given)")
    parser.add_argument("-f", "--follow", action="store_true", help="then keep printing events as they are committed")
    parser.add_argument("-j", "--json", action="store_true", help="one JSON object a line")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the events; with -f, then every later one until a signal says stop."""
    if args.follow and args.until is not None:
        raise CommandError(EXIT_USAGE, "--until ends a window that -f would follow past: leave one of them out")
    empty = window_order(args.since, args.until)
    if empty is not None:
        raise CommandError(EXIT_USAGE, empty)
    count = args.lines
    if count is None:
        count = FOLLOW_LINES if args.follow and args.after is None and args.since is None else ALL
    after = args.after or 0
    keep = window(args.since, args.until)
    stop = threading.Event()
    if args.follow:
        _stop_on_signals(stop)
    with open_store(args.file) as store:
        if count == ALL:
            with store.backend.read_tx("read the events"):
                _check_runner(store, args.runner, args.file)
                head = store.head().seq
                low, high = seq_window(store, args.since, args.until, head)
            events = store.read(after=max(after, low - 1), stream=args.runner)
            # Past the window's last seq no event is in it: stop there, not at the head.
            printed = _print(itertools.takewhile(lambda r: r.seq <= high, events), keep, args)
            start = max(after, low - 1, printed)
            following = store.follow(after=start, stream=args.runner, stop=stop) if args.follow else None
        else:
            with store.backend.read_tx("read the last events"):  # the head and the stream's version agree
                _check_runner(store, args.runner, args.file)
                head = store.head().seq
                low, high = seq_window(store, args.since, args.until, head)
                start = max(after, head)
                tail = last_events(store, count, runner=args.runner, after=max(after, low - 1), keep=keep,
                                   head=min(start, high))
                # Started in the transaction the tail was read in: a log cut back below that tail before the
                # follower's first event is then seen, not followed on from a seq it no longer holds.
                following = store.follow(after=start, stream=args.runner, stop=stop) if args.follow else None
            _print(tail, keep, args)
        if following is not None:
            sys.stdout.flush()
            _print(following, keep, args, flush=True)
    return EXIT_OK


def _check_runner(store: EventStore, runner: str | None, path: str) -> None:
    if runner is not None and store.stream_version(runner) == 0:
        raise no_runner(runner, path)


def _print(events: Iterable[RecordedEvent], keep: Callable[[RecordedEvent], bool] | None,
           args: argparse.Namespace, *, flush: bool = False) -> int:
    """Print the events `keep` keeps; return the last seq seen (0 for none)."""
    out, last = sys.stdout, 0
    for recorded in events:
        last = recorded.seq
        if keep is not None and not keep(recorded):
            continue
        out.write(json_line(recorded) if args.json else text_line(recorded))
        out.write("\n")
        if flush:
            out.flush()  # a reader of the pipe sees each event as it is committed
    return last


def window(since_ms: int | None, until_ms: int | None) -> Callable[[RecordedEvent], bool] | None:
    """A test of an event's ``at`` against ``[since_ms, until_ms]`` (inclusive), or None when both are open.

    Compares the text ``at`` as written with the bounds written the same way: no parse per event.
    """
    if since_ms is None and until_ms is None:
        return None
    low, high = window_text(since_ms, until_ms)
    return lambda recorded: low <= recorded.at <= high


def window_text(since_ms: int | None, until_ms: int | None) -> tuple[str, str]:
    """``[since_ms, until_ms]`` as the lowest and highest ``at`` text inside it (open ends as text below or
    above every time)."""
    # A bound beyond the times a store can stamp (1970 to 9999) selects nothing past it: text above or below all.
    above, below = "\U0010ffff", ""
    low = below if since_ms is None else above if since_ms > LATEST_MS else iso_ms(max(since_ms, EARLIEST_MS))
    high = above if until_ms is None else below if until_ms < EARLIEST_MS else iso_ms(min(until_ms, LATEST_MS))
    return low, high


def seq_window(store: EventStore, since_ms: int | None, until_ms: int | None, head: int) -> tuple[int, int]:
    """The seqs ``(first, last)`` that can hold events stamped in ``[since_ms, until_ms]``, found by bisection.

    The store never stamps an event before the one before it (the audit proves a log holds to that), so
    the events of a time window are one run of seqs: two searches of about log2(head) reads each find it,
    and a listing reads the window, not the log. ``(1, head)`` when both bounds are open.
    """
    low, high = window_text(since_ms, until_ms)
    first = 1 if since_ms is None else _first_seq(store, lambda at: at >= low, head)
    last = head if until_ms is None else _first_seq(store, lambda at: at > high, head) - 1
    return first, last


def _first_seq(store: EventStore, reached: Callable[[str], bool], head: int) -> int:
    """The lowest seq in 1..head whose event's at `reached` holds for (head + 1 when none), given that it
    holds for every seq after one where it does."""
    low, high = 1, head + 1
    while low < high:
        middle = (low + high) // 2
        recorded = store.event_at(middle)
        # A seq missing from a log edited outside the store counts as reached: the listing then starts
        # earlier and stops later, and the window's test still drops what lies outside it.
        if recorded is None or reached(recorded.at):
            high = middle
        else:
            low = middle + 1
    return low


def last_events(store: EventStore, count: int, *, runner: str | None = None, after: int = 0,
                keep: Callable[[RecordedEvent], bool] | None = None, head: int | None = None) -> list[RecordedEvent]:
    """The last `count` events (of `runner`'s stream, after seq `after`, that `keep` keeps), oldest first.

    Read backwards from the head (events up to seq `head`; default the log's) in chunks of `count`
    events, each twice the one before while `keep` leaves too few: the cost follows what is printed,
    not the length of the log. Call it inside a read transaction when `head` must agree with the stream.
    """
    if count <= 0:
        return []
    top = store.head().seq if head is None else head
    chunk: Callable[[int, int], Iterable[RecordedEvent]]
    if runner is None:
        upper = top

        def chunk(low: int, high: int) -> Iterable[RecordedEvent]:
            # A log edited outside the store may skip seqs: whatever lies past `high` was read already.
            return (r for r in store.read(after=low - 1, limit=high - low + 1) if r.seq <= high)
    else:
        upper = store.stream_version(runner)

        def chunk(low: int, high: int) -> Iterable[RecordedEvent]:
            # A stream edited outside the store may skip versions: whatever lies past `high` was read already.
            rows = itertools.islice(store.read_stream(runner, after_version=low - 1), high - low + 1)
            return (r for r in rows if r.version <= high)

    found: list[list[RecordedEvent]] = []  # newest chunk first
    have, size, high = 0, count, upper
    floor = after + 1 if runner is None else 1  # seqs of the log are positions; a stream's versions are not
    while high >= floor and have < count:
        low = max(floor, high - size + 1)
        # A chunk keeps no more than it holds: a count beyond any log (-n 10**30) is no deque length.
        kept: deque[RecordedEvent] = deque(maxlen=min(count - have, high - low + 1))
        reached_after = False
        for recorded in chunk(low, high):
            if recorded.seq <= after:
                reached_after = True
                continue
            if recorded.seq <= top and (keep is None or keep(recorded)):
                kept.append(recorded)
        found.append(list(kept))
        have += len(kept)
        if reached_after:
            break
        high, size = low - 1, size * 2
    return [recorded for part in reversed(found) for recorded in part]


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
