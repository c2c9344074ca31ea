"""The audit: one streaming pass that proves a log whole, or names its first bad seq, as a library call.

    import lifecycle_es
    report = lifecycle_es.audit("runners.db")              # a path, or an open EventStore
    if not report.ok:
        print(report.first_problem.seq, report.first_problem.reason)

What it proves, in one read transaction (one consistent view of the log), each recorded in `checks`:

- ``schema``: the file's schema is exactly the store's (no trigger, index or view added, none dropped
  or redefined, no constraint gone, no meta key the store never writes): a writer would refuse it;
- ``chain``: seqs contiguous from 1 (and no row outside them), every ``prev`` link, every hash (a MAC
  in keyed mode), every ``at`` a time as the store writes one and never earlier than the one before;
- ``rules``: every event replayed through the rules the commands obey, versions contiguous, a
  stream's first event naming its own runner, no stream left with a park pending; the host lease
  (``host_rules``): each ``HostLeaseAcquired`` token above every one before in its runner, and no host
  event carrying a token older than the latest ``HostLeaseAcquired`` before it (a fenced driver's write);
- ``snapshots`` and ``read_models``: each snapshot's tag verifies and its state equals the replay at
  its seq; every read-model row equals the replay (``lifecycle_es.caches``);
- ``seal``: the log still holds the sealed hash at the sealed seq;
- ``checkpoints`` (given ``trust``): every signed checkpoint verifies with a trusted public key, and
  the log holds each signed head at its seq (``lifecycle_es.checkpoint_audit``): with no secret.

The pass runs in this process (``jobs=1``) or is shared between this process and worker processes
(``lifecycle_es.workers``: fresh interpreters, so it needs no ``__main__`` guard and works from a thread),
each walker checking a seq range of the chain and replaying a share of the runners. Memory is one
state per runner, never the log. Only `LifecycleError` kinds are raised, and only when the log cannot
be audited at all (a keyed store without its key, a file that is not a store); everything found wrong
in a log is a `Problem`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from .caches import SnapshotCheck, check_read_models
from .checkpoint_audit import check_checkpoints
from .checkpoints import default_path
from .errors import InvalidInputError, LifecycleError, StoreBehindSealError, StoreKeyError
from .files import text_path
from .log import RecordedEvent
from .runner import LEASE_STATUSES, STATES
from .store import EventStore
from .values import not_plain, safe_progress
from .walk import MAX_JOBS, Found, Streams, Walked, counted, open_for_audit, owners, received, reopened, split, walk
from .workers import Workers

if TYPE_CHECKING:
    from .signing import Verifier

# What `audit`'s trust= takes: a public key file, a Verifier, or a list of them.
Trust: TypeAlias = "str | os.PathLike[str] | Verifier | Sequence[str | os.PathLike[str] | Verifier]"

MAX_PROBLEMS = 100
MAX_SCHEMA_PROBLEMS = 10
MAX_REASON_CHARS = 1000
CHECKS = ("schema", "chain", "rules", "snapshots", "read_models", "seal")
# The check each kind of problem fails, where the kind is not the check's own name.
_CHECK_OF = {"snapshot": "snapshots", "read-model": "read_models", "key": "chain", "read": "chain",
             "checkpoint": "checkpoints", "fork": "checkpoints", "signature": "checkpoints",
             "checkpoint-file": "checkpoints"}
DOWNGRADE = ("a key was given but the store claims to be unkeyed: a keyed store whose key id was removed and "
             "whose chain and seal were re-made without the key (a downgrade) looks just like this; audit it "
             "without the key only if it was never keyed")


class Problem(NamedTuple):
    """One thing found wrong: the seq it is tied to (None when none is), the stream, its kind, and why.

    `kind` is one of ``schema``, ``chain``, ``rules``, ``snapshot``, ``read-model``, ``seal``, ``key``, ``read``,
    and, for signed checkpoints, ``checkpoint``, ``fork``, ``signature``, ``checkpoint-file`` (see
    `lifecycle_es.checkpoint_audit`).
    """

    seq: int | None
    stream: str | None
    kind: str
    reason: str


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


@dataclass
class AuditReport:
    """What the audit found: the log's shape, what was proved (`checks`), and every problem, first bad first.

    `checks` maps each of ``schema``, ``chain``, ``rules``, ``snapshots``, ``read_models`` and ``seal`` (and
    ``checkpoints`` when the audit was given keys to trust) to
    True (proved), False (a problem found there) or None (not checked: nothing to check, or an earlier
    problem stopped the pass before it).
    """

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
    checkpoints: dict[str, Any] | None = None
    checks: dict[str, bool | None] = field(default_factory=lambda: dict.fromkeys(CHECKS))
    warnings: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the log is whole."""
        return not self.problems

    @property
    def streams(self) -> int:
        """How many streams (runners) the log holds."""
        return self.runners

    @property
    def head(self) -> tuple[int, str | None]:
        """The log's head: its seq and hash (hex; None for an empty log)."""
        return (self.head_seq, self.head_hash)

    @property
    def first_problem(self) -> Problem | None:
        """The problem with the lowest seq (problems tied to no seq come last); None when the log is whole."""
        if not self.problems:
            return None
        return min(self.problems, key=lambda problem: (problem.seq is None, problem.seq or 0))

    def add(self, seq: int | None, stream: str | None, kind: str, reason: str) -> None:
        """Record a problem (the first MAX_PROBLEMS of them; a reason quoting a huge value is cut short)."""
        self.checks[_CHECK_OF.get(kind, kind)] = False
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(seq, stream, kind, _one_line(reason)))

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON values (what ``lifecycle-es audit --json`` prints, less its exit code)."""
        first = self.first_problem
        return {
            "ok": self.ok, "path": self.path, "events": self.events, "runners": self.runners,
            "states": self.states, "leases": self.leases, "head_seq": self.head_seq, "head_hash": self.head_hash,
            "first_bad_seq": first.seq if first else None, "stream": first.stream if first else None,
            "kind": first.kind if first else None, "reason": first.reason if first else None,
            "checks": self.checks, "snapshots_checked": self.snapshots_checked,
            "read_models_checked": self.read_models_checked, "caches_checked": self.caches_checked,
            "seal": self.seal, "checkpoints": self.checkpoints, "jobs": self.jobs, "keyed": self.keyed,
            "warnings": self.warnings,
            "problems": [problem._asdict() for problem in sorted(
                self.problems, key=lambda problem: (problem.seq is None, problem.seq or 0))],
        }


def audit(target: str | os.PathLike[str] | EventStore, *, key: bytes | None = None,
          seal: str | os.PathLike[str] | None = None, jobs: int = 1,
          progress: Callable[[int, int], None] | None = None, trust: Trust | None = None,
          checkpoints: str | os.PathLike[str] | None = None) -> AuditReport:
    """Audit the log at `target` (a store file's path, or an open `EventStore`) and report what holds.

    `key`: the store's 32-byte key (a keyed store's hashes are MACs: without it StoreKeyError; given for
    a store that claims to be unkeyed, the audit goes on and reports a possible downgrade). `seal`: the
    seal file to check (default: ``<path>.seal`` when one is there). `jobs`: processes sharing the pass,
    this one and ``jobs - 1`` workers (a log under 10,000 events a process is walked in this one
    alone). `progress`: called with (events read, events in the log) as the pass goes; the library
    draws nothing. A path is opened read-only: nothing in the file, its -wal or its seal changes.

    `trust`: the public key (a ``FILE.pub`` path or a `Verifier`), or a list of them, whose signed
    checkpoints the log is held to: each checkpoint in `checkpoints` (default ``<path>.checkpoints``)
    must verify with one of them, and the log must still hold the head it signed. Without `trust` a
    checkpoint file is not read (a warning says so when one lies beside the store).
    """
    if type(jobs) is not int or not 1 <= jobs <= MAX_JOBS:  # a bool, or a subclass that may answer otherwise
        raise not_plain(jobs, "jobs") or InvalidInputError(
            "jobs", f"jobs is invalid: {jobs!r} is not a count of worker processes (1..{MAX_JOBS})")
    safe_progress(progress)
    if key is not None and (not isinstance(key, bytes | bytearray) or len(key) != 32):
        raise InvalidInputError("key", "key must be 32 bytes")
    seal_path = text_path(seal, "seal") if seal is not None else None
    trusted = _trusted(trust)
    if checkpoints is not None and trusted is None:
        raise InvalidInputError("checkpoints", "checking checkpoints needs the public key they are signed with: "
                                               "pass trust= too")
    path = target.path if isinstance(target, EventStore) else text_path(target, "target")
    if seal_path is None and os.path.lexists(path + ".seal"):
        seal_path = path + ".seal"
    signed = None
    if trusted is not None:
        signed = (text_path(checkpoints, "checkpoints") if checkpoints is not None else default_path(path), trusted)
    if isinstance(target, EventStore):
        return _audit(target, key, seal_path, jobs, progress, signed)
    store = open_for_audit(path, None)
    try:
        downgraded = key is not None and store.key_id is None
        if not downgraded:
            store.close()
            store = open_for_audit(path, key)
        # The workers reopen the store as the caller named it: its path has a URL's password masked.
        report = _audit(store, None if downgraded else key, seal_path, jobs, progress, signed, reopen=path)
        if downgraded:
            report.add(None, None, "key", DOWNGRADE)
        return report
    finally:
        store.close()


def _trusted(trust: Trust | None) -> list[Verifier] | None:
    """The verifiers `trust` names, each file read and checked now (InvalidInputError("trust") if not one)."""
    if trust is None:
        return None
    from .signing import Verifier, load_verifier

    items = [trust] if isinstance(trust, str | os.PathLike | Verifier) else trust
    if not isinstance(items, list | tuple) or not items:
        raise InvalidInputError("trust", "trust must be a public key file, a Verifier, or a non-empty list of them")
    verifiers = []
    for item in items:
        if isinstance(item, Verifier):
            verifiers.append(item)
            continue
        try:
            verifiers.append(load_verifier(item))
        except OSError as exc:
            raise InvalidInputError("trust", f"trust is invalid: {exc.strerror or exc}") from None
    return verifiers


def _audit(store: EventStore, key: bytes | None, seal_path: str | None, jobs: int,
           progress: Callable[[int, int], None] | None,
           signed: tuple[str, list[Verifier]] | None = None, *, reopen: str | None = None) -> AuditReport:
    key = key if key is not None else store._key
    if store.key_id is not None and key is None:
        raise StoreKeyError("the store is keyed: its hashes are MACs, so auditing it needs its key")
    report = AuditReport(path=store.path, keyed=store.keyed)
    # The lock for the whole pass: an open store's connection may serve a batch of another thread's writes,
    # which the audit must neither read nor run its read transaction inside.
    with store.lock, store.backend.read_tx("audit"):
        _prove(store, report, key, seal_path, jobs, progress, reopen or reopened(store))
        if signed is not None:
            check_checkpoints(store, report, *signed)
        elif os.path.lexists(store.path + ".checkpoints"):
            report.warnings.append(f"{store.path}.checkpoints was not checked: pass the signer's public key "
                                   "(trust=, --trust) to hold the log to its signed checkpoints")
    return report


def _prove(store: EventStore, report: AuditReport, key: bytes | None, seal_path: str | None, jobs: int,
           progress: Callable[[int, int], None] | None, reopen: str) -> None:
    """The pass over the log: schema, chain, rules, caches and seal, each found problem into `report`."""
    head = store.head()
    _, lowest = store.backend.seq_bounds()
    position = store.backend.read_model_position()
    # Only the events a snapshot was taken at need their state handed back for the snapshot check.
    snapshot_seqs = frozenset(seq for _, seq in store.backend.snapshot_positions())
    # A walk reads seq 1, 2, ...: a row at seq <= 0 lies outside every walk and every hash.
    outside = lowest is not None and lowest < 1
    ranges = split(head.seq, jobs) if jobs > 1 and not outside else []
    report.jobs = len(ranges) if len(ranges) > 1 else 1
    owned = counted(store) if report.jobs > 1 else {}
    owned = owners(owned, report.jobs) if owned else {}
    # The other parts' workers start first and work while this process checks the schema and walks part 0.
    calls = [(reopen, key, head.seq, first, last, part, len(ranges), position, snapshot_seqs, owned,
              store.backend.identity) for part, (first, last) in enumerate(ranges)][1:]
    tell = (lambda rows: progress(rows, head.seq)) if progress is not None else None
    with Workers("lifecycle_es.walk:walk_share", calls, progress=tell) as workers:
        workers.begin()
        schema = store.schema_problems()
        # A few name it; the rest are counted, so that a file with thousands leaves room for the log's own.
        for problem in schema[:MAX_SCHEMA_PROBLEMS]:
            report.add(None, None, "schema", f"the store's schema was altered outside lifecycle-es: {problem}")
        if len(schema) > MAX_SCHEMA_PROBLEMS:
            report.add(None, None, "schema", f"the store's schema was altered outside lifecycle-es in "
                                             f"{len(schema) - MAX_SCHEMA_PROBLEMS} more ways")
        if not schema:
            report.checks["schema"] = True
        report.head_seq = head.seq
        # A head row whose hash is not bytes (smuggled past STRICT) has no hash to show: the chain names its seq.
        report.head_hash = head.hash.hex() if head.seq and isinstance(head.hash, bytes) else None
        if outside:
            report.add(lowest, None, "chain", f"an event lies outside the chain, at seq {lowest}")
            return
        snapshots = SnapshotCheck(store)
        walks = _walks(store, workers, key, head.seq, ranges, owned, position, snapshot_seqs, progress)
    streams, captured = _merge(report, walks, ranges, snapshots)
    if any(walked.problem is not None for walked in walks):
        first = report.first_problem
        if len(walks) > 1 and first is not None and first.seq is not None:
            streams = _before(store, key, streams, report.events)
        _count(report, streams)
        return  # what follows compares against a replay that did not finish
    _count(report, streams)
    report.checks["chain"] = report.checks["rules"] = True
    for stream, (state, _, seq) in streams.items():
        if state.pending_park is not None:
            report.add(seq, stream, "rules", f"the stream ends with a park pending ({state.pending_park}): the "
                                             "RunnerParked the rules require in the same transaction is missing")
    _check_caches(store, report, snapshots, position, captured, streams)
    if seal_path is not None:
        _check_seal(store, report, seal_path, key)


def _walks(store: EventStore, workers: Workers, key: bytes | None, head: int, ranges: list[tuple[int, int]],
           owned: dict[str, int], position: int | None, snapshot_seqs: frozenset[int],
           progress: Callable[[int, int], None] | None) -> list[Walked]:
    """Walk part 0 here (all of the log when there is one part) while the workers walk the others."""
    if len(ranges) <= 1:
        tell = (lambda rows: progress(rows, head)) if progress is not None else None
        return [walk(store, key, head=head, chain_range=(1, head), share=None, position=position,
                     snapshot_seqs=snapshot_seqs, progress=tell)]
    # The pass is where its slowest walker is: this one's or the workers' count between this one's pages, the
    # workers' once it is done (`Workers.results`).
    tell = (lambda rows: progress(min(rows, workers.poll()), head)) if progress is not None else None
    first, last = ranges[0]
    here = walk(store, key, head=head, chain_range=(first, last), share=(0, len(ranges)), position=position,
                snapshot_seqs=snapshot_seqs, progress=tell, owned=owned)
    return [here, *(received(result) for result in workers.results())]


def _merge(report: AuditReport, walks: list[Walked], ranges: list[tuple[int, int]],
           snapshots: SnapshotCheck) -> tuple[Streams, Streams | None]:
    """Fold the walks' findings into the report; the runners at the end and as of the read models' seq."""
    streams: Streams = {}
    captured: Streams | None = None
    # One walk over every row stops at its first problem: of the walkers' problems only the lowest is the log's
    # (the others lie beyond it, or are the same row seen from another range: the walker that links its range to
    # an edited hash, the one that replays an edited row of its runner). At one seq the chain's problem first, as
    # one walk finds it (it proves a page's chain before replaying it), and of those the one of the walker whose
    # range holds the seq (another met the row only as one it could not place: a runner name that is not text).
    found = min(((walked.problem, part) for part, walked in enumerate(walks) if walked.problem is not None),
                key=lambda found: _order(found[0], found[1], ranges), default=(None, 0))[0]
    if found is not None:
        report.add(*found)
    for walked in walks:
        streams.update(walked.streams)
        if walked.captured is not None:
            captured = {**(captured or {}), **walked.captured}
        for row, state in walked.at_snapshots:
            snapshots.observe(RecordedEvent(*row), state)
    report.events = found.seq - 1 if found is not None and found.seq is not None else min(
        walked.rows for walked in walks)
    return streams, captured


def _order(problem: Found, part: int, ranges: list[tuple[int, int]]) -> tuple[bool, int, bool, bool]:
    """Where the problem walker `part` found stands among the walkers' (see `_merge`): the first is the log's."""
    seq = problem.seq or 0
    ours = part < len(ranges) and ranges[part][0] <= seq <= ranges[part][1]
    return (problem.seq is None, seq, problem.kind != "chain", not ours)


def _before(store: EventStore, key: bytes | None, streams: Streams, events: int) -> Streams:
    """The runners as one walk over every row leaves them when it stops after `events` rows: the walkers
    replayed their own runners on past another walker's problem, so those runners are folded again here,
    up to it (only on a failed pass, and only the runners some walker took beyond it)."""
    beyond = {stream for stream, (_, _, seq) in streams.items() if seq > events}
    if not beyond:
        return streams
    again = walk(store, key, head=events, chain_range=(1, 0), share=(0, 2), position=None, snapshot_seqs=(),
                 owned={stream: 0 if stream in beyond else 1 for stream in streams})
    return {**{stream: ends for stream, ends in streams.items() if stream not in beyond}, **again.streams}


def _count(report: AuditReport, streams: Streams) -> None:
    """The report's runners, their states and their leases' statuses, from the replayed `streams`."""
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
        for seq, stream, reason in snapshots.finish():
            report.add(seq, stream, "snapshot", reason)
        report.warnings += snapshots.warnings
        # SnapshotCheck looks up the snapshots of the log's streams; one of a stream the log does not have
        # would be loaded by nobody, but it is not the replay's either.
        for stream, seq in store.backend.snapshot_positions():
            if stream not in streams:
                report.add(seq, stream, "snapshot", f"snapshot of {stream!r}, a runner the log does not have")
        report.snapshots_checked = snapshots.checked
        if report.checks["snapshots"] is None and snapshots.checked:
            report.checks["snapshots"] = True
        if not store.backend.read_model_tables():
            return
        # Every row is compared with a replay, whatever the position table says or lacks: as of the position
        # when it is one the log holds, else as of the head (and the position is a problem of its own).
        head = report.head_seq
        states, as_of = (captured or {}), position
        if position is None:
            report.add(None, None, "read-model", "read model: its tables are there but read_model_position "
                                                 "is not: nothing says which seq they show")
            states, as_of = streams, head
        elif not 0 <= position <= head:
            report.add(head + 1 if position > head else None, None, "read-model",
                       f"the read models are at seq {position}, " + (
                           f"beyond the log's head {head}: the log lost events they saw" if position > head
                           else "which is no seq"))
            states, as_of = streams, head
        for runner_id, what in check_read_models(store, states):
            at_seq: int | None = states[runner_id][2] if runner_id in states else None
            report.add(at_seq, runner_id, "read-model", f"read model: {what} (as of seq {as_of})")
        report.read_models_checked = len(states)
        if report.checks["read_models"] is None:
            report.checks["read_models"] = True
    except (LifecycleError, TypeError, ValueError) as exc:
        report.add(None, None, "read-model", f"the snapshots or read models could not be checked: {exc}")


def _check_seal(store: EventStore, report: AuditReport, seal_path: str, key: bytes | None) -> None:
    report.seal = {"path": seal_path, "ok": False}
    try:
        sealed = store.check_seal(seal_path, key=key)
    except StoreBehindSealError as exc:
        report.seal.update(seq=exc.sealed_seq)
        seq = exc.head_seq + 1 if exc.head_seq < exc.sealed_seq else exc.sealed_seq
        report.add(seq, None, "seal", f"the log is behind its seal (sealed at seq {exc.sealed_seq}): {exc.reason}")
        return
    except LifecycleError as exc:  # a damaged or forged seal, or one made for another key
        report.add(None, None, "seal", f"the seal cannot be trusted: {exc}")
        return
    report.seal.update(ok=True, seq=sealed.seq, hash=sealed.hash, at=sealed.at)
    report.checks["seal"] = True
