"""Child mode: a unit is a child of its supervisor, a detached child process of the host.

    units = ChildUnits(stop_timeout_ms=5_000)
    handle = units.start(command, run_dir=run_dir, token=secret, resources=limits)
    units.status(handle)                 # "running", "stopped", "gone" or "unknown"
    units.stop(handle)                   # SIGTERM (relayed), wait, SIGKILL to every descendant
    units.reap(handle)                   # its exit, once it ended

Start: the host spawns the unit's supervisor (`hosts.supervisor`, in a new session) which forks the
unit (its own process group; its own cgroup where cgroup v2 allows), sets its rlimits and execs the
command (`hosts.child_spawn`). The handle names the supervisor (its pid and start ticks): it lives
exactly as long as the unit or anything the unit started, since it is their subreaper and kills what
the unit left behind when the unit ends. The unit gets a minimal environment (the caller's ``env``,
then ``PATH`` = `SAFE_PATH`, ``LANG=C.UTF-8`` and ``HOME`` over it), its token on stdin only, and
``unit.log`` in the run directory for stdout and stderr.

Status of a handle: ``unknown`` when it is not this host's (another host name, another mode, or no
usable pid and start ticks); ``gone`` when it is from another boot, or its supervisor is missing, a
different process (pid reused) or ended without recording the unit's end (killed); ``stopped`` once
its end is known (the supervisor's ``unit.end``, or what this host reaped); ``running`` otherwise.
Callers treat ``stopped`` and ``gone`` alike as not running.

The end survives the host: the supervisor writes ``unit.end`` before it exits, so a host that is not
its parent (restarted, or a new holder) reads how the unit ended as its parent would have
(`read_end`, hostile input: no link, regular, bounded, naming the handle's supervisor and boot).

Stop: SIGTERM to the supervisor, which relays it to the unit's group and every other descendant; wait
up to ``stop_timeout_ms`` for the supervisor to end; then SIGKILL to every descendant of the
supervisor (``setsid`` escapees included: they are re-parented to it, never to init), and wait again.
A pid <= 1 is never signalled, and neither is a pid whose start ticks differ from the handle's.
"""

from __future__ import annotations

import contextlib
import os
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
    pid_alive,
    proc_stat,
    resource_limit_death,
    safe_command,
    safe_env,
    signal_name,
    token_bytes,
)
from .rundir import PID_FILE, UNIT_LOG, WORK_DIR
from .supervisor import END_FILE, kill_descendants

_KILL_WAIT_MS = 5_000
# The supervisor's pid file is four short fields and the argv: a megabyte holds any sane command.
_PID_FILE_LIMIT = 1 << 20


# ``unit.end`` is one line of a few numbers: anything larger is not the supervisor's.
END_LIMIT = 4096
MAX_SIGNAL = 64


class ChildExit(msgspec.Struct, frozen=True, kw_only=True):
    """How a child unit ended: exit code or signal name, CPU used, and whether its limits killed it.

    ``pid`` is the handle's (the supervisor's).
    """

    pid: int
    code: int | None
    signal: str | None
    cpu_ms: int
    resource_limit: bool


class UnitEndRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the supervisor writes to ``unit.end`` (`hosts.supervisor`), as `read_end` checks it."""

    supervisor_pid: int
    start_ticks: int
    boot_id: str
    unit_pid: int
    code: int | None
    signal: int | None
    cpu_ms: int
    cpu_seconds: int
    oom_kill: bool


_END_DECODER = msgspec.json.Decoder(UnitEndRecord)


def read_end(handle: UnitRecord) -> ChildExit | None:
    """How the unit of `handle` ended, from the ``unit.end`` its supervisor wrote; None when there is
    no such record for this very supervisor (its pid, start ticks and boot), or it breaks the rules.

    The file is read as hostile input (`lifecycle_es.files.read_regular`: no link, no FIFO, a regular
    file of at most `END_LIMIT` bytes) and every field is bounded: a record that is not the
    supervisor's says nothing, and its unit's end is unknown (``gone``).
    """
    try:
        end = _END_DECODER.decode(read_regular(Path(handle.run_dir) / END_FILE, limit=END_LIMIT, what=END_FILE))
    except (OSError, msgspec.DecodeError):
        return None
    if (end.supervisor_pid != handle.pid or end.start_ticks != handle.start_ticks or end.boot_id != handle.boot_id
            or (end.code is None) == (end.signal is None) or end.cpu_ms < 0 or end.cpu_seconds < 0):
        return None
    if (end.code is not None and not 0 <= end.code <= 255) or (end.signal is not None
                                                               and not 1 <= end.signal <= MAX_SIGNAL):
        return None
    limited = resource_limit_death(code=end.code, signum=end.signal, cpu_ms=end.cpu_ms, cpu_seconds=end.cpu_seconds)
    return ChildExit(pid=end.supervisor_pid, code=end.code,
                     signal=signal_name(end.signal) if end.signal is not None else None, cpu_ms=end.cpu_ms,
                     resource_limit=limited or end.oom_kill)


class ChildUnits:
    """Start, observe, signal, stop and reap child-mode units of this host.

    `host_name` and `boot_id` default to this machine's; a handle with another host name is never
    touched. `stop_timeout_ms` is how long `stop` waits after SIGTERM; `poll_ms` how often it looks.
    """

    mode = "child"  # as ``UnitStarting`` and every handle of this driver record it

    def __init__(self, *, host_name: str | None = None, boot_id: str | None = None,
                 stop_timeout_ms: int = 30_000, poll_ms: int = 50, cgroup: bool = True) -> None:
        self.host_name = host_name if host_name is not None else socket.gethostname()
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self.stop_timeout_ms = stop_timeout_ms
        self.poll_ms = poll_ms
        self.cgroup = cgroup  # False: never a cgroup per unit, even where cgroup v2 is writable
        # Per (pid, start ticks) of a supervisor: the unit ends known here.
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

        The unit runs in `work_dir` (default ``<run_dir>/work``) under its supervisor (the handle's pid)
        and logs to ``<run_dir>/unit.log``.
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
                         run_dir=run_path, host=self.host_name, boot_id=self.boot_id, env=child_env,
                         log_path=run_path / UNIT_LOG, token=data, cgroup=self.cgroup)
        stat = proc_stat(pid)
        # The supervisor is our unreaped child, so its pid is held and its stat readable, zombie or not.
        if stat is None:
            raise UnitStartError(f"the supervisor {pid} of {argv[0]!r} vanished before its start ticks were read")
        return UnitRecord(mode="child", host=self.host_name, boot_id=self.boot_id, run_dir=str(run_path),
                          pid=pid, start_ticks=stat.start_ticks)

    # --- observe ------------------------------------------------------------------------------------

    def find(self, run_dir: str | os.PathLike[str], command: Sequence[str] | None = None) -> UnitRecord | None:
        """The handle of the unit last started in `run_dir`, from the pid file its supervisor wrote
        before the unit's exec; None when there is none, it cannot be read (a link, a FIFO, too large, not the
        supervisor's shape), or, with `command`, it ran another command. For a host that crashed between
        its intent (UnitStarting) and the outcome: `status` then says whether that unit still runs."""
        try:
            raw = msgspec.json.decode(read_regular(Path(run_dir) / PID_FILE, limit=_PID_FILE_LIMIT, what=PID_FILE))
        except (OSError, msgspec.DecodeError, RecursionError):  # a link, a FIFO, too large: not the supervisor's
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
        """``running``, ``stopped`` (its end known), ``gone`` or ``unknown`` (see the module docstring)."""
        key = self._key(handle)
        if key is None:
            return "unknown"
        if handle.boot_id != self.boot_id:
            return "gone"
        if key in self._exits:
            return "stopped"
        if pid_alive(*key):
            return "running"
        return "stopped" if self._ended(key, handle) is not None else "gone"

    def _ended(self, key: tuple[int, int], handle: UnitRecord) -> ChildExit | None:
        """The unit's end as its supervisor recorded it (remembered once read), or None."""
        ended = self._exits.get(key) or read_end(handle)
        if ended is not None:
            self._exits[key] = ended
        return ended

    # --- signal and stop ----------------------------------------------------------------------------

    def signal(self, handle: UnitRecord, signum: int) -> bool:
        """Send `signum` to the unit; True when it was sent.

        SIGKILL goes to every descendant of the supervisor (`hosts.supervisor.kill_descendants`); any
        other signal to the supervisor, which relays SIGTERM, SIGINT and SIGHUP to the unit. Nothing is
        sent for a handle of another host or boot, a pid <= 1, or a pid that no longer names the
        supervisor (reused, or ended).
        """
        key = self._key(handle)
        if key is None or handle.boot_id != self.boot_id or not pid_alive(*key):
            return False
        if signum == signal.SIGKILL:
            return kill_descendants(key[0]) > 0
        try:
            os.kill(key[0], signum)
        except ProcessLookupError:
            return False
        return True

    def stop(self, handle: UnitRecord, *, timeout_ms: int | None = None) -> tuple[str, ...]:
        """SIGTERM the unit (relayed by its supervisor), wait, SIGKILL every descendant left; return the
        names of the signals sent, ``("SIGTERM", "SIGKILL")`` when the stop escalated.

        ``()`` means nothing was sent: the handle is not this host's, or its supervisor already ended.
        Raises `UnitStopError` if the supervisor is still alive after SIGKILL to everything under it.
        """
        key = self._key(handle)
        if key is None or handle.boot_id != self.boot_id or not pid_alive(*key):
            return ()
        sent: list[str] = []
        if self.signal(handle, signal.SIGTERM):
            sent.append("SIGTERM")
        wait_ms = self.stop_timeout_ms if timeout_ms is None else timeout_ms
        if not self._wait_end(key, wait_ms):
            sent.append("SIGKILL")
            kill_descendants(key[0])
            if not self._wait_end(key, _KILL_WAIT_MS):
                # The supervisor itself does not end (stopped, or stuck): kill it and what is under it.
                kill_descendants(key[0])
                if pid_alive(*key):
                    os.kill(key[0], signal.SIGKILL)
                if not self._wait_end(key, _KILL_WAIT_MS) or kill_descendants(key[0]):
                    raise UnitStopError(f"unit supervisor {key[0]} is still alive after SIGKILL")
        return tuple(sent)

    def _wait_end(self, key: tuple[int, int], wait_ms: int) -> bool:
        """Poll until the supervisor has ended (True) or `wait_ms` passed (False)."""
        deadline = time.monotonic() + wait_ms / 1000
        while pid_alive(*key):
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_ms / 1000)
        return True

    # --- reap ---------------------------------------------------------------------------------------

    def reap(self, handle: UnitRecord, *, timeout_ms: int = 0) -> ChildExit | None:
        """How the unit ended, once it did; None while it runs or when its end is unknown.

        Collects the supervisor when this host is its parent (no zombie is left), then reads its
        ``unit.end`` (`read_end`): a host that is not the parent learns the same end. Waits up to
        `timeout_ms` for the end (0: look once). Returns the same ChildExit on every later call; None
        for a handle of another host or boot, or a supervisor that ended without a record.
        """
        key = self._key(handle)
        if key is None or handle.boot_id != self.boot_id:
            return None
        if key in self._exits:
            self._collect(key)
            return self._exits[key]
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._collect(key)
            if not pid_alive(*key):
                return self._ended(key, handle)
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_ms / 1000)

    @staticmethod
    def _collect(key: tuple[int, int]) -> None:
        """Reap the supervisor if it is this host's ended child (its zombie still names it)."""
        stat = proc_stat(key[0])
        if stat is None or stat.start_ticks != key[1] or not stat.dead:
            return
        # An unreaped child's pid cannot be reused, so a matching stat means wait4 names this supervisor.
        with contextlib.suppress(ChildProcessError):
            os.wait4(key[0], os.WNOHANG)

    # --- as the host drives it (hosts.driver.UnitDriver) ---------------------------------------------

    def plan(self, lease_id: str, run_dir: Path) -> None:
        """None: a child's handle (its pid) exists only once it runs."""
        return None

    def start_unit(self, command: Sequence[str], *, lease_id: str, run_dir: Path, token: str | bytes | None,
                   resources: Resources, env: Mapping[str, str], planned: UnitRecord | None) -> UnitRecord:
        """`start` in the lease's run directory; `lease_id` and `planned` (always None) are not needed."""
        return self.start(command, run_dir=run_dir, token=token, resources=resources, env=env)

    def observe(self, handle: UnitRecord) -> str:
        """`status` after `reap`: a unit that ended is ``stopped`` and its supervisor collected."""
        self.reap(handle)
        return self.status(handle)

    def exit(self, handle: UnitRecord) -> ChildExit | None:
        """How the unit ended, as `reap` learns it (looking once), or None."""
        return self.reap(handle)

    def find_started(self, run_dir: Path, *, lease_id: str, lease_generation: int, unit: str | None,
                     command: tuple[str, ...]) -> UnitRecord | None:
        """The unit whose supervisor wrote its pid file in `run_dir` for the intent's `command` (`find`)."""
        return self.find(run_dir, command)

    def discard(self, handle: UnitRecord) -> None:
        """Stop the unit and reap it, waiting up to the stop timeout for its end."""
        self.stop(handle)
        self.reap(handle, timeout_ms=self.stop_timeout_ms)
