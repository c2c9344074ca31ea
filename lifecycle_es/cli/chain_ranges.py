"""Chain verification over seq ranges, in worker processes, while the audit replays in the main one.

Each event's hash depends only on its own row and its ``prev``, so the chain splits: ``[1, head]`` is
cut into ranges and each worker, with its own read-only connection, checks its range's rows: seqs
contiguous, every ``prev`` equal to the hash of the row before it, every hash (or MAC) recomputed.
The first row of a range links to the last row of the range before: its worker reads that row's
hash column, and the worker of the range before proves that hash right. Together they prove the
chain as a sequential pass would. Stream versions are the sequential replay's to check.

Workers come from a ``forkserver`` (``spawn`` where there is none): never a fork of the main
process, whose SQLite connection and locks must not be shared with a child.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from typing import NamedTuple

from lifecycle_es import chain
from lifecycle_es.backend import Backend
from lifecycle_es.errors import EXIT_SOFTWARE, LifecycleError
from lifecycle_es.store import PAGE

from .access import open_store
from .exits import CommandError, classify

# A process costs more than it saves below this many events; shorter logs are verified inline.
MIN_RANGE_EVENTS = 10_000


class RangeResult(NamedTuple):
    """What a worker proved about ``[first, last]``: nothing wrong, or the first bad seq and why."""

    first: int
    last: int
    bad_seq: int | None = None
    stream: str | None = None
    reason: str | None = None


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


def verify_range(path: str, key: bytes | None, first: int, last: int) -> RangeResult:
    """Check the chain from `first` to `last` in the store at `path` (runs in a worker process)."""
    try:
        store = open_store(path, key=key, seal=False, need_key=True)
    except (LifecycleError, OSError) as exc:
        return RangeResult(first, last, 0, None, f"worker could not open the store: {classify(exc)[1]}")
    try:
        return _verify(store.backend, store.store_id, key, first, last)
    except (LifecycleError, OSError, UnicodeDecodeError) as exc:
        return RangeResult(first, last, first, None, classify(exc)[1])
    finally:
        store.close()


def _verify(backend: Backend, store_id: bytes, key: bytes | None, first: int, last: int) -> RangeResult:
    link = chain.link
    with backend.read_tx("verify a range of the chain"):
        if first == 1:
            prev = chain.genesis(store_id, key)
        else:
            before = backend.row_at(first - 1)
            if before is None:
                return RangeResult(first, last, first - 1, None, f"seq {first - 1} is missing (a gap)")
            prev = before[7]
        expected, after = first, first - 1
        while expected <= last:
            rows = backend.rows(after=after, stream=None, limit=min(PAGE, last - after))
            if not rows:
                return RangeResult(first, last, expected, None, f"seq {expected} is missing (a gap or a truncation)")
            for seq, stream, version, type_, at, body, row_prev, digest in rows:
                if seq != expected:
                    return RangeResult(first, last, expected, stream,
                                       f"seq {seq} found where {expected} was due (a gap or a reorder)")
                if row_prev != prev:
                    return RangeResult(first, last, seq, stream,
                                       "prev does not link to the hash of the event before it")
                if link(prev, seq, stream, version, type_, at, body, key) != digest:
                    return RangeResult(first, last, seq, stream, "hash does not match the event's contents")
                prev = digest
                expected += 1
            after = rows[-1][0]
    return RangeResult(first, last)


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        # Workers fork from a server that imported this module once, not from the main process.
        context.set_forkserver_preload([__name__])
    return context


class ChainJobs:
    """Worker processes verifying ranges of the chain; `results` waits for them.

    Use as a context manager: the pool is shut down (and its processes reaped) on the way out.
    """

    def __init__(self, path: str, key: bytes | None, ranges: list[tuple[int, int]]) -> None:
        self._executor = ProcessPoolExecutor(max_workers=len(ranges), mp_context=_context())
        # The key reaches the workers through the pool's pipe, never their argv or environment.
        self._futures: list[Future[RangeResult]] = [
            self._executor.submit(verify_range, path, key, first, last) for first, last in ranges]

    def __enter__(self) -> ChainJobs:
        return self

    def __exit__(self, *exc: object) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def results(self) -> list[RangeResult]:
        """Every range's result, in seq order (waits for the workers).

        A worker that died (killed, out of memory) proves nothing: CommandError, exit 70.
        """
        results = []
        for future in self._futures:
            try:
                results.append(future.result())
            except Exception as exc:  # BrokenProcessPool and whatever a dead worker leaves behind
                raise CommandError(EXIT_SOFTWARE, f"a chain verification worker failed: {classify(exc)[1]}") from exc
        return results
