"""One pass over a log's rows for the audit: the chain over a seq range, the rules over a share of the runners.

The audit walks a log once in one process (``jobs=1``: every seq and every runner), or once per walker
(the auditing process and a worker process for each other part), each checking the chain over its own
seq range and replaying its own share of the runners (a runner's events depend on nothing but its own
stream). When the runners were counted (`counted`, `owners`: every runner named), a walker reads only
the rows of its range, the row before it, and its own runners' rows (`Backend.pages_within`); the ranges
cover 1..head, and each walker proves its own holds every seq up to its end. Otherwise every walker reads
every row. A walker stops at its first problem; the first bad seq of the log is the lowest any walker
found (at one seq, the chain's problem before the rules', as one walk over every row finds it).

The shares are balanced by the runners' event counts (`owners`), the auditing process's share the
larger by what a worker's start-up costs; a stream no share names (the log changed under the count)
falls to `share_of`, which every walker computes alike.

Chain: every row through one `verify.ChainCheck` (the verifier `EventStore.verify` uses). Rules: each
runner's rows through one `replay.Fold` (the fold commands, projections and rebuild use), versions
1, 2, ... per stream, a stream's first event naming its own runner.
"""

from __future__ import annotations

import bisect
import heapq
import time
import zlib
from collections.abc import Callable, Collection, Mapping
from operator import itemgetter
from typing import NamedTuple

from .backend import Row
from .backends import ServerTarget, open_backend, target_url
from .errors import IntegrityError, LifecycleError
from .replay import Fold, unforeseen
from .state import RunnerState, decode_state, encode_state
from .store import EventStore
from .verify import ChainCheck
from .workers import report_progress

_SEQ = itemgetter(0)
# Per stream: (state, version, seq of its last event): the shape the read-model check takes.
Streams = dict[str, tuple[RunnerState, int, int]]
# A walker of fewer events than this costs more as a process than it saves; shorter logs are walked inline.
MIN_RANGE_EVENTS = 10_000
# The most processes a pass may be shared by: a count beyond any machine's CPUs is a mistake, not a plan.
MAX_JOBS = 256
BUSY_TIMEOUT_MS = 5000
# What a worker process's start-up (an interpreter and the package's imports, ~0.15 s of CPU) costs beyond what
# the auditing process does meanwhile (the schema, the snapshots' tags), in events replayed: the auditing
# process, which starts walking at once, takes that many more of the runners' events.
STARTUP_EVENTS = 10_000
# Beyond this many runners the shares are not counted (a seek per runner, a round trip on a server) but hashed:
# so many even out anyway.
MAX_COUNTED_STREAMS = 2_000


class Found(NamedTuple):
    """A problem one walk met: the seq (None when none), the stream, the kind (chain, rules, read), and why."""

    seq: int | None
    stream: str | None
    kind: str
    reason: str


class Walked(NamedTuple):
    """What one walk found: its first problem (if any), its runners at the end and as of `position`,
    the state after each event a snapshot was taken at, and the seq it got through (every row up to it that
    it was to read was walked: a walk that finished, its head)."""

    problem: Found | None
    streams: Streams
    captured: Streams | None
    at_snapshots: list[tuple[Row, RunnerState]]
    rows: int


def share_of(stream: str, parts: int) -> int:
    """Which of `parts` walkers replays `stream` (stable across processes and runs)."""
    name = stream if type(stream) is str else repr(stream)  # a name smuggled past STRICT is replayed by one too
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) % parts


def owners(counts: Mapping[str, int], parts: int, head_start: int = STARTUP_EVENTS) -> dict[str, int]:
    """Each stream's share of `parts`, given its event count: the largest runner first to the share with the
    fewest events so far, share 0 (the auditing process's) starting `head_start` events ahead of the others."""
    loads = [(0 if part == 0 else head_start, part) for part in range(parts)]
    heapq.heapify(loads)
    found: dict[str, int] = {}
    for stream, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        load, part = heapq.heappop(loads)
        found[stream] = part
        heapq.heappush(loads, (load + max(0, count), part))
    return found


def counted(store: EventStore) -> dict[str, int]:
    """Each runner's event count (its last version: a seek each), for `owners`; empty when the runners are
    too many to count or cannot be listed (then `share_of` shares them)."""
    try:
        streams = store.streams()
        if len(streams) > MAX_COUNTED_STREAMS:
            return {}
        counts = {stream: store.backend.stream_version(stream) for stream in streams}
    except (LifecycleError, TypeError, ValueError):  # text that does not decode: the walk names its seq
        return {}
    # A name or a last version of another type (smuggled past STRICT: text sorts after every number) cannot be
    # counted or ordered; the walk names its seq.
    if not all(type(stream) is str and type(count) is int for stream, count in counts.items()):
        return {}
    return counts


def split(head: int, jobs: int, min_range: int = MIN_RANGE_EVENTS) -> list[tuple[int, int]]:
    """``[1, head]`` cut into at most `jobs` contiguous ranges of at least `min_range` events each."""
    if head <= 0:
        return []
    count = max(1, min(jobs, head // max(1, min_range)))
    size, extra = divmod(head, count)
    ranges, first = [], 1
    for index in range(count):
        last = first + size - 1 + (1 if index < extra else 0)
        ranges.append((first, last))
        first = last + 1
    return ranges


def _ends(folds: dict[str, Fold]) -> Streams:
    ends: Streams = {}
    for stream, folding in folds.items():
        state = folding.state()
        if state is not None:
            ends[stream] = (state, folding.version, folding.seq)
    return ends


def walk(store: EventStore, key: bytes | None, *, head: int, chain_range: tuple[int, int] | None,
         share: tuple[int, int] | None, position: int | None, snapshot_seqs: Collection[int],
         progress: Callable[[int], None] | None = None, owned: Mapping[str, int] | None = None,
         checked: bool = True) -> Walked:
    """Walk rows 1..`head` once (inside the caller's read transaction, for one view of the log).

    `chain_range`: the seqs whose links, hashes and times to check (None: none). `share`: ``(part,
    parts)``, the runners to replay (None: all): those `owned` gives to `part` (see `owners`), and of the
    rest those `share_of` gives it. `position`: capture the replayed runners as of this seq (the read
    models'). `snapshot_seqs`: seqs after which to hand back the replayed state. `checked`: False replays
    the rules alone, as `replay.fold_log` does (a rebuild): no seq or version is checked.

    A share of several whose `owned` names every runner reads only what it needs: the rows of its chain
    range and the one before it (whose hash the range's first row links to), and its own runners' rows.
    The others' ranges, which `split` makes cover ``[1, head]``, prove the rest; each range's walker proves
    its range holds every seq up to its end, the last's up to `head`.
    """
    first, last = chain_range if chain_range is not None else (1, 0)
    part, parts = share if share is not None else (0, 1)
    own = _own_streams(owned, part) if chain_range is not None and parts > 1 else None
    start = max(1, first - 1) if own is not None else 1
    check = ChainCheck(store.store_id, key, first=first, last=last, start=start)
    folds: dict[str, Fold] = {}
    captured: Streams | None = {} if position == 0 else None
    at_snapshots: list[tuple[Row, RunnerState]] = []
    mine: dict[str, bool] = {stream: owner == part for stream, owner in (owned or {}).items()}
    everyone = parts == 1
    kind = "read"
    row: Row | None = None
    through = 0  # the seq the walk got through: every row up to it that it reads was walked
    try:
        # Text that is not UTF-8, or a body beyond the bound, comes back as the IntegrityError of its row.
        if own is None:
            pages = store.backend.pages(after=0, stream=None, limit=head)
        else:
            pages = store.backend.pages_within(after=0, through=head, seqs=(start, last), streams=own)
        for rows in pages:
            # The page's chain first, then its rules: a walk stops at its first bad row, so the rows before a
            # row the chain refuses are replayed before that refusal is raised.
            kind = "chain"
            end = rows[-1][0]
            chained = rows
            if own is not None and not (start <= rows[0][0] and end <= last):
                chained = rows[bisect.bisect_left(rows, start, key=_SEQ):bisect.bisect_right(rows, last, key=_SEQ)]
            refused: Exception | None = None
            try:
                if checked:
                    check.rows(chained)
                if own is not None and end > last:
                    _finish_range(store, check, last)  # the range whole before any row beyond it is replayed
            except (IntegrityError, TypeError, AttributeError) as exc:
                refused = exc
                # Seqs are the table's integer key, in order: the rows before the one refused.
                rows = rows[:bisect.bisect_left(rows, check.expected, key=_SEQ)]
            kind = "rules"
            # The read models' position: the runners as of it, once every row up to it was replayed.
            cut = None
            if captured is None and position is not None and rows and position <= rows[-1][0]:
                cut = bisect.bisect_right(rows, position, key=_SEQ)
            for piece, some in enumerate((rows,) if cut is None else (rows[:cut], rows[cut:])):
                for row in some:
                    stream = row[1]
                    if not everyone:
                        ours = mine.get(stream)
                        if ours is None:
                            ours = mine[stream] = share_of(stream, parts) == part
                        if not ours:
                            continue
                    folding = folds.get(stream)
                    if folding is None:
                        folding = folds[stream] = Fold()
                    # Inline, not a function: a call less for every row of the audit.
                    if checked and row[2] != folding.version + 1:
                        raise IntegrityError(row[0], f"version {row[2]} where {folding.version + 1} was due",
                                             stream=stream)
                    try:
                        folding.add_row(row)
                    except IntegrityError:
                        raise
                    except Exception as exc:  # a hostile body the rules did not foresee must not escape as a crash
                        raise unforeseen(row, exc) from None
                    if snapshot_seqs and row[0] in snapshot_seqs:
                        state = folding.state()
                        assert state is not None
                        at_snapshots.append((row, state))
                if cut is not None and piece == 0:
                    captured = _ends(folds)
            kind = "chain"
            if refused is not None:
                raise refused
            kind = "read"
            through = end
            if progress is not None:
                progress(through)
        kind = "chain"
        if own is None:
            if checked:
                check.finish(head)
        else:
            _finish_range(store, check, last)
            # Its own runners' rows were read to the head: none of them lies beyond the last one read.
            if captured is None and position is not None and position <= head:
                captured = _ends(folds)
            if through < head:
                through = head
                if progress is not None:
                    progress(through)
    except IntegrityError as exc:
        return Walked(Found(exc.seq, exc.stream, kind, exc.reason), _ends(folds), captured, at_snapshots,
                      _counted(check, kind, row, through))
    except LifecycleError as exc:  # a store error mid-read: tie it to the row being read
        return Walked(Found(through + 1, None, "read", f"the row could not be read: {exc}"), _ends(folds),
                      captured, at_snapshots, through)
    except (TypeError, AttributeError) as exc:
        # A value of the wrong type (smuggled past STRICT, or read from a damaged page) in a row outside this
        # walker's chain range, whose `chain.link` would have named it: the row's seq is the one just counted.
        counted = _counted(check, kind, row, through)
        return Walked(Found(counted, None, "chain", f"a value of the row is not of the store's types ({exc})"),
                      _ends(folds), captured, at_snapshots, counted)
    return Walked(None, _ends(folds), captured, at_snapshots, max(through, check.expected - 1))


def _finish_range(store: EventStore, check: ChainCheck, last: int) -> None:
    """`check.finish(last)` for a walker that reads beyond its range only its own runners' rows: rows missing
    at the range's end are named as one walk over every row names them, by the row found where the first was
    due (whichever runner's it is)."""
    if check.expected <= last:
        for rows in store.backend.pages(after=check.expected - 1, stream=None, limit=1):
            check.rows(rows[:1])
    check.finish(last)


def _own_streams(owned: Mapping[str, int] | None, part: int) -> list[str] | None:
    """The runners `owned` gives to `part`, when it names runners at all and every name is text (else None:
    the walk reads every row, and `share_of` places what `owned` does not name)."""
    if not owned or not all(type(stream) is str for stream in owned):
        return None
    return [stream for stream, owner in owned.items() if owner == part]


def _counted(check: ChainCheck, kind: str, row: Row | None, through: int) -> int:
    """How far a walk had got when it stopped: up to the row it was replaying, else as far as its chain check
    or its pages got."""
    return row[0] if kind == "rules" and row is not None else max(through, check.expected - 1)


def open_for_audit(path: str, key: bytes | None) -> EventStore:
    """The store at `path` opened read-only for a walk: nothing changed on it, no seal checked."""
    backend = open_backend(path, busy_timeout_ms=BUSY_TIMEOUT_MS, read_only=True)
    try:
        return EventStore(backend, key=key, now=lambda: time.time_ns() // 1_000_000)
    except BaseException:
        backend.close()
        raise


def reopened(store: EventStore) -> str:
    """Where a worker opens `store` again: its file, or its server's URL with the password its `path` masks
    (the worker is sent it on its stdin, never in its argv or environment)."""
    target = getattr(store.backend, "target", None)
    return target_url(target) if isinstance(target, ServerTarget) else store.path


# A worker's walk as it travels back: each state as its snapshot bytes (several times cheaper to make and
# load than a pickle of the state), or the state itself when it has none.
Sent = tuple[Found | None, dict[str, tuple[bytes | RunnerState, int, int]],
             dict[str, tuple[bytes | RunnerState, int, int]] | None, list[tuple[Row, bytes | RunnerState]], int]


def _sent_state(state: RunnerState) -> bytes | RunnerState:
    try:
        return encode_state(state)
    except (TypeError, ValueError, OverflowError):  # what no snapshot could hold travels as it is
        return state


def _received_state(state: bytes | RunnerState) -> RunnerState:
    return decode_state(state) if isinstance(state, bytes) else state


def _sent_streams(streams: Streams) -> dict[str, tuple[bytes | RunnerState, int, int]]:
    return {stream: (_sent_state(state), version, seq) for stream, (state, version, seq) in streams.items()}


def _received_streams(streams: dict[str, tuple[bytes | RunnerState, int, int]]) -> Streams:
    return {stream: (_received_state(state), version, seq) for stream, (state, version, seq) in streams.items()}


def sent(walked: Walked) -> Sent:
    """`walked` as a worker sends it back (see `received`)."""
    problem, streams, captured, at_snapshots, rows = walked
    return (problem, _sent_streams(streams), None if captured is None else _sent_streams(captured),
            [(row, _sent_state(state)) for row, state in at_snapshots], rows)


def received(result: Sent) -> Walked:
    """The `Walked` a worker sent back (`sent`): its states as they were."""
    problem, streams, captured, at_snapshots, rows = result
    return Walked(problem, _received_streams(streams), None if captured is None else _received_streams(captured),
                  [(row, _received_state(state)) for row, state in at_snapshots], rows)


def walk_share(path: str, key: bytes | None, head: int, first: int, last: int, part: int, parts: int,
               position: int | None, snapshot_seqs: Collection[int],
               owned: Mapping[str, int] | None = None, identity: tuple[int, int] | None = None,
               checked: bool = True) -> Sent:
    """One worker's walk (run by ``lifecycle_es.workers``): the chain over ``[first, last]``, the rules over
    runner share `part` of `parts` (see `walk`), sent back as `sent` makes it (`received` reads it).
    `identity`: the store's as the process that started the worker opened it (`Backend.identity`): a file
    found at `path` that is not that one (replaced since) is not walked. `checked`: see `walk`."""
    try:
        store = open_for_audit(path, key)
    except (LifecycleError, OSError) as exc:
        return sent(Walked(Found(None, None, "read", f"a worker could not open the store: {exc}"), {}, None, [], 0))
    if identity is not None and tuple(store.backend.identity) != tuple(identity):
        store.close()
        return sent(Walked(Found(None, None, "read", f"a worker found another store at {path!r} than the one "
                                                     "opened: it was replaced since, and is not walked"),
                           {}, None, [], 0))
    try:
        with store.backend.read_tx("audit a share of the log"):
            return sent(walk(store, key, head=head, chain_range=(first, last), share=(part, parts),
                             position=position, snapshot_seqs=snapshot_seqs, progress=report_progress,
                             owned=owned, checked=checked))
    except LifecycleError as exc:
        return sent(Walked(Found(first, None, "read", str(exc)), {}, None, [], 0))
    finally:
        store.close()
