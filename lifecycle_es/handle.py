"""`RunnerHandle`: what every command of a `RunnerLifecycle` runs through.

A handle names one runner (its stream) on an event store, with the identity a caller configured, an
injected clock and id source, and the runner's state kept in memory between commands. `_commit`
is the one transaction a command decides in (shared with other threads' commands through the store's
group commit, under a savepoint of its own): under the store's write lock it catches the state up
with the log (another process may have moved it), checks the identity, stamps a time never before
the log's head, lets the command decide its events, applies them through the rules (``runner.py``,
which raise the fences' errors, ``fences.py``), appends what the rules owe (a park that is due) and
the events at the stream's version, and takes a snapshot every so many events. The commands
themselves are in ``lifecycle.py``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

from msgspec import UNSET

from .canonical import MAX_EPOCH_MS, iso_ms, parse_iso_ms
from .errors import InvalidInputError, LifecycleError, PreflightError
from .events import Event, RunnerParked
from .fences import check_identity
from .host_fence import HostLeaseGrant, check_grant, stamped
from .log import RecordedEvent
from .preflight import preflight_writable_directory
from .replay import EMPTY, Folded, load, write_snapshot
from .runner import apply
from .state import RunnerState
from .store import EventStore, WriteTransaction
from .values import MAX_PATH_CHARS, Resources, not_plain, safe_digest, safe_id, safe_int, safe_path, safe_target, shown

DEFAULT_SNAPSHOT_EVERY = 64
"""How many of a runner's events the default snapshot interval spans, while the runner retains few leases."""
LEASES_PER_SNAPSHOT_EVENT = 4
"""The default interval grows (doubling from `DEFAULT_SNAPSHOT_EVERY`) until it spans at least a quarter as many
events as the runner retains leases (see `snapshot_interval`)."""


def snapshot_interval(every: int | None, leases: int) -> int:
    """How many of a runner's events lie between two of its snapshots: `every` when the caller chose it; by default
    `DEFAULT_SNAPSHOT_EVERY`, doubled while it spans fewer than a quarter as many events as the runner retains
    leases (`leases`).

    A snapshot holds every retained lease, so it costs about as much to write as they do (about 280 bytes each):
    every 64 events, a runner retaining 1,024 leases would write about 4.4 KB of snapshot per event, 19 times the
    event itself. Spread over 256 events it writes a quarter of that, and a cold load folds at most 256 events
    after it (under a millisecond), against the snapshot's own 1,024 leases to decode.
    """
    if every is not None:
        return every
    interval = DEFAULT_SNAPSHOT_EVERY
    while interval * LEASES_PER_SNAPSHOT_EVENT < leases:
        interval *= 2
    return interval


class UnknownRunnerError(LifecycleError):
    """The runner has no events yet: call `initialize` first."""


def _system_clock() -> int:
    return time.time_ns() // 1_000_000


def _random_hex() -> str:
    return uuid.uuid4().hex


def normalize_base_dir(base_dir: object) -> str:
    """An absolute, normalized base directory (1..4096 characters, no NUL nor lone surrogate), or InvalidInputError."""
    if not isinstance(base_dir, str | os.PathLike):
        raise InvalidInputError("base_dir", f"runner base_dir is invalid: {type(base_dir).__name__} is not a path")
    text = os.fspath(base_dir)
    if type(text) is not str:
        raise not_plain(text, "base_dir") or InvalidInputError(
            "base_dir", f"runner base_dir is invalid: {shown(text)} is bytes (pass a str path)")
    if not text:
        raise InvalidInputError("base_dir", "runner base_dir is invalid: it is empty (pass an absolute directory)")
    if len(text) > MAX_PATH_CHARS:
        raise InvalidInputError("base_dir", f"runner base_dir is invalid: {len(text)} characters, more than "
                                            f"{MAX_PATH_CHARS}")
    if "\0" in text:
        raise InvalidInputError("base_dir", f"runner base_dir is invalid: {shown(text)} holds NUL")
    # The very check the rules hold a recorded base dir to, on the path as resolved.
    return safe_path(os.path.abspath(text), "base_dir", "runner base_dir")


class RunnerHandle:
    """One runner's stream on an event store, and the transaction every command decides in.

    `RunnerLifecycle` is the handle with its commands; its docstring documents the parameters.
    """

    def __init__(self, store: EventStore, *, runner_id: str, target: str, base_dir: str | os.PathLike[str],
                 resources: Resources | dict[str, int], post_session_hook_digest: str,
                 now: Callable[[], int] | None = None, random_id: Callable[[], str] | None = None,
                 preflight_base_dir: Callable[[str], None] | None = None,
                 snapshot_every: int | None = None) -> None:
        if not isinstance(store, EventStore):
            raise InvalidInputError("store", f"store must be an EventStore, got {type(store).__name__}")
        self.store = store
        self.runner_id = safe_id(runner_id, "runner_id")
        self.target = safe_target(target)
        self.base_dir = normalize_base_dir(base_dir)
        self.resources = Resources.coerce(resources)
        self.post_session_hook_digest = safe_digest(post_session_hook_digest, "post_session_hook_digest")
        for name, value in (("now", now), ("random_id", random_id), ("preflight_base_dir", preflight_base_dir)):
            if value is not None and not callable(value):
                raise InvalidInputError(name, f"runner {name} must be a function, got {type(value).__name__}")
        self._now = now or _system_clock
        self._random_id = random_id or _random_hex
        self._preflight = preflight_base_dir or (lambda path: preflight_writable_directory(path, self._random_id))
        self._snapshot_every = None if snapshot_every is None else safe_int(snapshot_every, "snapshot_every", 1)
        self._folded: Folded = EMPTY
        # The host lease this handle writes under (`RunnerLifecycle.take_host_lease`), or None.
        self._host_grant: HostLeaseGrant | None = None

    def __repr__(self) -> str:
        state = self._folded.state
        where = f"{state.state} at generation {state.generation}" if state else "not loaded"
        return f"{type(self).__name__}({self.runner_id!r}, {self.target}, {where}, version {self._folded.version})"

    def _clock(self) -> int:
        value = self._now()
        if type(value) is not int or not 0 <= value <= MAX_EPOCH_MS:
            raise InvalidInputError("now", f"now() must return epoch milliseconds as an int, got {shown(value)}")
        return value

    def clock(self) -> int:
        """The lifecycle's clock now, in epoch milliseconds (checked: an int in range)."""
        return self._clock()

    def _catch_up(self, tx: WriteTransaction | None = None) -> Folded:
        """The runner's state as of the log's current end (reads only the events this handle has not seen).

        Inside a write transaction `tx` the stream's version is read through it, under the lock, and
        the append that follows reuses that read instead of making it again. What is read there is kept
        only once committed (`_keep`): in a batch it may hold writes of others that never commit. So is what
        a read without `tx` sees inside a write transaction this thread holds (a commit's work asking a
        runner's state): kept, a rolled-back event would stay in the state the next commands decide against.
        """
        folded = self._folded
        if folded.state is None:
            folded = load(self.store, self.runner_id)
        elif (tx.stream_version(self.runner_id) if tx is not None
              else self.store.stream_version(self.runner_id)) != folded.version:
            folded = load(self.store, self.runner_id, base=folded)
        if tx is None and not self.store.in_transaction:
            self._folded = folded
        return folded

    def _keep(self, folded: Folded) -> None:
        """Keep `folded`, read or written in a write transaction that has committed."""
        self._folded = folded

    def _state(self) -> RunnerState:
        with self.store.lock:  # committed state only, never a batch another thread has in flight
            state = self._catch_up().state
        if state is None:
            raise UnknownRunnerError(f"runner {self.runner_id} is not initialized (call initialize() first)")
        self._check_identity(state)
        return state

    def _check_identity(self, state: RunnerState) -> None:
        check_identity(state, self.runner_id, self.target, self.base_dir)

    def _commit(self, action: str, decide: Callable[[RunnerState, int, str], list[Event]],
                ) -> tuple[RunnerState, list[RecordedEvent]]:
        """Decide under the write lock against the current state, apply through the rules, append.

        Runs through `EventStore.commit`, so commands of other threads share its transaction (each
        under a savepoint); the state is kept once the commit is durable.
        """

        def work(tx: WriteTransaction) -> tuple[RunnerState, list[RecordedEvent], Folded]:
            current = self._catch_up(tx)
            if current.state is None:
                raise UnknownRunnerError(f"runner {self.runner_id} is not initialized (call initialize() first)")
            self._check_identity(current.state)
            now_ms = self._stamp(tx, current.state)
            at = iso_ms(now_ms)
            events = decide(current.state, now_ms, at)
            grant = self._host_grant
            if grant is not None:
                # A host's write: its lease checked under this lock, its token on every event it appends.
                check_grant(tx, grant, tx.lease_clock(now_ms))
                events = stamped(events, grant.token)
            state = current.state
            for event in events:
                state = apply(state, event, now_ms, at)
            if state.pending_park is not None:
                # A consequence is its own event in the same transaction: the rules say a park is due.
                parked = RunnerParked(cause=state.pending_park, generation=state.generation + 1,
                                      host_token=grant.token if grant is not None else UNSET)
                state = apply(state, parked, now_ms, at)
                events.append(parked)
            # Decided through the rules above, under this lock: appended as decided.
            recorded = tx.append_unchecked(self.runner_id, events, expected_version=current.version, at=at)
            folded = Folded(state, recorded[-1].version, recorded[-1].seq)
            every = snapshot_interval(self._snapshot_every, len(state.leases))
            if folded.version // every > current.version // every:
                write_snapshot(self.store, self.runner_id, folded, recorded[-1].hash)
            return state, recorded, folded

        state, recorded, folded = self.store.commit(action, work, stream=self.runner_id)
        self._keep(folded)
        return state, recorded

    def _stamp(self, tx: WriteTransaction, state: RunnerState | None) -> int:
        """The time a command's events are stamped: the clock, but never before the log's head or the
        stream's last event (a clock stepped back must neither stop the commands nor run the log backwards).

        Read under the write lock, so no event can land before this one with a later stamp.
        """
        now_ms = self._clock()
        head_at = tx.head_at()  # answered from the tail `_catch_up` just read: no second query
        if head_at:
            now_ms = max(now_ms, parse_iso_ms(head_at))
        if state is not None:
            now_ms = max(now_ms, parse_iso_ms(state.last_at or state.updated_at))
        return now_ms

    def _preflight_base_dir(self) -> None:
        try:
            self._preflight(self.base_dir)
        except LifecycleError:
            raise
        except OSError as exc:
            raise PreflightError(f"execution location base directory preflight failed (base_dir "
                                 f"{self.base_dir!r}: {exc.strerror or exc}); make it a writable directory") from None

    def _lease_id(self) -> str:
        value = self._random_id()
        if type(value) is not str:  # a subclass's format() is its own to answer
            raise InvalidInputError("random_id", f"random_id() must return a plain str, got {type(value).__name__}")
        return safe_id(f"lease-{value}", "random_id")

