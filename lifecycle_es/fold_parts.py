"""The whole log folded by several processes: every runner's state at the head, for a rebuild.

`fold_in_parts` shares the runners out by their event counts (`walk.owners`, as the audit does); this
process folds share 0 while a worker process (``lifecycle_es.workers``) folds each other share, every one
reading rows 1..head in a read transaction of its own. Each walker proves that seqs run 1, 2, ... to the
head and replays its runners through the rules, as `walk` does; no walker checks the chain (a rebuild
trusts the log's bytes as `replay.fold_log` does: the audit is what proves them).

    ends = fold_in_parts(store, head=store.head().seq, jobs=2)   # {runner: (state, version, seq)}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .errors import IntegrityError, LifecycleError
from .store import EventStore
from .walk import Found, Sent, Streams, Walked, counted, open_for_audit, owners, received, sent, walk
from .workers import WorkerError, Workers, report_progress


def fold_share(path: str, key: bytes | None, head: int, part: int, parts: int, owned: Mapping[str, int]) -> Sent:
    """One worker's fold (run by ``lifecycle_es.workers``): runner share `part` of `parts` up to `head`, sent
    back as `walk.sent` makes it."""
    try:
        store = open_for_audit(path, key)
    except (LifecycleError, OSError) as exc:
        return sent(Walked(Found(None, None, "read", f"a worker could not open the store: {exc}"), {}, None, [], 0))
    try:
        with store.backend.read_tx("fold a share of the log"):
            return sent(walk(store, key, head=head, chain_range=None, share=(part, parts), position=None,
                             snapshot_seqs=(), progress=report_progress, owned=owned))
    finally:
        store.close()


def fold_in_parts(store: EventStore, *, head: int, jobs: int,
                  progress: Callable[[int], None] | None = None) -> Streams:
    """Every runner's (state, version, seq of its last event) at `head`, folded by `jobs` processes: this one
    and ``jobs - 1`` workers reading the store at ``store.path``. IntegrityError at the lowest seq any of them
    found the log broken; WorkerError when a worker could not read it. `progress`: called with the seq the
    slowest walker got through."""
    owned = owners(counted(store), jobs)
    calls = [(store.path, store._key, head, part, jobs, owned) for part in range(1, jobs)]
    with Workers(f"{__name__}:fold_share", calls, progress=progress) as workers:
        workers.begin()
        tell = (lambda rows: progress(min(rows, workers.poll()))) if progress is not None else None
        here = walk(store, store._key, head=head, chain_range=None, share=(0, jobs), position=None,
                    snapshot_seqs=(), progress=tell, owned=owned)
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


__all__ = ["fold_in_parts", "fold_share"]
