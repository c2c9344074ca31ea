"""Rebuilding the caches from the log alone, and checking them against a fresh replay.

Snapshots and read models are caches; the log is the truth. `rebuild` drops both and rebuilds them
in one write transaction. `SnapshotCheck` and `check_read_models` are what the audit uses to prove
the caches equal a replay.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import msgspec

from lifecycle_es.replay import Folded, fold_log, proven_state, write_snapshot
from lifecycle_es.state import RunnerState, decode_state, encode_state
from lifecycle_es.store import EventStore, RecordedEvent
from lifecycle_es.values import shown

from .read_models import (
    INDEXES,
    LEASE_COLUMNS,
    RUNNER_COLUMNS,
    ReadModels,
    create_tables,
    lease_row,
    read_every_row,
    runner_row,
    write_runner,
)


class RebuildReport(NamedTuple):
    """What a rebuild did: events replayed, runners written, snapshots written, seconds taken."""

    events: int
    runners: int
    snapshots: int
    seconds: float


def rebuild(store: EventStore) -> RebuildReport:
    """Drop and rebuild snapshots and the read models from the log alone, in one transaction.

    Snapshots are tagged (see ``lifecycle_es.replay``): a keyed store opened without its key cannot
    tag them, so its rebuild raises StoreKeyError and changes nothing.
    """
    started = time.perf_counter()
    with store.transaction("rebuild") as tx:
        backend = tx.store.backend
        for statement in ("DROP TABLE IF EXISTS leases", "DROP TABLE IF EXISTS runners",
                          "DROP TABLE IF EXISTS read_model_position"):
            backend.execute(statement)
        backend.clear_snapshots()
        create_tables(store, indexes=False)
        # Each runner folded into a draft and frozen once (the rules and errors of replay_all).
        folds = fold_log(store)
        count = 0
        snapshots = 0
        for stream, folding in folds.items():
            state, digest = folding.state(), folding.hash
            assert state is not None and digest is not None
            count += folding.steps
            write_runner(store, None, state, folding.version, folding.seq)
            if write_snapshot(store, stream, Folded(state, folding.version, folding.seq), digest):
                snapshots += 1
        for statement in INDEXES:
            backend.execute(statement)
        if count:
            ReadModels()._set_position(store, store.head().seq)
    return RebuildReport(count, len(folds), snapshots, time.perf_counter() - started)


class SnapshotCheck:
    """Checks every stored snapshot: its tag at once, its state against the replay at its seq as the replay
    streams by (`observe`), then what is left (`finish`).

    A snapshot whose tag does not verify is a problem: nobody holding the store (and its key, when keyed)
    wrote it for that stream and event. One written before snapshots were tagged (its bytes are a state
    and nothing else) is ignored by commands; when it equals the replay it is only a warning, since the
    next snapshot or a rebuild writes over it. Problems are ``(seq, stream, reason)``.
    """

    def __init__(self, store: EventStore) -> None:
        # By seq, a list: a forged snapshot may name the seq of another stream's.
        self._due: dict[int, list[tuple[str, int, bytes, bytes, bool]]] = {}
        self.problems: list[tuple[int, str, str]] = []
        self.warnings: list[str] = []
        self.checked = 0
        keyed = " under its key" if store.keyed else ""
        for stream in store.streams():
            found = store.backend.snapshot(stream)
            if found is None:
                continue
            version, seq, blob, event_hash = found
            data = proven_state(store, stream, version, seq, blob, event_hash, strict=True)
            if data is not None:
                self._due.setdefault(seq, []).append((stream, version, data, event_hash, True))
            elif _untagged(blob):
                self._due.setdefault(seq, []).append((stream, version, blob, event_hash, False))
            else:
                self.checked += 1
                self.problems.append((seq, stream, f"snapshot of {stream!r} has a tag that does not verify: this "
                                                   f"store{keyed} did not write it for this stream and event "
                                                   f"(edited, or copied from elsewhere; rebuild rewrites it)"))

    def observe(self, recorded: RecordedEvent, state: RunnerState) -> None:
        """Check the snapshots taken at this event, if there are any."""
        for stream, version, data, event_hash, tagged in self._due.pop(recorded.seq, ()):
            self.checked += 1
            if stream != recorded.stream or version != recorded.version or event_hash != recorded.hash:
                self.problems.append((recorded.seq, stream, f"snapshot of {stream!r} does not name this event"))
            elif data != encode_state(state):
                self.problems.append((recorded.seq, stream, f"snapshot of {stream!r} differs from the replayed state"))
            elif not tagged:
                self.warnings.append(f"snapshot of {stream!r} at seq {recorded.seq} has no tag (written before "
                                     f"snapshots were tagged): commands ignore it; rebuild rewrites it")

    def finish(self) -> list[tuple[int, str, str]]:
        """Snapshots that named no event of the log are problems too; return every problem found."""
        for seq, found in sorted(self._due.items()):
            for stream, _, _, _, _ in found:
                self.problems.append((seq, stream, f"snapshot of {stream!r} names seq {seq}, which the log does "
                                                   "not hold"))
        self._due.clear()
        return self.problems


def _untagged(blob: object) -> bool:
    """Whether a snapshot's bytes are a state and nothing else (the format before snapshots were tagged)."""
    try:
        decode_state(blob)  # type: ignore[arg-type]
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
        return False
    return True


def check_read_models(store: EventStore, states: dict[str, tuple[RunnerState, int, int]]) -> list[tuple[str, str]]:
    """Compare every row of ``runners`` and ``leases`` with replayed states ``{id: (state, version, seq)}``.

    `states` is the replay as of the seq the read models say they applied (they lag the log while
    events are appended without them attached, and catch up on the next attach). Every row is compared,
    whatever that seq: a row that differs, one the replay has and the table lacks, one the table has and
    the replay lacks (a lease row of a runner without a runners row included), one stored twice.
    Returns (runner id, what differs) pairs, naming the lease and the columns; empty when the tables
    equal the replay or do not exist.
    """
    problems: list[tuple[str, str]] = []
    runners: dict[Any, tuple[Any, ...]] = {}
    for row in read_every_row(store, "runners"):
        if row[0] in runners:
            problems.append((row[0], "runners row stored twice"))
        runners[row[0]] = row
    leases: dict[Any, dict[Any, tuple[Any, ...]]] = {}
    for row in read_every_row(store, "leases"):
        by_id = leases.setdefault(row[0], {})
        if row[1] in by_id:
            problems.append((row[0], f"leases row {shown(row[1])} stored twice"))
        by_id[row[1]] = row
    for runner_id, (state, version, seq) in sorted(states.items()):
        row = runners.pop(runner_id, None)
        if row is None:
            problems.append((runner_id, "no runners row"))
        else:
            wanted = runner_row(state, version, seq)
            if row != wanted:
                problems.append((runner_id, f"runners row differs from the replay: "
                                            f"{_differences(RUNNER_COLUMNS, row, wanted)}"))
        retained = {lease.id: lease_row(runner_id, lease) for lease in state.leases}
        stored = leases.pop(runner_id, {})
        for lease_id in sorted(retained.keys() | stored.keys(), key=str):
            found, wanted = stored.get(lease_id), retained.get(lease_id)
            if found is None:
                problems.append((runner_id, f"no leases row for lease {shown(lease_id)}"))
            elif wanted is None:
                problems.append((runner_id, f"leases row {shown(lease_id)} for a lease the replay does not retain"))
            elif found != wanted:
                problems.append((runner_id, f"leases row {shown(lease_id)} differs from the replay: "
                                            f"{_differences(LEASE_COLUMNS, found, wanted)}"))
    problems.extend((runner_id, "runners row for a runner the replay does not have")
                    for runner_id in sorted(runners, key=str))
    problems.extend((runner_id, f"leases row {shown(lease_id)} for a runner the replay does not have")
                    for runner_id, stored in sorted(leases.items(), key=lambda item: str(item[0]))
                    for lease_id in sorted(stored, key=str))
    return problems


def _differences(columns: tuple[str, ...], found: tuple[Any, ...], wanted: tuple[Any, ...]) -> str:
    """The columns where a stored row differs from the replay's: ``name stored (replay: value)``."""
    return ", ".join(f"{name} {shown(have)} (replay: {shown(want)})"
                     for name, have, want in zip(columns, found, wanted, strict=True) if have != want)


def read_model_position(store: EventStore) -> int | None:
    """The last seq the read models applied, or None when the store has no read models."""
    exists = store.backend.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'read_model_position'")
    if not exists:
        return None
    rows = store.backend.execute("SELECT seq FROM read_model_position WHERE name = 'read_models'")
    return rows[0][0] if rows else 0

