"""The reconcile pass: the log's view of each lease's unit, and how the host converges the two.

`hosts.local.LocalHost` runs it (`reconcile()`, and `serve()` on every new event); this module holds
the decisions, LocalHost the side effects they call on (`Reconciler` is its base). Reconcile
converges, idempotently:

- a unit whose lease is no longer active (settled, parked, runner parked) is stopped;
- a unit that ended on its own is recorded (``UnitExited``, with its outcome decided once) and its
  lease ended from that record: exit 0 settles it (``result_digest`` = sha256 of ``<run dir>/result``
  when the unit wrote one, else of the exit), a death by its limits parks it ``resource-limit``, any
  other end ``lost-poll``; a unit gone from the machine (another boot, killed, vanished) ``lost-poll``;
- an active lease past its expiry: its unit is stopped and the lease parked ``lost-poll``;
- draining: SIGTERM to each unit once; at the deadline ``park_expired_drain`` and SIGKILL;
- an intent with no outcome (the host died mid-start): the unit is looked for (the pid file its
  supervisor wrote, which must name the intent's command; the proof naming the intent's systemd unit) and
  adopted, or the lease is parked ``checkout-failure``;
- accepting, parking: a unit whose tasks only wait (``status.json``, see `hosts.park`) until beyond
  `park_threshold_ms` is stopped with its wake time recorded, and started again at that time.

**Units are hostile input.** ``status.json`` and ``result`` are read without following links or
blocking, must be regular files, and are bounded (1 MiB, `hosts.park.STATUS_LIMIT`; 1 GiB, hashed in
chunks, `hosts.unitfiles.RESULT_LIMIT`). A unit whose file breaks these rules has failed: a running
one is stopped (``UnitStopped`` reason ``unsafe-file``) and its lease parked ``lost-poll``; an ended
one's lease is parked ``lost-poll`` rather than settled on that file (an ``unsafe-file`` action says
why). One unit's HostError is an ``error`` action: reconcile and serve go on with the other units.

**Unit facts in the log are public**, so the host acts only on units it can prove it started
(`hosts.unitfiles`: the proof it writes in the run directory before ``UnitStarted``). A recorded unit
that is not proven (a run directory other than ``<run root>/<lease id>``, no proof, or a different
lease generation, handle or command) is never observed, signalled, stopped, adopted or woken: the host
records ``UnitStopped`` with reason ``unproven-handle``, stops the unit its proof does name for that
lease if it still runs (that one is its own), and parks the lease ``lost-poll``. A wake starts the
proven command, never one only the log names.
"""

from __future__ import annotations

import abc
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from lifecycle_es.canonical import parse_iso_ms
from lifecycle_es.errors import InvalidInputError, StaleFenceError
from lifecycle_es.events import (
    UnitExited,
    UnitRecord,
    UnitSignalled,
    UnitStarted,
    UnitStarting,
    UnitStopped,
    UnitWakeRecorded,
)
from lifecycle_es.lifecycle import RunnerLifecycle
from lifecycle_es.state import Lease, RunnerState

from .driver import UnitDriver, sent_signals
from .park import parking_decision, record_wake
from .proc import HostError, UnitFileError, UnitStartError
from .rundir import RunDir
from .unitfiles import HandleProof, exit_digest, own_run_dir, read_proof, result_digest, unproven, write_proof


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Action(msgspec.Struct, frozen=True, kw_only=True):
    """One thing reconcile did: what, to which lease, why, and when it was done (`at_ms`: epoch ms on
    this machine's clock, taken once the deed is done; a report of it may be printed later, after a
    pause)."""

    kind: str
    lease_id: str
    detail: str = ""
    at_ms: int = msgspec.field(default_factory=_wall_ms)


class UnitView(msgspec.Struct, kw_only=True):
    """What the log says of one lease's unit: its intent, handle, signals, end and wake."""

    lease_id: str
    lease_generation: int
    run_dir: str
    unit: str | None
    command: tuple[str, ...]
    phase: str = "starting"  # starting -> running -> exited | stopped | waiting
    handle: UnitRecord | None = None
    signals: tuple[str, ...] = ()
    outcome: str | None = None
    wake_at: int | None = None


class Reconciler(abc.ABC):
    """The reconcile pass over the log's units (see the module); the host supplies the side effects."""

    lifecycle: RunnerLifecycle
    driver: UnitDriver
    run_root: str
    park_threshold_ms: int
    _now: Callable[[], int]
    _token_source: Callable[[str], str | bytes | None] | None
    _units: dict[str, UnitView]
    _version: int
    _tokens: dict[str, str | bytes | None]
    _signalled_here: set[tuple[str, str]]

    @abc.abstractmethod
    def _hold(self, lease_id: str) -> RunDir:
        """The lease's run directory, made and locked by this host."""

    @abc.abstractmethod
    def _release(self, lease_id: str) -> None:
        """Let the lease's run directory go."""

    @abc.abstractmethod
    def _start(self, lease_id: str, lease_generation: int, command: list[str], token: str | bytes | None,
               env: Mapping[str, str] | None) -> UnitRecord:
        """Start the lease's unit, recording intent and outcome."""

    # --- the log's view of units ---------------------------------------------------------------------

    def units(self) -> dict[str, UnitView]:
        """Every lease's unit as the log records it, caught up with the runner's stream."""
        store, stream = self.lifecycle.store, self.lifecycle.runner_id
        for recorded in store.read_stream(stream, after_version=self._version):
            self._fold(recorded.event)
            self._version = recorded.version
        return self._units

    def _fold(self, event: Any) -> None:
        if isinstance(event, UnitStarting):
            previous = self._units.get(event.lease_id)
            self._units[event.lease_id] = UnitView(
                lease_id=event.lease_id, lease_generation=event.lease_generation, run_dir=event.run_dir,
                unit=event.unit, command=tuple(event.command), wake_at=None,
                signals=previous.signals if previous else ())
            return
        view = self._units.get(getattr(event, "lease_id", ""))
        if view is None:
            return
        if isinstance(event, UnitStarted):
            view.phase, view.handle = "running", event.handle
        elif isinstance(event, UnitSignalled):
            view.signals = (*view.signals, event.signal)
        elif isinstance(event, UnitExited):
            view.phase, view.outcome = "exited", event.outcome
        elif isinstance(event, UnitWakeRecorded):
            view.wake_at = event.wake_at
        elif isinstance(event, UnitStopped):
            view.phase = "waiting" if event.reason == "parked-waiting" else "stopped"

    # --- proof ---------------------------------------------------------------------------------------

    @staticmethod
    def _prove(run: RunDir, lease_id: str, lease_generation: int, handle: UnitRecord,
               command: tuple[str, ...]) -> None:
        """Write the proof that this host started `handle` (before ``UnitStarted`` names it)."""
        proof = HandleProof(lease_id=lease_id, lease_generation=lease_generation, handle=handle, command=command)
        try:
            write_proof(run.path, proof)
        except OSError as exc:
            raise UnitStartError(f"cannot write the proof of the unit in {str(run.path)!r}: {exc.strerror}") from exc

    def _unproven_view(self, view: UnitView) -> str | None:
        """Why the log's record of a unit is not one this host can act on, or None (`hosts.unitfiles`)."""
        if view.phase == "waiting" and view.handle is None:
            return "the log records no started unit to wake"
        return unproven(self.run_root, view.lease_id, view.lease_generation, view.run_dir, view.handle,
                        view.command)

    def _end_unproven(self, view: UnitView, lease: Lease | None, why: str, actions: list[Action]) -> None:
        """A recorded unit this host cannot prove it started: never touched; its lease is lost.

        The unit its proof does name for this lease (the one this host started) goes with the lease.
        """
        actions.append(Action(kind="unproven", lease_id=view.lease_id, detail=why))
        try:
            own = own_run_dir(self.run_root, view.lease_id)
        except InvalidInputError:
            view.phase = "stopped"  # not a lease id: no lease to end, no directory of this host to look in
            return
        proof = read_proof(own)
        if (proof is not None and proof.lease_id == view.lease_id and proof.lease_generation == view.lease_generation
                and proof.handle.run_dir == str(own) and self.driver.observe(proof.handle) == "running"):
            self.driver.stop(proof.handle)
        self._record_stop(view, "unproven-handle", actions)
        if lease is not None and lease.generation == view.lease_generation:
            self._park(lease, "lost-poll", exit_digest(lease.id, "lost-poll", None, None), actions)

    # --- the pass ------------------------------------------------------------------------------------

    def reconcile(self) -> list[Action]:
        """Observe every recorded unit and converge the machine and the log (see the module docstring)."""
        actions: list[Action] = []
        state = self.lifecycle.state()
        now = self._now()
        if state.state == "draining" and state.drain is not None and parse_iso_ms(state.drain.deadline_at) <= now:
            # The deadline passed: park first (the log decides), then SIGKILL what still runs; the
            # units already had their SIGTERM at the start of the drain.
            self._lease_call(actions, "park_expired_drain", "*",
                             lambda: self.lifecycle.park_expired_drain(expected_generation=state.generation))
            for view in self.units().values():
                # An unproven unit is never signalled: the pass below records it and parks its lease.
                if (view.phase == "running" and view.handle is not None and self._unproven_view(view) is None
                        and self.driver.observe(view.handle) == "running"):
                    self._signal(view, signal.SIGKILL, "drain-deadline", actions)
            state = self.lifecycle.state()
        active = {lease.id: lease for lease in state.leases if lease.status == "active"}
        for lease_id, view in list(self.units().items()):
            try:
                self._converge(view, active.get(lease_id), state, now, actions)
            except HostError as exc:
                # One unit's trouble (a stop that failed, a run directory held elsewhere) is reported
                # and retried on the next pass; the other units are reconciled all the same.
                actions.append(Action(kind="error", lease_id=lease_id, detail=str(exc)))
        started = self.units()
        for lease in self.lifecycle.state().leases:  # as this pass left them: a lease it ended is not active
            # No unit, or one stopped with its lease left active (`LocalHost.stop(then=None)`).
            unit = started.get(lease.id)
            if lease.status != "active":
                continue
            if (unit is None or unit.phase == "stopped") and parse_iso_ms(lease.expires_at) <= now:
                self._park(lease, "lost-poll", exit_digest(lease.id, "expired", None, None), actions)
        return actions

    def _converge(self, view: UnitView, lease: Lease | None, state: RunnerState, now: int,
                  actions: list[Action]) -> None:
        waking = view.phase == "waiting" and lease is not None and view.wake_at is not None and now >= view.wake_at
        if view.phase in ("starting", "running") or waking:
            why = self._unproven_view(view)
            if why is not None:
                self._end_unproven(view, lease, why, actions)
                return
        if view.phase == "starting":
            self._recover_start(view, actions)
        if view.phase == "running" and view.handle is not None:
            self._converge_running(view, view.handle, lease, state, now, actions)
        if view.phase == "exited" and lease is not None and lease.generation == view.lease_generation:
            self._end_lease(view, lease, actions)
            return
        if waking and lease is not None:
            self._wake(view, lease, actions)
        if view.phase in ("exited", "stopped") or (view.phase == "waiting" and lease is None):
            self._release(view.lease_id)

    def _recover_start(self, view: UnitView, actions: list[Action]) -> None:
        """An intent without an outcome: the host died mid-start. Adopt the unit, or end the lease.

        The driver finds the unit in the host's own run directory (`hosts.driver.UnitDriver.find_started`:
        the pid file a child's supervisor wrote, naming the intent's command; the proof written before
        ``systemd-run``, naming the intent's unit and command).
        """
        own = own_run_dir(self.run_root, view.lease_id)
        handle = self.driver.find_started(own, lease_id=view.lease_id, lease_generation=view.lease_generation,
                                          unit=view.unit, command=view.command)
        if handle is not None and self.driver.status(handle) == "running":
            self._prove(self._hold(view.lease_id), view.lease_id, view.lease_generation, handle, view.command)
            self.lifecycle.record_host_facts([UnitStarted(lease_id=view.lease_id,
                                                          lease_generation=view.lease_generation, handle=handle)])
            view.phase, view.handle = "running", handle
            actions.append(Action(kind="adopted", lease_id=view.lease_id))
            return
        self._record_exit(view, "checkout-failure", None, None, actions)

    def _converge_running(self, view: UnitView, handle: UnitRecord, lease: Lease | None, state: RunnerState,
                          now: int, actions: list[Action]) -> None:
        observed = self.driver.observe(handle)
        if observed == "unknown":
            return
        if observed != "running":
            ended = self.driver.exit(handle)
            code, sig = (ended.code, ended.signal) if ended is not None else (None, None)
            if ended is None or observed == "gone":
                outcome = "lost-poll"
            elif ended.resource_limit:
                outcome = "resource-limit"
            else:
                outcome = "settled" if code == 0 else "lost-poll"
            # The lease is ended from this record by _converge's "exited" branch, the one place that
            # does it, so a host that dies right after the record ends the lease on its next pass.
            self._record_exit(view, outcome, code, sig, actions)
            return
        self._hold(view.lease_id)
        if lease is None or lease.generation != view.lease_generation:
            self._record_stop(view, "lease-ended", actions, self.driver.stop(handle))
        elif parse_iso_ms(lease.expires_at) <= now:
            self._record_stop(view, "lease-expired", actions, self.driver.stop(handle))
            self._park(lease, "lost-poll", exit_digest(lease.id, "expired", None, None), actions)
        elif state.state == "draining":
            if (view.lease_id, "SIGTERM") not in self._signalled_here:
                self._signal(view, signal.SIGTERM, "drain", actions)
        elif state.state == "accepting" and self.park_threshold_ms > 0:
            self._maybe_park(view, handle, lease, now, actions)

    def _maybe_park(self, view: UnitView, handle: UnitRecord, lease: Lease, now: int, actions: list[Action]) -> None:
        """Stop a unit whose work only waits beyond the threshold; reconcile starts it at its wake time."""
        try:
            decision = parking_decision(own_run_dir(self.run_root, view.lease_id), now, self.park_threshold_ms)
        except UnitFileError as exc:
            stopped = self.driver.stop(handle)
            actions.append(Action(kind="unsafe-file", lease_id=view.lease_id, detail=str(exc)))
            self._record_stop(view, "unsafe-file", actions, stopped)
            self._park(lease, "lost-poll", exit_digest(lease.id, "lost-poll", None, None), actions)
            return
        if decision is None:
            return
        record_wake(self.lifecycle, view.lease_id, decision.until)
        stopped = self.driver.stop(handle)
        self.lifecycle.record_host_facts([UnitStopped(lease_id=view.lease_id, reason="parked-waiting",
                                                      signals=sent_signals(stopped))])
        view.phase, view.wake_at = "waiting", decision.until
        self._release(view.lease_id)
        actions.append(Action(kind="parked-waiting", lease_id=view.lease_id, detail=f"wake at {decision.until}"))

    def _wake(self, view: UnitView, lease: Lease, actions: list[Action]) -> None:
        # The log says the unit stopped; should it still run, that record was not this host's: stop it
        # before its lease gets another.
        if view.handle is not None and self.driver.observe(view.handle) == "running":
            self.driver.stop(view.handle)
        token = self._tokens.get(view.lease_id)
        if token is None and self._token_source is not None:
            token = self._token_source(view.lease_id)
        try:
            self._start(view.lease_id, view.lease_generation, list(view.command), token, None)
        except UnitStartError as exc:
            actions.append(Action(kind="wake-failed", lease_id=view.lease_id, detail=str(exc)))
            return
        except StaleFenceError:
            return
        actions.append(Action(kind="woken", lease_id=view.lease_id))

    def _signal(self, view: UnitView, signum: int, reason: str, actions: list[Action]) -> None:
        name = signal.Signals(signum).name
        self.lifecycle.record_host_facts([UnitSignalled(lease_id=view.lease_id, signal=name, reason=reason)])
        assert view.handle is not None
        self.driver.signal(view.handle, signum)
        self._signalled_here.add((view.lease_id, name))
        actions.append(Action(kind="signalled", lease_id=view.lease_id, detail=f"{name} ({reason})"))

    # --- recording ends ------------------------------------------------------------------------------

    def _record_exit(self, view: UnitView, outcome: str, code: int | None, sig: str | None,
                     actions: list[Action]) -> None:
        self.lifecycle.record_host_facts([UnitExited(lease_id=view.lease_id, code=code, signal=sig, outcome=outcome)])
        view.phase, view.outcome = "exited", outcome
        ended = (f"killed by {sig}" if sig is not None else f"exit code {code}" if code is not None
                 else "its end unknown")
        actions.append(Action(kind="exited", lease_id=view.lease_id, detail=f"{outcome} ({ended})"))

    def _record_stop(self, view: UnitView, reason: str, actions: list[Action], stopped: object = None) -> None:
        """Record ``UnitStopped``; `stopped` is what the driver's stop returned (the signals it sent)."""
        self.lifecycle.record_host_facts([UnitStopped(lease_id=view.lease_id, reason=reason,
                                                      signals=sent_signals(stopped))])
        view.phase = "stopped"
        self._release(view.lease_id)
        actions.append(Action(kind="stopped", lease_id=view.lease_id, detail=reason))

    def _end_unit(self, lease_id: str, generation: int, run_dir: str, outcome: str, code: int | None,
                  sig: str | None) -> None:
        view = UnitView(lease_id=lease_id, lease_generation=generation, run_dir=run_dir, unit=None, command=())
        actions: list[Action] = []
        self._record_exit(view, outcome, code, sig, actions)
        lease = self.lifecycle.state().lease(lease_id)
        if lease is not None and lease.status == "active":
            self._end_lease(view, lease, actions)

    def _end_lease(self, view: UnitView, lease: Lease, actions: list[Action]) -> None:
        """End an active lease from its unit's recorded outcome (idempotent: a later lease is left alone)."""
        if lease.status != "active":
            return
        outcome = view.outcome or "lost-poll"
        try:
            digest = result_digest(own_run_dir(self.run_root, lease.id), lease.id, outcome, None, None)
        except UnitFileError as exc:
            # A result the host may not read settles nothing: the unit failed, whatever its exit said.
            actions.append(Action(kind="unsafe-file", lease_id=lease.id, detail=str(exc)))
            self._park(lease, "lost-poll", exit_digest(lease.id, outcome, None, None), actions)
            return
        if view.outcome == "settled":
            self._lease_call(actions, "settled", lease.id, lambda: self.lifecycle.settle_lease(
                lease_id=lease.id, lease_generation=lease.generation, result_digest=digest))
        else:
            reason = view.outcome if view.outcome in ("resource-limit", "checkout-failure") else "lost-poll"
            self._park(lease, reason, digest, actions)

    def _park(self, lease: Lease, reason: str, digest: str, actions: list[Action]) -> None:
        self._lease_call(actions, f"parked {reason}", lease.id, lambda: self.lifecycle.park_lease(
            lease_id=lease.id, lease_generation=lease.generation, result_digest=digest, reason=reason))

    @staticmethod
    def _lease_call(actions: list[Action], kind: str, lease_id: str, call: Callable[[], object]) -> None:
        """Run a lifecycle transition; another process having moved the runner on first is not an error."""
        try:
            call()
        except StaleFenceError as exc:
            actions.append(Action(kind="skipped", lease_id=lease_id, detail=str(exc)))
            return
        actions.append(Action(kind=kind, lease_id=lease_id))


__all__ = ["Action", "Reconciler", "UnitView"]
