"""`LocalHost`: the local host driver. It makes the units on this machine agree with the log.

    host = LocalHost(lifecycle, mode="child")
    handle = host.start(receipt, command=[sys.executable, "-m", "my_agent"], token=secret)
    host.reconcile()                     # observe every recorded unit and converge
    host.serve(stop_event)               # follow the log: reconcile on every new event and on a timer

One unit runs per active lease, in ``<run_root or base_dir>/<lease id>/`` (``work/`` inside, held by
an owner lock). Every side effect is an event of the runner's stream, decided under the rules like any
command: ``UnitStarting`` (intent, with the unit name and command) before a start, ``UnitStarted``
(the handle) after; ``UnitSignalled`` before a signal; ``UnitWakeRecorded`` before a unit that only
waits is stopped; ``UnitExited`` / ``UnitStopped`` after. A host SIGKILLed anywhere and started again
replays those facts, looks at the machine, and carries on from where the log says it was.

Reconcile converges, idempotently:

- a unit whose lease is no longer active (settled, parked, runner parked) is stopped;
- a unit that ended on its own is recorded (``UnitExited``, with its outcome decided once) and its
  lease ended from that record: exit 0 settles it (``result_digest`` = sha256 of ``<run dir>/result``
  when the unit wrote one, else of the exit), a death by its limits parks it ``resource-limit``, any
  other end ``lost-poll``; a unit gone from the machine (another boot, killed, vanished) ``lost-poll``;
- an active lease past its expiry: its unit is stopped and the lease parked ``lost-poll``;
- draining: SIGTERM to each unit once; at the deadline ``park_expired_drain`` and SIGKILL;
- an intent with no outcome (the host died mid-start): the unit is looked for (its pid file, its
  systemd unit name) and adopted, or the lease is parked ``checkout-failure``;
- accepting, parking: a unit whose tasks only wait (``status.json``, see `hosts.park`) until beyond
  `park_threshold_ms` is stopped with its wake time recorded, and started again at that time.
"""

from __future__ import annotations

import hashlib
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from lifecycle_es.canonical import canonical_bytes, parse_iso_ms
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
from lifecycle_es.receipts import LeaseReceipt
from lifecycle_es.runner import Lease, RunnerState

from .child import ChildUnits
from .park import parking_decision, record_wake
from .proc import Exec, UnitStartError, run_command
from .rundir import RunDir, RunDirHeldError, open_run_dir
from .systemd import SystemdUnits

RESULT_FILE = "result"
MODES = ("child", "systemd")


class Action(msgspec.Struct, frozen=True, kw_only=True):
    """One thing reconcile did: what, to which lease, and why."""

    kind: str
    lease_id: str
    detail: str = ""


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


def exit_digest(lease_id: str, outcome: str, code: int | None, signal_: str | None) -> str:
    """The result digest of a unit's end when it wrote no result: sha256 over its canonical exit."""
    material = {"leaseId": lease_id, "outcome": outcome, "code": code, "signal": signal_}
    return "sha256:" + hashlib.sha256(canonical_bytes(material)).hexdigest()


def result_digest(run_dir: str, lease_id: str, outcome: str, code: int | None, signal_: str | None) -> str:
    """sha256 of the unit's ``result`` file when it wrote one, else `exit_digest`."""
    try:
        with open(Path(run_dir) / RESULT_FILE, "rb") as handle:
            return "sha256:" + hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return exit_digest(lease_id, outcome, code, signal_)


class LocalHost:
    """Runs one unit per active lease of a runner on this machine, as the log says (see the module)."""

    def __init__(self, lifecycle: RunnerLifecycle, *, mode: str = "child", scope: str = "system",
                 run_root: str | None = None, stop_timeout_ms: int = 30_000, park_threshold_ms: int = 60_000,
                 user: str | None = None, group: str | None = None, exec: Exec | None = None,
                 now: Callable[[], int] | None = None,
                 token_source: Callable[[str], str | bytes | None] | None = None,
                 env: Mapping[str, str] | None = None, token_dir: str | None = None) -> None:
        if not isinstance(lifecycle, RunnerLifecycle):
            raise InvalidInputError("lifecycle", f"lifecycle must be a RunnerLifecycle, got {type(lifecycle).__name__}")
        if mode not in MODES:
            raise InvalidInputError("mode", f"mode must be 'child' or 'systemd', got {mode!r}")
        if scope not in ("system", "user"):
            raise InvalidInputError("scope", f"scope must be 'system' or 'user', got {scope!r}")
        for name, value in (("stop_timeout_ms", stop_timeout_ms), ("park_threshold_ms", park_threshold_ms)):
            if type(value) is not int or not 0 <= value <= 86_400_000:
                raise InvalidInputError(name, f"{name} must be an int in 0..86400000, got {value!r}")
        for name, value in (("now", now), ("token_source", token_source), ("exec", exec)):
            if value is not None and not callable(value):
                raise InvalidInputError(name, f"{name} must be callable")
        self.lifecycle = lifecycle
        self.mode = mode
        self.run_root = str(Path(run_root).absolute()) if run_root is not None else lifecycle.base_dir
        self.stop_timeout_ms = stop_timeout_ms
        self.park_threshold_ms = park_threshold_ms
        self._now = now or lifecycle.clock
        self._token_source = token_source
        self._env = dict(env or {})
        self.driver: ChildUnits | SystemdUnits
        if mode == "child":
            self.driver = ChildUnits(stop_timeout_ms=stop_timeout_ms)
        else:
            extra = {"token_dir": token_dir} if token_dir is not None else {}
            self.driver = SystemdUnits(scope=scope, user=user, group=group,  # type: ignore[arg-type]
                                       exec=exec or run_command, stop_timeout_ms=stop_timeout_ms, now=self._now,
                                       **extra)
        self._units: dict[str, UnitView] = {}
        self._version = 0
        self._run_dirs: dict[str, RunDir] = {}
        self._tokens: dict[str, str | bytes | None] = {}
        self._signalled_here: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        running = sum(1 for unit in self._units.values() if unit.phase == "running")
        return f"LocalHost({self.lifecycle.runner_id!r}, mode={self.mode}, running={running})"

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

    # --- start, status, stop -------------------------------------------------------------------------

    def _hold(self, lease_id: str) -> RunDir:
        held = self._run_dirs.get(lease_id)
        if held is None or not held.held:
            held = open_run_dir(self.run_root, lease_id)
            self._run_dirs[lease_id] = held
        return held

    def _release(self, lease_id: str) -> None:
        held = self._run_dirs.pop(lease_id, None)
        if held is not None:
            held.close()

    def start(self, receipt: LeaseReceipt, *, command: Sequence[str], token: str | bytes | None = None,
              env: Mapping[str, str] | None = None) -> UnitRecord:
        """Start the unit of a freshly leased session; its token goes to the unit's stdin only.

        The lease must still poll (`assert_poll`). A start that fails parks the lease
        ``checkout-failure`` and raises UnitStartError.
        """
        if not isinstance(receipt, LeaseReceipt) or receipt.runner_id != self.lifecycle.runner_id:
            raise InvalidInputError("receipt", "receipt must be a LeaseReceipt of this host's runner")
        lease = receipt.lease
        self.lifecycle.assert_poll(lease_id=lease.id, lease_generation=lease.generation,
                                   proxy_authority_id=receipt.proxy_authority.id,
                                   proxy_authority_revision=receipt.proxy_authority.revision)
        self._tokens[lease.id] = token
        return self._start(lease.id, lease.generation, list(command), token, env)

    def _start(self, lease_id: str, lease_generation: int, command: list[str], token: str | bytes | None,
               env: Mapping[str, str] | None) -> UnitRecord:
        run = self._hold(lease_id)
        unit = self.driver.new_unit_name(lease_id) if isinstance(self.driver, SystemdUnits) else None
        self.lifecycle.record_host_facts([UnitStarting(lease_id=lease_id, lease_generation=lease_generation,
                                                       mode=self.mode, run_dir=str(run.path), unit=unit,
                                                       command=tuple(command))])
        resources = self.lifecycle.state().resources
        merged_env = {**self._env, **(env or {})}
        try:
            if isinstance(self.driver, SystemdUnits):
                handle = self.driver.start(command, lease_id=lease_id, run_dir=run.path, token=token,
                                           resources=resources, env=merged_env, unit=unit)
            else:
                handle = self.driver.start(command, run_dir=run.path, token=token, resources=resources,
                                           env=merged_env)
        except UnitStartError as exc:
            self._end_unit(lease_id, lease_generation, str(run.path), "checkout-failure", None, None,
                           f"start failed: {exc}")
            raise
        self.lifecycle.record_host_facts([UnitStarted(lease_id=lease_id, lease_generation=lease_generation,
                                                      handle=handle)])
        return handle

    def status(self, handle: UnitRecord) -> str:
        """``running``, ``stopped``, ``failed``, ``gone`` or ``unknown`` (the seed's meanings)."""
        if isinstance(self.driver, ChildUnits):
            self.driver.reap(handle)
        return self.driver.status(handle)

    def stop(self, handle: UnitRecord) -> None:
        """Stop a unit (SIGTERM, wait, SIGKILL / systemctl stop) and record ``UnitStopped``."""
        lease_id = Path(handle.run_dir).name
        self.driver.stop(handle)
        self.lifecycle.record_host_facts([UnitStopped(lease_id=lease_id, reason="stopped")])
        self._release(lease_id)

    # --- reconcile -----------------------------------------------------------------------------------

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
                if view.phase == "running" and view.handle is not None and self.status(view.handle) == "running":
                    self._signal(view, signal.SIGKILL, "drain-deadline", actions)
            state = self.lifecycle.state()
        active = {lease.id: lease for lease in state.leases if lease.status == "active"}
        for lease_id, view in list(self.units().items()):
            self._converge(view, active.get(lease_id), state, now, actions)
        started = self.units()
        for lease in active.values():
            if lease.id not in started and parse_iso_ms(lease.expires_at) <= now:
                self._park(lease, "lost-poll", exit_digest(lease.id, "expired", None, None), actions)
        return actions

    def _converge(self, view: UnitView, lease: Lease | None, state: RunnerState, now: int,
                  actions: list[Action]) -> None:
        if view.phase == "starting":
            self._recover_start(view, lease, actions)
        if view.phase == "running" and view.handle is not None:
            self._converge_running(view, view.handle, lease, state, now, actions)
        if view.phase == "exited" and lease is not None and lease.generation == view.lease_generation:
            self._end_lease(view, lease, actions)
            return
        if view.phase == "waiting" and lease is not None and view.wake_at is not None and now >= view.wake_at:
            self._wake(view, lease, actions)
        if view.phase in ("exited", "stopped") or (view.phase == "waiting" and lease is None):
            self._release(view.lease_id)

    def _recover_start(self, view: UnitView, lease: Lease | None, actions: list[Action]) -> None:
        """An intent without an outcome: the host died mid-start. Adopt the unit, or end the lease."""
        if isinstance(self.driver, ChildUnits):
            handle = self.driver.find(view.run_dir)
        else:
            handle = UnitRecord(mode="systemd", host=self.driver.host_name, boot_id=self.driver.boot_id,
                                run_dir=view.run_dir, unit=view.unit)
        if handle is not None and self.driver.status(handle) == "running":
            self.lifecycle.record_host_facts([UnitStarted(lease_id=view.lease_id,
                                                          lease_generation=view.lease_generation, handle=handle)])
            view.phase, view.handle = "running", handle
            actions.append(Action(kind="adopted", lease_id=view.lease_id))
            return
        self._record_exit(view, "checkout-failure", None, None, actions)

    def _converge_running(self, view: UnitView, handle: UnitRecord, lease: Lease | None, state: RunnerState,
                          now: int, actions: list[Action]) -> None:
        observed = self.status(handle)
        if observed == "unknown":
            return
        if observed != "running":
            ended = self.driver.reap(handle) if isinstance(self.driver, ChildUnits) else self.driver.exit(handle)
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
            self.driver.stop(handle)
            self._record_stop(view, "lease-ended", actions)
        elif parse_iso_ms(lease.expires_at) <= now:
            self.driver.stop(handle)
            self._record_stop(view, "lease-expired", actions)
            self._park(lease, "lost-poll", exit_digest(lease.id, "expired", None, None), actions)
        elif state.state == "draining":
            if (view.lease_id, "SIGTERM") not in self._signalled_here:
                self._signal(view, signal.SIGTERM, "drain", actions)
        elif state.state == "accepting" and self.park_threshold_ms > 0:
            self._maybe_park(view, handle, now, actions)

    def _maybe_park(self, view: UnitView, handle: UnitRecord, now: int, actions: list[Action]) -> None:
        """Stop a unit whose work only waits beyond the threshold; reconcile starts it at its wake time."""
        decision = parking_decision(view.run_dir, now, self.park_threshold_ms)
        if decision is None:
            return
        record_wake(self.lifecycle, view.lease_id, decision.until)
        self.driver.stop(handle)
        self.lifecycle.record_host_facts([UnitStopped(lease_id=view.lease_id, reason="parked-waiting")])
        view.phase, view.wake_at = "waiting", decision.until
        self._release(view.lease_id)
        actions.append(Action(kind="parked-waiting", lease_id=view.lease_id, detail=f"wake at {decision.until}"))

    def _wake(self, view: UnitView, lease: Lease, actions: list[Action]) -> None:
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

    def _record_exit(self, view: UnitView, outcome: str, code: int | None, sig: str | None,
                     actions: list[Action]) -> None:
        self.lifecycle.record_host_facts([UnitExited(lease_id=view.lease_id, code=code, signal=sig, outcome=outcome)])
        view.phase, view.outcome = "exited", outcome
        actions.append(Action(kind="exited", lease_id=view.lease_id, detail=f"{outcome} code={code} signal={sig}"))

    def _record_stop(self, view: UnitView, reason: str, actions: list[Action]) -> None:
        self.lifecycle.record_host_facts([UnitStopped(lease_id=view.lease_id, reason=reason)])
        view.phase = "stopped"
        self._release(view.lease_id)
        actions.append(Action(kind="stopped", lease_id=view.lease_id, detail=reason))

    def _end_unit(self, lease_id: str, generation: int, run_dir: str, outcome: str, code: int | None,
                  sig: str | None, detail: str) -> None:
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
        digest = result_digest(view.run_dir, lease.id, view.outcome or "lost-poll", None, None)
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

    # --- serving -------------------------------------------------------------------------------------

    def serve(self, stop_event: threading.Event, *, poll_interval: float = 0.05, tick: float = 1.0,
              on_actions: Callable[[list[Action]], None] | None = None) -> None:
        """Reconcile until `stop_event` is set: on every new event in the log and every `tick` seconds."""
        store = self.lifecycle.store
        seen = -1
        waited = tick
        while not stop_event.is_set():
            head = store.head().seq
            if head != seen or waited >= tick:
                actions = self.reconcile()
                if actions and on_actions is not None:
                    on_actions(actions)
                seen, waited = store.head().seq, 0.0
            stop_event.wait(poll_interval)
            waited += poll_interval

    def close(self) -> None:
        """Release every run directory this host holds (units keep running; reconcile finds them again)."""
        for lease_id in list(self._run_dirs):
            self._release(lease_id)


__all__ = ["Action", "LocalHost", "RunDirHeldError", "UnitView", "exit_digest", "result_digest"]
