"""One pass over a log's rows: the chain over a seq range, the rules over a share of the runners.

The audit walks a log once in one process (``--jobs 1``: every seq and every runner), or once per worker
process, each checking the chain over its own seq range and replaying its own share of the runners
(a runner's events depend on nothing but its own stream). Every walker reads every row, so each also
sees that seqs run 1, 2, ... without a gap. A walker stops at its first problem; the first bad seq of
the log is the lowest any walker found.

Chain: a row's ``prev`` must be the hash of the row before it (for the first row of a range, read from
that row, which the walker of the range before proves), its hash must be ``chain.link`` of its
contents, and its ``at`` a time as the store writes one, not earlier than the row before it. Rows are
read in pages bounded by bytes as well as rows; a body beyond MAX_EVENT_BYTES is never loaded, and is
the problem at its seq. Rules: each event of a runner goes through ``lifecycle_es.replay.fold_row`` with the runner's
state, versions run 1, 2, ... per stream, and a stream's first event names its own runner.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection
from typing import NamedTuple

from lifecycle_es import chain
from lifecycle_es.backend import Backend, Row
from lifecycle_es.errors import IntegrityError, LifecycleError
from lifecycle_es.replay import fold_row
from lifecycle_es.state import RunnerState
from lifecycle_es.store import AT_SEPARATORS, time_problem

# Per stream, as the walk goes: (state, version, seq of its last event): the shape the read-model check takes.
Streams = dict[str, tuple[RunnerState, int, int]]


class Problem(NamedTuple):
    """One thing found wrong: the seq it is tied to (None when none is), the stream, and why."""

    seq: int | None
    stream: str | None
    reason: str


class Walked(NamedTuple):
    """What one walk found: its first problem (if any), its runners at the end and as of `position`,
    the state after each event a snapshot was taken at, and how many rows it read."""

    problem: Problem | None
    streams: Streams
    captured: Streams | None
    at_snapshots: list[tuple[Row, RunnerState]]
    rows: int


def share_of(stream: str, parts: int) -> int:
    """Which of `parts` walkers replays `stream` (stable across processes and runs)."""
    return zlib.crc32(stream.encode("utf-8", "surrogatepass")) % parts


def walk(backend: Backend, store_id: bytes, key: bytes | None, *, head: int, chain_range: tuple[int, int] | None,
         share: tuple[int, int] | None, position: int | None, snapshot_seqs: Collection[int],
         progress: Callable[[int], None] | None = None) -> Walked:
    """Walk rows 1..`head` once (inside the caller's read transaction, for one view of the file).

    `chain_range`: the seqs whose links and hashes to check (None: none). `share`: ``(part, parts)``,
    the runners to replay (None: all). `position`: capture the replayed runners as of this seq (the
    read models'). `snapshot_seqs`: seqs after which to hand back the replayed state.
    """
    first, last = chain_range if chain_range is not None else (0, -1)
    part, parts = share if share is not None else (0, 1)
    streams: Streams = {}
    captured: Streams | None = {} if position == 0 else None
    at_snapshots: list[tuple[Row, RunnerState]] = []
    mine: dict[str, bool] = {}
    link = chain.link
    prev = chain.genesis(store_id, key)  # the hash before seq 1; then always the last row's hash
    prev_at = ""  # and the at before it
    expected = 1
    try:
        # Text that is not UTF-8, or a body beyond the bound, comes back as the IntegrityError of its row.
        for rows in backend.pages(after=0, stream=None, limit=head):
            for row in rows:
                seq, stream, version, type_, at, body, row_prev, digest = row
                if seq != expected:
                    raise IntegrityError(expected, f"seq {seq} found where {expected} was due (a gap or a reorder)",
                                         stream=stream)
                if first <= seq <= last:
                    if row_prev != prev:
                        raise IntegrityError(seq, "prev does not link to the hash of the event before it",
                                             stream=stream)
                    if link(prev, seq, stream, version, type_, at, body, key) != digest:
                        raise IntegrityError(seq, "hash does not match the event's contents", stream=stream)
                    if at < prev_at or len(at) != 24 or at[23] != "Z" or at[4:20:3] != AT_SEPARATORS:
                        raise time_problem(seq, stream, at, prev_at)
                prev, prev_at = digest, at
                expected += 1
                ours = mine.get(stream)
                if ours is None:
                    ours = mine[stream] = share_of(stream, parts) == part
                if ours:
                    _replay_row(streams, row, at_snapshots, snapshot_seqs)
                if seq == position:
                    captured = dict(streams)
            if progress is not None:
                progress(expected - 1)
        if expected <= head:
            raise IntegrityError(expected, f"seq {expected} is missing (a gap or a truncation)")
    except IntegrityError as exc:
        return Walked(Problem(exc.seq, exc.stream, exc.reason), streams, captured, at_snapshots, expected - 1)
    except LifecycleError as exc:  # a store error mid-read: tie it to the row being read
        return Walked(Problem(expected, None, f"the row could not be read: {exc}"), streams, captured, at_snapshots,
                      expected - 1)
    except (TypeError, AttributeError) as exc:
        # A value of the wrong type (smuggled past STRICT, or read from a damaged page) in a row outside this
        # walker's chain range, whose `chain.link` would have named it: the row's seq is the one just counted.
        return Walked(Problem(expected - 1, None, f"a value of the row is not of the store's types ({exc})"),
                      streams, captured, at_snapshots, expected - 1)
    return Walked(None, streams, captured, at_snapshots, expected - 1)


def _replay_row(streams: Streams, row: Row, at_snapshots: list[tuple[Row, RunnerState]],
                snapshot_seqs: Collection[int]) -> None:
    """Fold one row into its runner's state, or raise the IntegrityError that names it."""
    seq, stream, version, type_, at, body, _, _ = row
    entry = streams.get(stream)
    state, last_version = (entry[0], entry[1]) if entry is not None else (None, 0)
    if version != last_version + 1:
        raise IntegrityError(seq, f"version {version} where {last_version + 1} was due", stream=stream)
    try:
        state = fold_row(state, seq, stream, type_, at, body)
    except IntegrityError:
        raise
    except Exception as exc:  # a hostile body the rules did not foresee must not escape as a crash
        raise IntegrityError(seq, f"{type_} could not be replayed: {type(exc).__name__}: {exc}",
                             stream=stream) from None
    if entry is None and state.runner_id != stream:
        raise IntegrityError(seq, f"the stream's first event names runner {state.runner_id!r}", stream=stream)
    streams[stream] = (state, version, seq)
    if seq in snapshot_seqs:
        at_snapshots.append((row, state))
