"""The audit over several processes: each walks the whole log once, checking its own seq range of the
chain and replaying its own share of the runners (see ``walk.py``).

``[1, head]`` is cut into as many ranges as there are workers; the first row of a range links to the
last row of the range before, whose hash the worker reads from that row and the worker of the range
before proves. Runners are shared out by a hash of their id: a runner's events depend on nothing but
its own stream, so its replay needs no other worker. The main process waits, draws the progress bar
from what the workers report through shared memory, and merges what they found.

Workers come from a ``forkserver`` (``spawn`` where there is none): never a fork of the main process,
whose SQLite connection and locks must not be shared with a child. The key reaches them through the
pool's pipe, never their argv or environment.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Collection
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from typing import Any

from lifecycle_es.errors import EXIT_SOFTWARE, LifecycleError

from .access import open_store
from .exits import CommandError, classify
from .render import Progress
from .walk import Problem, Walked, walk

# A process costs more than it saves below this many events a range; shorter logs are walked inline.
MIN_RANGE_EVENTS = 10_000
POLL_S = 0.25

_progress: Any = None  # in a worker: the shared array its walk reports rows read to


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


def _start(progress: Any) -> None:
    global _progress
    _progress = progress


def walk_share(path: str, key: bytes | None, head: int, first: int, last: int, part: int, parts: int,
               position: int | None, snapshot_seqs: Collection[int]) -> Walked:
    """One worker's walk: the chain over ``[first, last]``, the rules over runner share `part` of `parts`."""
    def report(rows: int) -> None:
        if _progress is not None:
            _progress[part] = rows

    try:
        store = open_store(path, key=key, seal=False, need_key=True)
    except (LifecycleError, OSError) as exc:
        return Walked(Problem(None, None, f"a worker could not open the store: {classify(exc)[1]}"), {}, None, [], 0)
    try:
        with store.backend.read_tx("audit a share of the log"):
            # Its states travel back by pickle, which leaves out their derived lease index.
            return walk(store.backend, store.store_id, key, head=head, chain_range=(first, last),
                        share=(part, parts), position=position, snapshot_seqs=snapshot_seqs, progress=report)
    except LifecycleError as exc:
        return Walked(Problem(first, None, classify(exc)[1]), {}, None, [], 0)
    finally:
        store.close()


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        # Workers fork from a server that imported this module once, not from the main process.
        context.set_forkserver_preload([__name__])
    return context


class Jobs:
    """Worker processes walking the log, one per range; `results` waits for them (a context manager)."""

    def __init__(self, path: str, key: bytes | None, head: int, ranges: list[tuple[int, int]],
                 position: int | None, snapshot_seqs: Collection[int]) -> None:
        context = _context()
        self._rows = context.Array("q", len(ranges), lock=False)  # rows each worker has read
        self._executor = ProcessPoolExecutor(max_workers=len(ranges), mp_context=context, initializer=_start,
                                             initargs=(self._rows,))
        seqs = frozenset(snapshot_seqs)
        self._futures: list[Future[Walked]] = [
            self._executor.submit(walk_share, path, key, head, first, last, part, len(ranges), position, seqs)
            for part, (first, last) in enumerate(ranges)]

    def __enter__(self) -> Jobs:
        return self

    def __exit__(self, *exc: object) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def results(self, bar: Progress | None = None) -> list[Walked]:
        """Every worker's walk, in range order. A worker that died (killed, out of memory) proves
        nothing: CommandError, exit 70."""
        pending = set(self._futures)
        while pending:
            _, pending = wait(pending, timeout=POLL_S, return_when=FIRST_EXCEPTION)
            if bar is not None:
                bar.update(min(self._rows))  # every worker reads every row: the slowest is where the walk is
        walked = []
        for future in self._futures:
            try:
                walked.append(future.result())
            except Exception as exc:  # BrokenProcessPool and whatever a dead worker leaves behind
                raise CommandError(EXIT_SOFTWARE, f"an audit worker failed: {classify(exc)[1]}") from exc
        return walked
