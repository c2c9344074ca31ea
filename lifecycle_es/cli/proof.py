"""The audit: a streaming pass over a log that proves it whole, or names its first bad seq.

What it proves, in one read transaction (one consistent view of the file):

- the schema: exactly the store's (`EventStore.schema_problems`: no trigger, index or view added, none
  dropped or redefined, no constraint gone, no meta key the store never writes); each difference is a
  problem, for a writer would refuse the file;
- the chain: seqs contiguous from 1 (and no row outside them), every ``prev`` link, every hash (a
  MAC in keyed mode);
- the rules: every event replayed through ``lifecycle_es.replay.fold_row`` per stream, versions
  contiguous, a stream's first event naming its own runner, and no stream left with a park pending
  (the RunnerParked that must follow in the same transaction is missing);
- the caches: each snapshot's tag verifies and its state equals the replayed state at its seq
  (``SnapshotCheck``), and every read-model row equals the replay as of the seq the read models
  record, or as of the head when that seq is missing or not one the log holds (``check_read_models``);
- the seal: the log still holds the sealed hash at the sealed seq.

The pass (``walk.py``) runs in this process (``--jobs 1``) or in worker processes that each check a
seq range of the chain and replay a share of the runners (``jobs.py``); this module merges what they
found and checks the caches and the seal. Memory is one state per runner (bounded by the retention
rules), never the log: rows are read in pages and each event is dropped once folded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lifecycle_es.caches import SnapshotCheck, check_read_models
from lifecycle_es.errors import LifecycleError, StoreBehindSealError
from lifecycle_es.runner import LEASE_STATUSES, STATES
from lifecycle_es.sqlite_errors import translated
from lifecycle_es.store import EventStore, RecordedEvent

from .exits import one_line
from .jobs import Jobs, split
from .render import Progress
from .walk import Problem, Streams, Walked, walk

MAX_PROBLEMS = 100
MAX_SCHEMA_PROBLEMS = 10


@dataclass
class AuditReport:
    """What the audit found: the log's shape, what was checked, and every problem (first bad first)."""

    path: str
    keyed: bool
    jobs: int = 1
    events: int = 0
    runners: int = 0
    states: dict[str, int] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)
    head_seq: int = 0
    head_hash: str | None = None
    snapshots_checked: int = 0
    read_models_checked: int | None = None
    caches_checked: bool = False  # False when a problem stopped the replay before the caches were compared
    seal: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the log is whole."""
        return not self.problems

    @property
    def first(self) -> Problem | None:
        """The problem with the lowest seq (problems tied to no seq come last)."""
        if not self.problems:
            return None
        return min(self.problems, key=lambda problem: (problem.seq is None, problem.seq or 0))

    def add(self, seq: int | None, stream: str | None, reason: str) -> None:
        """Record a problem (the first MAX_PROBLEMS of them; a reason quoting a huge value is cut short)."""
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(seq, stream, one_line(reason)))

    def as_json(self, exit_code: int) -> dict[str, Any]:
        """The report as one JSON object."""
        first = self.first
        return {
            "ok": self.ok, "exit_code": exit_code, "path": self.path, "events": self.events,
            "runners": self.runners, "states": self.states, "leases": self.leases, "head_seq": self.head_seq,
            "head_hash": self.head_hash, "first_bad_seq": first.seq if first else None,
            "stream": first.stream if first else None, "reason": first.reason if first else None,
            "snapshots_checked": self.snapshots_checked, "read_models_checked": self.read_models_checked,
            "caches_checked": self.caches_checked, "seal": self.seal, "jobs": self.jobs, "keyed": self.keyed,
            "warnings": self.warnings,
            "problems": [problem._asdict() for problem in sorted(
                self.problems, key=lambda problem: (problem.seq is None, problem.seq or 0))],
        }


def audit(store: EventStore, *, key: bytes | None, jobs: int, seal_path: str | None,
          progress: bool = True) -> AuditReport:
    """Audit the open `store` (read-only is enough); `jobs` > 1 walks the log in that many worker processes."""
    report = AuditReport(path=store.path, keyed=store.keyed)
    with store.backend.read_tx("audit"):
        schema = store.schema_problems()
        # A few name it; the rest are counted, so that a file with thousands leaves room for the log's own.
        for problem in schema[:MAX_SCHEMA_PROBLEMS]:
            report.add(None, None, f"the store's schema was altered outside lifecycle-es: {problem}")
        if len(schema) > MAX_SCHEMA_PROBLEMS:
            report.add(None, None, f"the store's schema was altered outside lifecycle-es in "
                                   f"{len(schema) - MAX_SCHEMA_PROBLEMS} more ways")
        head = store.head()
        report.head_seq = head.seq
        report.head_hash = head.hash.hex() if head.seq else None
        _, lowest = store.backend.seq_bounds()
        if lowest is not None and lowest < 1:
            # A walk reads seq 1, 2, ...: a row at seq <= 0 lies outside every walk and every hash.
            report.add(lowest, None, f"an event lies outside the chain, at seq {lowest}")
            return report
        snapshots = SnapshotCheck(store)
        position = store.backend.read_model_position()
        # Only the events a snapshot was taken at need their state handed back for the snapshot check.
        snapshot_seqs = {seq for _, seq in store.backend.snapshot_positions()}
        ranges = split(head.seq, jobs) if jobs > 1 else []
        report.jobs = len(ranges) if len(ranges) > 1 else 1
        bar = Progress("audit", head.seq) if progress else None
        try:
            if report.jobs > 1:
                with Jobs(store.path, key, head.seq, ranges, position, snapshot_seqs) as workers:
                    walks = workers.results(bar)
            else:
                walks = [walk(store.backend, store.store_id, key, head=head.seq, chain_range=(1, head.seq),
                              share=None, position=position, snapshot_seqs=snapshot_seqs,
                              progress=bar.update if bar is not None else None)]
        finally:
            if bar is not None:
                bar.close()
        streams, captured = _merge(report, walks, snapshots)
        if report.problems:
            return report  # what follows compares against a replay that did not finish
        for stream, (state, _, seq) in streams.items():
            if state.pending_park is not None:
                report.add(seq, stream, f"the stream ends with a park pending ({state.pending_park}): the "
                                        "RunnerParked the rules require in the same transaction is missing")
        _check_caches(store, report, snapshots, position, captured, streams)
        if seal_path is not None:
            _check_seal(store, report, seal_path, key)
    return report


def _merge(report: AuditReport, walks: list[Walked], snapshots: SnapshotCheck) -> tuple[Streams, Streams | None]:
    """Fold the walks' findings into the report; the runners at the end and as of the read models' seq."""
    streams: Streams = {}
    captured: Streams | None = None
    seen: set[Problem] = set()
    for walked in walks:
        if walked.problem is not None and walked.problem not in seen:  # a gap is every walker's to find
            seen.add(walked.problem)
            report.add(*walked.problem)
        streams.update(walked.streams)
        if walked.captured is not None:
            captured = {**(captured or {}), **walked.captured}
        for row, state in walked.at_snapshots:
            snapshots.observe(RecordedEvent(*row), state)
    first = report.first
    report.events = first.seq - 1 if first is not None and first.seq is not None else min(
        walked.rows for walked in walks)
    _summarize(report, streams)
    return streams, captured


def _summarize(report: AuditReport, streams: Streams) -> None:
    states = dict.fromkeys(STATES, 0)
    leases = dict.fromkeys(LEASE_STATUSES, 0)
    for state, _, _ in streams.values():
        states[state.state] = states.get(state.state, 0) + 1
        for lease in state.leases:
            leases[lease.status] = leases.get(lease.status, 0) + 1
    report.runners, report.states, report.leases = len(streams), states, leases


def _check_caches(store: EventStore, report: AuditReport, snapshots: SnapshotCheck, position: int | None,
                  captured: Streams | None, streams: Streams) -> None:
    """Snapshots and read models against the replay. Their tables may be hostile too: any failure to
    read them is a problem found, not a crash."""
    report.caches_checked = True
    try:
        with translated("check snapshots"):
            for seq, stream, reason in snapshots.finish():
                report.add(seq, stream, reason)
            report.warnings += snapshots.warnings
            # SnapshotCheck looks up the snapshots of the log's streams; one of a stream the log does not
            # have would be loaded by nobody, but it is not the replay's either.
            for stream, seq in store.backend.snapshot_positions():
                if stream not in streams:
                    report.add(seq, stream, f"snapshot of {stream!r}, a runner the log does not have")
        report.snapshots_checked = snapshots.checked
        with translated("check read models"):
            tables = store.backend.read_model_tables()
        if not tables:
            return
        # Every row is compared with a replay, whatever the position table says or lacks: as of the position
        # when it is one the log holds, else as of the head (and the position is a problem of its own).
        head = report.head_seq
        states, as_of = (captured or {}), position
        if position is None:
            report.add(None, None, "read model: its tables are there but read_model_position "
                                   "is not: nothing says which seq they show")
            states, as_of = streams, head
        elif not 0 <= position <= head:
            report.add(head + 1 if position > head else None, None,
                       f"the read models are at seq {position}, " + (
                           f"beyond the log's head {head}: the log lost events they saw" if position > head
                           else "which is no seq"))
            states, as_of = streams, head
        with translated("check read models"):
            for runner_id, what in check_read_models(store, states):
                seq = states[runner_id][2] if runner_id in states else None
                report.add(seq, runner_id, f"read model: {what} (as of seq {as_of})")
        report.read_models_checked = len(states)
    except (LifecycleError, TypeError, ValueError) as exc:
        report.add(None, None, f"the snapshots or read models could not be checked: {exc}")


def _check_seal(store: EventStore, report: AuditReport, seal_path: str, key: bytes | None) -> None:
    report.seal = {"path": seal_path, "ok": False}
    try:
        sealed = store.check_seal(seal_path, key=key)
    except StoreBehindSealError as exc:
        report.seal.update(seq=exc.sealed_seq)
        seq = exc.head_seq + 1 if exc.head_seq < exc.sealed_seq else exc.sealed_seq
        report.add(seq, None, f"the log is behind its seal (sealed at seq {exc.sealed_seq}): {exc.reason}")
        return
    except LifecycleError as exc:  # a damaged or forged seal, or one made for another key
        report.add(None, None, f"the seal cannot be trusted: {exc}")
        return
    report.seal.update(ok=True, seq=sealed.seq, hash=sealed.hash, at=sealed.at)
