"""The draft the rules fold events into: a runner's state, mutable, frozen into a `RunnerState` at the end.

The rules in ``runner.py`` check each event against a `RunnerDraft` and then change it. A draft keeps
its leases one of two ways, behind one set of operations the rules call (so the rules are written once):

- *shared* (`thaw(state)`): the leases stay the frozen tuple of the state thawed, each change makes a
  new tuple and a new `_LeaseIndex`, and freezing costs a constructor call. A command's one or two
  events are folded so, and the state before stays what it was.
- *keyed* (`thaw(state, keyed=True)`): the leases sit in a dict by id, in retained order, changed in
  place, with counts kept as numbers; thawing and freezing copy the leases once. A replay of many
  events is folded so, in time independent of how many leases the runner retains.

A state whose retained lease ids are not distinct (none the rules produce; a damaged or forged
snapshot could hold one) is only ever thawed shared, where each operation keeps the scans' semantics.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import msgspec

from .state import (
    _INDEX,
    Lease,
    RunnerCapacityError,
    RunnerState,
    _find,
    _LeaseIndex,
    index_of,
)

_replace = msgspec.structs.replace


def _capacity_error(capacity: int) -> RunnerCapacityError:
    return RunnerCapacityError(
        f"execution location runner holds {capacity} active leases; settle or park one first")


class RunnerDraft(abc.ABC):
    """A runner's state while events are folded into it: the fields, mutable, and its leases' operations.

    The rules read and set the plain fields directly and change leases only through the methods, each
    of which checks what it must before changing anything (so a refused event leaves the draft as it was).
    """

    __slots__ = ("base_dir", "drain", "generation", "host_holder", "host_token", "last_at", "pending_park",
                 "policy_revision", "post_session_hook_digest", "proxy_authority", "resources", "runner_id", "schema",
                 "state", "target", "units_starting", "updated_at")

    def _take(self, state: Any) -> None:
        self.schema = state.schema
        self.runner_id = state.runner_id
        self.target = state.target
        self.state = state.state
        self.generation = state.generation
        self.policy_revision = state.policy_revision
        self.base_dir = state.base_dir
        self.resources = state.resources
        self.proxy_authority = state.proxy_authority
        self.post_session_hook_digest = state.post_session_hook_digest
        self.drain = state.drain
        self.updated_at = state.updated_at
        self.pending_park = state.pending_park
        # A state stored before `last_at` was kept: its last event was a lifecycle event, or the time
        # of a unit fact after it is lost; `updated_at` is the latest time it can vouch for.
        self.last_at = state.last_at or state.updated_at
        self.units_starting = state.units_starting
        self.host_holder = state.host_holder
        self.host_token = state.host_token

    def _value(self, leases: tuple[Lease, ...], index: _LeaseIndex) -> RunnerState:
        state = RunnerState(
            schema=self.schema, runner_id=self.runner_id, target=self.target, state=self.state,
            generation=self.generation, policy_revision=self.policy_revision, base_dir=self.base_dir,
            resources=self.resources, proxy_authority=self.proxy_authority,
            post_session_hook_digest=self.post_session_hook_digest, drain=self.drain, leases=leases,
            updated_at=self.updated_at, pending_park=self.pending_park, last_at=self.last_at,
            units_starting=self.units_starting, host_holder=self.host_holder, host_token=self.host_token)
        state.__dict__[_INDEX] = index
        return state

    # The lease operations, per way of keeping them (see the module docstring).
    @abc.abstractmethod
    def lease(self, lease_id: str) -> Lease | None:
        """The retained lease with this id, if any."""
        ...

    @abc.abstractmethod
    def active_count(self) -> int:
        """How many retained leases are active."""
        ...

    @abc.abstractmethod
    def session_active(self, session_id: str) -> bool:
        """Whether the session holds an active lease."""
        ...

    @abc.abstractmethod
    def active_ids(self) -> tuple[str, ...]:
        """The ids of the active leases, oldest first."""
        ...

    @abc.abstractmethod
    def add_lease(self, lease: Lease, capacity: int) -> None:
        """Retain `lease`; holding `capacity` leases, evict the oldest no longer active (RunnerCapacityError if none).

        The capacity is the rules' to pass (``runner.MAX_RETAINED_LEASES``, read when they run).
        """
        ...

    @abc.abstractmethod
    def replace_lease(self, old: Lease, new: Lease) -> None:
        """Put `new` where the retained `old` (same id) is."""
        ...

    @abc.abstractmethod
    def park_active(self) -> None:
        """Every active lease becomes parked."""
        ...

    @abc.abstractmethod
    def keep_last(self, count: int) -> None:
        """Retain only the last `count` leases."""
        ...

    @abc.abstractmethod
    def freeze(self) -> RunnerState:
        """The state as a frozen value (the draft may go on folding after)."""
        ...


class _SharedDraft(RunnerDraft):
    __slots__ = ("index", "leases")

    def __init__(self, state: RunnerState) -> None:
        self._take(state)
        self.leases = state.leases
        self.index = index_of(state)

    def lease(self, lease_id: str) -> Lease | None:
        return _find(self.leases, self.index, lease_id)

    def active_count(self) -> int:
        return self.index.active

    def session_active(self, session_id: str) -> bool:
        return self.index.sessions.get(session_id, 0) > 0

    def active_ids(self) -> tuple[str, ...]:
        return tuple(lease.id for lease in self.leases if lease.status == "active")

    def add_lease(self, lease: Lease, capacity: int) -> None:
        leases, index = self.leases, self.index
        evicted = None
        # Tuple concatenation copies in C, twice as fast as unpacking into a new tuple (RUF005's advice).
        if len(leases) < capacity:
            leases = leases + (lease,)  # noqa: RUF005
        else:
            for position, candidate in enumerate(leases):
                if candidate.status != "active":
                    evicted = candidate
                    leases = leases[:position] + leases[position + 1:] + (lease,)
                    break
            else:
                raise _capacity_error(capacity)
        ids = index.ids
        ids.add(lease.id)
        if len(ids) > 2 * len(leases) + 64:
            # Evicted ids pile up in the shared superset; start a fresh one for this line of states.
            ids = {retained.id for retained in leases}
        if evicted is not None:
            index = index.changed(ids, evicted.status, None, evicted.session_id, index.unique)
        self.index = index.changed(ids, None, lease.status, lease.session_id, index.unique)
        self.leases = leases

    def replace_lease(self, old: Lease, new: Lease) -> None:
        leases, index = self.leases, self.index
        if not index.unique:
            # Every lease of that id is replaced, as the scan always did; only a fresh count is sure then.
            self.leases = tuple(new if lease.id == new.id else lease for lease in leases)
            self.index = _LeaseIndex.of(self.leases)
            return
        for position in range(len(leases) - 1, -1, -1):
            if leases[position].id == new.id:
                # One copy into a list and one back: fewer passes over the leases (each a reference count
                # touched, in memory a long replay has long left) than slicing and concatenating.
                replaced = list(leases)
                replaced[position] = new
                self.leases = tuple(replaced)
                break
        if old.status != new.status:
            self.index = index.changed(index.ids, old.status, new.status, old.session_id, True)

    def park_active(self) -> None:
        index = self.index
        self.leases = tuple(_replace(lease, status="parked") if lease.status == "active" else lease
                            for lease in self.leases)
        self.index = _LeaseIndex(index.ids, 0, index.parked + index.active, index.settled, index.other, {},
                                 index.unique)

    def keep_last(self, count: int) -> None:
        self.leases = self.leases[-count:]
        self.index = _LeaseIndex.of(self.leases)

    def freeze(self) -> RunnerState:
        return self._value(self.leases, self.index)


class _KeyedDraft(RunnerDraft):
    # `lease` is the leases dict's own `get`, bound whenever `leases` is set: the rules ask it once or twice
    # an event, and a dict's method answers without a call into Python.
    __slots__ = ("active", "lease", "leases", "other", "parked", "sessions", "settled")
    lease: Callable[[str], Lease | None]  # type: ignore[assignment]
    leases: dict[str, Lease]

    def __init__(self, state: RunnerState | None) -> None:
        self._keep({})
        self.sessions: dict[str, int] = {}
        self.active = self.parked = self.settled = self.other = 0
        if state is not None:
            self._take(state)
            index = index_of(state)
            assert index.unique, "a state with duplicate lease ids is folded shared"
            self._keep({lease.id: lease for lease in state.leases})
            self.sessions = dict(index.sessions)
            self.active, self.parked, self.settled, self.other = index.active, index.parked, index.settled, index.other

    def _count(self, lease: Lease, step: int) -> None:
        status = lease.status
        if status == "active":
            self.active += step
            left = self.sessions.get(lease.session_id, 0) + step
            if left > 0:
                self.sessions[lease.session_id] = left
            else:
                self.sessions.pop(lease.session_id, None)
        elif status == "settled":
            self.settled += step
        elif status == "parked":
            self.parked += step
        else:
            self.other += step

    def _keep(self, leases: dict[str, Lease]) -> None:
        self.leases = leases
        self.lease = leases.get

    def active_count(self) -> int:
        return self.active

    def session_active(self, session_id: str) -> bool:
        return self.sessions.get(session_id, 0) > 0

    def active_ids(self) -> tuple[str, ...]:
        return tuple(lease.id for lease in self.leases.values() if lease.status == "active")

    def add_lease(self, lease: Lease, capacity: int) -> None:
        leases = self.leases
        if len(leases) >= capacity:
            for candidate in leases.values():  # oldest first: a dict keeps insertion order
                if candidate.status != "active":
                    break
            else:
                raise _capacity_error(capacity)
            del leases[candidate.id]
            self._count(candidate, -1)
        leases[lease.id] = lease
        if lease.status == "active":  # a grant, what the rules add: counted here, not by a _count call
            self.active += 1
            sessions, session = self.sessions, lease.session_id
            sessions[session] = sessions.get(session, 0) + 1
        else:
            self._count(lease, 1)

    def replace_lease(self, old: Lease, new: Lease) -> None:
        self.leases[new.id] = new  # an existing key keeps its place
        before, after = old.status, new.status
        if before == after:
            return
        if before == "active" and after in ("settled", "parked"):
            # A lease ending, half the events of a log: counted here, not by two _count calls.
            self.active -= 1
            if after == "settled":
                self.settled += 1
            else:
                self.parked += 1
            sessions, session = self.sessions, old.session_id
            left = sessions.get(session, 0) - 1
            if left > 0:
                sessions[session] = left
            else:
                sessions.pop(session, None)
            return
        self._count(old, -1)
        self._count(new, 1)

    def park_active(self) -> None:
        leases = self.leases
        for lease in leases.values():
            if lease.status == "active":
                leases[lease.id] = _replace(lease, status="parked")  # a value changed, not the keys
        self.parked += self.active
        self.active = 0
        self.sessions.clear()

    def keep_last(self, count: int) -> None:
        if len(self.leases) <= count:
            return  # nothing to trim: the leases and their counts stand
        kept = tuple(self.leases.values())[-count:]
        self._keep({lease.id: lease for lease in kept})
        # The counts made again from the kept leases, by C-level counts over their statuses (a reclaim trims
        # up to 768 leases, every few hundred events of a long log).
        statuses = [lease.status for lease in kept]
        self.active, self.parked, self.settled = (statuses.count("active"), statuses.count("parked"),
                                                  statuses.count("settled"))
        self.other = len(kept) - self.active - self.parked - self.settled
        sessions: dict[str, int] = {}
        if self.active:
            for lease in kept:
                if lease.status == "active":
                    sessions[lease.session_id] = sessions.get(lease.session_id, 0) + 1
        self.sessions = sessions

    def freeze(self) -> RunnerState:
        index = _LeaseIndex(set(self.leases), self.active, self.parked, self.settled, self.other,
                            dict(self.sessions), True)
        return self._value(tuple(self.leases.values()), index)


def thaw(state: RunnerState, *, keyed: bool = False) -> RunnerDraft:
    """A draft of `state`: shared (cheap to make, for a few events) or keyed (for many); see above.

    A state whose retained ids are not distinct is thawed shared whatever `keyed` says.
    """
    if keyed and index_of(state).unique:
        return _KeyedDraft(state)
    return _SharedDraft(state)


def new_draft(**fields: Any) -> RunnerDraft:
    """A keyed draft of a runner with no leases, from its fields (all but ``leases``)."""
    draft = _KeyedDraft(None)
    for name in RunnerDraft.__slots__:
        setattr(draft, name, fields.get(name))
    return draft


def is_keyed(draft: RunnerDraft) -> bool:
    """Whether `draft` keeps its leases keyed (changed in place)."""
    return isinstance(draft, _KeyedDraft)
