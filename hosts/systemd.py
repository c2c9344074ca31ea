"""Systemd mode: a unit is a transient service made by ``systemd-run``, stopped with its whole cgroup.

The argv is built by a pure function, `systemd_run_argv`, and every command runs through an injectable
`Exec` (default `run_command`: a minimal environment, a timeout that settles even when a grandchild
keeps the pipes open), so the rules are testable without systemd and a test can point the commands
at a private manager (``nsenter``).

The unit: ``--service-type=exec`` (systemd-run returns once the command was exec'd, or fails if it
could not be), ``KillMode=control-group`` (stop kills every process the unit started, ``setsid`` ones
included), ``Restart=on-failure`` every second but never after the exits no restart can fix
(``RestartPreventExitStatus=65 70 75 76``) nor after a death by the unit's limits (71 and SIGXCPU: the
lease parks ``resource-limit``, and the failed unit keeps its Result for the host to read),
``StartLimitIntervalSec=0`` (without it a unit that crashes fast is refused further restarts after
five in ten seconds), ``LimitCPU=<cpu>:<cpu + 1>`` (soft and hard, so the limit kills with SIGXCPU:
see `hosts.proc`), ``LimitCORE=0`` and ``MemoryMax=``.

Scope: ``system`` runs the unit through the system manager as ``User=``/``Group=``; as root the user
must be named (a unit must not run as root by omission), otherwise it defaults to this process's uid
and gid. ``user`` talks to the calling user's manager (``--user``), which runs units as that user and
refuses ``User=``.

The token reaches the unit on stdin only: it is written to a root-only file (``<token dir>/<unit>.token``,
0600, in a 0700 directory, default ``/run/lifecycle-es``) that systemd opens as the unit's stdin
(``StandardInput=file:``). Once systemd-run returned, the command is running with the file open, and the
file is replaced by an empty one: a restart in place opens it again and reads nothing. Stop removes
it. In ``user`` scope the unit runs as the token file's owner, who could read it anyway.

Status from ``systemctl show``: `unit_status` maps it as the seed does (loaded and active or
activating is ``running``, ``inactive`` is ``stopped``, ``failed`` is ``failed``, not loaded is
``gone``); a ``systemctl show`` that did not run is ``unknown`` (never ``gone``: a manager that cannot
be reached says nothing about the unit). `unit_exit` reads how the main process last ended,
``Result=`` included, and whether that was a death by the unit's limits (``Result=oom-kill``, SIGXCPU, or
the out-of-memory exit of `hosts.proc`).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import signal
import socket
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from lifecycle_es.errors import EXIT_DATAERR, EXIT_FENCED, EXIT_HELD, EXIT_SOFTWARE, InvalidInputError
from lifecycle_es.events import UnitRecord
from lifecycle_es.files import read_regular
from lifecycle_es.values import Resources, safe_id, shown

from .proc import (
    EXIT_OUT_OF_MEMORY,
    SAFE_PATH,
    CommandResult,
    Exec,
    HostError,
    UnitStartError,
    UnitStopError,
    current_boot_id,
    resource_limit_death,
    run_command,
    safe_command,
    safe_env,
    signal_name,
    token_bytes,
)
from .rundir import EXIT_FILE

SYSTEMD_RUN = "/usr/bin/systemd-run"
SYSTEMCTL = "/usr/bin/systemctl"
DEFAULT_TOKEN_DIR = "/run/lifecycle-es"
UNIT_SAFE = re.compile(r"[A-Za-z0-9:_.-]{1,200}")
# Exits a restart cannot fix: data error, software error, fenced, held elsewhere.
TERMINAL_EXITS = (EXIT_DATAERR, EXIT_SOFTWARE, EXIT_FENCED, EXIT_HELD)
# Deaths by the unit's limits are not restarted either: the lease parks ``resource-limit`` instead, and
# the unit stays failed with its Result and status for the host to read (a restart would hide them).
RESOURCE_LIMIT_EXITS = (str(EXIT_OUT_OF_MEMORY), "SIGXCPU")
SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainCode", "MainPID")
# systemctl's exit status for "unit not loaded" (LSB 5): stopping a unit systemd already collected.
SYSTEMCTL_NOT_LOADED = 5
# ExecMainCode is the waitid() si_code of the main process: exited, killed, dumped core.
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
_PROPERTY_PATH_RE = re.compile(r"/[^\s\x00-\x1f\x7f]*")

Scope = Literal["system", "user"]


def _property_path(value: str | os.PathLike[str], field: str) -> str:
    """An absolute path fit for a ``-p Name=value`` property: no whitespace or control characters."""
    text = os.fspath(value)
    if not isinstance(text, str) or _PROPERTY_PATH_RE.fullmatch(text) is None:
        raise InvalidInputError(field, f"{field} must be an absolute path without whitespace, got {shown(text)}")
    return text


def _account(value: str, field: str) -> str:
    """A user or group name (or numeric id) as User=/Group= takes it."""
    if not isinstance(value, str) or _USER_RE.fullmatch(value) is None:
        raise InvalidInputError(field, f"{field} is not a user or group name: {shown(value)}")
    return value


def systemd_run_argv(*, unit: str, command: Sequence[str], scope: Scope = "system", user: str | None = None,
                     group: str | None = None, description: str | None = None, stop_timeout_ms: int = 30_000,
                     resources: Resources | None = None, token_file: str | os.PathLike[str] | None = None,
                     work_dir: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
                     restart: bool = True, log_file: str | os.PathLike[str] | None = None,
                     exit_file: str | os.PathLike[str] | None = None,
                     systemd_run: str = SYSTEMD_RUN) -> list[str]:
    """The ``systemd-run`` argv that starts `command` as transient service `unit` (pure).

    `user`/`group` are required in ``system`` scope and refused in ``user`` scope. `token_file` becomes
    the unit's stdin; `log_file`, when given, gets its stdout and stderr appended (the default is the
    manager's journal). `env` is the caller's extra environment; PATH and LANG are set over it.
    `exit_file`, when given, gets ``$SERVICE_RESULT $EXIT_CODE $EXIT_STATUS`` written by an
    ``ExecStopPost=+`` line each time the main process ends: a transient unit that exits cleanly is
    garbage-collected at once, and with it the only other record of how it ended.
    """
    if not isinstance(unit, str) or UNIT_SAFE.fullmatch(unit) is None:
        raise InvalidInputError("unit", f"unit name {shown(unit)} is not safe (1-200 of A-Z a-z 0-9 : _ . -)")
    argv_command = safe_command(command)
    if scope not in ("system", "user"):
        raise InvalidInputError("scope", f"scope must be 'system' or 'user', got {shown(scope)}")
    if scope == "system" and (user is None or group is None):
        raise InvalidInputError("user", "system scope needs the user and group the unit runs as "
                                        "(as root, name an unprivileged user)")
    if scope == "user" and (user is not None or group is not None):
        raise InvalidInputError("user", "a user manager runs units as its own user and refuses User=/Group=")
    if type(stop_timeout_ms) is not int or stop_timeout_ms < 0:
        raise InvalidInputError("stop_timeout_ms", f"stop_timeout_ms must be an integer >= 0, "
                                                   f"got {shown(stop_timeout_ms)}")
    text = description if description is not None else f"lifecycle-es unit {unit}"
    if not isinstance(text, str) or any(ch in text for ch in "\0\n\r"):
        raise InvalidInputError("description", "description must be one line of text")
    argv = [systemd_run] + (["--user"] if scope == "user" else []) + [
        f"--unit={unit}", f"--description={text}", "--service-type=exec", "--quiet",
        "-p", "KillMode=control-group",
        "-p", f"TimeoutStopSec={max(1, math.ceil(stop_timeout_ms / 1000))}s",
    ]
    if restart:
        argv += ["-p", "Restart=on-failure", "-p", "RestartSec=1",
                 "-p", f"RestartPreventExitStatus={' '.join([*map(str, TERMINAL_EXITS), *RESOURCE_LIMIT_EXITS])}"]
    argv += ["-p", "StartLimitIntervalSec=0"]
    if scope == "system":
        argv += ["-p", f"User={_account(user or '', 'user')}", "-p", f"Group={_account(group or '', 'group')}"]
    if resources is not None:
        limits = Resources.coerce(resources)
        argv += ["-p", f"LimitCPU={limits.cpu_seconds}:{limits.cpu_seconds + 1}", "-p", "LimitCORE=0",
                 "-p", f"MemoryMax={limits.memory_bytes}"]
    if token_file is not None:
        argv += ["-p", f"StandardInput=file:{_property_path(token_file, 'token_file')}"]
    if log_file is not None:
        log = _property_path(log_file, "log_file")
        argv += ["-p", f"StandardOutput=append:{log}", "-p", f"StandardError=append:{log}"]
    if exit_file is not None:
        # "$$" is a literal "$" for systemd's own expansion; "+" runs it with full privileges, so the
        # record lands in the host's run directory whatever user the unit runs as.
        target = _property_path(exit_file, "exit_file")
        if any(ch in target for ch in "'\"\\$%`"):
            raise InvalidInputError("exit_file", f"exit_file must not hold quotes, $, %, ` or \\: {shown(target)}")
        argv += ["-p", f"ExecStopPost=+/bin/sh -c 'echo $$SERVICE_RESULT $$EXIT_CODE $$EXIT_STATUS > {target}'"]
    if work_dir is not None:
        argv.append(f"--working-directory={_property_path(work_dir, 'work_dir')}")
    unit_env = {**safe_env(env), "PATH": SAFE_PATH, "LANG": "C.UTF-8"}
    argv += [f"--setenv={name}={value}" for name, value in unit_env.items()]
    return [*argv, "--", *argv_command]


def unit_name(lease_id: str, *, prefix: str, now_ms: int, salt: int) -> str:
    """A fresh unit name for a lease: prefix, the lease id (characters a unit name cannot hold become
    ``_``), then the time in base 36 and two base-36 digits of salt, as the seed names them."""
    safe_id(lease_id, "lease_id")

    def base36(n: int) -> str:
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"
        out = ""
        while True:
            n, r = divmod(n, 36)
            out = digits[r] + out
            if n == 0:
                return out

    tail = f"-{base36(now_ms)}{base36(salt % 1296).rjust(2, '0')}"
    body = re.sub(r"[^A-Za-z0-9:_.-]", "_", lease_id)[: 200 - len(prefix) - len(tail)]
    name = f"{prefix}{body}{tail}"
    if UNIT_SAFE.fullmatch(name) is None:
        raise InvalidInputError("unit_prefix", f"unit name {shown(name)} is not safe")
    return name


def parse_show(text: str) -> dict[str, str]:
    """``systemctl show`` output (``Name=value`` lines) as a dict; lines without ``=`` are skipped."""
    out = {}
    for line in text.split("\n"):
        i = line.find("=")
        if i > 0:
            out[line[:i]] = line[i + 1:]
    return out


def unit_status(show: Mapping[str, str]) -> str:
    """A unit's state as a host status: ``running``, ``stopped``, ``failed``, ``gone`` or ``unknown``."""
    if show.get("LoadState") in (None, "not-found"):
        return "gone"
    active = show.get("ActiveState")
    if active in ("active", "activating", "deactivating", "reloading", "refreshing"):
        return "running"
    if active == "failed":
        return "failed"
    if active == "inactive":
        return "stopped"
    return "unknown"


class UnitExit(msgspec.Struct, frozen=True, kw_only=True):
    """How a unit's main process last ended, from ``systemctl show``."""

    result: str
    code: int | None
    signal: str | None
    resource_limit: bool


def unit_exit(show: Mapping[str, str]) -> UnitExit | None:
    """The last exit of the unit's main process, or None when it has not exited (or is unknown)."""
    try:
        how = int(show.get("ExecMainCode", "0"))
        status = int(show.get("ExecMainStatus", "0"))
    except ValueError:
        return None
    if how not in (_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED):
        return None
    code = status if how == _CLD_EXITED else None
    signum = status if how != _CLD_EXITED else None
    result = show.get("Result", "")
    return UnitExit(result=result, code=code, signal=signal_name(signum) if signum is not None else None,
                    resource_limit=result == "oom-kill" or resource_limit_death(code=code, signum=signum))


def read_exit_record(path: str | os.PathLike[str]) -> UnitExit | None:
    """How a unit ended, from the record its ``ExecStopPost`` wrote (see `systemd_run_argv`), or None."""
    try:
        fields = read_regular(path, limit=256, what=EXIT_FILE).decode("ascii", "replace").split()
    except OSError:  # missing, or a link, FIFO or large file in its place: no record of ours
        return None
    if len(fields) != 3 or fields[1] not in ("exited", "killed", "dumped"):
        return None
    result, how, status = fields
    if how == "exited":
        if not status.isdigit():
            return None
        code, signame = int(status), None
    else:
        code, signame = None, status if status.startswith("SIG") else f"SIG{status}"
    signum = getattr(signal, signame, None) if signame else None
    return UnitExit(result=result, code=code, signal=signame,
                    resource_limit=result == "oom-kill" or resource_limit_death(code=code, signum=signum))


class SystemdUnits:
    """Start, observe, signal and stop systemd-mode units of this host.

    `exec` runs every systemd-run and systemctl command (the seam tests use); `now` is an epoch-ms
    clock for unit names. In ``system`` scope as root, `user` (and `group`, default the same) must be
    named: refused with InvalidInputError otherwise.
    """

    def __init__(self, *, scope: Scope = "system", user: str | None = None, group: str | None = None,
                 exec: Exec = run_command, token_dir: str | os.PathLike[str] = DEFAULT_TOKEN_DIR,
                 host_name: str | None = None, boot_id: str | None = None, stop_timeout_ms: int = 30_000,
                 unit_prefix: str = "les-", restart: bool = True,
                 now: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
                 systemd_run: str = SYSTEMD_RUN, systemctl: str = SYSTEMCTL) -> None:
        if scope == "system" and user is None:
            if os.geteuid() == 0:
                raise InvalidInputError("user", "running as root: name the unprivileged user units run as (user)")
            user, group = str(os.getuid()), group if group is not None else str(os.getgid())
        elif scope == "system" and group is None:
            group = user
        self.scope: Scope = scope
        self.user, self.group = user, group
        self.exec = exec
        self.token_dir = Path(_property_path(token_dir, "token_dir"))
        self.host_name = host_name if host_name is not None else socket.gethostname()
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self.stop_timeout_ms = stop_timeout_ms
        self.unit_prefix, self.restart, self.now = unit_prefix, restart, now
        self.systemd_run, self.systemctl = systemd_run, systemctl

    def __repr__(self) -> str:
        return f"<SystemdUnits scope={self.scope} host={self.host_name!r} user={self.user!r}>"

    def token_file(self, unit: str) -> Path:
        """Where the token of `unit` is kept while it runs (empty once it started)."""
        return self.token_dir / f"{unit}.token"

    def _ctl(self, *args: str, timeout_ms: int = 30_000) -> CommandResult:
        """Run ``systemctl [--user] args...`` through the injected exec."""
        scope = ["--user"] if self.scope == "user" else []
        return self.exec([self.systemctl, *scope, *args], timeout_ms=timeout_ms)

    # --- start --------------------------------------------------------------------------------------

    def new_unit_name(self, lease_id: str) -> str:
        """A fresh unit name for `lease_id`, to record (UnitStarting) before `start(unit=...)` uses it."""
        return unit_name(lease_id, prefix=self.unit_prefix, now_ms=self.now(), salt=secrets.randbelow(1296))

    def start(self, command: Sequence[str], *, lease_id: str, run_dir: str | os.PathLike[str],
              token: str | bytes | None, resources: Resources | Mapping[str, int],
              env: Mapping[str, str] | None = None, work_dir: str | os.PathLike[str] | None = None,
              log_file: str | os.PathLike[str] | None = None, unit: str | None = None) -> UnitRecord:
        """Start `command` as a transient service for `lease_id`, its token on stdin; return the handle.

        `unit` is the name chosen beforehand (`new_unit_name`), or a fresh one. `work_dir` defaults to
        ``<run_dir>/work``. Raises InvalidInputError for a bad argument and UnitStartError when
        systemd-run fails (the half-made unit is stopped, the token file removed).
        """
        # No token: the unit's stdin is empty (EOF at once), as for a unit restarted by a host that never held it.
        data = token_bytes(token) if token is not None else b""
        safe_id(lease_id, "lease_id")
        run_path = Path(run_dir)
        unit = unit if unit is not None else self.new_unit_name(lease_id)
        if not isinstance(unit, str) or UNIT_SAFE.fullmatch(unit) is None:
            raise InvalidInputError("unit", f"unit name {shown(unit)} is not safe (1-200 of A-Z a-z 0-9 : _ . -)")
        path = self.token_file(unit)
        argv = systemd_run_argv(
            unit=unit, command=command, scope=self.scope, user=self.user, group=self.group,
            description=f"lifecycle-es lease {lease_id}", stop_timeout_ms=self.stop_timeout_ms,
            resources=Resources.coerce(resources), token_file=path,
            work_dir=work_dir if work_dir is not None else run_path / "work", env=env,
            restart=self.restart, log_file=log_file, exit_file=run_path / EXIT_FILE, systemd_run=self.systemd_run)
        # A record left by an earlier unit of this run directory must not speak for this one.
        (run_path / EXIT_FILE).unlink(missing_ok=True)
        self._write_token(path, data)
        started = False
        try:
            result = self.exec(argv, timeout_ms=60_000)
            if not result.ok:
                self._ctl("stop", f"{unit}.service", timeout_ms=self.stop_timeout_ms + 10_000)
                self._ctl("reset-failed", f"{unit}.service")
                how = "timed out" if result.timed_out else f"exit {result.code}"
                raise UnitStartError(f"systemd-run {unit}: {how}: {result.last_line()}")
            started = True
        finally:
            # Type=exec: the command runs with the file open as stdin already, so the path can go empty.
            # It stays because a restart in place opens it again (and reads nothing); stop removes it.
            with contextlib.suppress(OSError):
                if started:
                    self._empty_token(path)
                else:
                    path.unlink(missing_ok=True)
        return UnitRecord(mode="systemd", host=self.host_name, boot_id=self.boot_id, run_dir=str(run_path),
                          unit=unit)

    def _write_token(self, path: Path, data: bytes) -> None:
        """Write the token to a fresh 0600 file in the 0700 token directory (made when missing)."""
        os.makedirs(self.token_dir, mode=0o700, exist_ok=True)
        info = os.lstat(self.token_dir)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise HostError(f"token dir {self.token_dir} is not a directory of uid {os.geteuid()}")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(self.token_dir, 0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    @staticmethod
    def _empty_token(path: Path) -> None:
        """Replace the token file by an empty one: the unit's open descriptor keeps the token."""
        tmp = path.with_name(path.name + ".tmp")
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        os.replace(tmp, path)

    # --- observe ------------------------------------------------------------------------------------

    def _unit(self, handle: UnitRecord) -> str | None:
        """The unit name of a systemd handle of this host and boot, or None."""
        if handle.mode != "systemd" or handle.host != self.host_name or handle.boot_id != self.boot_id:
            return None
        if not isinstance(handle.unit, str) or UNIT_SAFE.fullmatch(handle.unit) is None:
            return None
        return handle.unit

    def show(self, handle: UnitRecord) -> dict[str, str] | None:
        """The unit's ``systemctl show`` properties (`SHOW_PROPERTIES`), or None when that did not run."""
        unit = self._unit(handle)
        if unit is None:
            return None
        result = self._ctl("show", f"{unit}.service", f"--property={','.join(SHOW_PROPERTIES)}")
        return parse_show(result.stdout) if result.ok else None

    def status(self, handle: UnitRecord) -> str:
        """``running``, ``stopped``, ``failed``, ``gone`` or ``unknown`` (see the module docstring)."""
        if handle.mode != "systemd" or handle.host != self.host_name:
            return "unknown"
        if handle.boot_id != self.boot_id:
            return "gone"
        show = self.show(handle)
        if show is None:
            return "unknown"
        status = unit_status(show)
        if status == "gone" and read_exit_record(Path(handle.run_dir) / EXIT_FILE) is not None:
            return "stopped"  # it ended and systemd collected it; its ExecStopPost said how
        return status

    def exit(self, handle: UnitRecord) -> UnitExit | None:
        """How the unit's main process last ended (`unit_exit`), or None."""
        show = self.show(handle)
        if show is None:
            return None
        if unit_status(show) == "gone":
            return read_exit_record(Path(handle.run_dir) / EXIT_FILE)
        return unit_exit(show)

    # --- signal and stop ----------------------------------------------------------------------------

    def signal(self, handle: UnitRecord, signum: int) -> bool:
        """Send `signum` to every process of the unit (``systemctl kill``); True when it was sent."""
        unit = self._unit(handle)
        if unit is None:
            return False
        return self._ctl("kill", f"--signal={signal_name(signum)}", f"{unit}.service").ok

    def stop(self, handle: UnitRecord) -> None:
        """``systemctl stop`` (its whole cgroup), then ``reset-failed``, then remove the token file.

        A unit systemd already collected (exit 5, not loaded) counts as stopped. Raises UnitStopError
        when the stop failed and the unit still runs. A handle of another host or boot is left alone.
        """
        unit = self._unit(handle)
        if unit is None:
            return
        result = self._ctl("stop", f"{unit}.service", timeout_ms=self.stop_timeout_ms + 10_000)
        if not result.ok and result.code != SYSTEMCTL_NOT_LOADED and self.status(handle) == "running":
            how = "timed out" if result.timed_out else result.last_line()
            raise UnitStopError(f"systemctl stop {unit}: {how}")
        self._ctl("reset-failed", f"{unit}.service")
        self.token_file(unit).unlink(missing_ok=True)

