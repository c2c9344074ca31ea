"""A runner's state as a value: frozen, encoded into snapshots, compared by the audit.

`RunnerState` and its parts, the snapshot codec, and the `_LeaseIndex` a state carries beside its
fields so that questions about its leases (is this id retained, how many are active, does this
session hold one) need no scan. The rules fold events into a mutable `RunnerDraft` (``draft.py``)
and freeze it back into a `RunnerState`.
"""

from __future__ import annotations

import msgspec

from .errors import LifecycleError
from .values import Resources


class RunnerCapacityError(LifecycleError):
    """The runner holds 1024 active leases: retention evicts no active lease, so a new one is refused."""


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """A lease as the runner's state holds it (the original's lease record)."""

    id: str
    session_id: str
    generation: int
    issued_at: str
    expires_at: str
    status: str
    result_digest: str | None = None
    hook_receipt_digest: str | None = None


class ProxyRef(msgspec.Struct, frozen=True, kw_only=True):
    """The proxy authority a runner is bound to: id (``unbound`` at first) and revision."""

    id: str
    revision: int


class Drain(msgspec.Struct, frozen=True, kw_only=True):
    """A drain under way: the signal, when it was requested, and its deadline."""

    signal: str
    requested_at: str
    deadline_at: str


class UnitIntent(msgspec.Struct, frozen=True, kw_only=True):
    """A unit start a host announced (``UnitStarting``) and has not yet recorded as started or ended."""

    lease_id: str
    mode: str
    run_dir: str
    unit: str | None = None


class RunnerState(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """A runner's whole state, as the original's JSON file held it, rebuilt from its events.

    ``pending_park`` is set between a fact that leaves no active lease and the RunnerParked that
    must follow it in the same transaction; a replay that finds anything else there is illegal.
    ``last_at`` is when the stream's last event was stamped (unit facts included, which leave
    ``updated_at`` alone; None in a state stored before it was kept: then ``updated_at``), so no event
    may be stamped before it. ``units_starting`` holds the unit starts announced and not yet followed
    by their outcome, one per lease at most, each of an active lease. ``host_holder`` and
    ``host_token`` are the runner's host lease as its last ``HostLeaseAcquired`` took it (None and 0
    before any): every host event after it carries that token.
    Besides its fields a state may carry a `_LeaseIndex` in its ``__dict__`` (``dict=True``): derived
    from ``leases``, never encoded, compared or hashed, it spares the rules a scan of every retained
    lease per event.
    """

    schema: str
    runner_id: str
    target: str
    state: str
    generation: int
    policy_revision: int
    base_dir: str
    resources: Resources
    proxy_authority: ProxyRef
    post_session_hook_digest: str
    drain: Drain | None
    leases: tuple[Lease, ...]
    updated_at: str
    pending_park: str | None = None
    last_at: str | None = None
    units_starting: tuple[UnitIntent, ...] = ()
    host_holder: str | None = None
    host_token: int = 0

    def lease(self, lease_id: str) -> Lease | None:
        """The retained lease with this id, if any."""
        return _find(self.leases, index_of(self), lease_id)

    def active_leases(self) -> list[Lease]:
        """Leases still active."""
        return [lease for lease in self.leases if lease.status == "active"]


_STATE_DECODER = msgspec.json.Decoder(RunnerState)
_STATE_ENCODER = msgspec.json.Encoder()


def encode_state(state: RunnerState) -> bytes:
    """A state's bytes for a snapshot."""
    return _STATE_ENCODER.encode(state)


def decode_state(data: bytes) -> RunnerState:
    """A state from snapshot bytes (msgspec errors on damage)."""
    return _STATE_DECODER.decode(data)


class _LeaseIndex:
    """What the rules ask of a state's leases, answered without scanning them; derived, never stored.

    `ids` is a superset of the retained lease ids: shared by a line of states and only ever grown, it
    stays a superset for every state holding it, so an id not in it is not retained. `active`,
    `parked`, `settled` count the leases of each status and `other` those of any other status (only a
    damaged snapshot has one); `sessions` counts active leases per session (a new dict on every change:
    it holds only active leases). `unique` says the retained ids are distinct. An index is never
    changed once made (but for `ids` growing), so states may share one.
    """

    __slots__ = ("active", "ids", "other", "parked", "sessions", "settled", "unique")

    def __init__(self, ids: set[str], active: int, parked: int, settled: int, other: int,
                 sessions: dict[str, int], unique: bool) -> None:
        self.ids = ids
        self.active = active
        self.parked = parked
        self.settled = settled
        self.other = other
        self.sessions = sessions
        self.unique = unique

    @classmethod
    def of(cls, leases: tuple[Lease, ...]) -> _LeaseIndex:
        """The index of `leases`, by one scan."""
        ids = {lease.id for lease in leases}
        sessions: dict[str, int] = {}
        counts = {"active": 0, "parked": 0, "settled": 0}
        other = 0
        for lease in leases:
            status = lease.status
            if status == "active":
                sessions[lease.session_id] = sessions.get(lease.session_id, 0) + 1
            if status in counts:
                counts[status] += 1
            else:
                other += 1
        return cls(ids, counts["active"], counts["parked"], counts["settled"], other, sessions,
                   len(ids) == len(leases))

    def changed(self, ids: set[str], before: str | None, after: str | None, session: str,
                unique: bool) -> _LeaseIndex:
        """The index once one lease of `session` went from status `before` to `after` (None: absent)."""
        counts = [self.active, self.parked, self.settled, self.other]
        sessions = self.sessions
        if before is not None:
            counts[_SLOT.get(before, 3)] -= 1
        if after is not None:
            counts[_SLOT.get(after, 3)] += 1
        if (before == "active") != (after == "active"):
            sessions = dict(sessions)
            left = sessions.get(session, 0) + (1 if after == "active" else -1)
            if left > 0:
                sessions[session] = left
            else:
                sessions.pop(session, None)
        active, parked, settled, other = counts
        return _LeaseIndex(ids, active, parked, settled, other, sessions, unique)


_SLOT = {"active": 0, "parked": 1, "settled": 2}
_INDEX = "_lease_index"


def index_of(state: RunnerState) -> _LeaseIndex:
    """The state's lease index, made by one scan the first time it is asked for."""
    index: _LeaseIndex | None = state.__dict__.get(_INDEX)
    if index is None:
        index = state.__dict__[_INDEX] = _LeaseIndex.of(state.leases)
    return index


def lease_counts(state: RunnerState) -> tuple[int, int, int]:
    """(active, parked, settled) lease counts, from the index; a status the original has not is a KeyError."""
    index = index_of(state)
    if index.other:
        # As the original's project() has it: a status it does not know is an error, not a count.
        raise KeyError(next(lease.status for lease in state.leases if lease.status not in _SLOT))
    return index.active, index.parked, index.settled


def _find(leases: tuple[Lease, ...], index: _LeaseIndex, lease_id: str) -> Lease | None:
    if lease_id not in index.ids:
        return None
    # Ids are distinct (the rules keep them so), so the last match is the only one; the leases asked
    # for are mostly the recent ones, at the end. With duplicates the first match answers, as it did.
    for lease in reversed(leases) if index.unique else leases:
        if lease.id == lease_id:
            return lease
    return None
