"""The runner's state and its transition rules: pure, no I/O, no clock.

`apply(state, event, at_ms)` folds one event into a runner's state and checks, as it does, every rule
of the seed that the event must have obeyed: the command path builds events from a caller's input and
applies them (a broken rule raises the seed's error kind and message, and nothing is appended); the
replay path applies recorded events (a broken rule is an IntegrityError at that seq). One set of rules
serves both, so a log the commands could not have written never replays clean.

Retention follows the seed with one improvement: the state holds at most 1024 leases, evicting the
oldest lease that is no longer active (never an active one), and 256 after a completed reclaim. The
log itself keeps every lease forever.
"""

from __future__ import annotations

import msgspec

from .canonical import parse_iso_ms, receipt_digest
from .errors import AuthorityError, InvalidInputError, LifecycleError, StaleFenceError
from .events import (
    RUNNER_SCHEMA,
    UNIT_EVENTS,
    DrainExpired,
    DrainRequested,
    Event,
    HookAuthorized,
    LeaseAcquired,
    LeaseParked,
    LeaseSettled,
    ProxyRotated,
    ReclaimBegun,
    ReclaimCompleted,
    RunnerInitialized,
    RunnerParked,
    UnitStarting,
)
from .values import ProxyAuthority, Resources

STATES = ("accepting", "draining", "parked", "reclaiming")
LEASE_STATUSES = ("active", "settled", "parked")
PARK_REASONS = ("checkout-failure", "lost-poll", "resource-limit")
MAX_RETAINED_LEASES = 1024
RETAINED_AFTER_RECLAIM = 256
MAX_PROXY_AGE_MS = 5 * 60 * 1000
MAX_PROXY_SKEW_MS = 30_000
MIN_TTL_MS = 1_000
MAX_TTL_MS = 24 * 60 * 60 * 1000
MIN_DRAIN_MS = 1
MAX_DRAIN_MS = 10 * 60 * 1000
HOOK_DOMAIN = "chainlesschain.execution-location.post-session-hook.v1\x00"


class RunnerCapacityError(LifecycleError):
    """The runner holds 1024 active leases: retention evicts no active lease, so a new one is refused."""


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """A lease as the runner's state holds it (the seed's lease record)."""

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


class RunnerState(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """A runner's whole state, as the seed's JSON file held it, rebuilt from its events.

    ``pending_park`` is set between a fact that leaves no active lease and the RunnerParked that
    must follow it in the same transaction; a replay that finds anything else there is illegal.
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

    def lease(self, lease_id: str) -> Lease | None:
        """The retained lease with this id, if any."""
        index = _index(self)
        if lease_id not in index.ids:
            return None
        # Ids are distinct (the rules keep them so), so the last match is the only one; the leases
        # asked for are mostly the recent ones, at the end.
        for lease in reversed(self.leases) if index.unique else self.leases:
            if lease.id == lease_id:
                return lease
        return None

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


def hook_receipt_material(*, runner_id: str, runner_generation: int, lease_id: str, lease_generation: int,
                          result_digest: str, hook_digest: str) -> dict[str, object]:
    """The seed's post-session hook receipt material (camelCase, so digests match the seed's)."""
    return {
        "runnerId": runner_id,
        "runnerGeneration": runner_generation,
        "leaseId": lease_id,
        "leaseGeneration": lease_generation,
        "resultDigest": result_digest,
        "hookDigest": hook_digest,
    }


def check_fresh(proxy: ProxyAuthority, now_ms: int) -> None:
    """AuthorityError unless the authority was issued at most 30 s ahead, at most 5 min ago, and lives."""
    issued = parse_iso_ms(proxy.issued_at)
    expires = parse_iso_ms(proxy.expires_at)
    if issued > now_ms + MAX_PROXY_SKEW_MS or now_ms - issued > MAX_PROXY_AGE_MS or expires <= now_ms:
        raise AuthorityError(
            f"execution location proxy authority is not fresh (proxy_authority {proxy.id} revision "
            f"{proxy.revision}: issued_at {proxy.issued_at}, expires_at {proxy.expires_at})"
        )


def check_min_revision(proxy: ProxyAuthority, minimum: int) -> None:
    """InvalidInputError when the revision is below the minimum (the seed's safeInteger bound)."""
    if proxy.revision < max(1, minimum):
        raise InvalidInputError(
            "proxy_authority.revision",
            f"proxy authority revision is invalid: {proxy.revision} is below the minimum {max(1, minimum)}",
        )


class _LeaseIndex:
    """What the rules ask of a state's leases, answered without scanning them; derived, never stored.

    `ids` is a superset of the retained lease ids: shared by a line of states and only ever grown, it
    stays a superset for every state holding it, so an id not in it is not retained. `active` counts
    the active leases and `sessions` counts them per session (a new dict on every change: it holds
    only active leases, a handful). `unique` says the retained ids are distinct: the rules keep them
    so, and a state decoded with duplicates falls back to the scans. An index is never changed once
    made (but for `ids` growing), so states may share one.
    """

    __slots__ = ("active", "ids", "sessions", "unique")

    def __init__(self, ids: set[str], active: int, sessions: dict[str, int], unique: bool) -> None:
        self.ids = ids
        self.active = active
        self.sessions = sessions
        self.unique = unique

    @classmethod
    def of(cls, leases: tuple[Lease, ...]) -> _LeaseIndex:
        """The index of `leases`, by one scan."""
        ids = {lease.id for lease in leases}
        sessions: dict[str, int] = {}
        for lease in leases:
            if lease.status == "active":
                sessions[lease.session_id] = sessions.get(lease.session_id, 0) + 1
        return cls(ids, sum(sessions.values()), sessions, len(ids) == len(leases))

    def ended(self, lease: Lease) -> _LeaseIndex:
        """The index once the active `lease` is no longer active."""
        sessions = dict(self.sessions)
        left = sessions.pop(lease.session_id, 0) - 1
        if left > 0:
            sessions[lease.session_id] = left
        return _LeaseIndex(self.ids, self.active - 1, sessions, self.unique)


_INDEX = "_lease_index"


def _index(state: RunnerState) -> _LeaseIndex:
    index: _LeaseIndex | None = state.__dict__.get(_INDEX)
    if index is None:
        index = state.__dict__[_INDEX] = _LeaseIndex.of(state.leases)
    return index


def _indexed(state: RunnerState, index: _LeaseIndex) -> RunnerState:
    state.__dict__[_INDEX] = index
    return state


def _with_lease(leases: tuple[Lease, ...], lease: Lease) -> tuple[Lease, ...]:
    """Append a lease, evicting the oldest lease that is no longer active when at capacity."""
    # Tuple concatenation copies in C, twice as fast as unpacking into a new tuple (RUF005's advice).
    if len(leases) < MAX_RETAINED_LEASES:
        return leases + (lease,)  # noqa: RUF005
    for index, candidate in enumerate(leases):
        if candidate.status != "active":
            return leases[:index] + leases[index + 1:] + (lease,)
    raise RunnerCapacityError(
        f"execution location runner holds {MAX_RETAINED_LEASES} active leases; settle or park one first"
    )


def _replace_lease(state: RunnerState, new: Lease) -> tuple[Lease, ...]:
    """The state's leases with the one of `new`'s id replaced by `new` (a copy, never a scan in Python)."""
    leases = state.leases
    if not _index(state).unique:
        return tuple(new if lease.id == new.id else lease for lease in leases)
    for position in range(len(leases) - 1, -1, -1):
        if leases[position].id == new.id:
            # One copy into a list and one back: fewer passes over the leases (each a reference count
            # touched, in memory a long replay has long left) than slicing and concatenating.
            replaced = list(leases)
            replaced[position] = new
            return tuple(replaced)
    return leases


def _replace(current: RunnerState, /, **changes: object) -> RunnerState:
    return msgspec.structs.replace(current, **changes)


def apply(state: RunnerState | None, event: Event, at_ms: int, at: str) -> RunnerState:
    """Fold `event`, stamped `at` (ISO) / `at_ms` (epoch ms), into `state`, checking every rule.

    Raises the seed's error kinds (StaleFenceError, AuthorityError, InvalidInputError, LifecycleError)
    when the event breaks a rule for this state.
    """
    if state is None:
        if not isinstance(event, RunnerInitialized):
            raise LifecycleError(f"runner is not initialized: its first event is {type(event).__name__}")
        if event.schema != RUNNER_SCHEMA:
            raise LifecycleError(f"runner lifecycle state schema is invalid: {event.schema!r}")
        return RunnerState(
            schema=event.schema, runner_id=event.runner_id, target=event.target, state="accepting", generation=1,
            policy_revision=1, base_dir=event.base_dir, resources=event.resources,
            proxy_authority=ProxyRef(id="unbound", revision=0),
            post_session_hook_digest=event.post_session_hook_digest, drain=None, leases=(), updated_at=at,
        )
    if state.pending_park is not None and not isinstance(event, RunnerParked):
        raise LifecycleError(f"runner must park ({state.pending_park}) before {type(event).__name__}")
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise LifecycleError(f"{type(event).__name__} does not apply to an initialized runner")
    return handler(state, event, at_ms, at)


def _initialized_again(state: RunnerState, event: RunnerInitialized, at_ms: int, at: str) -> RunnerState:
    raise LifecycleError(f"runner {state.runner_id} is already initialized")


def _lease_acquired(state: RunnerState, event: LeaseAcquired, at_ms: int, at: str) -> RunnerState:
    proxy = event.proxy_authority
    check_fresh(proxy, at_ms)  # first, as the seed's validateProxyAuthority runs before its fences
    if state.state != "accepting" or state.generation != event.lease_generation:
        raise StaleFenceError(
            f"execution location runner is not accepting this generation (runner {state.state} at generation "
            f"{state.generation}, expected_generation {event.lease_generation})"
        )
    index = _index(state)
    if index.sessions.get(event.session_id, 0) > 0:
        raise StaleFenceError(f"execution location session already has an active lease (session_id "
                              f"{event.session_id})")
    if state.proxy_authority.id not in ("unbound", proxy.id):
        raise AuthorityError(f"execution location proxy authority identity drifted (proxy_authority.id "
                             f"{proxy.id}, runner bound to {state.proxy_authority.id})")
    if proxy.revision < state.proxy_authority.revision:
        raise AuthorityError(f"execution location proxy authority revision rolled back (proxy_authority.revision "
                             f"{proxy.revision} < {state.proxy_authority.revision})")
    ttl = parse_iso_ms(event.expires_at) - at_ms
    if event.issued_at != at or not MIN_TTL_MS <= ttl <= MAX_TTL_MS:
        raise InvalidInputError("ttl_ms", f"lease ttlMs is invalid: {ttl} is outside {MIN_TTL_MS}..{MAX_TTL_MS}")
    if state.lease(event.lease_id) is not None:
        raise StaleFenceError(f"execution location lease id is already taken (lease_id {event.lease_id})")
    lease = Lease(id=event.lease_id, session_id=event.session_id, generation=event.lease_generation,
                  issued_at=event.issued_at, expires_at=event.expires_at, status="active")
    leases = _with_lease(state.leases, lease)
    new = _replace(state, proxy_authority=ProxyRef(id=proxy.id, revision=proxy.revision), leases=leases,
                   updated_at=at)
    ids = index.ids
    ids.add(lease.id)
    if len(ids) > 2 * len(leases) + 64:
        # Evicted ids pile up in the shared superset; start a fresh one for this line of states.
        ids = {retained.id for retained in leases}
    sessions = dict(index.sessions)
    sessions[lease.session_id] = sessions.get(lease.session_id, 0) + 1
    return _indexed(new, _LeaseIndex(ids, index.active + 1, sessions, index.unique))


def _proxy_rotated(state: RunnerState, event: ProxyRotated, at_ms: int, at: str) -> RunnerState:
    proxy = event.proxy_authority
    check_min_revision(proxy, state.proxy_authority.revision + 1)
    check_fresh(proxy, at_ms)
    if (state.state not in ("accepting", "draining") or event.generation != state.generation + 1
            or proxy.id != state.proxy_authority.id):
        raise StaleFenceError(
            f"execution location proxy rotation fence is stale (runner {state.state} at generation "
            f"{state.generation}, expected_generation {event.generation - 1}, proxy_authority.id {proxy.id})"
        )
    if event.policy_revision != state.policy_revision + 1:
        raise LifecycleError(f"policy revision must become {state.policy_revision + 1}, not {event.policy_revision}")
    return _indexed(_replace(state, generation=event.generation, policy_revision=event.policy_revision,
                             proxy_authority=ProxyRef(id=proxy.id, revision=proxy.revision), updated_at=at),
                    _index(state))


def _drain_requested(state: RunnerState, event: DrainRequested, at_ms: int, at: str) -> RunnerState:
    if event.signal != "SIGTERM":
        raise InvalidInputError("signal", f"runner drain requires SIGTERM, got {event.signal!r}")
    timeout = parse_iso_ms(event.deadline_at) - at_ms
    if event.requested_at != at or not MIN_DRAIN_MS <= timeout <= MAX_DRAIN_MS:
        raise InvalidInputError("timeout_ms", f"drain timeoutMs is invalid: {timeout} is outside "
                                              f"{MIN_DRAIN_MS}..{MAX_DRAIN_MS}")
    if state.state != "accepting" or event.generation != state.generation + 1:
        raise StaleFenceError(f"execution location drain generation is stale (runner {state.state} at generation "
                              f"{state.generation}, expected_generation {event.generation - 1})")
    drain = Drain(signal=event.signal, requested_at=event.requested_at, deadline_at=event.deadline_at)
    index = _index(state)
    pending = "drain-idle" if index.active == 0 else None
    return _indexed(_replace(state, state="draining", generation=event.generation, drain=drain, updated_at=at,
                             pending_park=pending), index)


def _active_lease(state: RunnerState, lease_id: str, lease_generation: int, message: str) -> Lease:
    lease = state.lease(lease_id)
    if lease is None or lease.status != "active" or lease.generation != lease_generation:
        found = "no such lease" if lease is None else f"lease {lease.status} at generation {lease.generation}"
        raise StaleFenceError(f"{message} (lease_id {lease_id}, lease_generation {lease_generation}: {found})")
    return lease


def _ended(state: RunnerState, lease: Lease, leases: tuple[Lease, ...]) -> _LeaseIndex:
    """The index after the active `lease` ended, leaving `leases`."""
    index = _index(state)
    # With duplicate ids every lease of that id was replaced; only a fresh count is sure then.
    return index.ended(lease) if index.unique else _LeaseIndex.of(leases)


def _lease_settled(state: RunnerState, event: LeaseSettled, at_ms: int, at: str) -> RunnerState:
    lease = _active_lease(state, event.lease_id, event.lease_generation,
                          "execution location result lease fence is stale")
    leases = _replace_lease(state, msgspec.structs.replace(lease, status="settled", result_digest=event.result_digest))
    index = _ended(state, lease, leases)
    pending = "drain-settled" if state.state == "draining" and index.active == 0 else None
    return _indexed(_replace(state, leases=leases, updated_at=at, pending_park=pending), index)


def _lease_parked(state: RunnerState, event: LeaseParked, at_ms: int, at: str) -> RunnerState:
    if event.reason not in PARK_REASONS:
        raise InvalidInputError("reason", f"execution location park reason is invalid: {event.reason!r}")
    if state.state not in ("accepting", "draining"):
        raise StaleFenceError(f"execution location park lease fence is stale (runner {state.state})")
    lease = _active_lease(state, event.lease_id, event.lease_generation,
                          "execution location park lease fence is stale")
    leases = _replace_lease(state, msgspec.structs.replace(lease, status="parked", result_digest=event.result_digest))
    index = _ended(state, lease, leases)
    return _indexed(_replace(state, leases=leases, updated_at=at,
                             pending_park="lease-parked" if index.active == 0 else None), index)


def _drain_expired(state: RunnerState, event: DrainExpired, at_ms: int, at: str) -> RunnerState:
    if state.state != "draining" or state.drain is None or parse_iso_ms(state.drain.deadline_at) > at_ms:
        raise StaleFenceError(f"execution location drain is not ready to park (runner {state.state})")
    if event.deadline_at != state.drain.deadline_at:
        raise LifecycleError(f"drain deadline {event.deadline_at} is not the runner's {state.drain.deadline_at}")
    active = tuple(lease.id for lease in state.leases if lease.status == "active")
    if tuple(event.lease_ids) != active:
        raise LifecycleError("the leases parked by an expired drain are not the runner's active leases")
    leases = tuple(msgspec.structs.replace(lease, status="parked") if lease.status == "active" else lease
                   for lease in state.leases)
    index = _index(state)
    return _indexed(_replace(state, leases=leases, updated_at=at, pending_park="drain-expired"),
                    _LeaseIndex(index.ids, 0, {}, index.unique))


def _runner_parked(state: RunnerState, event: RunnerParked, at_ms: int, at: str) -> RunnerState:
    if state.pending_park is None or event.cause != state.pending_park:
        raise LifecycleError(f"runner cannot park for {event.cause!r} here (pending: {state.pending_park})")
    if event.generation != state.generation + 1:
        raise LifecycleError(f"parking must move generation to {state.generation + 1}, not {event.generation}")
    return _indexed(_replace(state, state="parked", generation=event.generation, drain=None, updated_at=at,
                             pending_park=None), _index(state))


def _reclaim_begun(state: RunnerState, event: ReclaimBegun, at_ms: int, at: str) -> RunnerState:
    proxy = event.proxy_authority
    check_min_revision(proxy, state.proxy_authority.revision + 1)
    check_fresh(proxy, at_ms)
    if state.state != "parked" or event.generation != state.generation + 1 or proxy.id != state.proxy_authority.id:
        raise StaleFenceError(
            f"execution location reclaim fence is stale (runner {state.state} at generation {state.generation}, "
            f"expected_generation {event.generation - 1}, proxy_authority.id {proxy.id})"
        )
    return _indexed(_replace(state, state="reclaiming", generation=event.generation,
                             proxy_authority=ProxyRef(id=proxy.id, revision=proxy.revision), updated_at=at),
                    _index(state))


def _reclaim_completed(state: RunnerState, event: ReclaimCompleted, at_ms: int, at: str) -> RunnerState:
    if state.state != "reclaiming" or event.generation != state.generation + 1:
        raise StaleFenceError(f"execution location reclaim completion is stale (runner {state.state} at "
                              f"generation {state.generation}, expected_generation {event.generation - 1})")
    return _replace(state, state="accepting", generation=event.generation,
                    leases=state.leases[-RETAINED_AFTER_RECLAIM:], updated_at=at)


def _hook_authorized(state: RunnerState, event: HookAuthorized, at_ms: int, at: str) -> RunnerState:
    lease = state.lease(event.lease_id)
    if (state.generation != event.runner_generation or state.state not in ("parked", "draining") or lease is None
            or lease.generation != event.lease_generation or lease.status == "active"
            or lease.result_digest != event.result_digest or lease.hook_receipt_digest is not None
            or event.hook_digest != state.post_session_hook_digest):
        raise StaleFenceError(
            f"execution location post-session hook fence is stale (runner {state.state} at generation "
            f"{state.generation}, expected_runner_generation {event.runner_generation}, lease_id {event.lease_id})"
        )
    material = hook_receipt_material(
        runner_id=state.runner_id, runner_generation=state.generation, lease_id=lease.id,
        lease_generation=lease.generation, result_digest=event.result_digest, hook_digest=event.hook_digest)
    if receipt_digest(HOOK_DOMAIN, material) != event.receipt_digest:
        raise LifecycleError("post-session hook receipt digest does not match its material")
    leases = _replace_lease(state, msgspec.structs.replace(lease, hook_receipt_digest=event.receipt_digest))
    new = _replace(state, leases=leases, updated_at=at)
    index = _index(state)
    # The lease's status is unchanged, and so is every count: the index carries over (unless duplicate
    # ids were all replaced by this one lease; then the next use counts afresh).
    return _indexed(new, index) if index.unique else new


def _unit_starting(state: RunnerState, event: UnitStarting, at_ms: int, at: str) -> RunnerState:
    lease = state.lease(event.lease_id)
    if lease is None or lease.status != "active" or lease.generation != event.lease_generation:
        raise StaleFenceError(f"a unit may only start for an active lease (lease_id {event.lease_id})")
    return state


def _unit_fact(state: RunnerState, event: Event, at_ms: int, at: str) -> RunnerState:
    # A unit's outcome may be recorded after its lease ended (a unit outliving a settle is stopped
    # and recorded as such); only the intent to start one needs the lease active.
    return state


_HANDLERS = {
    RunnerInitialized: _initialized_again,
    LeaseAcquired: _lease_acquired,
    ProxyRotated: _proxy_rotated,
    DrainRequested: _drain_requested,
    LeaseSettled: _lease_settled,
    LeaseParked: _lease_parked,
    DrainExpired: _drain_expired,
    RunnerParked: _runner_parked,
    ReclaimBegun: _reclaim_begun,
    ReclaimCompleted: _reclaim_completed,
    HookAuthorized: _hook_authorized,
    UnitStarting: _unit_starting,
}
for _unit_event in UNIT_EVENTS:
    _HANDLERS.setdefault(_unit_event, _unit_fact)
