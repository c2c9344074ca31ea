"""Property-testing kit for hosts that embed lifecycle-es.

This module needs hypothesis installed (a test-only dependency: ``pip install 'lifecycle-es[test]'``);
the library itself never imports it.

- `FakeClock`, `SequentialIds`: the injected clock and id source, under the test's control.
- Value strategies: `ids`, `digests`, `resources`, `proxy_authorities` (fresh at a given time).
- `ReferenceRunner`: an independent in-memory model of the seed (the JavaScript runner lifecycle),
  written from the seed's source, not from ``lifecycle_es.runner``: a dict state shaped like the
  seed's JSON file, the seed's checks in the seed's order, the commands and keyword names of
  `RunnerLifecycle`, the same error kinds, and the events each command should append.
- `command_programs`, `run_program`: random command programs checked against the model;
  `event_logs`, `invalid_event_logs`: logs a runner's stream could hold, and logs that break a rule
  at a known event.

    from hypothesis import given
    from lifecycle_es import EventStore, RunnerLifecycle
    from lifecycle_es.preflight import preflight_writable_directory
    from lifecycle_es.testing import (RUNNER_DEFAULTS, FakeClock, ReferenceRunner, SequentialIds,
                                      command_programs, run_program)

    @given(command_programs(invalid=True))
    def test_the_library_agrees_with_the_model(program):   # base_dir: an existing directory
        model_clock, clock = FakeClock(), FakeClock()
        with EventStore.open(db_path(), now=clock) as store:
            model = ReferenceRunner(**RUNNER_DEFAULTS, base_dir=base_dir, now=model_clock,
                                    authority_file=store.path)
            real = RunnerLifecycle(store, **RUNNER_DEFAULTS, base_dir=base_dir, now=clock,
                                   random_id=SequentialIds(), preflight_base_dir=preflight_writable_directory)
            assert run_program(real, clock, program) == run_program(model, model_clock, program)

Where the seed coerces a value with ``Number()`` or compares an unchecked string, the library refuses
a malformed value (a bool, a float, a generation below 1, an id outside the pattern) as
InvalidInputError; the model does the same. The model has no file system: it runs no base directory
preflight and draws no probe names from ``random_id``, so pair it with a lifecycle whose
``preflight_base_dir`` draws none either (the default preflight function called without one does not).
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - the message is the documentation
    raise ImportError("lifecycle_es.testing needs hypothesis: pip install 'lifecycle-es[test]'") from exc

from .canonical import MAX_EPOCH_MS, iso_ms, parse_iso_ms, receipt_digest
from .errors import AuthorityError, InvalidInputError, LifecycleError, StaleFenceError
from .events import (
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
)
from .lifecycle import UnknownRunnerError
from .receipts import (
    BaseDirClaim,
    DrainParkSnapshot,
    HookReceipt,
    LeaseParkSnapshot,
    LeaseReceipt,
    PollResult,
    PostSessionHook,
    RunnerSnapshot,
)
from .runner import Drain, Lease, ProxyRef, RunnerCapacityError, RunnerState
from .values import ProxyAuthority, Resources

__all__ = [
    "COMMANDS",
    "RUNNER_DEFAULTS",
    "START_MS",
    "Command",
    "FakeClock",
    "ReferenceRunner",
    "SequentialIds",
    "command_programs",
    "digests",
    "event_logs",
    "ids",
    "invalid_event_logs",
    "proxy_authorities",
    "resources",
    "run_program",
]

# The seed's constants, copied from its source rather than imported: the model must not share a
# mistake with the code it checks.
SCHEMA = "cc-execution-location-runner-lifecycle/v1"
TARGETS = ("local", "wsl", "ssh", "container")
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,255}")
_DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}")
_ID_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_ID_CHARS = _ID_FIRST + "._:@+-"
MAX_SAFE_INTEGER = 2**53 - 1
MAX_PROXY_AGE_MS = 5 * 60 * 1000
MAX_PROXY_SKEW_MS = 30_000
MAX_RETAINED_LEASES = 1024
RETAINED_AFTER_RECLAIM = 256
TTL_BOUNDS = (1_000, 24 * 60 * 60 * 1000)
DRAIN_BOUNDS = (1, 10 * 60 * 1000)
PARK_REASONS = ("checkout-failure", "lost-poll", "resource-limit")
LEASE_DOMAIN = "chainlesschain.execution-location.runner-lease.v1\0"
BASE_DIR_DOMAIN = "chainlesschain.execution-location.base-dir.v1\0"
HOOK_DOMAIN = "chainlesschain.execution-location.post-session-hook.v1\0"
MIB = 1024 * 1024

START_MS = 1_767_225_600_000
"""2026-01-01T00:00:00.000Z: where a `FakeClock` starts unless told otherwise."""

RUNNER_DEFAULTS: dict[str, Any] = {
    "runner_id": "runner-1",
    "target": "local",
    "resources": Resources(cpu_seconds=600, memory_bytes=1024 * MIB),
    "post_session_hook_digest": "sha256:" + "ab" * 32,
}
"""The runner identity `command_programs` plans against (add ``base_dir`` and ``now``)."""

COMMANDS = (
    "initialize", "acquire_lease", "assert_poll", "rotate_proxy_authority", "refresh_lease_authority",
    "request_drain", "settle_lease", "park_lease", "park_expired_drain", "begin_reclaim", "complete_reclaim",
    "authorize_post_session_hook",
)
"""Every command `ReferenceRunner` and `RunnerLifecycle` share, by name."""


class FakeClock:
    """An epoch-millisecond clock that stands still until `advance` moves it; pass it as ``now=``."""

    def __init__(self, start_ms: int = START_MS) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        """The current time in epoch milliseconds."""
        return self.ms

    def advance(self, ms: int) -> int:
        """Move the clock by `ms` milliseconds (negative models skew) and return the new time."""
        self.ms += ms
        return self.ms

    def __repr__(self) -> str:
        return f"FakeClock(ms={self.ms})"


class SequentialIds:
    """A ``random_id`` stand-in: ``000001``, ``000002``, ...; two runners fed alike name leases alike."""

    def __init__(self, start: int = 1) -> None:
        self.next = start

    def __call__(self) -> str:
        """The next id."""
        value = f"{self.next:06d}"
        self.next += 1
        return value


# --- value strategies ------------------------------------------------------------------------------


def ids(*, max_size: int = 32) -> st.SearchStrategy[str]:
    """Identifiers within the seed's pattern (1..`max_size` characters, at most 256)."""
    rest = st.text(alphabet=_ID_CHARS, max_size=min(max_size, 256) - 1)
    return st.builds(str.__add__, st.sampled_from(_ID_FIRST), rest)


def digests() -> st.SearchStrategy[str]:
    """``sha256:<64 lowercase hex>`` digests."""
    return st.binary(min_size=32, max_size=32).map(lambda raw: "sha256:" + raw.hex())


def resources() -> st.SearchStrategy[Resources]:
    """Resource limits within the seed's bounds (1..86400 CPU seconds, 64 MiB..64 GiB)."""
    return st.builds(Resources, cpu_seconds=st.integers(1, 86_400),
                     memory_bytes=st.integers(64 * MIB, 64 * 1024 * MIB))


def proxy_authorities(now_ms: int, *, id: str | st.SearchStrategy[str] | None = None,
                      min_revision: int = 1, max_revision: int | None = None) -> st.SearchStrategy[ProxyAuthority]:
    """Proxy authorities fresh at `now_ms`: issued at most 5 min before and 30 s after it, not expired.

    `id`: a fixed id, a strategy, or None for `ids()`. Revisions lie in ``min_revision..max_revision``
    (default: up to ``min_revision + 8``).
    """
    id_strategy = ids(max_size=24) if id is None else id if isinstance(id, st.SearchStrategy) else st.just(id)
    low = max(1, min_revision)
    return st.builds(
        ProxyAuthority,
        id=id_strategy,
        revision=st.integers(low, max(low, max_revision if max_revision is not None else low + 8)),
        issued_at=st.integers(max(0, now_ms - MAX_PROXY_AGE_MS), now_ms + MAX_PROXY_SKEW_MS).map(iso_ms),
        expires_at=st.integers(now_ms + 1, now_ms + 24 * 60 * 60 * 1000).map(iso_ms),
    )


# --- the seed's value checks (raising the library's error kinds) -----------------------------------


def _id(value: object, field: str) -> str:
    if not isinstance(value, str) or _ID_RE.fullmatch(value) is None:
        raise InvalidInputError(field, f"{field} is invalid")
    return value


def _digest(value: object, field: str) -> str:
    if not isinstance(value, str) or _DIGEST_RE.fullmatch(value) is None:
        raise InvalidInputError(field, f"{field} is invalid")
    return value


def _integer(value: object, field: str, minimum: int = 0, maximum: int = MAX_SAFE_INTEGER) -> int:
    # The seed's Number() would take "3" or true; the library refuses anything but an int, and so do we.
    if type(value) is not int or not minimum <= value <= maximum:
        raise InvalidInputError(field, f"{field} is invalid")
    return value


def _timestamp_ms(value: object, field: str) -> int:
    if isinstance(value, datetime) and value.utcoffset() is not None:
        millis = int(value.timestamp() * 1000)
    elif isinstance(value, str) and len(value) <= 64 and value.isascii():
        try:
            millis = parse_iso_ms(value)
        except (ValueError, OverflowError):
            raise InvalidInputError(field, f"{field} is invalid") from None
    else:
        raise InvalidInputError(field, f"{field} is invalid")
    if not 0 <= millis <= MAX_EPOCH_MS:
        raise InvalidInputError(field, f"{field} is invalid")
    return millis


def _proxy(value: object) -> dict[str, Any]:
    """The seed's validateProxyAuthority, value part: shape, id, revision >= 1, timestamps."""
    data = msgspec.structs.asdict(value) if isinstance(value, ProxyAuthority) else value
    if not isinstance(data, Mapping) or sorted(map(str, data)) != ["expires_at", "id", "issued_at", "revision"]:
        raise InvalidInputError("proxy_authority", "proxy authority has an invalid schema")
    # The library validates the id with the rest of the value (a ProxyAuthority cannot even be built
    # with a bad one), where the seed checks it after freshness.
    return {"id": _id(data["id"], "proxy_authority.id"),
            "revision": _integer(data["revision"], "proxy_authority.revision", 1),
            "issuedAt": _timestamp_ms(data["issued_at"], "proxy_authority.issued_at"),
            "expiresAt": _timestamp_ms(data["expires_at"], "proxy_authority.expires_at")}


def _min_revision(proxy: dict[str, Any], minimum: int) -> None:
    if proxy["revision"] < max(1, minimum):
        raise InvalidInputError("proxy_authority.revision", "proxy authority revision is invalid")


def _fresh(proxy: dict[str, Any], now_ms: int) -> None:
    if (proxy["issuedAt"] > now_ms + MAX_PROXY_SKEW_MS or now_ms - proxy["issuedAt"] > MAX_PROXY_AGE_MS
            or proxy["expiresAt"] <= now_ms):
        raise AuthorityError("execution location proxy authority is not fresh")


def _proxy_struct(proxy: dict[str, Any]) -> ProxyAuthority:
    return ProxyAuthority(id=proxy["id"], revision=proxy["revision"], issued_at=iso_ms(proxy["issuedAt"]),
                          expires_at=iso_ms(proxy["expiresAt"]))


def _lease_struct(lease: dict[str, Any]) -> Lease:
    return Lease(id=lease["id"], session_id=lease["sessionId"], generation=lease["generation"],
                 issued_at=lease["issuedAt"], expires_at=lease["expiresAt"], status=lease["status"],
                 result_digest=lease["resultDigest"], hook_receipt_digest=lease["hookReceiptDigest"])


class _Shared:
    """The one state document and log that handles of the same runner share (like one JSON file)."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] | None = None
        self.log: list[tuple[int, Event]] = []


class ReferenceRunner:
    """An independent in-memory model of the seed's runner lifecycle, and a generator of valid event logs.

    The state is a dict shaped like the seed's JSON file (camelCase keys). Each command runs the seed's
    checks in the seed's order, raises the error kind `RunnerLifecycle` raises, returns what it returns,
    and sets `last_events` to the events it should append (`log` holds every ``(at_ms, event)`` so far).
    DESIGN.md's improvements on the seed hold: retention evicts the oldest lease that is no longer
    active and never an active one (a full table of active leases refuses with RunnerCapacityError),
    and a drain with no active lease parks the runner at once.

    As in the seed, a lease receipt names this handle's resources and hook digest (the seed checks
    only runner id, target and base dir against the recorded ones); the library's name the recorded
    ones. They agree whenever the handles are built alike, as they should be.
    """

    def __init__(self, *, runner_id: str, target: str, base_dir: str | os.PathLike[str],
                 resources: Resources | Mapping[str, int], post_session_hook_digest: str, now: Callable[[], int],
                 random_id: Callable[[], str] | None = None, authority_file: str = "",
                 max_retained_leases: int = MAX_RETAINED_LEASES,
                 retained_after_reclaim: int = RETAINED_AFTER_RECLAIM) -> None:
        self.runner_id = _id(runner_id, "runner_id")
        if not isinstance(target, str) or target not in TARGETS:
            raise InvalidInputError("target", "runner target is invalid")
        self.target = target
        self.base_dir = os.path.abspath(os.fspath(base_dir))
        given = msgspec.structs.asdict(resources) if isinstance(resources, Resources) else dict(resources)
        self.resources = {"cpuSeconds": _integer(given.get("cpu_seconds"), "resources.cpu_seconds", 1, 86_400),
                          "memoryBytes": _integer(given.get("memory_bytes"), "resources.memory_bytes", 64 * MIB,
                                                  64 * 1024 * MIB)}
        self.post_session_hook_digest = _digest(post_session_hook_digest, "post_session_hook_digest")
        self.authority_file = authority_file
        self.max_retained_leases = max_retained_leases
        self.retained_after_reclaim = retained_after_reclaim
        self._now = now
        self._random_id = random_id or SequentialIds()
        self._shared = _Shared()
        self.last_events: list[Event] = []

    def __repr__(self) -> str:
        doc = self._shared.doc
        shown = f"{doc['state']} at generation {doc['generation']}" if doc else "not initialized"
        return f"ReferenceRunner({self.runner_id!r}, {self.target}, {shown}, {len(self._shared.log)} events)"

    def handle(self, **identity: Any) -> ReferenceRunner:
        """Another handle on the same runner state (as a second process opening the same file)."""
        settings = {"runner_id": self.runner_id, "target": self.target, "base_dir": self.base_dir,
                    "resources": {"cpu_seconds": self.resources["cpuSeconds"],
                                  "memory_bytes": self.resources["memoryBytes"]},
                    "post_session_hook_digest": self.post_session_hook_digest, "now": self._now,
                    "random_id": self._random_id, "authority_file": self.authority_file,
                    "max_retained_leases": self.max_retained_leases,
                    "retained_after_reclaim": self.retained_after_reclaim}
        other = ReferenceRunner(**{**settings, **identity})
        other._shared = self._shared
        return other

    @property
    def doc(self) -> dict[str, Any] | None:
        """A copy of the state document (the seed's JSON), or None before `initialize`."""
        return copy.deepcopy(self._shared.doc)

    @property
    def log(self) -> list[tuple[int, Event]]:
        """Every event the runner's stream should hold so far, with its time in epoch ms."""
        return list(self._shared.log)

    # --- plumbing ------------------------------------------------------------------------------------

    def _draft(self) -> dict[str, Any]:
        """A working copy of the state (the seed's mutateSecurityStore draft); UnknownRunnerError if none."""
        doc = self._shared.doc
        if doc is None:
            raise UnknownRunnerError(f"runner {self.runner_id} is not initialized")
        # The seed's validateState(draft, this) runs on every read and write, not only in initialize.
        if doc["runnerId"] != self.runner_id or doc["target"] != self.target or doc["baseDir"] != self.base_dir:
            raise LifecycleError("runner lifecycle identity drifted")
        # Commands replace nested values (proxy, drain) rather than edit them, and edit only lease
        # records, so copying the top level and each lease isolates the draft (deepcopy is 50x slower).
        return {**doc, "leases": [dict(lease) for lease in doc["leases"]]}

    def _commit(self, draft: dict[str, Any], now_ms: int, events: list[Event]) -> None:
        draft["updatedAt"] = iso_ms(now_ms)
        self._shared.doc = draft
        self._shared.log.extend((now_ms, event) for event in events)
        self.last_events = events

    def _park(self, draft: dict[str, Any], cause: str, events: list[Event]) -> None:
        draft["state"], draft["generation"], draft["drain"] = "parked", draft["generation"] + 1, None
        events.append(RunnerParked(cause=cause, generation=draft["generation"]))

    def _find(self, draft: dict[str, Any], lease_id: str) -> dict[str, Any] | None:
        return next((lease for lease in draft["leases"] if lease["id"] == lease_id), None)

    def _retain(self, leases: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
        """Drop the oldest leases that are no longer active until at most `limit` remain."""
        leases = list(leases)
        while len(leases) > limit:
            index = next((i for i, lease in enumerate(leases) if lease["status"] != "active"), None)
            if index is None:
                raise RunnerCapacityError(f"execution location runner holds {len(leases)} active leases")
            del leases[index]
        return leases

    def _project(self, doc: dict[str, Any]) -> RunnerSnapshot:
        statuses = [lease["status"] for lease in doc["leases"]]
        drain = doc["drain"]
        return RunnerSnapshot(
            schema=doc["schema"], runner_id=doc["runnerId"], target=doc["target"], state=doc["state"],
            accepting=doc["state"] == "accepting", generation=doc["generation"],
            policy_revision=doc["policyRevision"], base_dir_digest=receipt_digest(BASE_DIR_DOMAIN, doc["baseDir"]),
            resources=Resources(cpu_seconds=doc["resources"]["cpuSeconds"],
                                memory_bytes=doc["resources"]["memoryBytes"]),
            proxy_authority=ProxyRef(**doc["proxyAuthority"]),
            drain=Drain(signal=drain["signal"], requested_at=drain["requestedAt"],
                        deadline_at=drain["deadlineAt"]) if drain else None,
            active_lease_count=statuses.count("active"), parked_lease_count=statuses.count("parked"),
            settled_lease_count=statuses.count("settled"), updated_at=doc["updatedAt"],
        )

    def _lease_receipt(self, doc: dict[str, Any], runner_generation: int, lease: dict[str, Any],
                       proxy: dict[str, Any]) -> LeaseReceipt:
        material = {
            "runnerId": self.runner_id, "target": self.target, "authorityFile": self.authority_file,
            "state": doc["state"], "runnerGeneration": runner_generation, "lease": dict(lease),
            "proxyAuthority": {"id": proxy["id"], "revision": proxy["revision"],
                               "issuedAt": iso_ms(proxy["issuedAt"]), "expiresAt": iso_ms(proxy["expiresAt"])},
            "baseDir": {"path": self.base_dir, "writableRequired": True},
            "resources": dict(self.resources),
            "postSessionHook": {"digest": self.post_session_hook_digest, "generation": lease["generation"]},
        }
        return LeaseReceipt(
            runner_id=self.runner_id, target=self.target, authority_file=self.authority_file, state=doc["state"],
            runner_generation=runner_generation, lease=_lease_struct(lease), proxy_authority=_proxy_struct(proxy),
            base_dir=BaseDirClaim(path=self.base_dir),
            resources=Resources(cpu_seconds=self.resources["cpuSeconds"], memory_bytes=self.resources["memoryBytes"]),
            post_session_hook=PostSessionHook(digest=self.post_session_hook_digest, generation=lease["generation"]),
            lease_receipt_digest=receipt_digest(LEASE_DOMAIN, material),
        )

    # --- reading -------------------------------------------------------------------------------------

    def snapshot(self) -> RunnerSnapshot:
        """The seed's ``project()`` of the current state."""
        return self._project(self._draft())

    def runner_state(self) -> RunnerState:
        """The current state as the library's `RunnerState` (what ``RunnerLifecycle.state()`` returns)."""
        doc = self._draft()
        drain = doc["drain"]
        return RunnerState(
            schema=doc["schema"], runner_id=doc["runnerId"], target=doc["target"], state=doc["state"],
            generation=doc["generation"], policy_revision=doc["policyRevision"], base_dir=doc["baseDir"],
            resources=Resources(cpu_seconds=doc["resources"]["cpuSeconds"],
                                memory_bytes=doc["resources"]["memoryBytes"]),
            proxy_authority=ProxyRef(**doc["proxyAuthority"]), post_session_hook_digest=doc["postSessionHookDigest"],
            drain=Drain(signal=drain["signal"], requested_at=drain["requestedAt"],
                        deadline_at=drain["deadlineAt"]) if drain else None,
            leases=tuple(_lease_struct(lease) for lease in doc["leases"]), updated_at=doc["updatedAt"],
        )

    # --- commands (the seed's methods, in its order of checks) ---------------------------------------

    def initialize(self) -> RunnerSnapshot:
        """Create the runner, or check the identity of the one that exists (LifecycleError if it drifted)."""
        self.last_events = []
        now_ms = self._now()
        if self._shared.doc is None:
            draft = {
                "schema": SCHEMA, "runnerId": self.runner_id, "target": self.target, "state": "accepting",
                "generation": 1, "policyRevision": 1, "baseDir": self.base_dir, "resources": dict(self.resources),
                "proxyAuthority": {"id": "unbound", "revision": 0},
                "postSessionHookDigest": self.post_session_hook_digest, "drain": None, "leases": [],
            }
            self._commit(draft, now_ms, [RunnerInitialized(
                schema=SCHEMA, runner_id=self.runner_id, target=self.target, base_dir=self.base_dir,
                resources=Resources(cpu_seconds=self.resources["cpuSeconds"],
                                    memory_bytes=self.resources["memoryBytes"]),
                post_session_hook_digest=self.post_session_hook_digest)])
        return self._project(self._draft())

    def acquire_lease(self, *, session_id: str, expected_generation: int, ttl_ms: int = 10 * 60 * 1000,
                      proxy_authority: ProxyAuthority | Mapping[str, Any]) -> LeaseReceipt:
        """Grant a lease at the current generation under a fresh proxy authority."""
        self.last_events = []
        now_ms = self._now()
        session = _id(session_id, "session_id")
        expected = _integer(expected_generation, "expected_generation", 1)
        proxy = _proxy(proxy_authority)
        _fresh(proxy, now_ms)
        ttl = _integer(ttl_ms, "ttl_ms", *TTL_BOUNDS)
        # The seed draws the id before checking ttl; the library after. Either way one id per attempt
        # that gets this far, and the model draws where the library does so their ids stay in step.
        lease_id = _id(f"lease-{self._random_id()}", "random_id")
        draft = self._draft()
        if draft["state"] != "accepting" or draft["generation"] != expected:
            raise StaleFenceError("execution location runner is not accepting this generation")
        if any(lease["sessionId"] == session and lease["status"] == "active" for lease in draft["leases"]):
            raise StaleFenceError("execution location session already has an active lease")
        if draft["proxyAuthority"]["id"] not in ("unbound", proxy["id"]):
            raise AuthorityError("execution location proxy authority identity drifted")
        if proxy["revision"] < draft["proxyAuthority"]["revision"]:
            raise AuthorityError("execution location proxy authority revision rolled back")
        if self._find(draft, lease_id) is not None:
            # Not in the seed (its ids are random UUIDs); the library refuses a reused id as stale.
            raise StaleFenceError("execution location lease id is already taken")
        lease = {"id": lease_id, "sessionId": session, "generation": draft["generation"], "issuedAt": iso_ms(now_ms),
                 "expiresAt": iso_ms(now_ms + ttl), "status": "active", "resultDigest": None,
                 "hookReceiptDigest": None}
        draft["proxyAuthority"] = {"id": proxy["id"], "revision": proxy["revision"]}
        draft["leases"] = [*self._retain(draft["leases"], self.max_retained_leases - 1), lease]
        self._commit(draft, now_ms, [LeaseAcquired(
            lease_id=lease_id, session_id=session, lease_generation=expected, issued_at=lease["issuedAt"],
            expires_at=lease["expiresAt"], proxy_authority=_proxy_struct(proxy))])
        return self._lease_receipt(draft, expected, lease, proxy)

    def assert_poll(self, *, lease_id: str, lease_generation: int, proxy_authority_id: str,
                    proxy_authority_revision: int) -> PollResult:
        """Check that a lease may still poll; appends nothing."""
        self.last_events = []
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        proxy_authority_id = _id(proxy_authority_id, "proxy_authority_id")
        proxy_authority_revision = _integer(proxy_authority_revision, "proxy_authority_revision")
        doc = self._draft()
        lease = self._find(doc, lease_id)
        if (lease is None or lease["status"] != "active" or lease["generation"] != lease_generation
                or parse_iso_ms(lease["expiresAt"]) <= self._now()
                or doc["proxyAuthority"]["id"] != proxy_authority_id
                or doc["proxyAuthority"]["revision"] != proxy_authority_revision
                or doc["state"] in ("parked", "reclaiming")):
            raise StaleFenceError("execution location poll lease is stale or parked")
        return PollResult(runner_id=doc["runnerId"], runner_generation=doc["generation"], lease_id=lease["id"],
                          lease_generation=lease["generation"], state=doc["state"],
                          proxy_authority=ProxyRef(**doc["proxyAuthority"]))

    def rotate_proxy_authority(self, *, expected_generation: int,
                               proxy_authority: ProxyAuthority | Mapping[str, Any]) -> RunnerSnapshot:
        """Move to a newer proxy revision (at least current + 1); generation and policy revision +1."""
        self.last_events = []
        expected = _integer(expected_generation, "expected_generation", 1)
        proxy = _proxy(proxy_authority)
        now_ms = self._now()
        draft = self._draft()
        _min_revision(proxy, draft["proxyAuthority"]["revision"] + 1)
        _fresh(proxy, now_ms)
        if (draft["state"] not in ("accepting", "draining") or draft["generation"] != expected
                or proxy["id"] != draft["proxyAuthority"]["id"]):
            raise StaleFenceError("execution location proxy rotation fence is stale")
        draft["generation"] += 1
        draft["policyRevision"] += 1
        draft["proxyAuthority"] = {"id": proxy["id"], "revision": proxy["revision"]}
        self._commit(draft, now_ms, [ProxyRotated(proxy_authority=_proxy_struct(proxy),
                                                  generation=draft["generation"],
                                                  policy_revision=draft["policyRevision"])])
        return self._project(draft)

    def refresh_lease_authority(self, *, lease_id: str, lease_generation: int, expected_generation: int,
                                proxy_authority: ProxyAuthority | Mapping[str, Any]) -> LeaseReceipt:
        """Re-issue an active lease's receipt under the current proxy authority; appends nothing."""
        self.last_events = []
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        expected = _integer(expected_generation, "expected_generation", 1)
        proxy = _proxy(proxy_authority)
        doc = self._draft()
        now_ms = self._now()
        _min_revision(proxy, doc["proxyAuthority"]["revision"])
        _fresh(proxy, now_ms)
        lease = self._find(doc, lease_id)
        if (doc["state"] != "accepting" or doc["generation"] != expected
                or doc["proxyAuthority"]["id"] != proxy["id"] or doc["proxyAuthority"]["revision"] != proxy["revision"]
                or lease is None or lease["status"] != "active" or lease["generation"] != lease_generation
                or parse_iso_ms(lease["expiresAt"]) <= now_ms):
            raise StaleFenceError("execution location lease refresh fence is stale")
        return self._lease_receipt(doc, doc["generation"], lease, proxy)

    def request_drain(self, *, expected_generation: int, timeout_ms: int = 30_000,
                      signal: str = "SIGTERM") -> RunnerSnapshot:
        """Stop accepting, generation +1; with no active lease the runner parks at once (generation +1)."""
        self.last_events = []
        if signal != "SIGTERM":
            raise InvalidInputError("signal", "runner drain requires SIGTERM")
        expected = _integer(expected_generation, "expected_generation", 1)
        timeout = _integer(timeout_ms, "timeout_ms", *DRAIN_BOUNDS)
        now_ms = self._now()
        draft = self._draft()
        if draft["state"] != "accepting" or draft["generation"] != expected:
            raise StaleFenceError("execution location drain generation is stale")
        drain = {"signal": signal, "requestedAt": iso_ms(now_ms), "deadlineAt": iso_ms(now_ms + timeout)}
        draft.update(state="draining", generation=draft["generation"] + 1, drain=drain)
        events: list[Event] = [DrainRequested(signal=signal, requested_at=drain["requestedAt"],
                                              deadline_at=drain["deadlineAt"], generation=draft["generation"])]
        if all(lease["status"] != "active" for lease in draft["leases"]):
            self._park(draft, "drain-idle", events)
        self._commit(draft, now_ms, events)
        return self._project(draft)

    def settle_lease(self, *, lease_id: str, lease_generation: int, result_digest: str) -> RunnerSnapshot:
        """End an active lease with a result; the last one settled during a drain parks the runner."""
        self.last_events = []
        result_digest = _digest(result_digest, "result_digest")
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        lease = self._find(draft, lease_id)
        if lease is None or lease["status"] != "active" or lease["generation"] != lease_generation:
            raise StaleFenceError("execution location result lease fence is stale")
        lease.update(status="settled", resultDigest=result_digest)
        events: list[Event] = [LeaseSettled(lease_id=lease_id, lease_generation=lease_generation,
                                            result_digest=result_digest)]
        if draft["state"] == "draining" and all(other["status"] != "active" for other in draft["leases"]):
            self._park(draft, "drain-settled", events)
        self._commit(draft, now_ms, events)
        return self._project(draft)

    def park_lease(self, *, lease_id: str, lease_generation: int, result_digest: str,
                   reason: str) -> LeaseParkSnapshot:
        """End an active lease without finishing; the last active lease parked parks the runner."""
        self.last_events = []
        result_digest = _digest(result_digest, "result_digest")
        if reason not in PARK_REASONS:
            raise InvalidInputError("reason", "execution location park reason is invalid")
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        lease = self._find(draft, lease_id)
        if (draft["state"] not in ("accepting", "draining") or lease is None or lease["status"] != "active"
                or lease["generation"] != lease_generation):
            raise StaleFenceError("execution location park lease fence is stale")
        lease.update(status="parked", resultDigest=result_digest)
        events: list[Event] = [LeaseParked(lease_id=lease_id, lease_generation=lease_generation,
                                           result_digest=result_digest, reason=reason)]
        if all(other["status"] != "active" for other in draft["leases"]):
            self._park(draft, "lease-parked", events)
        self._commit(draft, now_ms, events)
        return LeaseParkSnapshot(**msgspec.structs.asdict(self._project(draft)), park_reason=reason)

    def park_expired_drain(self, *, expected_generation: int) -> DrainParkSnapshot:
        """Past the drain deadline: park every active lease, then the runner; generation +1."""
        self.last_events = []
        expected = _integer(expected_generation, "expected_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        if (draft["state"] != "draining" or draft["generation"] != expected
                or parse_iso_ms(draft["drain"]["deadlineAt"]) > now_ms):
            raise StaleFenceError("execution location drain is not ready to park")
        active = [lease for lease in draft["leases"] if lease["status"] == "active"]
        for lease in active:
            lease["status"] = "parked"
        events: list[Event] = [DrainExpired(lease_ids=tuple(lease["id"] for lease in active),
                                            deadline_at=draft["drain"]["deadlineAt"])]
        self._park(draft, "drain-expired", events)
        self._commit(draft, now_ms, events)
        return DrainParkSnapshot(**msgspec.structs.asdict(self._project(draft)), newly_parked_lease_count=len(active))

    def begin_reclaim(self, *, expected_generation: int,
                      proxy_authority: ProxyAuthority | Mapping[str, Any]) -> RunnerSnapshot:
        """Start reclaiming a parked runner under a newer proxy revision; generation +1."""
        self.last_events = []
        expected = _integer(expected_generation, "expected_generation", 1)
        proxy = _proxy(proxy_authority)
        now_ms = self._now()
        draft = self._draft()
        _min_revision(proxy, draft["proxyAuthority"]["revision"] + 1)
        _fresh(proxy, now_ms)
        if (draft["state"] != "parked" or draft["generation"] != expected
                or proxy["id"] != draft["proxyAuthority"]["id"]):
            raise StaleFenceError("execution location reclaim fence is stale")
        draft.update(state="reclaiming", generation=draft["generation"] + 1,
                     proxyAuthority={"id": proxy["id"], "revision": proxy["revision"]})
        self._commit(draft, now_ms, [ReclaimBegun(proxy_authority=_proxy_struct(proxy),
                                                  generation=draft["generation"])])
        return self._project(draft)

    def complete_reclaim(self, *, expected_generation: int) -> RunnerSnapshot:
        """Accept again, generation +1, keeping the newest 256 leases."""
        self.last_events = []
        expected = _integer(expected_generation, "expected_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        if draft["state"] != "reclaiming" or draft["generation"] != expected:
            raise StaleFenceError("execution location reclaim completion is stale")
        draft.update(state="accepting", generation=draft["generation"] + 1,
                     leases=self._retain(draft["leases"], self.retained_after_reclaim))
        self._commit(draft, now_ms, [ReclaimCompleted(generation=draft["generation"])])
        return self._project(draft)

    def authorize_post_session_hook(self, *, expected_runner_generation: int, lease_id: str, lease_generation: int,
                                    result_digest: str, hook_digest: str) -> HookReceipt:
        """Authorize the post-session hook of an ended lease, once; its receipt digest goes on the lease."""
        self.last_events = []
        result_digest = _digest(result_digest, "result_digest")
        hook_digest = _digest(hook_digest, "hook_digest")
        expected = _integer(expected_runner_generation, "expected_runner_generation", 1)
        lease_id = _id(lease_id, "lease_id")
        lease_generation = _integer(lease_generation, "lease_generation", 1)
        now_ms = self._now()
        draft = self._draft()
        lease = self._find(draft, lease_id)
        if (draft["generation"] != expected or draft["state"] not in ("parked", "draining") or lease is None
                or lease["generation"] != lease_generation or lease["status"] == "active"
                or lease["resultDigest"] != result_digest or lease["hookReceiptDigest"] is not None
                or hook_digest != draft["postSessionHookDigest"]):
            raise StaleFenceError("execution location post-session hook fence is stale")
        material = {"runnerId": draft["runnerId"], "runnerGeneration": draft["generation"], "leaseId": lease_id,
                    "leaseGeneration": lease_generation, "resultDigest": result_digest, "hookDigest": hook_digest}
        digest = receipt_digest(HOOK_DOMAIN, material)
        lease["hookReceiptDigest"] = digest
        self._commit(draft, now_ms, [HookAuthorized(
            lease_id=lease_id, lease_generation=lease_generation, runner_generation=expected,
            result_digest=result_digest, hook_digest=hook_digest, receipt_digest=digest)])
        return HookReceipt(runner_id=draft["runnerId"], runner_generation=expected, lease_id=lease_id,
                           lease_generation=lease_generation, result_digest=result_digest, hook_digest=hook_digest,
                           receipt_digest=digest)


# --- command programs ------------------------------------------------------------------------------


class Command(NamedTuple):
    """One step of a program: advance the clock by `advance_ms`, then call `name(**kwargs)`.

    `expect` is the name of the error class the model raised (None when the command succeeded).
    """

    advance_ms: int
    name: str
    kwargs: dict[str, Any]
    expect: str | None = None


def run_program(runner: Any, clock: FakeClock, program: list[Command]) -> list[tuple[Any, str | None]]:
    """Run `program` against a `ReferenceRunner` or a `RunnerLifecycle`; ``(result, error name)`` per step.

    Lease ids in a program are those a fresh `SequentialIds` hands out: build the runner with
    ``random_id=SequentialIds()``, `RUNNER_DEFAULTS`, and a clock at the program's start.
    """
    outcomes: list[tuple[Any, str | None]] = []
    for command in program:
        clock.advance(command.advance_ms)
        try:
            outcomes.append((getattr(runner, command.name)(**command.kwargs), None))
        except LifecycleError as exc:
            outcomes.append((None, type(exc).__name__))
    return outcomes


_ADVANCES = (0, 0, 0, 1, 999, 30_000, 61_000, 400_000)
_TTLS = (1_000, 60_000, 600_000, 24 * 60 * 60 * 1000)
_TIMEOUTS = (1, 1_000, 60_000, 600_000)


def _options(doc: dict[str, Any], now_ms: int, sessions: list[str]) -> list[str]:
    """The commands that are valid now (or, for park_expired_drain, once the deadline is waited out)."""
    state = doc["state"]
    active = [lease for lease in doc["leases"] if lease["status"] == "active"]
    live = [lease for lease in active if parse_iso_ms(lease["expiresAt"]) > now_ms]
    busy = {lease["sessionId"] for lease in active}
    options: list[str] = []
    if state == "accepting":
        options += ["request_drain", "rotate_proxy_authority"]
        options += ["acquire_lease"] * 3 if set(sessions) - busy else []
        options += ["refresh_lease_authority"] if live else []
    if state in ("accepting", "draining"):
        options += ["settle_lease", "park_lease"] * 2 if active else []
        options += ["assert_poll"] if live else []
    if state == "draining":
        options += ["rotate_proxy_authority", "park_expired_drain"]
    if state == "parked":
        options.append("begin_reclaim")
    if state == "reclaiming":
        options.append("complete_reclaim")
    if state in ("parked", "draining") and _hookable(doc):
        options.append("authorize_post_session_hook")
    return options


def _hookable(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [lease for lease in doc["leases"]
            if lease["status"] != "active" and lease["resultDigest"] and lease["hookReceiptDigest"] is None]


def _valid_command(draw: Any, model: ReferenceRunner, clock: FakeClock, proxy_id: str,
                   sessions: list[str]) -> tuple[int, str, dict[str, Any]]:
    """Draw a clock step and a command valid for the model after it."""
    advance = draw(st.sampled_from(_ADVANCES))
    clock.advance(advance)
    doc = model.doc
    assert doc is not None
    now_ms = clock()
    name = draw(st.sampled_from(_options(doc, now_ms, sessions)))
    generation, bound = doc["generation"], doc["proxyAuthority"]
    active = [lease for lease in doc["leases"] if lease["status"] == "active"]
    live = [lease for lease in active if parse_iso_ms(lease["expiresAt"]) > now_ms]
    kwargs: dict[str, Any]
    if name == "park_expired_drain":
        wait = max(0, parse_iso_ms(doc["drain"]["deadlineAt"]) - now_ms)
        clock.advance(wait)
        advance += wait
        kwargs = {"expected_generation": generation}
    elif name == "acquire_lease":
        busy = {lease["sessionId"] for lease in active}
        proxy = draw(proxy_authorities(now_ms, id=proxy_id if bound["id"] == "unbound" else bound["id"],
                                       min_revision=bound["revision"], max_revision=bound["revision"] + 2))
        kwargs = {"session_id": draw(st.sampled_from([s for s in sessions if s not in busy])),
                  "expected_generation": generation, "ttl_ms": draw(st.sampled_from(_TTLS)),
                  "proxy_authority": proxy}
    elif name in ("rotate_proxy_authority", "begin_reclaim"):
        proxy = draw(proxy_authorities(now_ms, id=bound["id"], min_revision=bound["revision"] + 1,
                                       max_revision=bound["revision"] + 3))
        kwargs = {"expected_generation": generation, "proxy_authority": proxy}
    elif name == "request_drain":
        kwargs = {"expected_generation": generation, "timeout_ms": draw(st.sampled_from(_TIMEOUTS))}
    elif name == "complete_reclaim":
        kwargs = {"expected_generation": generation}
    elif name in ("settle_lease", "park_lease"):
        lease = draw(st.sampled_from(active))
        kwargs = {"lease_id": lease["id"], "lease_generation": lease["generation"], "result_digest": draw(digests())}
        if name == "park_lease":
            kwargs["reason"] = draw(st.sampled_from(PARK_REASONS))
    elif name == "assert_poll":
        lease = draw(st.sampled_from(live))
        kwargs = {"lease_id": lease["id"], "lease_generation": lease["generation"],
                  "proxy_authority_id": bound["id"], "proxy_authority_revision": bound["revision"]}
    elif name == "refresh_lease_authority":
        lease = draw(st.sampled_from(live))
        proxy = draw(proxy_authorities(now_ms, id=bound["id"], min_revision=bound["revision"],
                                       max_revision=bound["revision"]))
        kwargs = {"lease_id": lease["id"], "lease_generation": lease["generation"],
                  "expected_generation": generation, "proxy_authority": proxy}
    else:
        lease = draw(st.sampled_from(_hookable(doc)))
        kwargs = {"expected_runner_generation": generation, "lease_id": lease["id"],
                  "lease_generation": lease["generation"], "result_digest": lease["resultDigest"],
                  "hook_digest": model.post_session_hook_digest}
    return advance, name, kwargs


def _spoil(draw: Any, name: str, kwargs: dict[str, Any], now_ms: int) -> tuple[str, dict[str, Any]]:
    """Make a valid command (most likely) invalid: a stale fence, a bad value, a stale or drifted proxy."""
    kwargs = dict(kwargs)
    spoilers = ["wrong-state"] + [key for key in kwargs if key in _SPOILERS]
    which = draw(st.sampled_from(spoilers))
    if which == "wrong-state":
        other = draw(st.sampled_from(("complete_reclaim", "park_expired_drain", "request_drain")))
        return other, {"expected_generation": kwargs.get("expected_generation", 1)}
    kwargs[which] = _SPOILERS[which](draw, kwargs[which], now_ms)
    return name, kwargs


def _spoil_proxy(draw: Any, proxy: ProxyAuthority, now_ms: int) -> Any:
    kind = draw(st.sampled_from(("stale", "drifted", "rolled-back", "shape")))
    if kind == "stale":
        return msgspec.structs.replace(proxy, issued_at=iso_ms(max(0, now_ms - MAX_PROXY_AGE_MS - 1)))
    if kind == "drifted":
        return msgspec.structs.replace(proxy, id=proxy.id + "-drifted")
    if kind == "rolled-back":
        return msgspec.structs.replace(proxy, revision=max(1, proxy.revision - 2))
    return {"id": proxy.id, "revision": proxy.revision, "issued_at": proxy.issued_at}


_SPOILERS: dict[str, Callable[[Any, Any, int], Any]] = {
    "expected_generation": lambda draw, value, now: max(1, value + draw(st.sampled_from((-1, 1, 2)))),
    "expected_runner_generation": lambda draw, value, now: value + 1,
    "lease_generation": lambda draw, value, now: value + 1,
    "lease_id": lambda draw, value, now: "lease-never-acquired",
    "session_id": lambda draw, value, now: "-not-an-id",
    "result_digest": lambda draw, value, now: "sha256:" + "G" * 64,
    "hook_digest": lambda draw, value, now: "sha256:" + "0" * 64,
    "ttl_ms": lambda draw, value, now: draw(st.sampled_from((0, 999, True, 24 * 60 * 60 * 1000 + 1))),
    "timeout_ms": lambda draw, value, now: draw(st.sampled_from((0, 600_001, 1.5))),
    "reason": lambda draw, value, now: "bored",
    "proxy_authority": _spoil_proxy,
    "proxy_authority_revision": lambda draw, value, now: value + 1,
}


def _call(runner: Any, name: str, kwargs: dict[str, Any]) -> LifecycleError | None:
    try:
        getattr(runner, name)(**kwargs)
    except LifecycleError as exc:
        return exc
    return None


def _plan(draw: Any, model: ReferenceRunner, clock: FakeClock, max_commands: int, invalid: bool) -> list[Command]:
    proxy_id = draw(ids(max_size=12))
    sessions = draw(st.lists(ids(max_size=8), min_size=1, max_size=4, unique=True))
    program = [Command(0, "initialize", {})]
    model.initialize()
    for _ in range(draw(st.integers(0, max_commands))):
        advance, name, kwargs = _valid_command(draw, model, clock, proxy_id, sessions)
        if invalid and draw(st.integers(0, 2)) == 0:
            name, kwargs = _spoil(draw, name, kwargs, clock())
        error = _call(model, name, kwargs)
        program.append(Command(advance, name, kwargs, type(error).__name__ if error is not None else None))
    return program


@st.composite
def command_programs(draw: Any, *, max_commands: int = 30, invalid: bool = False, start_ms: int = START_MS,
                     runner_id: str = RUNNER_DEFAULTS["runner_id"],
                     post_session_hook_digest: str = RUNNER_DEFAULTS["post_session_hook_digest"]) -> list[Command]:
    """Programs of commands for one runner (`RUNNER_DEFAULTS`), planned against a `ReferenceRunner`.

    The first command is ``initialize``; the clock starts at `start_ms`. Without `invalid` every
    command is valid when it runs; with it about one in three is spoiled (a stale generation, an
    unknown lease, a bad value, a stale, drifted or rolled-back proxy, a command for another state).
    Each step's `Command.expect` is the error the model raised. Run one with `run_program`.
    """
    clock = FakeClock(start_ms)
    model = ReferenceRunner(**{**RUNNER_DEFAULTS, "runner_id": runner_id,
                               "post_session_hook_digest": post_session_hook_digest},
                            base_dir="/srv/lifecycle-es", now=clock)
    return _plan(draw, model, clock, max_commands, invalid)


@st.composite
def event_logs(draw: Any, *, max_commands: int = 30, runner_id: str | None = None,
               start_ms: int = START_MS) -> list[tuple[int, Event]]:
    """Event logs a runner's stream could hold: ``(at_ms, event)`` from a valid program on the model.

    The runner's identity (id unless given, target, resources, hook digest) is drawn too. Every log
    replays clean through ``lifecycle_es.runner.apply`` with ``at = iso_ms(at_ms)``.
    """
    clock = FakeClock(start_ms)
    runner = runner_id if runner_id is not None else draw(ids(max_size=16))
    model = ReferenceRunner(runner_id=runner, target=draw(st.sampled_from(TARGETS)),
                            base_dir=f"/srv/runners/{runner}", resources=draw(resources()),
                            post_session_hook_digest=draw(digests()), now=clock)
    _plan(draw, model, clock, max_commands, invalid=False)
    return model.log


_GENERATION_FIELDS = {
    LeaseAcquired: "lease_generation", LeaseSettled: "lease_generation", LeaseParked: "lease_generation",
    HookAuthorized: "runner_generation", ProxyRotated: "generation", DrainRequested: "generation",
    RunnerParked: "generation", ReclaimBegun: "generation", ReclaimCompleted: "generation",
}


def _proxy_before(log: list[tuple[int, Event]], index: int) -> tuple[str, int]:
    """The runner's proxy (id, revision) after the events before `index` (the last one granted)."""
    for _, event in reversed(log[:index]):
        if isinstance(event, LeaseAcquired | ProxyRotated | ReclaimBegun):
            return event.proxy_authority.id, event.proxy_authority.revision
    return "proxy-1", 1


@st.composite
def invalid_event_logs(draw: Any, **options: Any) -> tuple[list[tuple[int, Event]], int]:
    """An `event_logs` log broken by one mutation, and the index of the first event that breaks a rule.

    Mutations (each guaranteed to break a rule at the index returned, whatever came before):
    a second RunnerInitialized; a generation field off by one; a settle of a lease never acquired;
    a RunnerParked the rules require removed (the next event breaks); a LeaseAcquired right after
    the runner parked. `options` go to `event_logs`.
    """
    log = draw(event_logs(**options))
    generations = [i for i, (_, event) in enumerate(log) if type(event) in _GENERATION_FIELDS]
    parks = [i for i, (_, event) in enumerate(log) if isinstance(event, RunnerParked)]
    kinds = ["initialized-again", "settle-unknown"]
    kinds += ["generation-off-by-one"] if generations else []
    kinds += ["missing-park"] if any(i < len(log) - 1 for i in parks) else []
    kinds += ["acquire-while-parked"] if parks else []
    kind = draw(st.sampled_from(kinds))
    if kind == "generation-off-by-one":
        index = draw(st.sampled_from(generations))
        at_ms, event = log[index]
        field = _GENERATION_FIELDS[type(event)]
        changed = msgspec.structs.replace(event, **{field: getattr(event, field) + draw(st.sampled_from((-1, 1)))})
        return [*log[:index], (at_ms, changed), *log[index + 1:]], index
    if kind == "missing-park":
        index = draw(st.sampled_from([i for i in parks if i < len(log) - 1]))
        return [*log[:index], *log[index + 1:]], index
    if kind == "acquire-while-parked":
        index = draw(st.sampled_from(parks)) + 1
        at_ms, parked = log[index - 1]
        proxy_id, revision = _proxy_before(log, index)
        event: Event = LeaseAcquired(
            lease_id="lease-while-parked", session_id="session-while-parked",
            lease_generation=parked.generation, issued_at=iso_ms(at_ms),  # type: ignore[attr-defined]
            expires_at=iso_ms(at_ms + 60_000),
            proxy_authority=ProxyAuthority(id=proxy_id, revision=revision, issued_at=iso_ms(at_ms),
                                           expires_at=iso_ms(at_ms + 60_000)))
    else:
        index = draw(st.integers(1, len(log)))
        at_ms = log[index - 1][0]
        event = log[0][1] if kind == "initialized-again" else LeaseSettled(
            lease_id="lease-never-acquired", lease_generation=1, result_digest="sha256:" + "0" * 64)
    return [*log[:index], (at_ms, event), *log[index:]], index
