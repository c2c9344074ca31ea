"""Holding a runner's host lease for a driver: taken, renewed every ttl/3, and a local deadline that only shortens it.

    keeper = LeaseKeeper(lifecycle, holder=holder_name(), ttl_ms=15_000)
    if keeper.try_take():                       # False while another live driver holds it (a standby)
        host = LocalHost(lifecycle, ...)
        host.driver = FencedDriver(host.driver, keeper)   # no side effect once the local deadline passed
        renewer = LeaseRenewer(store_path, [keeper])      # its own connection and thread
        ...
        keeper.check()                          # HostFencedError: stop acting, exit 75

The store decides the lease (`lifecycle_es.host_lease`): its row, its token and its expiry by the
store's clock, checked in every write. The driver's own clock can only make it give up sooner: the
local deadline is the time *before* the last successful take or renewal was asked for, plus the ttl,
read from ``CLOCK_BOOTTIME`` (monotonic, and counting a suspended machine or a stopped process alike).
Since the store stamped that renewal no earlier, the local deadline falls no later than the store's
expiry: a driver that checks it before every side effect (`FencedDriver`) has stopped acting by the
time a standby may take over, which waits the expiry plus a grace on top (``act_after_ms``).

Renewal runs on its own thread and connection (`LeaseRenewer`), so a reconcile that waits on a slow
stop never lets the lease lapse. A renewal refused by the store (another holder's token, or expired)
fences the keeper at once; one that fails otherwise (a busy store) is retried until the local deadline.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lifecycle_es.errors import HostFencedError, HostLeaseHeldError, StoreError
from lifecycle_es.events import UnitRecord
from lifecycle_es.host_lease import DEFAULT_HOST_LEASE_GRACE_MS, DEFAULT_HOST_LEASE_TTL_MS, HostLeaseGrant
from lifecycle_es.lifecycle import RunnerLifecycle
from lifecycle_es.store import EventStore
from lifecycle_es.values import Resources

from .driver import UnitDriver, UnitEnd
from .proc import current_boot_id


def boottime() -> float:
    """Seconds on ``CLOCK_BOOTTIME``: monotonic, and it keeps counting while the machine is suspended."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def holder_name(host: str | None = None, boot_id: str | None = None, instance: str | None = None) -> str:
    """``<host name>/<boot id>/<instance id>``: who holds a host lease (a fresh random instance id by default)."""
    host = host if host is not None else socket.gethostname()
    boot_id = boot_id if boot_id is not None else current_boot_id()
    instance = instance if instance is not None else uuid.uuid4().hex[:12]
    return f"{host}/{boot_id}/{instance}"


class LeaseKeeper:
    """One runner's host lease as a driver holds it (see the module): thread-safe, read by the serving loop."""

    def __init__(self, lifecycle: RunnerLifecycle, *, holder: str, ttl_ms: int = DEFAULT_HOST_LEASE_TTL_MS,
                 grace_ms: int = DEFAULT_HOST_LEASE_GRACE_MS, clock: Callable[[], float] = boottime) -> None:
        self.lifecycle = lifecycle
        self.holder = holder
        self.ttl_ms = ttl_ms
        self.grace_ms = grace_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._grant: HostLeaseGrant | None = None
        self._deadline = 0.0  # local: no side effect at or after it
        self._renewed = 0.0  # local time the last successful take or renewal was asked for
        self._ready = 0.0  # local time units may first be touched
        self._fence: HostFencedError | None = None
        self.held_by: HostLeaseHeldError | None = None
        self.fences = 0

    def __repr__(self) -> str:
        grant = self._grant
        what = f"token {grant.token}, {self.seconds_left():.1f} s left" if grant else "standby"
        return f"LeaseKeeper({self.lifecycle.runner_id!r}, {self.holder}, {what})"

    @property
    def runner_id(self) -> str:
        """The runner this lease is of."""
        return self.lifecycle.runner_id

    @property
    def grant(self) -> HostLeaseGrant | None:
        """The lease as last taken or renewed, or None (never taken: a standby)."""
        return self._grant

    def try_take(self) -> bool:
        """Take the lease; False (and `held_by` says by whom) while another live driver holds it."""
        asked = self._clock()
        try:
            grant = self.lifecycle.take_host_lease(holder=self.holder, ttl_ms=self.ttl_ms, grace_ms=self.grace_ms)
        except HostLeaseHeldError as held:
            self.held_by = held
            return False
        taken = self._clock()
        with self._lock:
            self._grant, self._fence, self.held_by = grant, None, None
            self._renewed, self._deadline = asked, asked + grant.ttl_ms / 1000
            # The wait is counted from after the take returned: never shorter than the store's.
            self._ready = taken + (grant.act_after_ms - grant.taken_ms) / 1000
        return True

    def renew_due(self) -> bool:
        """Whether a third of the ttl passed since the last renewal was asked for."""
        return self._grant is not None and self._fence is None and (
            self._clock() >= self._renewed + self.ttl_ms / 3000)

    def renew(self, via: RunnerLifecycle) -> None:
        """Renew through `via` (a handle of the renewing connection); HostFencedError fences the keeper."""
        grant = self._grant
        if grant is None or self._fence is not None:
            return
        asked = self._clock()
        try:
            renewed = via.renew_host_lease(grant)
        except HostFencedError as fenced:
            self.fence(fenced)
            raise
        with self._lock:
            if self._fence is None and self._grant is not None and self._grant.token == renewed.token:
                self._grant, self._renewed, self._deadline = renewed, asked, asked + renewed.ttl_ms / 1000

    def fence(self, error: HostFencedError) -> None:
        """Stop acting under this lease for good (the store refused it, or the local deadline passed)."""
        with self._lock:
            if self._fence is None:
                self._fence = error
                self.fences += 1

    def seconds_left(self) -> float:
        """Seconds until the local deadline (0 once past it, or when not held)."""
        if self._grant is None or self._fence is not None:
            return 0.0
        return max(0.0, self._deadline - self._clock())

    def overdue(self, seconds: float) -> HostFencedError | None:
        """The fence for a lease held, not yet fenced, whose local deadline passed more than `seconds` ago,
        or None. The serving loop fences a lease at its next turn after the deadline; one still unfenced so
        long after it means the loop is stuck (a read that never returns: the server cut off)."""
        grant = self._grant
        if grant is None or self._fence is not None:
            return None
        late = self._clock() - self._deadline
        if late <= seconds:
            return None
        return HostFencedError(self.runner_id, self.holder, grant.token,
                               f"not renewed by its local deadline ({late * 1000:.0f} ms ago), and the serving "
                               "loop is stuck (the store does not answer)")

    def ready(self) -> bool:
        """Whether units may be touched: held, and the previous holder's expiry plus the grace passed."""
        return self._grant is not None and self._clock() >= self._ready

    def check(self) -> None:
        """HostFencedError when this driver must not act: fenced, or its local deadline passed."""
        if self._fence is not None:
            raise self._fence
        grant = self._grant
        if grant is None:
            raise HostFencedError(self.runner_id, self.holder, 0, "this driver never took the lease")
        late = self._clock() - self._deadline
        if late >= 0:
            self.fence(HostFencedError(self.runner_id, self.holder, grant.token,
                                       f"not renewed by its local deadline ({late * 1000:.0f} ms ago)"))
            raise self._fence  # type: ignore[misc]  # set just above

    def release(self) -> None:
        """Let the lease go after the driver stopped acting (a standby takes it at once); errors are ignored."""
        grant = self._grant
        if grant is not None and self._fence is None:
            with contextlib.suppress(StoreError):  # it lapses by itself at its expiry
                self.lifecycle.release_host_lease(grant)


class FencedDriver:
    """A `UnitDriver` whose side effects (start, signal, stop, discard) first check the host lease."""

    def __init__(self, driver: UnitDriver, keeper: LeaseKeeper) -> None:
        self._driver = driver
        self._keeper = keeper

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver, name)

    @property
    def mode(self) -> str:
        """The wrapped driver's mode."""
        return self._driver.mode

    def plan(self, lease_id: str, run_dir: Path) -> UnitRecord | None:
        """As the wrapped driver."""
        return self._driver.plan(lease_id, run_dir)

    def start_unit(self, command: Sequence[str], *, lease_id: str, run_dir: Path, token: str | bytes | None,
                   resources: Resources, env: Mapping[str, str], planned: UnitRecord | None) -> UnitRecord:
        """Start the unit, unless the lease must no longer be acted under (HostFencedError)."""
        self._keeper.check()
        return self._driver.start_unit(command, lease_id=lease_id, run_dir=run_dir, token=token,
                                       resources=resources, env=env, planned=planned)

    def status(self, handle: UnitRecord) -> str:
        """As the wrapped driver (looking is no side effect)."""
        return self._driver.status(handle)

    def observe(self, handle: UnitRecord) -> str:
        """As the wrapped driver."""
        return self._driver.observe(handle)

    def exit(self, handle: UnitRecord) -> UnitEnd | None:
        """As the wrapped driver."""
        return self._driver.exit(handle)

    def find_started(self, run_dir: Path, *, lease_id: str, lease_generation: int, unit: str | None,
                     command: tuple[str, ...]) -> UnitRecord | None:
        """As the wrapped driver."""
        return self._driver.find_started(run_dir, lease_id=lease_id, lease_generation=lease_generation, unit=unit,
                                         command=command)

    def signal(self, handle: UnitRecord, signum: int) -> bool:
        """Signal the unit, unless the lease must no longer be acted under."""
        self._keeper.check()
        return self._driver.signal(handle, signum)

    def stop(self, handle: UnitRecord) -> object:
        """Stop the unit, unless the lease must no longer be acted under."""
        self._keeper.check()
        return self._driver.stop(handle)

    def discard(self, handle: UnitRecord) -> None:
        """Stop a unit just started that the host will not keep: always (it is this host's own, just made)."""
        self._driver.discard(handle)


class LeaseRenewer:
    """Renews keepers' leases every ttl/3 on its own thread and its own connection to the store."""

    def __init__(self, store_path: str | os.PathLike[str], keepers: Sequence[LeaseKeeper], *,
                 on_error: Callable[[LeaseKeeper, Exception], None] | None = None,
                 on_renewed: Callable[[LeaseKeeper, float], None] | None = None) -> None:
        self._path = store_path
        self._keepers = list(keepers)
        self._on_error = on_error
        self._on_renewed = on_renewed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-lease-renewer", daemon=True)

    def start(self) -> LeaseRenewer:
        """Start renewing."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop renewing (the leases then lapse at their expiry unless released)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        interval = min(keeper.ttl_ms for keeper in self._keepers) / 12000 if self._keepers else 1.0
        with EventStore.open(self._path) as store:
            handles: dict[str, RunnerLifecycle] = {}
            while not self._stop.wait(interval):
                for keeper in self._keepers:
                    if not keeper.renew_due():
                        continue
                    mine = keeper.lifecycle
                    via = handles.get(keeper.runner_id)
                    if via is None:
                        via = handles[keeper.runner_id] = RunnerLifecycle(
                            store, runner_id=mine.runner_id, target=mine.target, base_dir=mine.base_dir,
                            resources=mine.resources, post_session_hook_digest=mine.post_session_hook_digest,
                            now=mine.clock)
                    began = time.monotonic()
                    try:
                        keeper.renew(via)
                    except StoreError as exc:  # fenced: the keeper knows; busy: retried, the deadline decides
                        if self._on_error is not None:
                            self._on_error(keeper, exc)
                        continue
                    if self._on_renewed is not None:
                        self._on_renewed(keeper, time.monotonic() - began)


__all__ = ["FencedDriver", "LeaseKeeper", "LeaseRenewer", "boottime", "holder_name"]
