"""Systemd mode: a unit is a transient service made by ``systemd-run``, stopped with its whole cgroup.

    units = SystemdUnits(scope="user", token_dir="/run/user/1000/lifecycle-es")
    handle = units.start(command, lease_id="lease-1", run_dir=run_dir, token=secret, resources=limits)
    units.status(handle)                 # "running", "stopped", "failed", "gone" or "unknown"
    units.stop(handle)

The argv is built by a pure function (`hosts.systemd_run.systemd_run_argv`: the unit's properties are
described there), what systemd says is parsed by pure functions (`hosts.systemd_show`), and every
command runs through an injectable `Exec` (default `run_command`: a minimal environment, a timeout that
settles even when a grandchild keeps the pipes open), so the rules are testable without systemd and a
test can point the commands at a private manager (``nsenter``).

Scope: ``system`` runs the unit through the system manager as ``User=``/``Group=``; as root the user
must be named (a unit must not run as root by omission), otherwise it defaults to this process's uid
and gid. ``user`` talks to the calling user's manager (``--user``), which runs units as that user and
refuses ``User=``.

The token reaches the unit on stdin only: it is written to a root-only file (``<token dir>/<unit>.token``,
0600, in a 0700 directory, default ``/run/lifecycle-es``) that systemd opens as the unit's stdin
(``StandardInput=file:``). Once systemd-run returned, the command is running with the file open, and the
file is replaced by an empty one: a restart in place opens it again and reads nothing. Stop removes
it. In ``user`` scope the unit runs as the token file's owner, who could read it anyway.

Status from ``systemctl show`` (`hosts.systemd_show.unit_status`); a ``systemctl show`` that did not
run is ``unknown`` (never ``gone``: a manager that cannot be reached says nothing about the unit). A
unit systemd collected is ``stopped`` when its exit record says how it ended.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lifecycle_es.errors import InvalidInputError
from lifecycle_es.events import UnitRecord
from lifecycle_es.values import Resources, not_plain, safe_id, shown

from .driver import DriverOptions
from .proc import (
    CommandResult,
    Exec,
    HostError,
    UnitStartError,
    UnitStopError,
    current_boot_id,
    run_command,
    signal_name,
    token_bytes,
)
from .rundir import EXIT_FILE
from .systemd_run import SYSTEMD_RUN, UNIT_SAFE, Scope, property_path, systemd_run_argv, unit_name
from .systemd_show import SHOW_PROPERTIES, UnitExit, parse_show, read_exit_record, unit_exit, unit_status
from .unitfiles import HandleProof, read_proof

SYSTEMCTL = "/usr/bin/systemctl"
DEFAULT_TOKEN_DIR = "/run/lifecycle-es"

# systemctl's exit status for "unit not loaded" (LSB 5): stopping a unit systemd already collected.
SYSTEMCTL_NOT_LOADED = 5


def _epoch_ms() -> int:
    return time.time_ns() // 1_000_000


class SystemdUnits:
    """Start, observe, signal and stop systemd-mode units of this host.

    `exec` runs every systemd-run and systemctl command (the seam tests use); `now` is an epoch-ms
    clock for unit names. In ``system`` scope as root, `user` (and `group`, default the same) must be
    named: refused with InvalidInputError otherwise.
    """

    mode = "systemd"  # as ``UnitStarting`` and every handle of this driver record it

    def __init__(self, *, scope: Scope = "system", user: str | None = None, group: str | None = None,
                 exec: Exec = run_command, token_dir: str | os.PathLike[str] = DEFAULT_TOKEN_DIR,
                 host_name: str | None = None, boot_id: str | None = None, stop_timeout_ms: int = 30_000,
                 unit_prefix: str = "les-", restart: bool = True,
                 now: Callable[[], int] = _epoch_ms,
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
        self.token_dir = Path(property_path(token_dir, "token_dir"))
        self.host_name = host_name if host_name is not None else socket.gethostname()
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self.stop_timeout_ms = stop_timeout_ms
        self.unit_prefix, self.restart, self.now = unit_prefix, restart, now
        self.systemd_run, self.systemctl = systemd_run, systemctl

    @classmethod
    def for_host(cls, options: DriverOptions) -> SystemdUnits:
        """The driver `hosts.local.LocalHost` runs in systemd mode, from its options."""
        return cls(scope=options.scope, user=options.user, group=options.group,
                   exec=options.exec if options.exec is not None else run_command,
                   token_dir=options.token_dir if options.token_dir is not None else DEFAULT_TOKEN_DIR,
                   stop_timeout_ms=options.stop_timeout_ms, now=options.now if options.now is not None else _epoch_ms)

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
        if type(unit) is not str or UNIT_SAFE.fullmatch(unit) is None:
            raise not_plain(unit, "unit") or InvalidInputError(
                "unit", f"unit name {shown(unit)} is not safe (1-200 of A-Z a-z 0-9 : _ . -)")
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
        return self._handle(run_path, unit)

    def _handle(self, run_dir: str | os.PathLike[str], unit: str | None) -> UnitRecord:
        """The handle of `unit` started in `run_dir` by this host, this boot."""
        return UnitRecord(mode="systemd", host=self.host_name, boot_id=self.boot_id, run_dir=str(run_dir), unit=unit)

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

    # --- as the host drives it (hosts.driver.UnitDriver) ---------------------------------------------

    def plan(self, lease_id: str, run_dir: Path) -> UnitRecord:
        """The handle of the lease's next unit, its name fresh (`new_unit_name`): known before the start."""
        return self._handle(run_dir, self.new_unit_name(lease_id))

    def start_unit(self, command: Sequence[str], *, lease_id: str, run_dir: Path, token: str | bytes | None,
                   resources: Resources, env: Mapping[str, str], planned: UnitRecord | None) -> UnitRecord:
        """`start` under the unit name `plan` chose (a fresh one without a plan)."""
        return self.start(command, lease_id=lease_id, run_dir=run_dir, token=token, resources=resources, env=env,
                          unit=planned.unit if planned is not None else None)

    def observe(self, handle: UnitRecord) -> str:
        """`status`: systemd keeps its units' ends, so there is nothing to collect first."""
        return self.status(handle)

    def find_started(self, run_dir: Path, *, lease_id: str, lease_generation: int, unit: str | None,
                     command: tuple[str, ...]) -> UnitRecord | None:
        """The intent's unit, when the proof written before ``systemd-run`` names it, its lease and command."""
        planned = self._handle(run_dir, unit)
        proof = HandleProof(lease_id=lease_id, lease_generation=lease_generation, handle=planned, command=command)
        return planned if read_proof(run_dir) == proof else None

    def discard(self, handle: UnitRecord) -> None:
        """`stop`: systemd collects the unit's end itself."""
        self.stop(handle)



__all__ = ["DEFAULT_TOKEN_DIR", "SYSTEMCTL", "SYSTEMCTL_NOT_LOADED", "SystemdUnits"]
