"""The ``systemd-run`` argv of a lease's unit, and its name: pure functions, no systemd needed.

    argv = systemd_run_argv(unit=unit_name("lease-1", prefix="les-", now_ms=now, salt=7),
                            command=["/usr/bin/agent"], scope="user", token_file="/run/lifecycle-es/u.token")

The unit: ``--service-type=exec`` (systemd-run returns once the command was exec'd, or fails if it
could not be), ``KillMode=control-group`` (stop kills every process the unit started, ``setsid`` ones
included), ``Restart=on-failure`` every second but never after the exits no restart can fix
(``RestartPreventExitStatus=65 70 75 76``) nor after a death by the unit's limits (71 and SIGXCPU: the
lease parks ``resource-limit``, and the failed unit keeps its Result for the host to read),
``StartLimitIntervalSec=0`` (without it a unit that crashes fast is refused further restarts after
five in ten seconds), ``LimitCPU=<cpu>:<cpu + 1>`` (soft and hard, so the limit kills with SIGXCPU:
see `hosts.proc`), ``LimitCORE=0`` and ``MemoryMax=``.

Scope: ``system`` runs the unit through the system manager as ``User=``/``Group=`` (both must be
named); ``user`` talks to the calling user's manager (``--user``), which runs units as that user and
refuses ``User=``. The token file becomes the unit's stdin (``StandardInput=file:``); see
`hosts.systemd` for how the driver keeps it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from lifecycle_es.errors import EXIT_DATAERR, EXIT_FENCED, EXIT_HELD, EXIT_SOFTWARE, InvalidInputError
from lifecycle_es.values import Resources, not_plain, safe_choice, safe_id, shown

from .proc import EXIT_OUT_OF_MEMORY, SAFE_PATH, safe_command, safe_env

SYSTEMD_RUN = "/usr/bin/systemd-run"
UNIT_SAFE = re.compile(r"[A-Za-z0-9:_.-]{1,200}")
# Exits a restart cannot fix: data error, software error, fenced, held elsewhere.
TERMINAL_EXITS = (EXIT_DATAERR, EXIT_SOFTWARE, EXIT_FENCED, EXIT_HELD)
# Deaths by the unit's limits are not restarted either: the lease parks ``resource-limit`` instead, and
# the unit stays failed with its Result and status for the host to read (a restart would hide them).
RESOURCE_LIMIT_EXITS = (str(EXIT_OUT_OF_MEMORY), "SIGXCPU")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
_PROPERTY_PATH_RE = re.compile(r"/[^\s\x00-\x1f\x7f]*")

Scope = Literal["system", "user"]


def property_path(value: str | os.PathLike[str], field: str) -> str:
    """An absolute path fit for a ``-p Name=value`` property: no whitespace or control characters."""
    text = os.fspath(value)
    if type(text) is not str or _PROPERTY_PATH_RE.fullmatch(text) is None:
        raise not_plain(text, field) or InvalidInputError(
            field, f"{field} must be an absolute path without whitespace, got {shown(text)}")
    return text


def _account(value: str, field: str) -> str:
    """A user or group name (or numeric id) as User=/Group= takes it."""
    if type(value) is not str or _USER_RE.fullmatch(value) is None:
        raise not_plain(value, field) or InvalidInputError(
            field, f"{field} is not a user or group name: {shown(value)}")
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
    if type(unit) is not str or UNIT_SAFE.fullmatch(unit) is None:
        raise not_plain(unit, "unit") or InvalidInputError(
            "unit", f"unit name {shown(unit)} is not safe (1-200 of A-Z a-z 0-9 : _ . -)")
    argv_command = safe_command(command)
    safe_choice(scope, "scope", ("system", "user"))
    if scope == "system" and (user is None or group is None):
        raise InvalidInputError("user", "system scope needs the user and group the unit runs as "
                                        "(as root, name an unprivileged user)")
    if scope == "user" and (user is not None or group is not None):
        raise InvalidInputError("user", "a user manager runs units as its own user and refuses User=/Group=")
    if type(stop_timeout_ms) is not int or stop_timeout_ms < 0:
        raise InvalidInputError("stop_timeout_ms", f"stop_timeout_ms must be an integer >= 0, "
                                                   f"got {shown(stop_timeout_ms)}")
    text = description if description is not None else f"lifecycle-es unit {unit}"
    if type(text) is not str or any(ch in text for ch in "\0\n\r"):
        raise not_plain(text, "description") or InvalidInputError("description", "description must be one line of text")
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
        argv += ["-p", f"StandardInput=file:{property_path(token_file, 'token_file')}"]
    if log_file is not None:
        log = property_path(log_file, "log_file")
        argv += ["-p", f"StandardOutput=append:{log}", "-p", f"StandardError=append:{log}"]
    if exit_file is not None:
        # "$$" is a literal "$" for systemd's own expansion; "+" runs it with full privileges, so the
        # record lands in the host's run directory whatever user the unit runs as.
        target = property_path(exit_file, "exit_file")
        if any(ch in target for ch in "'\"\\$%`"):
            raise InvalidInputError("exit_file", f"exit_file must not hold quotes, $, %, ` or \\: {shown(target)}")
        argv += ["-p", f"ExecStopPost=+/bin/sh -c 'echo $$SERVICE_RESULT $$EXIT_CODE $$EXIT_STATUS > {target}'"]
    if work_dir is not None:
        argv.append(f"--working-directory={property_path(work_dir, 'work_dir')}")
    unit_env = {**safe_env(env), "PATH": SAFE_PATH, "LANG": "C.UTF-8"}
    argv += [f"--setenv={name}={value}" for name, value in unit_env.items()]
    return [*argv, "--", *argv_command]


def unit_name(lease_id: str, *, prefix: str, now_ms: int, salt: int) -> str:
    """A fresh unit name for a lease: prefix, the lease id (characters a unit name cannot hold become
    ``_``), then the time in base 36 and two base-36 digits of salt (names of one lease sort by time)."""
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


__all__ = [
    "RESOURCE_LIMIT_EXITS",
    "SYSTEMD_RUN",
    "TERMINAL_EXITS",
    "UNIT_SAFE",
    "Scope",
    "property_path",
    "systemd_run_argv",
    "unit_name",
]
