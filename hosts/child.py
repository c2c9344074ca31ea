"""Child mode: a unit is a detached child process of the host, in its own session and process group.

    units = ChildUnits(stop_timeout_ms=5_000)
    handle = units.start(command, run_dir=run_dir, token=secret, resources=limits)
    units.status(handle)                 # "running", "stopped", "gone" or "unknown"
    units.stop(handle)                   # SIGTERM the group, wait, SIGKILL
    units.reap(handle)                   # its exit, once it ended

Start: a wrapper spawned with ``setsid`` sets the unit's rlimits and execs the command (same pid, same
start ticks, so the handle names the unit itself); the unit gets a minimal environment (the caller's
``env``, then ``PATH`` = `SAFE_PATH`, ``LANG=C.UTF-8`` and ``HOME`` over it), its token on stdin only,
and ``unit.log`` in the run directory for stdout and stderr. The wrapper writes ``unit.pid`` in the run
directory before the exec: `find` reads it back, the safe way and only for the intent's command, for a
host that crashed before it recorded the start. How, and why so: `hosts.child_spawn`.

Status of a handle: ``unknown`` when it is not this host's (another host name, another mode, or no
usable pid and start ticks); ``gone`` when it is from another boot, or its process is missing, a
zombie (dead, not reaped yet) or a different process (pid reused); ``stopped`` once this host reaped
it (`reap` recorded its exit); ``running`` otherwise. Callers treat ``stopped`` and ``gone`` alike as
not running.

Stop: SIGTERM to the group, wait up to ``stop_timeout_ms`` until neither the unit nor any other
member of its group is alive, then SIGKILL to the group. A pid <= 1 is never signalled, and neither is
a pid whose start ticks differ from the handle's (a reused pid). The group is signalled only while the
unit's own pid is still held (running, or a zombie this host has not reaped), so the group id cannot
name someone else's group.

Reaping: the host is the unit's parent, so a dead unit stays a zombie until `reap` collects its exit
(``os.wait4`` with WNOHANG): code or signal, CPU used, and whether it reads as a death by its limits
(`hosts.proc.resource_limit_death`). A host with SIGCHLD ignored has its children reaped by the kernel
and learns no exit status.

Weakness of child mode (systemd mode has none of it): a process that leaves the group (``setsid``,
``setpgid``) escapes the stop; a unit whose host restarted is no longer its child, so its exit status
is lost (it shows as ``gone``).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from lifecycle_es.errors import InvalidInputError
from lifecycle_es.events import UnitRecord
from lifecycle_es.files import read_regular
from lifecycle_es.values import Resources

from .child_spawn import spawn_unit
from .driver import DriverOptions
from .proc import (
    SAFE_PATH,
    UnitStartError,
    UnitStopError,
    current_boot_id,
    group_members,
    pid_alive,
    proc_stat,
    resource_limit_death,
    safe_command,
    safe_env,
    signal_name,
    token_bytes,
)
from .rundir import PID_FILE, UNIT_LOG, WORK_DIR

_KILL_WAIT_MS = 5_000
# The wrapper's pid file is four short fields and the argv: a megabyte holds any sane command.
_PID_FILE_LIMIT = 1 << 20


class ChildExit(msgspec.Struct, frozen=True, kw_only=True):
    """How a child unit ended: exit code or signal name, CPU used, and whether its limits killed it."""

    pid: int
    code: int | None
    signal: str | None
    cpu_ms: int
    resource_limit: bool


class ChildUnits:
    """Start, observe, signal, stop and reap child-mode units of this host.

    `host_name` and `boot_id` default to this machine's; a handle with another host name is never
    touched. `stop_timeout_ms` is how long `stop` waits after SIGTERM; `poll_ms` how often it looks.
    """

    mode = "child"  # as ``UnitStarting`` and every handle of this driver record it

    def __init__(self, *, host_name: str | None = None, boot_id: str | None = None,
                 stop_timeout_ms: int = 30_000, poll_ms: int = 50) -> None:
        self.host_name = host_name if host_name is not None else socket.gethostname()
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self.stop_timeout_ms = stop_timeout_ms
        self.poll_ms = poll_ms
        # Per (pid, start ticks): the CPU limit of units this object started, and the exits it reaped.
        self._cpu_limits: dict[tuple[int, int], int] = {}
        self._exits: dict[tuple[int, int], ChildExit] = {}

    @classmethod
    def for_host(cls, options: DriverOptions) -> ChildUnits:
        """The driver `hosts.local.LocalHost` runs in child mode: of its options, only the stop timeout applies."""
        return cls(stop_timeout_ms=options.stop_timeout_ms)

    def __repr__(self) -> str:
        return f"<ChildUnits host={self.host_name!r} reaped={len(self._exits)}>"

    # --- start --------------------------------------------------------------------------------------

    def start(self, command: Sequence[str], *, run_dir: str | os.PathLike[str], token: str | bytes | None,
              resources: Resources | Mapping[str, int], env: Mapping[str, str] | None = None,
              work_dir: str | os.PathLike[str] | None = None) -> UnitRecord:
        """Start `command` as a detached unit and hand it `token` on stdin; return its handle.

        The unit runs in `work_dir` (default ``<run_dir>/work``) and logs to ``<run_dir>/unit.log``.
        Raises `InvalidInputError` for a bad argument and `UnitStartError` when the command cannot be
        run (nothing is left running then).
        """
        argv = safe_command(command)
        # No token: the unit's stdin is empty (EOF at once), as for a unit restarted by a host that never held it.
        data = token_bytes(token) if token is not None else b""
        limits = Resources.coerce(resources)
        run_path = Path(run_dir)
        cwd = Path(work_dir) if work_dir is not None else run_path / WORK_DIR
        if not run_path.is_absolute() or not cwd.is_absolute():
            raise InvalidInputError("run_dir", "run_dir and work_dir must be absolute paths")
        child_env = {**safe_env(env), "PATH": SAFE_PATH, "LANG": "C.UTF-8",
                     "HOME": os.environ.get("HOME", "/")}
        pid = spawn_unit(argv, cpu_seconds=limits.cpu_seconds, memory_bytes=limits.memory_bytes, work_dir=cwd,
                         pid_file=run_path / PID_FILE, host=self.host_name, boot_id=self.boot_id, env=child_env,
                         log_path=run_path / UNIT_LOG, token=data)
        stat = proc_stat(pid)
        # The unit is our unreaped child, so its pid is held and its stat readable, zombie or not.
        if stat is None:
            raise UnitStartError(f"child {pid} of {argv[0]!r} vanished before its start ticks were read")
        self._cpu_limits[(pid, stat.start_ticks)] = limits.cpu_seconds
        return UnitRecord(mode="child", host=self.host_name, boot_id=self.boot_id, run_dir=str(run_path),
                          pid=pid, start_ticks=stat.start_ticks)

    # --- observe ------------------------------------------------------------------------------------

    def find(self, run_dir: str | os.PathLike[str], command: Sequence[str] | None = None) -> UnitRecord | None:
        """The handle of the unit last started in `run_dir`, from the pid file its wrapper wrote before
        the exec; None when there is none, it cannot be read (a link, a FIFO, too large, not the
        wrapper's shape), or, with `command`, it ran another command. For a host that crashed between
        its intent (UnitStarting) and the outcome: `status` then says whether that unit still runs."""
        try:
            raw = msgspec.json.decode(read_regular(Path(run_dir) / PID_FILE, limit=_PID_FILE_LIMIT, what=PID_FILE))
        except (OSError, msgspec.DecodeError, RecursionError):  # a link, a FIFO, too large: not the wrapper's
            return None
        if not isinstance(raw, dict):
            return None
        pid, ticks, boot, host = (raw.get(k) for k in ("pid", "start_ticks", "boot_id", "host"))
        if type(pid) is not int or type(ticks) is not int or not isinstance(boot, str) or not isinstance(host, str):
            return None
        if command is not None and raw.get("argv") != list(command):
            return None
        return UnitRecord(mode="child", host=host, boot_id=boot, run_dir=str(run_dir), pid=pid, start_ticks=ticks)

    def _key(self, handle: UnitRecord) -> tuple[int, int] | None:
        """(pid, start ticks) of a child handle of this host, or None when the handle is not usable."""
        if handle.mode != "child" or handle.host != self.host_name:
            return None
        pid, ticks = handle.pid, handle.start_ticks
        if type(pid) is not int or pid <= 1 or type(ticks) is not int:
            return None
        return pid, ticks

    def _held(self, key: tuple[int, int]) -> bool:
        """Whether the handle's pid still names its process, running or an unreaped zombie."""
        stat = proc_stat(key[0])
        return stat is not None and stat.start_ticks == key[1]

    def status(self, handle: UnitRecord) -> str:
        """``running``, ``stopped`` (reaped here), ``gone`` or ``unknown`` (see the module docstring)."""
        key = self._key(handle)
        if key is None:
            return "unknown"
        if handle.boot_id != self.boot_id:
            return "gone"
        if key in self._exits:
            return "stopped"
        return "running" if pid_alive(*key) else "gone"

    def _group_live(self, key: tuple[int, int]) -> bool:
        """Whether the unit or another live member of its process group is still there."""
        return pid_alive(*key) or bool(group_members(key[0]))

    # --- signal and stop ----------------------------------------------------------------------------

    def signal(self, handle: UnitRecord, signum: int) -> bool:
        """Send `signum` to the unit's process group; True when it was sent.

        Nothing is sent for a handle of another host or boot, a pid <= 1, or a pid that no longer
        names the unit (reused, or reaped).
        """
        key = self._key(handle)
        if key is None or handle.boot_id != self.boot_id or not self._held(key):
            return False
        try:
            os.killpg(key[0], signum)
        except ProcessLookupError:
            return False  # a zombie leader with no live member left: nothing to signal
        return True

    def stop(self, handle: UnitRecord, *, timeout_ms: int | None = None) -> tuple[str, ...]:
        """SIGTERM the unit's group, wait, SIGKILL what is left; return the names of signals sent.

        ``()`` means nothing was sent: the handle is not this host's, or nothing of it is alive. Raises
        `UnitStopError` if something of the group is still alive after SIGKILL.
        """
        key = self._key(handle)
        if key is None or handle.boot_id != self.boot_id or not self._held(key):
            return ()
        if not self._group_live(key):
            return ()
        sent: list[str] = []
        if self.signal(handle, signal.SIGTERM):
            sent.append("SIGTERM")
        wait_ms = self.stop_timeout_ms if timeout_ms is None else timeout_ms
        if not self._wait_group(key, wait_ms):
            # Checked again inside signal(): the pid must still be held before the group is named.
            if self.signal(handle, signal.SIGKILL):
                sent.append("SIGKILL")
            if not self._wait_group(key, _KILL_WAIT_MS):
                raise UnitStopError(f"unit {key[0]} (group {key[0]}) is still alive after SIGKILL")
        return tuple(sent)

    def _wait_group(self, key: tuple[int, int], wait_ms: int) -> bool:
        """Poll until nothing of the group is alive (True) or `wait_ms` passed (False)."""
        deadline = time.monotonic() + wait_ms / 1000
        while self._held(key) and self._group_live(key):
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_ms / 1000)
        return True

    # --- reap ---------------------------------------------------------------------------------------

    def reap(self, handle: UnitRecord, *, timeout_ms: int = 0) -> ChildExit | None:
        """Collect the exit of a dead unit this host is the parent of; None while it runs.

        Waits up to `timeout_ms` for it to end (0: look once). Returns the same ChildExit on every
        later call; None for a handle that is not this host's child (another host, boot, or process).
        """
        key = self._key(handle)
        if key is None or handle.boot_id != self.boot_id:
            return None
        if key in self._exits:
            return self._exits[key]
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            # An unreaped child's pid cannot be reused, so a matching stat means wait4 names this unit.
            if not self._held(key):
                return None
            try:
                pid, status, usage = os.wait4(key[0], os.WNOHANG)
            except ChildProcessError:
                return None  # not our child (the host restarted, or another waiter took it)
            if pid != 0:
                return self._record_exit(key, status, usage)
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_ms / 1000)

    def _record_exit(self, key: tuple[int, int], status: int, usage: resource.struct_rusage) -> ChildExit:
        """Turn a wait status into a ChildExit and remember it for `status` and later `reap` calls."""
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        cpu_ms = int((usage.ru_utime + usage.ru_stime) * 1000)
        exit_ = ChildExit(
            pid=key[0], code=code, signal=signal_name(signum) if signum is not None else None, cpu_ms=cpu_ms,
            resource_limit=resource_limit_death(code=code, signum=signum, cpu_ms=cpu_ms,
                                                cpu_seconds=self._cpu_limits.get(key)),
        )
        self._exits[key] = exit_
        return exit_

    # --- as the host drives it (hosts.driver.UnitDriver) ---------------------------------------------

    def plan(self, lease_id: str, run_dir: Path) -> None:
        """None: a child's handle (its pid) exists only once it runs."""
        return None

    def start_unit(self, command: Sequence[str], *, lease_id: str, run_dir: Path, token: str | bytes | None,
                   resources: Resources, env: Mapping[str, str], planned: UnitRecord | None) -> UnitRecord:
        """`start` in the lease's run directory; `lease_id` and `planned` (always None) are not needed."""
        return self.start(command, run_dir=run_dir, token=token, resources=resources, env=env)

    def observe(self, handle: UnitRecord) -> str:
        """`status` after `reap`: a unit that ended is ``stopped`` (collected here), not a zombie read ``gone``."""
        self.reap(handle)
        return self.status(handle)

    def exit(self, handle: UnitRecord) -> ChildExit | None:
        """How the unit ended, as `reap` collected it (looking once), or None."""
        return self.reap(handle)

    def find_started(self, run_dir: Path, *, lease_id: str, lease_generation: int, unit: str | None,
                     command: tuple[str, ...]) -> UnitRecord | None:
        """The unit whose wrapper wrote its pid file in `run_dir` for the intent's `command` (`find`)."""
        return self.find(run_dir, command)

    def discard(self, handle: UnitRecord) -> None:
        """Stop the unit and reap it, waiting up to the stop timeout for its end."""
        self.stop(handle)
        self.reap(handle, timeout_ms=self.stop_timeout_ms)
