"""`HostServer`: one process driving the units of one or several runners, each under its own host lease.

    server = HostServer(store, lifecycles, make_host=lambda lifecycle, keeper: LocalHost(lifecycle, ...),
                        holder=holder_name(), ttl_ms=15_000, report=print_event)
    code = server.run(stop_event)       # 0 stopped, 75 fenced, 76 held (with no_wait)

For each runner the server is a standby until it takes the runner's host lease (`hosts.lease`): it
reads the lease row and tries to take it once the holder's expiry has passed by the store's clock. A
taker waits until the previous holder's expiry plus the grace (``act_after_ms``) before it touches a
unit, then builds the runner's `LocalHost` (its driver wrapped in `FencedDriver`) and reconciles on
every new event and every `tick`: the units the log records and the machine still runs are adopted as
they are, the others are found gone and their leases parked ``lost-poll``. Renewals run on their own
thread and connection (`LeaseRenewer`).

A lease lost (the store refused a write or a renewal, or the local deadline passed before a renewal
came back) stops the whole process from acting at once: every runner's host is closed, the other
leases are released so their standbys take over without waiting, and `run` returns EXIT_FENCED (75).
With `no_wait`, a runner whose lease another live driver holds makes `run` return EXIT_HELD (76) before
anything is touched. A stop request (SIGTERM) closes the hosts (units keep running; the next holder
adopts them) and releases the leases.

`report(kind, fields)` tells what happened (``standby``, ``lease-taken``, ``acting``, ``adopted``,
``action``, ``busy``, ``fenced``, ``held``, ``released``, ``renewed``, ``renew-failed``, ``reconciled``); the
command line turns it into text or JSON lines, and metrics.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lifecycle_es.canonical import iso_ms
from lifecycle_es.errors import EXIT_FENCED, EXIT_HELD, HostFencedError, InvalidInputError, StoreBusyError
from lifecycle_es.lifecycle import RunnerLifecycle
from lifecycle_es.store import EventStore
from lifecycle_es.values import safe_callable, safe_number, safe_progress, safe_stop

from .lease import FencedDriver, LeaseKeeper, LeaseRenewer
from .local import LocalHost

EXIT_OK = 0
Report = Callable[[str, dict[str, Any]], None]


@dataclass
class _Slot:
    """One runner of the server: its lease, its host once acting, and when it last reconciled."""

    lifecycle: RunnerLifecycle
    keeper: LeaseKeeper
    host: LocalHost | None = None
    seen: int = -1
    last: float = field(default=0.0)
    announced: bool = False


class HostServer:
    """Drives several runners' units from one process, each under its own host lease (see the module)."""

    def __init__(self, store: EventStore, lifecycles: Sequence[RunnerLifecycle], *,
                 make_host: Callable[[RunnerLifecycle, LeaseKeeper], LocalHost], holder: str, ttl_ms: int,
                 grace_ms: int, tick: float = 1.0, poll_interval: float = 0.05, no_wait: bool = False,
                 report: Report | None = None, on_stuck: Callable[[HostFencedError], None] | None = None) -> None:
        safe_callable(make_host, "make_host", "(lifecycle, keeper)")
        safe_number(tick, "tick", 0, 86_400)
        safe_number(poll_interval, "poll_interval", 0, 3600, above=True)
        if type(no_wait) is not bool:
            raise InvalidInputError("no_wait", f"no_wait is invalid: a {type(no_wait).__name__} is not a bool")
        safe_progress(report, "report", "(kind, fields)")
        safe_progress(on_stuck, "on_stuck", "(error)")
        self.store = store
        self._make_host = make_host
        self.holder = holder
        self.tick = tick
        self.poll_interval = poll_interval
        self.no_wait = no_wait
        self._report = report or (lambda kind, fields: None)
        # Called from a watchdog thread when a lease's deadline passed and the loop, blocked in a call to
        # the store, did not fence it: the caller stops the process (the CLI exits 75 at once).
        self._on_stuck = on_stuck
        self.slots = [_Slot(lifecycle, LeaseKeeper(lifecycle, holder=holder, ttl_ms=ttl_ms, grace_ms=grace_ms))
                      for lifecycle in lifecycles]

    def __repr__(self) -> str:
        acting = sum(1 for slot in self.slots if slot.host is not None)
        return f"HostServer({self.holder}, {len(self.slots)} runners, {acting} acting)"

    @property
    def keepers(self) -> list[LeaseKeeper]:
        """Each runner's lease keeper."""
        return [slot.keeper for slot in self.slots]

    def run(self, stop: threading.Event, *, on_tick: Callable[[], None] | None = None) -> int:
        """Serve until `stop` is set (EXIT_OK), a lease is lost (EXIT_FENCED) or, with `no_wait`, held (EXIT_HELD).

        `on_tick` is called once per turn of the loop, after every runner was looked at (a heartbeat).
        """
        safe_stop(stop)
        safe_progress(on_tick, "on_tick", "nothing")
        renewer = LeaseRenewer(self.store.path, self.keepers, on_error=self._renew_failed,
                               on_renewed=self._renewed).start()
        done = threading.Event()
        if self._on_stuck is not None:
            threading.Thread(target=self._watch, args=(done,), name="lease-watchdog", daemon=True).start()
        code = EXIT_OK
        try:
            while not stop.is_set():
                for slot in self.slots:
                    try:
                        if slot.keeper.grant is None and not self._take(slot):
                            if self.no_wait:
                                return EXIT_HELD
                            continue
                        slot.keeper.check()
                        if slot.keeper.ready():
                            self._serve(slot)
                    except StoreBusyError as busy:
                        # Another writer held the store's lock too long: try again on the next turn (the
                        # lease's deadline, checked before any side effect, bounds how long that may last).
                        self._report("busy", {"runner": slot.keeper.runner_id, "error": str(busy)})
                if on_tick is not None:
                    on_tick()
                stop.wait(self.poll_interval)
        except HostFencedError as fenced:
            code = EXIT_FENCED
            for slot in self.slots:
                if slot.keeper.runner_id == fenced.runner_id:
                    slot.keeper.fence(fenced)
            self._report("fenced", {"runner": fenced.runner_id, "token": fenced.token, "reason": fenced.reason})
        finally:
            done.set()
            renewer.close()
            for slot in self.slots:
                if slot.host is not None:
                    slot.host.close()
                grant = slot.keeper.grant
                if grant is not None and slot.keeper.seconds_left() > 0:  # held and not fenced
                    slot.keeper.release()
                    self._report("released", {"runner": slot.keeper.runner_id, "token": grant.token})
        return code

    def _watch(self, done: threading.Event) -> None:
        """Hand a lease the loop failed to fence in time (it is stuck in a call) to `on_stuck`."""
        allowance = 2 * max(self.tick, self.poll_interval) + 1.0
        while not done.wait(0.1):
            for keeper in self.keepers:
                stuck = keeper.overdue(allowance)
                if stuck is not None and self._on_stuck is not None:
                    keeper.fence(stuck)
                    self._report("fenced", {"runner": stuck.runner_id, "token": stuck.token, "reason": stuck.reason})
                    self._on_stuck(stuck)
                    return

    def _take(self, slot: _Slot) -> bool:
        keeper = slot.keeper
        row = self.store.host_lease(keeper.runner_id)
        # A live holder's row is only read: a write transaction per poll and standby would crowd the lock.
        if row is not None and row[0] != self.holder and row[2] > slot.lifecycle.clock():
            self._standby(slot, row[0], row[2] - slot.lifecycle.clock())
            return False
        if not keeper.try_take():
            held = keeper.held_by
            assert held is not None
            self._standby(slot, held.holder, held.expires_in_ms)
            return False
        grant = keeper.grant
        assert grant is not None
        self._report("lease-taken", {"runner": keeper.runner_id, "token": grant.token, "holder": self.holder,
                                     "wait_ms": grant.act_after_ms - grant.taken_ms})
        return True

    def _standby(self, slot: _Slot, holder: str, expires_in_ms: int) -> None:
        if self.no_wait:
            self._report("held", {"runner": slot.keeper.runner_id, "holder": holder, "expires_in_ms": expires_in_ms})
        elif not slot.announced:
            slot.announced = True
            self._report("standby", {"runner": slot.keeper.runner_id, "holder": holder,
                                     "expires_in_ms": expires_in_ms})

    def _serve(self, slot: _Slot) -> None:
        if slot.host is None:
            host = self._make_host(slot.lifecycle, slot.keeper)
            host.driver = FencedDriver(host.driver, slot.keeper)
            slot.host = host
            grant = slot.keeper.grant
            assert grant is not None
            self._report("acting", {"runner": slot.keeper.runner_id, "token": grant.token})
            self._reconcile(slot)
            adopted = sorted(lease_id for lease_id, view in host.units().items() if view.phase == "running")
            if adopted:
                self._report("adopted", {"runner": slot.keeper.runner_id, "leases": adopted})
            return
        head = self.store.head().seq
        if head != slot.seen or time.monotonic() - slot.last >= self.tick:
            self._reconcile(slot)

    def _reconcile(self, slot: _Slot) -> None:
        host = slot.host
        assert host is not None
        started = time.monotonic()
        actions = host.reconcile()
        slot.seen, slot.last = self.store.head().seq, time.monotonic()
        runner = slot.keeper.runner_id
        self._report("reconciled", {"runner": runner, "seconds": slot.last - started,
                                    "units": dict(Counter(view.phase for view in host.units().values())),
                                    "leases": dict(Counter(lease.status for lease in slot.lifecycle.state().leases))})
        for action in actions:
            self._report("action", {"runner": runner, "kind": action.kind, "lease": action.lease_id,
                                    "detail": action.detail, "at": iso_ms(action.at_ms)})

    def _renewed(self, keeper: LeaseKeeper, seconds: float) -> None:
        self._report("renewed", {"runner": keeper.runner_id, "seconds": seconds})

    def _renew_failed(self, keeper: LeaseKeeper, error: Exception) -> None:
        self._report("renew-failed", {"runner": keeper.runner_id, "error": str(error)})


__all__ = ["EXIT_OK", "HostServer", "Report"]
