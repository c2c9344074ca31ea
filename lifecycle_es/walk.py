"""One pass over a log's rows for the audit: the chain over a seq range, the rules over a share of the runners.

The audit walks a log once in one process (``jobs=1``: every seq and every runner), or once per worker
process, each checking the chain over its own seq range and replaying its own share of the runners
(a runner's events depend on nothing but its own stream). Every walker reads every row, so each also
sees that seqs run 1, 2, ... without a gap. A walker stops at its first problem; the first bad seq of
the log is the lowest any walker found.

Chain: every row through one `verify.ChainCheck` (the verifier `EventStore.verify` uses). Rules: each
runner's rows through one `replay.Fold` (the fold commands, projections and rebuild use), versions
1, 2, ... per stream, a stream's first event naming its own runner.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Collection
from typing import NamedTuple

from .backend import Row
from .backends import open_backend
from .errors import IntegrityError, LifecycleError
from .replay import Fold
from .state import RunnerState
from .store import EventStore
from .verify import ChainCheck
from .workers import report_progress

# Per stream: (state, version, seq of its last event): the shape the read-model check takes.
Streams = dict[str, tuple[RunnerState, int, int]]
# A walker of fewer events than this costs more as a process than it saves; shorter logs are walked inline.
MIN_RANGE_EVENTS = 10_000
BUSY_TIMEOUT_MS = 5000


class Found(NamedTuple):
    """A problem one walk met: the seq (None when none), the stream, the kind (chain, rules, read), and why."""

    seq: int | None
    stream: str | None
    kind: str
    reason: str


class Walked(NamedTuple):
    """What one walk found: its first problem (if any), its runners at the end and as of `position`,
    the state after each event a snapshot was taken at, and how many rows it read."""

    problem: Found | None
    streams: Streams
    captured: Streams | None
    at_snapshots: list[tuple[Row, RunnerState]]
    rows: int


def share_of(stream: str, parts: int) -> int:
    """Which of `parts` walkers replays `stream` (stable across processes and runs)."""
    return zlib.crc32(stream.encode("utf-8", "surrogatepass")) % parts


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
         progress: Callable[[int], None] | None = None) -> Walked:
    """Walk rows 1..`head` once (inside the caller's read transaction, for one view of the log).

    `chain_range`: the seqs whose links, hashes and times to check (None: none). `share`: ``(part,
    parts)``, the runners to replay (None: all). `position`: capture the replayed runners as of this seq
    (the read models'). `snapshot_seqs`: seqs after which to hand back the replayed state.
    """
    first, last = chain_range if chain_range is not None else (1, 0)
    part, parts = share if share is not None else (0, 1)
    check = ChainCheck(store.store_id, key, first=first, last=last)
    folds: dict[str, Fold] = {}
    captured: Streams | None = {} if position == 0 else None
    at_snapshots: list[tuple[Row, RunnerState]] = []
    mine: dict[str, bool] = {}
    kind = "read"
    try:
        # Text that is not UTF-8, or a body beyond the bound, comes back as the IntegrityError of its row.
        for rows in store.backend.pages(after=0, stream=None, limit=head):
            for row in rows:
                kind = "chain"
                check.row(row)
                stream = row[1]
                ours = mine.get(stream)
                if ours is None:
                    ours = mine[stream] = share_of(stream, parts) == part
                if ours:
                    kind = "rules"
                    folding = folds.get(stream)
                    if folding is None:
                        folding = folds[stream] = Fold()
                    # Inline, not a function: a call less for every row of the audit.
                    if row[2] != folding.version + 1:
                        raise IntegrityError(row[0], f"version {row[2]} where {folding.version + 1} was due",
                                             stream=stream)
                    try:
                        folding.add_row(row)
                    except IntegrityError:
                        raise
                    except Exception as exc:  # a hostile body the rules did not foresee must not escape as a crash
                        raise _unforeseen(row, exc) from None
                    if row[0] in snapshot_seqs:
                        state = folding.state()
                        assert state is not None
                        at_snapshots.append((row, state))
                if row[0] == position:
                    captured = _ends(folds)
                kind = "read"
            if progress is not None:
                progress(check.expected - 1)
        kind = "chain"
        check.finish(head)
    except IntegrityError as exc:
        return Walked(Found(exc.seq, exc.stream, kind, exc.reason), _ends(folds), captured, at_snapshots,
                      check.expected - 1)
    except LifecycleError as exc:  # a store error mid-read: tie it to the row being read
        return Walked(Found(check.expected, None, "read", f"the row could not be read: {exc}"), _ends(folds),
                      captured, at_snapshots, check.expected - 1)
    except (TypeError, AttributeError) as exc:
        # A value of the wrong type (smuggled past STRICT, or read from a damaged page) in a row outside this
        # walker's chain range, whose `chain.link` would have named it: the row's seq is the one just counted.
        return Walked(Found(check.expected - 1, None, "chain", f"a value of the row is not of the store's types "
                                                               f"({exc})"),
                      _ends(folds), captured, at_snapshots, check.expected - 1)
    return Walked(None, _ends(folds), captured, at_snapshots, check.expected - 1)


def _unforeseen(row: Row, exc: Exception) -> IntegrityError:
    """The IntegrityError of a row whose replay raised what no rule foresaw."""
    return IntegrityError(row[0], f"{row[3]} could not be replayed: {type(exc).__name__}: {exc}", stream=row[1])


def open_for_audit(path: str, key: bytes | None) -> EventStore:
    """The store at `path` opened read-only for a walk: nothing changed on it, no seal checked."""
    backend = open_backend(path, busy_timeout_ms=BUSY_TIMEOUT_MS, read_only=True)
    try:
        return EventStore(backend, key=key, now=lambda: time.time_ns() // 1_000_000)
    except BaseException:
        backend.close()
        raise


def walk_share(path: str, key: bytes | None, head: int, first: int, last: int, part: int, parts: int,
               position: int | None, snapshot_seqs: Collection[int]) -> Walked:
    """One worker's walk (run by ``lifecycle_es.workers``): the chain over ``[first, last]``, the rules over
    runner share `part` of `parts`."""
    try:
        store = open_for_audit(path, key)
    except (LifecycleError, OSError) as exc:
        return Walked(Found(None, None, "read", f"a worker could not open the store: {exc}"), {}, None, [], 0)
    try:
        with store.backend.read_tx("audit a share of the log"):
            return walk(store, key, head=head, chain_range=(first, last), share=(part, parts), position=position,
                        snapshot_seqs=snapshot_seqs, progress=report_progress)
    except LifecycleError as exc:
        return Walked(Found(first, None, "read", str(exc)), {}, None, [], 0)
    finally:
        store.close()
