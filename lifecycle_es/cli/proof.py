"""The audit: one streaming pass over a log that proves it whole, or names its first bad seq.

What it proves, in one read transaction (one consistent view of the file):

- the chain: seqs contiguous from 1 (and no row outside them), every ``prev`` link, every hash (a
  MAC in keyed mode), inline or by worker processes over seq ranges (``chain_ranges.py``);
- the rules: every event replayed through ``lifecycle_es.replay.fold`` per stream, versions
  contiguous, a stream's first event naming its own runner, and no stream left with a park pending
  (the RunnerParked that must follow in the same transaction is missing);
- the caches: each snapshot equals the replayed state at its seq (``SnapshotCheck``), and the read
  models equal the replay as of the seq they record (``check_read_models``);
- the seal: the log still holds the sealed hash at the sealed seq.

Memory is one state per runner (bounded by the retention rules), never the log: rows are read in
pages and each event is dropped once folded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lifecycle_es import chain
from lifecycle_es.errors import IntegrityError, LifecycleError, StoreBehindSealError
from lifecycle_es.replay import fold_row
from lifecycle_es.runner import LEASE_STATUSES, STATES, RunnerState
from lifecycle_es.sqlite import translated
from lifecycle_es.store import PAGE, EventStore, RecordedEvent
from projections import SnapshotCheck, check_read_models, read_model_position

from .access import missing_triggers
from .chain_ranges import ChainJobs, split
from .exits import one_line
from .render import Progress

MAX_PROBLEMS = 100


class Problem(NamedTuple):
    """One thing found wrong: the seq it is tied to (None when none is), the stream, and why."""

    seq: int | None
    stream: str | None
    reason: str


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


# Per stream, as the replay goes: (state, version, seq of its last event). The read-model check takes
# this shape, as of the seq the read models record.
Streams = dict[str, tuple[RunnerState, int, int]]


def audit(store: EventStore, *, key: bytes | None, jobs: int, seal_path: str | None,
          progress: bool = True) -> AuditReport:
    """Audit the open `store` (read-only is enough); `jobs` > 1 verifies the chain in worker processes."""
    report = AuditReport(path=store.path, keyed=store.keyed)
    report.warnings += [f"append-only trigger {name} is missing: the file was edited outside lifecycle-es"
                        for name in missing_triggers(store)]
    with store.backend.read_tx("audit"):
        head = store.head()
        report.head_seq = head.seq
        report.head_hash = head.hash.hex() if head.seq else None
        with translated("count events"):
            ((lowest,),) = store.backend.execute("SELECT min(seq) FROM events")
        if lowest is not None and lowest < 1:
            # read() walks seq 1, 2, ...: a row at seq <= 0 lies outside every walk and every hash.
            report.add(lowest, None, f"an event lies outside the chain, at seq {lowest}")
            return report
        snapshots = SnapshotCheck(store)
        position = read_model_position(store)
        ranges = split(head.seq, jobs) if jobs > 1 else []
        report.jobs = len(ranges) if len(ranges) > 1 else 1
        if report.jobs > 1:
            with ChainJobs(store.path, key, ranges) as workers:
                streams, captured = _replay(store, report, head.seq, False, None, position, snapshots, progress)
                for result in workers.results():
                    if result.bad_seq is not None:
                        report.add(result.bad_seq, result.stream, result.reason or "chain broken")
        else:
            streams, captured = _replay(store, report, head.seq, True, key, position, snapshots, progress)
        _summarize(report, streams)
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


def _replay(store: EventStore, report: AuditReport, head: int, verify: bool, key: bytes | None,
            position: int | None, snapshots: SnapshotCheck, show: bool) -> tuple[Streams, Streams | None]:
    """Fold every event up to `head`, checking the chain too when `verify` (no workers do it).

    Returns the streams at the end, and as of `position` (the read models' seq) when there is one.
    """
    streams: Streams = {}
    captured: Streams | None = {} if position == 0 else None
    prev = chain.genesis(store.store_id, key) if verify else b""
    link, observe, rows_after = chain.link, snapshots.observe, store.backend.rows
    with translated("list snapshots"):
        # Only the events a snapshot was taken at need a RecordedEvent for the snapshot check.
        snapshot_seqs = {row[0] for row in store.backend.execute("SELECT seq FROM snapshots")}
    bar = Progress("audit", head) if show else None
    expected = 1
    try:
        while expected <= head:
            # Text that is not UTF-8 comes back as the IntegrityError of its row (the backend's doing).
            rows = rows_after(after=expected - 1, stream=None, limit=min(PAGE, head - expected + 1))
            if not rows:
                raise IntegrityError(expected, f"seq {expected} is missing (a gap or a truncation)")
            for row in rows:
                seq, stream, version, type_, at, body, row_prev, digest = row
                if seq != expected:
                    raise IntegrityError(expected, f"seq {seq} found where {expected} was due (a gap or a reorder)",
                                         stream=stream)
                entry = streams.get(stream)
                state, last_version = (entry[0], entry[1]) if entry is not None else (None, 0)
                if version != last_version + 1:
                    raise IntegrityError(seq, f"version {version} where {last_version + 1} was due", stream=stream)
                if verify:
                    if row_prev != prev:
                        raise IntegrityError(seq, "prev does not link to the hash of the event before it",
                                             stream=stream)
                    if link(prev, seq, stream, version, type_, at, body, key) != digest:
                        raise IntegrityError(seq, "hash does not match the event's contents", stream=stream)
                    prev = digest
                try:
                    state = fold_row(state, seq, stream, type_, at, body)
                except IntegrityError:
                    raise
                except Exception as exc:  # a hostile body the rules did not foresee must not escape as a crash
                    raise IntegrityError(seq, f"{type_} could not be replayed: {type(exc).__name__}: {exc}",
                                         stream=stream) from None
                if entry is None and state.runner_id != stream:
                    raise IntegrityError(seq, f"the stream's first event names runner {state.runner_id!r}",
                                         stream=stream)
                streams[stream] = (state, version, seq)
                if seq in snapshot_seqs:
                    observe(RecordedEvent(seq, stream, version, type_, at, body, row_prev, digest), state)
                if seq == position:
                    captured = dict(streams)
                expected += 1
            if bar is not None:
                bar.update(expected - 1)
    except IntegrityError as exc:
        report.add(exc.seq, exc.stream, exc.reason)
    except LifecycleError as exc:  # a store error mid-read: tie it to the row being read
        report.add(expected, None, f"the row could not be read: {exc}")
    finally:
        if bar is not None:
            bar.close()
    report.events = expected - 1
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
            for seq, reason in snapshots.finish():
                report.add(seq, None, reason)
            # SnapshotCheck looks up the snapshots of the log's streams; one of a stream the log does not
            # have would be loaded by nobody, but it is not the replay's either.
            for stream, seq in store.backend.execute("SELECT stream, seq FROM snapshots ORDER BY seq"):
                if stream not in streams:
                    report.add(seq, stream, f"snapshot of {stream!r}, a runner the log does not have")
        report.snapshots_checked = snapshots.checked
        if position is None:
            return
        if position > report.head_seq:
            report.add(report.head_seq + 1, None, f"the read models are at seq {position}, beyond the log's head "
                                                  f"{report.head_seq}: the log lost events they saw")
            return
        states = captured if captured is not None else {}
        with translated("check read models"):
            for runner_id, what in check_read_models(store, states):
                seq = states[runner_id][2] if runner_id in states else None
                report.add(seq, runner_id, f"read model: {what} (as of seq {position})")
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
