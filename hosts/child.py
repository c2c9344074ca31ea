"""Child mode: a unit is a detached child process of the host, in its own session and process group.

Start: the host spawns a tiny wrapper (this interpreter, isolated: ``-I -S``) with ``setsid``, a
minimal environment (the caller's ``env``, then ``PATH`` = `SAFE_PATH`, ``LANG=C.UTF-8`` and ``HOME``
over it), stdin a pipe, stdout and stderr appended to the run directory's ``unit.log`` (0600). The
wrapper writes ``unit.pid`` in the run directory (pid, start ticks, boot id, host and argv: `find`
reads it back, the safe way and only for the intent's command, for a host that crashed before it
recorded the start), sets the rlimits (``RLIMIT_CPU`` soft ``cpu_seconds``, hard one more;
``RLIMIT_AS`` ``memory_bytes``; ``RLIMIT_CORE`` 0, so a SIGXCPU death writes no core into the work
dir), changes into the work directory and execs the command: same pid,
same start ticks, so the handle names the unit itself. The wrapper reports a failed exec through a
close-on-exec pipe, so a command that cannot run fails `start` rather than leaving a handle to a dead
process. The wrapper, not ``preexec_fn``, sets the limits because ``preexec_fn`` is not safe in a host
that runs threads.

The token is written to the stdin pipe, which is then closed: the unit reads it to EOF. It is never
in argv, the environment or a file.

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

import contextlib
import fcntl
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from stat import S_ISREG

import msgspec

from lifecycle_es.errors import InvalidInputError
from lifecycle_es.events import UnitRecord
from lifecycle_es.files import read_regular
from lifecycle_es.values import Resources

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

# The wrapper runs between spawn and exec. argv: cpu seconds, memory bytes, work dir, pid file, host,
# boot id, command... fd 3 is the error pipe: made close-on-exec here, so a successful exec closes it
# (EOF in the host). The pid file is written before the exec, so a host that dies right after the
# spawn still finds its unit.
_WRAPPER = """\
import json, os, resource, sys
def lower(kind, soft, hard):
    old_soft, old_hard = resource.getrlimit(kind)
    if old_hard != resource.RLIM_INFINITY:
        hard = min(hard, old_hard)
    resource.setrlimit(kind, (min(soft, hard), hard))
stage = "setup"
try:
    os.set_inheritable(3, False)
    cpu, mem, cwd, pid_file, host, boot_id = sys.argv[1:7]
    argv = sys.argv[7:]
    stage = "pid file"
    with open("/proc/self/stat", "rb") as f:
        ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
    record = {"pid": os.getpid(), "start_ticks": ticks, "boot_id": boot_id, "host": host, "argv": argv}
    fd = os.open(pid_file + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.write(fd, json.dumps(record).encode())
    os.close(fd)
    os.replace(pid_file + ".tmp", pid_file)
    stage = "rlimit"
    lower(resource.RLIMIT_CORE, 0, 0)
    lower(resource.RLIMIT_CPU, int(cpu), int(cpu) + 1)
    lower(resource.RLIMIT_AS, int(mem), int(mem))
    stage = "chdir"
    os.chdir(cwd)
    stage = "exec"
    os.execvp(argv[0], argv)
except OSError as exc:
    if stage in ("rlimit", "chdir", "exec"):
        try:
            os.unlink(pid_file)
        except OSError:
            pass
    os.write(3, ("%s: %s" % (stage, exc.strerror)).encode())
    os._exit(127)
"""
# Descriptors handed to posix_spawn are moved at or above this, so no dup2 onto 0..3 clobbers a source.
_HIGH_FD = 10
_EXEC_REPORT_TIMEOUT_S = 30.0
_TOKEN_TIMEOUT_S = 30.0
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

    def __init__(self, *, host_name: str | None = None, boot_id: str | None = None,
                 stop_timeout_ms: int = 30_000, poll_ms: int = 50) -> None:
        self.host_name = host_name if host_name is not None else socket.gethostname()
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self.stop_timeout_ms = stop_timeout_ms
        self.poll_ms = poll_ms
        # Per (pid, start ticks): the CPU limit of units this object started, and the exits it reaped.
        self._cpu_limits: dict[tuple[int, int], int] = {}
        self._exits: dict[tuple[int, int], ChildExit] = {}

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
        wrapper = [sys.executable, "-I", "-S", "-c", _WRAPPER, str(limits.cpu_seconds), str(limits.memory_bytes),
                   str(cwd), str(run_path / PID_FILE), self.host_name, self.boot_id, *argv]
        pid = self._spawn(wrapper, child_env, run_path / UNIT_LOG, data, name=argv[0])
        stat = proc_stat(pid)
        # The unit is our unreaped child, so its pid is held and its stat readable, zombie or not.
        if stat is None:
            raise UnitStartError(f"child {pid} of {argv[0]!r} vanished before its start ticks were read")
        self._cpu_limits[(pid, stat.start_ticks)] = limits.cpu_seconds
        return UnitRecord(mode="child", host=self.host_name, boot_id=self.boot_id, run_dir=str(run_path),
                          pid=pid, start_ticks=stat.start_ticks)

    def _spawn(self, wrapper: list[str], env: dict[str, str], log_path: Path, token: bytes, *,
               name: str) -> int:
        """posix_spawn the wrapper in a new session, wait for its exec, write the token, return the pid."""
        opened: list[int] = []

        def high(fd: int) -> int:
            moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD)
            os.close(fd)
            opened.append(moved)
            return moved

        try:
            try:
                # A unit that ran here before may have left a FIFO in the log's place: O_NONBLOCK makes
                # its open fail (no reader) or return at once, never wait for a reader.
                log_fd = high(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                                      | os.O_NONBLOCK | os.O_CLOEXEC, 0o600))
            except OSError as exc:
                raise UnitStartError(f"cannot open the unit log {str(log_path)!r}: {exc.strerror}") from exc
            if not S_ISREG(os.fstat(log_fd).st_mode):
                raise UnitStartError(f"the unit log {str(log_path)!r} is not a regular file")
            os.set_blocking(log_fd, True)
            os.fchmod(log_fd, 0o600)
            stdin_r, stdin_w = (high(fd) for fd in os.pipe())
            report_r, report_w = (high(fd) for fd in os.pipe())
            try:
                pid = os.posix_spawn(wrapper[0], wrapper, env, setsid=True, file_actions=[
                    (os.POSIX_SPAWN_DUP2, stdin_r, 0), (os.POSIX_SPAWN_DUP2, log_fd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2), (os.POSIX_SPAWN_DUP2, report_w, 3),
                ])
            except OSError as exc:
                raise UnitStartError(f"cannot start the unit wrapper {wrapper[0]!r}: {exc.strerror}") from exc
            for fd in (stdin_r, report_w, log_fd):
                opened.remove(fd)
                os.close(fd)
            failure = self._exec_report(report_r, pid)
            if failure is not None:
                os.waitpid(pid, 0)
                raise UnitStartError(f"cannot run {name!r}: {failure}")
            if not self._hand_token(stdin_w, token):
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise UnitStartError(f"{name!r} did not read its token within {_TOKEN_TIMEOUT_S:.0f} s")
            return pid
        finally:
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)

    @staticmethod
    def _hand_token(stdin_w: int, token: bytes) -> bool:
        """Write the token to the unit's stdin; False if the unit did not take it in time.

        A pipe normally holds 64 KiB, but Linux shrinks new pipes to one page for a user over its pipe
        quota: the write waits for the reader then, with a deadline, never forever.
        """
        with contextlib.suppress(OSError):
            fcntl.fcntl(stdin_w, fcntl.F_SETPIPE_SZ, max(len(token), 65536))
        os.set_blocking(stdin_w, False)
        deadline = time.monotonic() + _TOKEN_TIMEOUT_S
        view = memoryview(token)
        try:
            while view:
                _, ready, _ = select.select([], [stdin_w], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    return False
                with contextlib.suppress(BlockingIOError):
                    view = view[os.write(stdin_w, view):]
        except BrokenPipeError:
            pass  # the unit exited or closed stdin without reading: its exit tells the host why
        return True

    @staticmethod
    def _exec_report(report_r: int, pid: int) -> str | None:
        """What the wrapper wrote before dying, or None once its exec closed the pipe (EOF)."""
        deadline = time.monotonic() + _EXEC_REPORT_TIMEOUT_S
        chunks = []
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([report_r], [], [], max(0.0, left))
            if not ready:
                # A wrapper that neither execs nor fails is stuck: end it rather than hand out its pid.
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "the unit wrapper did not exec in time"
            chunk = os.read(report_r, 4096)
            if not chunk:
                return b"".join(chunks).decode("utf-8", "replace") if chunks else None
            chunks.append(chunk)

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

    def _record_exit(self, key: tuple[int, int], status: int, usage: os.struct_rusage) -> ChildExit:
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
