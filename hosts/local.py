"""`LocalHost`: the local host driver. It makes the units on this machine agree with the log.

    host = LocalHost(lifecycle, mode="child")
    handle = host.start(receipt, command=[sys.executable, "-m", "my_agent"], token=secret)
    host.reconcile()                     # observe every recorded unit and converge
    host.serve(stop_event)               # follow the log: reconcile on every new event and on a timer
    host.stop(handle, then="settle")     # stop the unit, then settle its lease ("park", or None: leave it)

One unit runs per active lease, in ``<run_root or base_dir>/<lease id>/`` (``work/`` inside, held by
an owner lock). Every side effect is an event of the runner's stream, decided under the rules like any
command: ``UnitStarting`` (intent, with the unit name and command) before a start, ``UnitStarted``
(the handle) after; ``UnitSignalled`` before a signal; ``UnitWakeRecorded`` before a unit that only
waits is stopped; ``UnitExited`` / ``UnitStopped`` after. A host SIGKILLed anywhere and started again
replays those facts, looks at the machine, and carries on from where the log says it was.

How reconcile converges, how units are treated as hostile input (their files read safely and
bounded; a unit breaking the rules ends as a failure, parking its lease ``lost-poll``), and how the host
acts only on units it can prove it started (a recorded unit it cannot prove is never signalled; its
lease parks ``lost-poll``, ``UnitStopped`` says ``unproven-handle``): see `hosts.reconcile`. `stop` of
a handle this host cannot prove it started raises UnprovenUnitError; `status` says ``unknown``.

**One unit per lease.** `start` for a lease whose unit the log records as started (or starting) and
not ended raises `UnitRunningError` and appends nothing: it never makes a second process, and never
hands back the running one either (a second call may carry another command or token; the caller
decides). Stop the unit first, or let `reconcile` record its end. `command` is a list of strings: a
``str`` (which would run as one argument per character) is `InvalidInputError` naming ``command``, as
are a bad ``token`` or ``env``, all before anything is recorded.

**What a unit is told.** Its environment holds ``LIFECYCLE_ES_RUN_DIR`` (its run directory) and
``LIFECYCLE_ES_RESULT`` (where its result goes: ``<run dir>/result``), set over the caller's ``env``;
a result left in its working directory instead is not ignored (`hosts.unitfiles`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast

from lifecycle_es.errors import InvalidInputError, StaleFenceError
from lifecycle_es.events import UnitRecord, UnitStarted, UnitStarting, UnitStopped
from lifecycle_es.lifecycle import RunnerLifecycle
from lifecycle_es.receipts import LeaseReceipt
from lifecycle_es.values import safe_choice, safe_number, safe_progress, safe_stop, shown

from .child import ChildUnits
from .driver import DriverOptions, UnitDriver, sent_signals
from .proc import Exec, UnitRunningError, UnitStartError, UnprovenUnitError, safe_command, safe_env, token_bytes
from .reconcile import Action, Reconciler, UnitView
from .rundir import RunDir, open_run_dir, safe_run_root
from .systemd import SystemdUnits
from .systemd_run import Scope
from .unitfiles import RESULT_ENV, RESULT_FILE, RUN_DIR_ENV, exit_digest, own_run_dir, result_digest, unproven

# What `stop` does to the lease after the unit stopped.
STOP_THEN = ("settle", "park", None)

# Each mode's driver, built from the host's options: what differs between modes lives in the driver.
MODES: Mapping[str, Callable[[DriverOptions], UnitDriver]] = {"child": ChildUnits.for_host,
                                                              "systemd": SystemdUnits.for_host}


class LocalHost(Reconciler):
    """Runs one unit per active lease of a runner on this machine, as the log says (see the module)."""

    def __init__(self, lifecycle: RunnerLifecycle, *, mode: str = "child", scope: str = "system",
                 run_root: str | None = None, stop_timeout_ms: int = 30_000, park_threshold_ms: int = 60_000,
                 user: str | None = None, group: str | None = None, exec: Exec | None = None,
                 now: Callable[[], int] | None = None,
                 token_source: Callable[[str], str | bytes | None] | None = None,
                 env: Mapping[str, str] | None = None, token_dir: str | None = None) -> None:
        if not isinstance(lifecycle, RunnerLifecycle):
            raise InvalidInputError("lifecycle", f"lifecycle must be a RunnerLifecycle, got {type(lifecycle).__name__}")
        safe_choice(mode, "mode", tuple(MODES))
        safe_choice(scope, "scope", ("system", "user"))
        for name, value in (("stop_timeout_ms", stop_timeout_ms), ("park_threshold_ms", park_threshold_ms)):
            if type(value) is not int or not 0 <= value <= 86_400_000:
                raise InvalidInputError(name, f"{name} must be an int in 0..86400000, got {value!r}")
        for name, given in (("now", now), ("token_source", token_source), ("exec", exec)):
            if given is not None and not callable(given):
                raise InvalidInputError(name, f"{name} must be callable")
        self.lifecycle = lifecycle
        self.mode = mode
        self.run_root = safe_run_root(run_root) if run_root is not None else lifecycle.base_dir
        self.stop_timeout_ms = stop_timeout_ms
        self.park_threshold_ms = park_threshold_ms
        self._now = now or lifecycle.clock
        self._token_source = token_source
        self._env = dict(env or {})
        options = DriverOptions(stop_timeout_ms=stop_timeout_ms, scope=cast(Scope, scope), user=user, group=group,
                                exec=exec, now=self._now, token_dir=token_dir)  # scope: checked above
        self.driver: UnitDriver = MODES[mode](options)
        self._units: dict[str, UnitView] = {}
        self._version = 0
        self._run_dirs: dict[str, RunDir] = {}
        self._tokens: dict[str, str | bytes | None] = {}
        self._signalled_here: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        running = sum(1 for unit in self._units.values() if unit.phase == "running")
        return f"LocalHost({self.lifecycle.runner_id!r}, mode={self.mode}, running={running})"

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

        `command` is a list of strings (a ``str`` is InvalidInputError naming ``command``); the lease
        must still poll (`assert_poll`). Raises UnitRunningError, appending nothing, when the lease
        already has a unit that has not ended (see the module). A start that fails parks the lease
        ``checkout-failure`` and raises UnitStartError.
        """
        argv = safe_command(command)
        if token is not None:
            token_bytes(token)
        safe_env(env)
        if not isinstance(receipt, LeaseReceipt) or receipt.runner_id != self.lifecycle.runner_id:
            raise InvalidInputError("receipt", "receipt must be a LeaseReceipt of this host's runner")
        lease = receipt.lease
        self.lifecycle.assert_poll(lease_id=lease.id, lease_generation=lease.generation,
                                   proxy_authority_id=receipt.proxy_authority.id,
                                   proxy_authority_revision=receipt.proxy_authority.revision)
        view = self.units().get(lease.id)
        if view is not None and view.phase in ("starting", "running"):
            which = (f"supervisor pid {view.handle.pid}" if view.handle is not None and view.handle.pid is not None
                     else f"unit {view.handle.unit}" if view.handle is not None else "its start is under way")
            raise UnitRunningError(
                f"lease {lease.id} already has a unit ({which}) that has not ended: not starting a second; stop "
                "it first (stop(handle, then=None)) or let reconcile() record its end", lease_id=lease.id,
                handle=view.handle)
        self._tokens[lease.id] = token
        return self._start(lease.id, lease.generation, argv, token, env)

    def _start(self, lease_id: str, lease_generation: int, command: list[str], token: str | bytes | None,
               env: Mapping[str, str] | None) -> UnitRecord:
        run = self._hold(lease_id)
        planned = self.driver.plan(lease_id, run.path)
        self.lifecycle.record_host_facts([UnitStarting(
            lease_id=lease_id, lease_generation=lease_generation, mode=self.driver.mode, run_dir=str(run.path),
            unit=planned.unit if planned is not None else None, command=tuple(command))])
        resources = self.lifecycle.state().resources
        merged_env = {**self._env, **(env or {}), RUN_DIR_ENV: str(run.path), RESULT_ENV: str(run.path / RESULT_FILE)}
        try:
            if planned is not None:
                # The handle is known before the start: proven first, so a host that dies during the
                # start can still adopt the unit.
                self._prove(run, lease_id, lease_generation, planned, tuple(command))
            handle = self.driver.start_unit(command, lease_id=lease_id, run_dir=run.path, token=token,
                                            resources=resources, env=merged_env, planned=planned)
            if handle != planned:
                try:
                    self._prove(run, lease_id, lease_generation, handle, tuple(command))
                except UnitStartError:
                    self.driver.discard(handle)  # a unit it could not prove is one the host may not keep
                    raise
        except UnitStartError:
            self._end_unit(lease_id, lease_generation, str(run.path), "checkout-failure", None, None)
            raise
        self.lifecycle.record_host_facts([UnitStarted(lease_id=lease_id, lease_generation=lease_generation,
                                                      handle=handle)])
        return handle

    def _unproven_handle(self, handle: UnitRecord) -> str | None:
        """Why a caller's handle is not a unit this host started (see `hosts.unitfiles`), or None."""
        if not isinstance(handle, UnitRecord):
            raise InvalidInputError("handle", f"handle must be a UnitRecord, got {type(handle).__name__}")
        return unproven(self.run_root, Path(handle.run_dir).name, None, handle.run_dir, handle)

    def status(self, handle: UnitRecord) -> str:
        """``running``, ``stopped``, ``failed``, ``gone`` or ``unknown`` (see `hosts.driver.UnitDriver.status`).

        ``unknown`` too for a handle this host cannot prove it started: it is never looked at.
        """
        if self._unproven_handle(handle) is not None:
            return "unknown"
        return self.driver.observe(handle)

    def stop(self, handle: UnitRecord, *, then: str | None) -> None:
        """Stop a unit (SIGTERM, wait, SIGKILL / systemctl stop), record ``UnitStopped`` with the
        signals sent (``SIGKILL`` among them when the stop escalated), then do `then` to its lease:

        - ``"settle"``: settle it, with the digest of the unit's ``result`` (else of its stop), as a
          clean exit would; a result the host may not read, or a misplaced one, raises UnitFileError
          and the lease stays active;
        - ``"park"``: park it ``lost-poll`` (the session was cut short);
        - ``None``: leave it active with no unit: start another unit for it, or settle or park it
          yourself; reconcile parks it ``lost-poll`` once it expires.

        `then` must be given: what a stop does to the lease is always the caller's word. A lease that
        already ended raises StaleFenceError for ``"settle"`` and ``"park"`` (the unit is stopped all
        the same). Raises UnprovenUnitError, signalling nothing, for a handle this host cannot prove
        it started.
        """
        if then not in STOP_THEN:
            raise InvalidInputError("then", f"then must be 'settle', 'park' or None, got {shown(then)}")
        why = self._unproven_handle(handle)
        if why is not None:
            raise UnprovenUnitError(f"not stopping a unit this host cannot prove it started: {why}")
        lease_id = Path(handle.run_dir).name
        sent = sent_signals(self.driver.stop(handle))
        self.lifecycle.record_host_facts([UnitStopped(lease_id=lease_id, reason="stopped", signals=sent)])
        self._release(lease_id)
        if then is None:
            return
        view = self.units().get(lease_id)
        lease = self.lifecycle.state().lease(lease_id)
        if lease is None or lease.status != "active" or view is None or view.lease_generation != lease.generation:
            raise StaleFenceError(f"unit of lease {lease_id} stopped, but the lease is no longer active at the "
                                  f"unit's generation: nothing to {then}")
        if then == "settle":
            digest = result_digest(own_run_dir(self.run_root, lease_id), lease_id, "settled", None, None)
            self.lifecycle.settle_lease(lease_id=lease_id, lease_generation=lease.generation, result_digest=digest)
        else:
            self.lifecycle.park_lease(lease_id=lease_id, lease_generation=lease.generation, reason="lost-poll",
                                      result_digest=exit_digest(lease_id, "lost-poll", None, None))

    # --- serving -------------------------------------------------------------------------------------

    def serve(self, stop_event: threading.Event, *, poll_interval: float = 0.05, tick: float = 1.0,
              on_actions: Callable[[list[Action]], None] | None = None) -> None:
        """Reconcile until `stop_event` is set: on every new event in the log and every `tick` seconds."""
        safe_stop(stop_event, "stop_event")
        safe_number(poll_interval, "poll_interval", 0, 3600, above=True)
        safe_number(tick, "tick", 0, 86_400)
        safe_progress(on_actions, "on_actions", "(actions)")
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


__all__ = ["MODES", "STOP_THEN", "LocalHost"]
