"""What the host drivers know about processes on this machine: /proc, the boot, how a death reads, and
how a command is run (`run_command`, the default `Exec` seam of hosts.systemd).

A pid alone names a process only until it is reused, so every handle carries the process's start time
in clock ticks since boot (field 22 of ``/proc/<pid>/stat``) and the boot id: the pair (pid, start
ticks) names one process for as long as the machine is up, and a handle from another boot names
nothing. Field 2 of the stat line (the command name) may hold spaces and parentheses, so the fields
are read after the *last* ``)``.

How a death reads (both drivers use these rules, so a lease parks ``resource-limit`` the same way in
child and systemd mode):

- CPU: the soft limit is ``cpu_seconds`` and the hard limit one second more. At the soft limit the
  kernel sends SIGXCPU (default action: terminate), at the hard limit SIGKILL. With soft equal to hard
  the kernel sends SIGKILL at once (checked on Linux 6.x), which nothing could tell from any other
  SIGKILL; the extra second makes the cause readable. Death by SIGXCPU is a resource-limit death,
  and so is SIGKILL once the process had used at least ``cpu_seconds`` of CPU (it ignored SIGXCPU and
  met the hard limit one second later: rusage samples CPU time, and that second is the margin).
- Memory: an address-space limit makes allocations fail; the process sees ENOMEM (Python raises
  MemoryError) and nothing in its exit status says why. The convention: a unit that ran out of memory
  exits ``EXIT_OUT_OF_MEMORY`` (71, sysexits' EX_OSERR: the operating system refused a resource), and
  that exit counts as a resource-limit death. An uncaught MemoryError in Python exits 1 and is not
  one: a unit that wants its lease parked ``resource-limit`` catches it and exits 71. systemd's own
  OOM kill shows as ``Result=oom-kill`` and needs no convention.

Errors::

    LifecycleError
    └── HostError                        a host side effect (start, signal, stop, run dir) failed
        ├── UnitStartError               a unit could not be started; nothing is left running
        ├── UnitRunningError             a lease's unit is recorded and not ended: no second one starts
        ├── UnitStopError                a unit is still running after every way of stopping it
        ├── UnitFileError                a file the unit controls breaks the host's rules (a unit failure)
        ├── UnprovenUnitError            a recorded unit this host cannot prove it started (never signalled)
        └── RunDirHeldError              another process holds the run directory (exit_code 76)
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec

from lifecycle_es.errors import InvalidInputError, LifecycleError
from lifecycle_es.files import UnsafeFileError
from lifecycle_es.values import not_plain, shown

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A pipe holds 64 KiB on Linux by default: a token that fits is written without waiting on the reader.
MAX_TOKEN_BYTES = 65536
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
EXIT_OUT_OF_MEMORY = 71
# Zombie (exited, not yet reaped) and dead: no longer a running process, whatever its pid says.
DEAD_STATES = frozenset({"Z", "X"})


class HostError(LifecycleError):
    """A host side effect (starting, signalling or stopping a unit, holding a run dir) failed."""


class UnitStartError(HostError):
    """A unit could not be started; whatever was half made (token file, child) was removed."""


class UnitRunningError(HostError):
    """The lease already has a unit the log records as started (or starting) and not ended: `start`
    makes no second process. ``lease_id`` and ``handle`` (None while only its start is recorded) say which."""

    def __init__(self, message: str, *, lease_id: str, handle: object) -> None:
        super().__init__(message)
        self.lease_id = lease_id
        self.handle = handle


class UnitStopError(HostError):
    """A unit is still running after every way of stopping it was tried."""


class UnitFileError(HostError):
    """A file the unit controls (``status.json``, ``result``) is a link, not a regular file, too large
    or unreadable: the unit broke the host's rules, and its lease ends as a unit failure."""


class UnprovenUnitError(HostError):
    """A unit handle this host cannot prove it started (see `hosts.unitfiles`): it is never signalled."""


def unit_file_error(exc: OSError, path: str | os.PathLike[str], what: str) -> UnitFileError:
    """The UnitFileError for a refused read of a unit's file (`lifecycle_es.files` says what was wrong)."""
    if isinstance(exc, UnsafeFileError):
        reason = exc.strerror
    else:
        reason = f"cannot read {what} {os.fspath(path)!r}: {exc.strerror}"
    return UnitFileError(f"the unit broke the host's file rules: {reason}")


class ProcStat(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of ``/proc/<pid>/stat`` the drivers use: state, group, session, start ticks."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start_ticks: int

    @property
    def dead(self) -> bool:
        """Whether the process already exited (a zombie waiting for its parent, or dead)."""
        return self.state in DEAD_STATES


def proc_stat(pid: int) -> ProcStat | None:
    """The stat fields of `pid`, zombies included; None when there is no such process or pid <= 0."""
    if type(pid) is not int or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # Fields after the command name: state is field 3, so index 0 here; start time is field 22.
    rest = line[line.rfind(")") + 2:].split()
    try:
        return ProcStat(pid=pid, state=rest[0], ppid=int(rest[1]), pgrp=int(rest[2]),
                        session=int(rest[3]), start_ticks=int(rest[19]))
    except (IndexError, ValueError):
        return None


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot).

    None for a zombie or dead process (Z, X), a missing one, or a pid <= 0: only a running process
    has start ticks here, so a reused pid is never mistaken for the process a handle names.
    """
    stat = proc_stat(pid)
    if stat is None or stat.dead:
        return None
    return stat.start_ticks


def current_boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``): a handle from another boot names nothing."""
    with open(BOOT_ID_PATH, encoding="ascii") as f:
        return f.read().strip()


def pid_alive(pid: int, start_ticks: int) -> bool:
    """Whether `pid` is still the running (not zombie) process that started at `start_ticks`."""
    return type(start_ticks) is int and proc_start_ticks(pid) == start_ticks


def group_members(pgrp: int) -> list[int]:
    """The pids of live (not zombie) processes in process group `pgrp`, found by scanning /proc."""
    if type(pgrp) is not int or pgrp <= 1:
        return []
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None and stat.pgrp == pgrp and not stat.dead:
                members.append(stat.pid)
    return members


def signal_name(signum: int) -> str:
    """``SIGXCPU`` for 24: the name a UnitExited or UnitSignalled event records."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def resource_limit_death(*, code: int | None, signum: int | None, cpu_ms: int | None = None,
                         cpu_seconds: int | None = None) -> bool:
    """Whether an exit reads as a death by the unit's limits (the rules in the module docstring).

    `cpu_ms` is the CPU the process used (from its rusage) and `cpu_seconds` its limit; without both a
    SIGKILL is never put down to the CPU limit.
    """
    if signum == signal.SIGXCPU:
        return True
    if signum == signal.SIGKILL and cpu_ms is not None and cpu_seconds is not None:
        return cpu_ms >= cpu_seconds * 1000
    return code == EXIT_OUT_OF_MEMORY


def token_bytes(token: str | bytes) -> bytes:
    """A unit's secret token as the bytes its stdin gets: str (UTF-8) or bytes, 1..64 KiB.

    The message of a refusal never shows the token.
    """
    if type(token) is str:
        data = token.encode("utf-8")
    elif isinstance(token, bytes | bytearray):
        data = bytes(token)
    else:  # a str subclass too: its encode() is its own to answer
        raise InvalidInputError("token", f"token must be a plain str or bytes, got {type(token).__name__}")
    if not 1 <= len(data) <= MAX_TOKEN_BYTES:
        raise InvalidInputError("token", f"token must be 1..{MAX_TOKEN_BYTES} bytes, got {len(data)}")
    return data


def safe_command(command: Sequence[str]) -> list[str]:
    """A unit's command: a non-empty list of strings without NUL (a NUL would cut an argument short)."""
    if isinstance(command, str | bytes) or not isinstance(command, Sequence) or not command:
        raise InvalidInputError("command", f"command must be a non-empty list of strings, got {shown(command)}")
    for arg in command:
        if type(arg) is not str or "\0" in arg:
            raise not_plain(arg, "command") or InvalidInputError(
                "command", f"command argument {shown(arg)} is not a string without NUL")
    if not command[0]:
        raise InvalidInputError("command", "command[0] is empty")
    return list(command)


def safe_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's extra environment for a unit, checked: names are identifiers, values hold no NUL or
    newline (systemd-run's --setenv takes one line)."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise InvalidInputError("env", f"env must be a mapping of str to str, got {type(env).__name__}")
    out = {}
    for name, value in env.items():
        if type(name) is not str or ENV_NAME_RE.fullmatch(name) is None:
            raise not_plain(name, "env") or InvalidInputError("env", f"env name {shown(name)} is not an identifier")
        if type(value) is not str or "\0" in value or "\n" in value:
            raise not_plain(value, "env") or InvalidInputError(
                "env", f"env value of {name} must be a string without NUL or newline")
        out[name] = value
    return out


# --- running a command ------------------------------------------------------------------------------


class CommandResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a command ended: its exit code (None when it timed out), and what it printed."""

    code: int | None
    timed_out: bool
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """Exit code 0 within the timeout."""
        return self.code == 0 and not self.timed_out

    def last_line(self) -> str:
        """The last line of stderr, cut to 300 characters: what an error message may quote."""
        lines = self.stderr.strip().splitlines()
        return lines[-1][:300] if lines else ""


class Exec(Protocol):
    """Runs argv with `input` on stdin and a timeout; the seam between this module and systemd."""

    def __call__(self, argv: Sequence[str], *, input: bytes | None = None,
                 timeout_ms: int = 30_000) -> CommandResult:
        """Run `argv` and return how it ended; never raises for a command that fails."""
        ...


def run_command(argv: Sequence[str], *, input: bytes | None = None, timeout_ms: int = 30_000,
                env: Mapping[str, str] | None = None) -> CommandResult:
    """Run `argv` with a minimal environment (PATH, LANG, HOME, and XDG_RUNTIME_DIR when set, which
    ``systemctl --user`` needs to find the user's manager) plus `env`; kill it after `timeout_ms`.

    A command that cannot be started ends with code 127 and the reason on stderr, as in a shell.
    """
    base = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/")}
    if "XDG_RUNTIME_DIR" in os.environ:
        base["XDG_RUNTIME_DIR"] = os.environ["XDG_RUNTIME_DIR"]
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**base, **(env or {})})
    except OSError as exc:
        return CommandResult(code=127, timed_out=False, stdout="", stderr=f"cannot run {argv[0]}: {exc.strerror}")
    try:
        out, err = proc.communicate(input or b"", timeout=timeout_ms / 1000)
    except subprocess.TimeoutExpired as exc:
        # Settle now even if a grandchild keeps the pipes: end the command and stop reading.
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        return CommandResult(code=None, timed_out=True, stdout=(exc.stdout or b"").decode("utf-8", "replace"),
                             stderr=(exc.stderr or b"").decode("utf-8", "replace"))
    return CommandResult(code=proc.returncode, timed_out=False, stdout=out.decode("utf-8", "replace"),
                         stderr=err.decode("utf-8", "replace"))
