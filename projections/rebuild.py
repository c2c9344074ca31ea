"""Rebuilding the caches, snapshots and read models, from the log alone.

Snapshots and read models are caches; the log is the truth. `rebuild` drops both and rebuilds them
in one write transaction (the audit's check that they equal a replay is ``lifecycle_es.caches``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from lifecycle_es.replay import Folded, fold_log, write_snapshot
from lifecycle_es.store import EventStore

from .read_models import write_runner


class RebuildReport(NamedTuple):
    """What a rebuild did: events replayed, runners written, snapshots written, seconds taken."""

    events: int
    runners: int
    snapshots: int
    seconds: float


def rebuild(store: EventStore, *, progress: Callable[[int, int], None] | None = None) -> RebuildReport:
    """Drop and rebuild snapshots and the read models from the log alone, in one transaction.

    Snapshots are tagged (see ``lifecycle_es.replay``): a keyed store opened without its key cannot
    tag them, so its rebuild raises StoreKeyError and changes nothing. `progress`: called with (events
    replayed, events in the log) as the replay goes; the library draws nothing.
    """
    started = time.perf_counter()
    with store.transaction("rebuild") as tx:
        backend = tx.store.backend
        backend.drop_read_models()
        backend.clear_snapshots()
        backend.create_read_models(indexes=False)
        head = store.head().seq
        tell = (lambda seq: progress(seq, head)) if progress is not None else None
        # Each runner folded into a draft and frozen once (the rules and errors of replay_all).
        folds = fold_log(store, progress=tell)
        count = 0
        snapshots = 0
        for stream, folding in folds.items():
            state, digest = folding.state(), folding.hash
            assert state is not None and digest is not None
            count += folding.steps
            write_runner(store, None, state, folding.version, folding.seq)
            if write_snapshot(store, stream, Folded(state, folding.version, folding.seq), digest):
                snapshots += 1
        backend.create_read_model_indexes()
        if count:
            backend.set_read_model_position(head)
    return RebuildReport(count, len(folds), snapshots, time.perf_counter() - started)
