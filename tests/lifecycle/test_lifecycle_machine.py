"""Stateful property test: a real RunnerLifecycle on a real store against the seed's model, on both
backends (a file, and a schema of each run's own on a PostgreSQL server, dropped in teardown).

Every command goes to `lifecycle_es.testing.ReferenceRunner` (an independent transliteration of the
seed) and to a `RunnerLifecycle` (one of two handles on two connections to the same store, so each
must catch up with the other's writes). Both must succeed or raise the same error class; a refused
command appends nothing; a granted one appends exactly the events the model names. After every step
the full replay, the live handles, a fresh handle (snapshot + tail), the model, the read models, the
snapshots and the chain must all agree.

Runs in well under a minute per backend; ``LIFECYCLE_ES_MACHINE_EXAMPLES=2000`` makes a long run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)
from targets import Places

import projections
from lifecycle_es import EventStore, LifecycleError, RunnerLifecycle, runner
from lifecycle_es.caches import SnapshotCheck, check_read_models
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import DrainRequested, RunnerParked
from lifecycle_es.preflight import preflight_writable_directory
from lifecycle_es.receipts import project
from lifecycle_es.replay import snapshot_of
from lifecycle_es.testing import (
    RUNNER_DEFAULTS,
    FakeClock,
    ReferenceRunner,
    SequentialIds,
    digests,
    proxy_authorities,
)
from lifecycle_es.values import ProxyAuthority

EXAMPLES = int(os.environ.get("LIFECYCLE_ES_MACHINE_EXAMPLES", "40"))
# A run on a server costs about three times a run on a file (round trips for every read and each commit,
# and a schema made and dropped per run): half the examples keep both machines on the server near 20 s
# (under 40 s on a loaded machine), while a long run (the variable above) still scales both.
SERVER_EXAMPLES = max(1, EXAMPLES // 2)
RUNNER_ID = RUNNER_DEFAULTS["runner_id"]
HOOK_DIGEST = RUNNER_DEFAULTS["post_session_hook_digest"]
SESSIONS = st.sampled_from(["s-1", "s-2", "s-3", "s-4", "s-5"])
HANDLES = st.sampled_from([0, 1])
PROXY_ID = "proxy-a"
SNAPSHOT_EVERY = 3
TTLS = st.sampled_from([1_000, 60_000, 600_000, 3_600_000])
TIMEOUTS = st.sampled_from([1, 1_000, 60_000, 600_000])
REASONS = st.sampled_from(["checkout-failure", "lost-poll", "resource-limit"])

INVALID_KINDS = (
    "bad-digest", "bad-reason", "bad-signal", "bad-ttl", "bad-timeout", "bool-generation", "bad-session",
    "unknown-lease", "proxy-shape", "proxy-bad-id", "stale-proxy", "future-proxy", "expired-proxy",
    "drifted-proxy", "rolled-back-proxy", "rotate-below-minimum", "rotate-other-id", "reclaim-other-id",
    "zero-lease-generation",
)
STALE_COMMANDS = ("acquire_lease", "rotate_proxy_authority", "request_drain", "park_expired_drain",
                  "begin_reclaim", "complete_reclaim", "authorize_post_session_hook")


class LeaseHandle(NamedTuple):
    """What a session holds after acquiring: the lease id, its generation and the session."""

    lease_id: str
    generation: int
    session_id: str


class LifecycleMachine(RuleBasedStateMachine):
    """Drives two RunnerLifecycle handles on one store and the model with the same commands."""

    leases = Bundle("leases")
    # (retained leases, retained after reclaim) to run the library with, or None for its own 1024/256.
    retention: tuple[int, int] | None = None

    def __init__(self, places: Places) -> None:
        super().__init__()
        self.places = places
        self._saved_retention = (runner.MAX_RETAINED_LEASES, runner.RETAINED_AFTER_RECLAIM)
        caps = self.retention or self._saved_retention
        # The library reads its retention constants at call time; small ones make eviction and the
        # capacity refusal reachable in 30 steps. Restored in teardown.
        runner.MAX_RETAINED_LEASES, runner.RETAINED_AFTER_RECLAIM = caps
        self.directory = Path(tempfile.mkdtemp(prefix="lces-machine-"))
        self.base_dir = self.directory / "base"
        self.base_dir.mkdir()
        self.clock = FakeClock()
        path = places.new()
        self.stores = [EventStore.open(path, now=self.clock), EventStore.open(path, now=self.clock)]
        for store in self.stores:
            projections.attach(store)
        ids = SequentialIds()  # shared: whichever handle acquires draws the next id, as the model does
        self.handles = [self._lifecycle(store, ids) for store in self.stores]
        self.model = ReferenceRunner(**RUNNER_DEFAULTS, base_dir=self.base_dir, now=self.clock,
                                     authority_file=self.stores[0].path, max_retained_leases=caps[0],
                                     retained_after_reclaim=caps[1])
        self.highest_generation = 0
        self.history: list[tuple[int, Any]] = []

    def _lifecycle(self, store: EventStore, ids: Any = None, **identity: Any) -> RunnerLifecycle:
        settings_ = {**RUNNER_DEFAULTS, "base_dir": self.base_dir, **identity}
        # The real preflight runs; called without random_id it names its probe with uuid4, so it
        # draws nothing from the shared id sequence.
        return RunnerLifecycle(store, **settings_, now=self.clock, random_id=ids or SequentialIds(),
                               preflight_base_dir=preflight_writable_directory, snapshot_every=SNAPSHOT_EVERY)

    def teardown(self) -> None:
        runner.MAX_RETAINED_LEASES, runner.RETAINED_AFTER_RECLAIM = self._saved_retention
        for store in self.stores:
            store.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.places.clean()

    # --- the comparison --------------------------------------------------------------------------

    @property
    def doc(self) -> dict[str, Any]:
        doc = self.model.doc
        assert doc is not None
        return doc

    def both(self, name: str, handle: int = 0, **kwargs: Any) -> Any:
        """Run a command on the model and on a real handle; same outcome, and the log shows it."""
        store = self.stores[0]
        before = store.head().seq
        expected_error = actual_error = None
        expected = actual = None
        try:
            expected = getattr(self.model, name)(**kwargs)
        except LifecycleError as exc:
            expected_error = exc
        try:
            actual = getattr(self.handles[handle], name)(**kwargs)
        except LifecycleError as exc:
            actual_error = exc
        assert type(actual_error) is type(expected_error), (
            f"{name}({kwargs}): the model says {expected_error!r}, the library {actual_error!r}")
        # Shown by --hypothesis-show-statistics: which transitions and refusals a run reached.
        outcome = type(expected_error).__name__ if expected_error else "+".join(
            type(appended).__name__ for appended in self.model.last_events) or "read"
        event(f"{type(self).__name__}.{name}: {outcome}")
        appended = list(store.read(after=before))
        if expected_error is not None:
            assert appended == [], f"{name} was refused but appended {appended}"
            return None
        assert actual == expected
        assert [recorded.event for recorded in appended] == self.model.last_events
        assert all(recorded.at == iso_ms(self.clock()) for recorded in appended)
        if appended:
            self.history.append((appended[-1].seq, self.model.runner_state()))
        return actual

    def proxy(self, data: st.DataObject, *, revision: int, proxy_id: str | None = None) -> ProxyAuthority:
        bound = self.doc["proxyAuthority"]["id"]
        chosen = proxy_id or (PROXY_ID if bound == "unbound" else bound)
        return data.draw(proxy_authorities(self.clock(), id=chosen, min_revision=revision, max_revision=revision))

    def lease_record(self, lease_id: str) -> dict[str, Any] | None:
        return next((lease for lease in self.doc["leases"] if lease["id"] == lease_id), None)

    # --- rules -----------------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.both("initialize")

    @rule(ms=st.sampled_from([1, 999, 1_000, 29_999, 60_000, 300_001, 600_000]))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    def _acquire(self, data: st.DataObject, session: str, ttl: int, step: int, handle: int) -> LeaseHandle | None:
        doc = self.doc
        proxy = self.proxy(data, revision=max(1, doc["proxyAuthority"]["revision"] + step))
        receipt = self.both("acquire_lease", handle, session_id=session, expected_generation=doc["generation"],
                            ttl_ms=ttl, proxy_authority=proxy)
        return LeaseHandle(receipt.lease.id, receipt.lease.generation, session) if receipt else None

    @precondition(lambda self: self.doc["state"] == "accepting")
    @rule(target=leases, session=SESSIONS, ttl=TTLS, step=st.integers(0, 2), handle=HANDLES, data=st.data())
    def acquire_lease(self, session: str, ttl: int, step: int, handle: int, data: st.DataObject) -> Any:
        acquired = self._acquire(data, session, ttl, step, handle)
        return acquired if acquired is not None else multiple()

    @precondition(lambda self: self.doc["state"] == "accepting")
    @rule(target=leases, sessions=st.lists(SESSIONS, min_size=2, max_size=5), handle=HANDLES, data=st.data())
    def acquire_many(self, sessions: list[str], handle: int, data: st.DataObject) -> Any:
        acquired = [self._acquire(data, session, 600_000, 0, handle) for session in sessions]
        return multiple(*(lease for lease in acquired if lease is not None))

    def active_or(self, lease: LeaseHandle, pick_active: bool, data: st.DataObject) -> LeaseHandle:
        """The bundle's lease (often ended: a stale fence) or, when asked and there is one, an active one."""
        active = [record for record in self.doc["leases"] if record["status"] == "active"]
        if not (pick_active and active):
            return lease
        record = data.draw(st.sampled_from(active))
        return LeaseHandle(record["id"], record["generation"], record["sessionId"])

    @rule(lease=leases, pick_active=st.booleans(), digest=digests(), handle=HANDLES, data=st.data())
    def settle_lease(self, lease: LeaseHandle, pick_active: bool, digest: str, handle: int,
                     data: st.DataObject) -> None:
        lease = self.active_or(lease, pick_active, data)
        self.both("settle_lease", handle, lease_id=lease.lease_id, lease_generation=lease.generation,
                  result_digest=digest)

    @rule(lease=leases, pick_active=st.booleans(), digest=digests(), reason=REASONS, handle=HANDLES,
          data=st.data())
    def park_lease(self, lease: LeaseHandle, pick_active: bool, digest: str, reason: str, handle: int,
                   data: st.DataObject) -> None:
        lease = self.active_or(lease, pick_active, data)
        self.both("park_lease", handle, lease_id=lease.lease_id, lease_generation=lease.generation,
                  result_digest=digest, reason=reason)

    @rule(lease=leases, handle=HANDLES)
    def assert_poll(self, lease: LeaseHandle, handle: int) -> None:
        bound = self.doc["proxyAuthority"]
        self.both("assert_poll", handle, lease_id=lease.lease_id, lease_generation=lease.generation,
                  proxy_authority_id=bound["id"], proxy_authority_revision=bound["revision"])

    @rule(lease=leases, handle=HANDLES, data=st.data())
    def refresh_lease_authority(self, lease: LeaseHandle, handle: int, data: st.DataObject) -> None:
        doc = self.doc
        self.both("refresh_lease_authority", handle, lease_id=lease.lease_id, lease_generation=lease.generation,
                  expected_generation=doc["generation"],
                  proxy_authority=self.proxy(data, revision=max(1, doc["proxyAuthority"]["revision"])))

    @precondition(lambda self: self.doc["state"] in ("parked", "draining"))
    @rule(lease=leases, pick_ended=st.booleans(), recorded_digest=st.booleans(), digest=digests(),
          handle=HANDLES, data=st.data())
    def authorize_post_session_hook(self, lease: LeaseHandle, pick_ended: bool, recorded_digest: bool,
                                    digest: str, handle: int, data: st.DataObject) -> None:
        ended = [record for record in self.doc["leases"]
                 if record["resultDigest"] is not None and record["hookReceiptDigest"] is None]
        if pick_ended and ended:
            chosen = data.draw(st.sampled_from(ended))
            lease = LeaseHandle(chosen["id"], chosen["generation"], chosen["sessionId"])
        record = self.lease_record(lease.lease_id)
        if recorded_digest and record is not None and record["resultDigest"] is not None:
            digest = record["resultDigest"]
        self.both("authorize_post_session_hook", handle, expected_runner_generation=self.doc["generation"],
                  lease_id=lease.lease_id, lease_generation=lease.generation, result_digest=digest,
                  hook_digest=HOOK_DIGEST)

    @precondition(lambda self: self.doc["state"] in ("accepting", "draining"))
    @rule(step=st.integers(1, 3), handle=HANDLES, data=st.data())
    def rotate_proxy_authority(self, step: int, handle: int, data: st.DataObject) -> None:
        doc = self.doc
        self.both("rotate_proxy_authority", handle, expected_generation=doc["generation"],
                  proxy_authority=self.proxy(data, revision=doc["proxyAuthority"]["revision"] + step,
                                             proxy_id=doc["proxyAuthority"]["id"]))

    @precondition(lambda self: self.doc["state"] == "accepting")
    @rule(timeout=TIMEOUTS, handle=HANDLES)
    def request_drain(self, timeout: int, handle: int) -> None:
        self.both("request_drain", handle, expected_generation=self.doc["generation"], timeout_ms=timeout)

    @precondition(lambda self: self.doc["state"] == "draining")
    @rule()
    def wait_out_drain(self) -> None:
        deadline = self.doc["drain"]["deadlineAt"]
        while iso_ms(self.clock()) < deadline:  # ISO-8601 UTC strings of one shape sort as time does
            self.clock.advance(1_000)

    @precondition(lambda self: self.doc["state"] == "draining")
    @rule(wait=st.booleans(), handle=HANDLES)
    def park_expired_drain(self, wait: bool, handle: int) -> None:
        if wait:
            self.wait_out_drain()
        self.both("park_expired_drain", handle, expected_generation=self.doc["generation"])

    @precondition(lambda self: self.doc["state"] == "parked")
    @rule(step=st.integers(1, 3), handle=HANDLES, data=st.data())
    def begin_reclaim(self, step: int, handle: int, data: st.DataObject) -> None:
        doc = self.doc
        self.both("begin_reclaim", handle, expected_generation=doc["generation"],
                  proxy_authority=self.proxy(data, revision=doc["proxyAuthority"]["revision"] + step,
                                             proxy_id=doc["proxyAuthority"]["id"]))

    @precondition(lambda self: self.doc["state"] == "reclaiming")
    @rule(handle=HANDLES)
    def complete_reclaim(self, handle: int) -> None:
        self.both("complete_reclaim", handle, expected_generation=self.doc["generation"])

    @rule(name=st.sampled_from(STALE_COMMANDS), delta=st.sampled_from([-2, -1, 1, 2]), session=SESSIONS,
          handle=HANDLES, data=st.data())
    def stale_generation(self, name: str, delta: int, session: str, handle: int, data: st.DataObject) -> None:
        """Any command at the wrong generation, in any state: both sides refuse it alike."""
        doc = self.doc
        generation = max(1, doc["generation"] + delta)
        revision = doc["proxyAuthority"]["revision"]
        kwargs: dict[str, Any] = {"expected_generation": generation}
        if name == "acquire_lease":
            kwargs.update(session_id=session, proxy_authority=self.proxy(data, revision=max(1, revision)))
        elif name in ("rotate_proxy_authority", "begin_reclaim"):
            kwargs["proxy_authority"] = self.proxy(data, revision=revision + 1, proxy_id=doc["proxyAuthority"]["id"])
        elif name == "authorize_post_session_hook":
            ended = [lease for lease in doc["leases"] if lease["resultDigest"] is not None] or [None]
            lease = data.draw(st.sampled_from(ended))
            if lease is None:
                return
            kwargs = {"expected_runner_generation": generation, "lease_id": lease["id"],
                      "lease_generation": lease["generation"], "result_digest": lease["resultDigest"],
                      "hook_digest": HOOK_DIGEST}
        self.both(name, handle, **kwargs)

    @rule(kind=st.sampled_from(INVALID_KINDS), handle=HANDLES, data=st.data())
    def invalid_command(self, kind: str, handle: int, data: st.DataObject) -> None:
        """A malformed value, or an authority that is not fresh, drifted or rolled back."""
        doc = self.doc
        generation, now = doc["generation"], self.clock()
        bound = doc["proxyAuthority"]
        good = self.proxy(data, revision=max(1, bound["revision"]))
        acquire = {"session_id": "s-9", "expected_generation": generation, "proxy_authority": good}
        lease = {"lease_id": "lease-000001", "lease_generation": 1}
        digest = "sha256:" + "1" * 64
        name, kwargs = {
            "bad-digest": ("settle_lease", {**lease, "result_digest": "sha256:XYZ"}),
            "bad-reason": ("park_lease", {**lease, "result_digest": digest, "reason": "bored"}),
            "bad-signal": ("request_drain", {"expected_generation": generation, "signal": "SIGKILL"}),
            "bad-ttl": ("acquire_lease", {**acquire, "ttl_ms": 999}),
            "bad-timeout": ("request_drain", {"expected_generation": generation, "timeout_ms": 0}),
            "bool-generation": ("complete_reclaim", {"expected_generation": True}),
            "bad-session": ("acquire_lease", {**acquire, "session_id": "-s"}),
            "unknown-lease": ("settle_lease", {"lease_id": "lease-never", "lease_generation": 1,
                                               "result_digest": digest}),
            "zero-lease-generation": ("settle_lease", {"lease_id": "lease-000001", "lease_generation": 0,
                                                       "result_digest": digest}),
            "proxy-shape": ("rotate_proxy_authority", {"expected_generation": generation, "proxy_authority": {
                "id": good.id, "revision": good.revision + 1, "issued_at": good.issued_at}}),
            "proxy-bad-id": ("acquire_lease", {**acquire, "proxy_authority": {
                "id": "-x", "revision": 1, "issued_at": good.issued_at, "expires_at": good.expires_at}}),
            "stale-proxy": ("acquire_lease", {**acquire, "proxy_authority": ProxyAuthority(
                id=good.id, revision=good.revision, issued_at=iso_ms(now - 300_001), expires_at=iso_ms(now + 1))}),
            "future-proxy": ("acquire_lease", {**acquire, "proxy_authority": ProxyAuthority(
                id=good.id, revision=good.revision, issued_at=iso_ms(now + 30_001), expires_at=iso_ms(now + 10**6))}),
            "expired-proxy": ("refresh_lease_authority", {**lease, "expected_generation": generation,
                              "proxy_authority": ProxyAuthority(id=good.id, revision=good.revision,
                                                                issued_at=iso_ms(now), expires_at=iso_ms(now))}),
            "drifted-proxy": ("acquire_lease", {**acquire, "proxy_authority": self.proxy(
                data, revision=good.revision, proxy_id="proxy-b")}),
            "rolled-back-proxy": ("acquire_lease", {**acquire, "proxy_authority": self.proxy(
                data, revision=max(1, bound["revision"] - 1))}),
            "rotate-below-minimum": ("rotate_proxy_authority", {"expected_generation": generation,
                                                                "proxy_authority": good}),
            "rotate-other-id": ("rotate_proxy_authority", {"expected_generation": generation,
                                                           "proxy_authority": self.proxy(
                                                               data, revision=bound["revision"] + 1,
                                                               proxy_id="proxy-b")}),
            "reclaim-other-id": ("begin_reclaim", {"expected_generation": generation, "proxy_authority": self.proxy(
                data, revision=bound["revision"] + 1, proxy_id="proxy-b")}),
        }[kind]
        self.both(name, handle, **kwargs)

    @rule(handle=HANDLES)
    def initialize_again(self, handle: int) -> None:
        self.both("initialize", handle)

    @rule(identity=st.sampled_from([{"target": "wsl"}, {"base_dir": "/srv/elsewhere"}]))
    def initialize_with_drifted_identity(self, identity: dict[str, str]) -> None:
        before = self.stores[0].head().seq
        outcomes = []
        for candidate in (self.model.handle(**identity), self._lifecycle(self.stores[0], **identity)):
            try:
                candidate.initialize()
            except LifecycleError as exc:
                outcomes.append(type(exc))
        assert outcomes == [LifecycleError, LifecycleError]
        assert self.stores[0].head().seq == before

    @rule(identity=st.sampled_from([{"target": "ssh"}, {"base_dir": "/srv/elsewhere"}]),
          name=st.sampled_from(["snapshot", "request_drain", "complete_reclaim", "settle_lease"]))
    def command_from_a_drifted_handle(self, identity: dict[str, str], name: str) -> None:
        """A handle whose target or base dir is not the recorded one is refused on every command."""
        before = self.stores[0].head().seq
        kwargs: dict[str, Any] = {
            "snapshot": {}, "request_drain": {"expected_generation": self.doc["generation"]},
            "complete_reclaim": {"expected_generation": self.doc["generation"]},
            "settle_lease": {"lease_id": "lease-000001", "lease_generation": 1, "result_digest": "sha256:" + "3" * 64},
        }[name]
        outcomes = []
        for candidate in (self.model.handle(**identity), self._lifecycle(self.stores[0], **identity)):
            try:
                getattr(candidate, name)(**kwargs)
            except LifecycleError as exc:
                outcomes.append(type(exc))
            else:
                outcomes.append(None)
        assert outcomes == [LifecycleError, LifecycleError], f"{name} from a handle with {identity}: {outcomes}"
        assert self.stores[0].head().seq == before

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def every_view_of_the_runner_agrees(self) -> None:
        if self.model.doc is None:
            return
        store = self.stores[0]
        replayed = projections.replay(store)
        assert list(replayed) == [RUNNER_ID]
        fresh = self._lifecycle(store).state()  # a cold handle: snapshot plus tail
        model = self.model.runner_state()
        assert replayed[RUNNER_ID] == self.handles[0].state() == self.handles[1].state() == fresh == model
        assert project(fresh) == self.model.snapshot()
        version = store.stream_version(RUNNER_ID)
        snapshot = snapshot_of(store, RUNNER_ID)
        if version >= SNAPSHOT_EVERY:
            assert snapshot is not None and version - snapshot.version < SNAPSHOT_EVERY
        if self.history:
            seq, state = self.history[len(self.history) // 2]
            assert projections.state_at(store, RUNNER_ID, seq) == state

    @invariant()
    def caches_and_chain_hold(self) -> None:
        if self.model.doc is None:
            return
        store = self.stores[0]
        store.verify()
        check = SnapshotCheck(store)
        states = {}
        for recorded, state in projections.replay_all(store):
            check.observe(recorded, state)
            states[recorded.stream] = (state, recorded.version, recorded.seq)
        assert check.finish() == []
        assert store.backend.read_model_position() == store.head().seq
        assert check_read_models(store, states) == []

    @invariant()
    def the_runner_obeys_the_seeds_laws(self) -> None:
        if self.model.doc is None:
            return
        state = self.handles[0].state()
        assert state.generation >= self.highest_generation
        self.highest_generation = state.generation
        sessions = [lease.session_id for lease in state.active_leases()]
        assert len(sessions) == len(set(sessions))
        last = None
        for recorded in self.stores[0].read_stream(RUNNER_ID):
            if isinstance(recorded.event, DrainRequested | RunnerParked):
                last = type(recorded.event)
        assert (state.state == "draining") == (last is DrainRequested) == (state.drain is not None)
        assert len(state.leases) <= runner.MAX_RETAINED_LEASES


class SmallRetentionMachine(LifecycleMachine):
    """The same machine with retention of 4 leases (2 after reclaim): eviction and capacity in reach."""

    retention = (4, 2)


def machine_settings(places: Places) -> settings:
    examples = SERVER_EXAMPLES if places.backend == "postgres" else EXAMPLES
    return settings(max_examples=examples, stateful_step_count=30, deadline=None)


def test_lifecycle_machine(places: Places) -> None:
    run_state_machine_as_test(lambda: LifecycleMachine(places), settings=machine_settings(places))


def test_small_retention_machine(places: Places) -> None:
    run_state_machine_as_test(lambda: SmallRetentionMachine(places), settings=machine_settings(places))
