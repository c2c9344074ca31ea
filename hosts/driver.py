"""`UnitDriver`: what the local host and its reconcile pass need of a mode's units, and nothing more.

    driver: UnitDriver = ChildUnits.for_host(DriverOptions(stop_timeout_ms=5_000))   # or SystemdUnits
    planned = driver.plan(lease_id, run_dir)        # the handle, when the mode knows it before the start
    handle = driver.start_unit(command, lease_id=lease_id, run_dir=run_dir, token=secret,
                               resources=limits, env={}, planned=planned)
    driver.observe(handle)                          # "running", "stopped", "failed", "gone" or "unknown"
    driver.exit(handle)                             # how it ended (a `UnitEnd`), once it did

`hosts.local.LocalHost` and `hosts.reconcile.Reconciler` speak to a driver only through this protocol:
they never ask which mode they run, so everything a mode does its own way lives in its driver.
`hosts.child.ChildUnits` runs a unit as a detached child process; `hosts.systemd.SystemdUnits` as a
transient systemd service. Where they differ:

- **The handle before the start.** A systemd unit's name is chosen first, so `plan` returns the
  handle it will have: the host records the name in ``UnitStarting`` and proves the handle before
  ``systemd-run``, so a host that dies during the start still adopts the unit. A child's pid exists
  only once it runs: `plan` returns None, and the host proves the handle `start_unit` returns.
- **Observing.** The host is a child unit's parent, so `observe` collects the exit of one that ended
  before it reports it (``stopped``; a zombie would read ``gone``); systemd keeps its units' ends
  itself. `status` looks without collecting anything.
- **Finding a unit after a crash.** `find_started`: a child by the pid file its supervisor wrote; a
  systemd unit by the proof written before ``systemd-run``, naming the intent's unit and command.
- **A unit the host may not keep** (its proof could not be written): `discard` stops it, and a child
  is also reaped.

Every method takes the handle as recorded (`lifecycle_es.events.UnitRecord`); a handle of another mode,
host or boot is never touched (``unknown`` or ``gone``, nothing signalled). Each driver class builds
itself from the host's `DriverOptions` (``for_host``); `hosts.local.MODES` names them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lifecycle_es.events import UNIT_SIGNALS_SENT, UnitRecord
from lifecycle_es.values import Resources

from .proc import Exec
from .systemd_run import Scope


class UnitEnd(Protocol):
    """How a unit's main process ended: exit code or signal name, and whether its limits killed it."""

    @property
    def code(self) -> int | None:
        """The exit code, or None when a signal ended it."""

    @property
    def signal(self) -> str | None:
        """The name of the signal that ended it (``SIGKILL``), or None when it exited."""

    @property
    def resource_limit(self) -> bool:
        """Whether this reads as a death by the unit's limits (its lease parks ``resource-limit``)."""


class UnitDriver(Protocol):
    """The units of one mode on this machine, as the host drives them (see the module)."""

    @property
    def mode(self) -> str:
        """The mode name, as ``UnitStarting`` and every handle of this driver record it."""

    def plan(self, lease_id: str, run_dir: Path) -> UnitRecord | None:
        """The handle of the lease's next unit when it is known before the start (then `start_unit`
        returns it), or None."""

    def start_unit(self, command: Sequence[str], *, lease_id: str, run_dir: Path, token: str | bytes | None,
                   resources: Resources, env: Mapping[str, str], planned: UnitRecord | None) -> UnitRecord:
        """Start the lease's unit (`planned`: what `plan` returned) with `token` on stdin; its handle.

        Raises UnitStartError when it cannot be started; nothing is left running then.
        """

    def status(self, handle: UnitRecord) -> str:
        """``running``, ``stopped``, ``failed``, ``gone`` or ``unknown``, changing nothing."""

    def observe(self, handle: UnitRecord) -> str:
        """The status after collecting what the unit's end left to collect (see the module)."""

    def exit(self, handle: UnitRecord) -> UnitEnd | None:
        """How the unit last ended, or None when that is not known (it runs, or nothing says)."""

    def find_started(self, run_dir: Path, *, lease_id: str, lease_generation: int, unit: str | None,
                     command: tuple[str, ...]) -> UnitRecord | None:
        """The unit an intent (``UnitStarting``) without an outcome started in `run_dir`, or None."""

    def signal(self, handle: UnitRecord, signum: int) -> bool:
        """Send `signum` to every process of the unit; True when it was sent."""

    def stop(self, handle: UnitRecord) -> object:
        """Stop the unit and everything it started (SIGTERM, wait, SIGKILL). Raises UnitStopError when
        something of it is still alive after that. A driver that sends the signals itself returns their
        names (``("SIGTERM", "SIGKILL")`` for a stop that escalated: `sent_signals` reads it, and
        ``UnitStopped.signals`` records it); systemd sends its own and says nothing (None)."""

    def discard(self, handle: UnitRecord) -> None:
        """Stop a unit just started that the host will not keep, and collect its end."""


@dataclass(frozen=True, kw_only=True)
class DriverOptions:
    """What `hosts.local.LocalHost` is told about its units; each mode's factory takes what it uses.

    Both modes: `stop_timeout_ms`. Systemd only: `scope`, `user`, `group`, `exec` (None: run the
    commands directly), `now` (epoch ms, for unit names) and `token_dir` (None: the default).
    """

    stop_timeout_ms: int = 30_000
    scope: Scope = "system"
    user: str | None = None
    group: str | None = None
    exec: Exec | None = None
    now: Callable[[], int] | None = None
    token_dir: str | None = None


def sent_signals(stopped: object) -> tuple[str, ...]:
    """The signals a driver's `stop` says it sent, as ``UnitStopped.signals`` records them (``()`` when
    it does not say: systemd sends its own)."""
    if isinstance(stopped, tuple) and all(sig in UNIT_SIGNALS_SENT for sig in stopped):
        return stopped
    return ()


__all__ = ["DriverOptions", "UnitDriver", "UnitEnd", "sent_signals"]
