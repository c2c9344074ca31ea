"""The whole log folded by several processes: every runner's state at the head, for a rebuild.

`fold_in_parts` shares the runners out by their event counts (`walk.owners`, as the audit does); this
process folds share 0 while a worker process (``lifecycle_es.workers``, `walk.walk_share`) folds each other
share, each in a read transaction of its own, reading only its own runners' rows up to the head (all rows
when the runners could not be counted). Each replays its runners through the rules alone, as
`replay.fold_log` does: none checks the chain, the seqs or the versions (a rebuild trusts the log's bytes;
the audit is what proves them), so that the rebuild refuses just what one process refuses. With `checked`
(a keyed store's rebuild, which tags what it folds with the key) each walker also proves its range of the
chain (`walk.split`'s ranges, as the audit's walkers do), seqs and versions included.

    ends = fold_in_parts(store, head=store.head().seq, jobs=2)   # {runner: (state, version, seq)}
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import IntegrityError
from .store import EventStore
from .walk import Streams, counted, owners, received, reopened, split, walk
from .workers import WorkerError, Workers


def fold_in_parts(store: EventStore, *, head: int, jobs: int,
                  progress: Callable[[int], None] | None = None, checked: bool = False) -> Streams:
    """Every runner's (state, version, seq of its last event) at `head`, folded by `jobs` processes: this one
    and ``jobs - 1`` workers reading the store at ``store.path``. IntegrityError at the lowest seq any of them
    found the log broken; WorkerError when a worker could not read it. `progress`: called with the seq the
    slowest walker got through. `checked`: the chain, seqs and versions proven too (see the module docstring),
    by ``len(split(head, jobs))`` walkers, one a range."""
    # Unchecked, an empty chain range (1, 0): no seq to check, so each walker reads only its own runners' rows.
    ranges = (split(head, jobs) or [(1, 0)]) if checked else [(1, 0)] * jobs
    jobs = len(ranges)
    owned = owners(counted(store), jobs)
    calls = [(reopened(store), store._key, head, first, last, part, jobs, None, (), owned, store.backend.identity,
              checked) for part, (first, last) in enumerate(ranges)][1:]
    with Workers("lifecycle_es.walk:walk_share", calls, progress=progress) as workers:
        workers.begin()
        tell = (lambda rows: progress(min(rows, workers.poll()))) if progress is not None and calls else progress
        here = walk(store, store._key, head=head, chain_range=ranges[0], share=(0, jobs), position=None,
                    snapshot_seqs=(), progress=tell, owned=owned, checked=checked)
        walks = [here, *(received(result) for result in workers.results())]
    problems = sorted((walked.problem for walked in walks if walked.problem is not None),
                      key=lambda problem: (problem.seq is None, problem.seq or 0))
    if problems:
        problem = problems[0]
        if problem.seq is None:
            raise WorkerError(problem.reason)
        raise IntegrityError(problem.seq, problem.reason, stream=problem.stream)
    ends: Streams = {}
    for walked in walks:
        ends.update(walked.streams)
    return ends


__all__ = ["fold_in_parts"]
