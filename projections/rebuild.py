"""Rebuilding the caches, snapshots and read models, from the log alone.

Snapshots and read models are caches; the log is the truth. `rebuild` drops both and rebuilds them
in one write transaction (the audit's check that they equal a replay is ``lifecycle_es.caches``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from lifecycle_es.errors import IntegrityError
from lifecycle_es.fold_parts import fold_in_parts
from lifecycle_es.replay import Folded, fold_log, write_snapshot
from lifecycle_es.state import RunnerState
from lifecycle_es.store import EventStore
from lifecycle_es.values import safe_int, safe_progress
from lifecycle_es.walk import MAX_JOBS, split

from .read_models import write_runner


class RebuildReport(NamedTuple):
    """What a rebuild did: events replayed, runners written, snapshots written, seconds taken."""

    events: int
    runners: int
    snapshots: int
    seconds: float


def rebuild(store: EventStore, *, progress: Callable[[int, int], None] | None = None,
            jobs: int = 1) -> RebuildReport:
    """Drop and rebuild snapshots and the read models from the log alone, in one transaction.

    Snapshots are tagged (see ``lifecycle_es.replay``): a keyed store opened without its key cannot
    tag them, so its rebuild raises StoreKeyError and changes nothing. `progress`: called with (events
    replayed, events in the log) as the replay goes; the library draws nothing. `jobs`: processes sharing
    the replay, this one and ``jobs - 1`` workers reading the store at ``store.path`` (a log under 10,000
    events a process is replayed in this one alone; see ``lifecycle_es.fold_parts``).
    """
    jobs = safe_int(jobs, "jobs", 1, MAX_JOBS)
    safe_progress(progress)
    started = time.perf_counter()
    with store.transaction("rebuild") as tx:
        backend = tx.store.backend
        backend.drop_read_models()
        backend.clear_snapshots()
        backend.create_read_models(indexes=False)
        head = store.head().seq
        tell = (lambda seq: progress(seq, head)) if progress is not None else None
        parts = len(split(head, jobs))  # one, or none for an empty log, unless the log is long enough to share
        ends = _ends(store, head, parts, tell)
        count = 0
        snapshots = 0
        for stream, (state, version, seq, digest) in ends.items():
            count += version
            write_runner(store, None, state, version, seq)
            if write_snapshot(store, stream, Folded(state, version, seq), digest):
                snapshots += 1
        backend.create_read_model_indexes()
        if count:
            backend.set_read_model_position(head)
    return RebuildReport(count, len(ends), snapshots, time.perf_counter() - started)


def _ends(store: EventStore, head: int, parts: int,
          tell: Callable[[int], None] | None) -> dict[str, tuple[RunnerState, int, int, bytes]]:
    """Each runner's state, version, seq and hash of its last event: folded here, or by `parts` processes.

    A keyed store's rebuild tags each snapshot with the key, vouching for the state folded: so it proves the
    chain as it folds (every hash the MAC of its row under the key, linked to the one before), and a row written
    or edited without the key fails the rebuild with IntegrityError instead of being signed into a snapshot.
    """
    keyed = store.holds_key  # opened without its key, it tags nothing: the rebuild fails at its first snapshot
    if parts <= 1 and not keyed:
        # Each runner folded into a draft and frozen once (the rules and errors of replay_all).
        ends = {}
        for stream, folding in fold_log(store, progress=tell).items():
            state = folding.state()
            assert state is not None
            ends[stream] = (state, folding.version, folding.seq, _last_hash(folding.seq, stream, folding.hash))
        return ends
    found = fold_in_parts(store, head=head, jobs=max(parts, 1), progress=tell, checked=keyed)
    out = {}
    for stream in sorted(found):
        state, version, seq = found[stream]
        row = store.backend.row_at(seq)
        if row is None or row[1] != stream:  # the log moved under the fold: never while this transaction holds it
            raise IntegrityError(seq, f"the last event of {stream!r} is not at seq {seq} any more", stream=stream)
        out[stream] = (state, version, seq, _last_hash(seq, stream, row[7]))
    return out


def _last_hash(seq: int, stream: str, digest: bytes | None) -> bytes:
    """The hash of a runner's last event, which its snapshot names; IntegrityError when the row holds none the
    store wrote, or no stream (a column read as NULL: longer than the backend reads)."""
    if type(stream) is not str:
        raise IntegrityError(seq, "its stream is not an id the store wrote: audit it (lifecycle-es audit)")
    if type(digest) is not bytes or len(digest) != 32:
        raise IntegrityError(seq, "its hash is not the 32 bytes the store wrote: audit it (lifecycle-es audit)",
                             stream=stream)
    return digest
