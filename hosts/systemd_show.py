"""What ``systemctl show`` and a unit's exit record say about a systemd unit: pure parsing.

    show = parse_show(systemctl_show_output)
    unit_status(show)                    # "running", "stopped", "failed", "gone" or "unknown"
    unit_exit(show)                      # how the main process last ended, or None
    read_exit_record(run_dir / "unit.exit")

`unit_status` maps a unit's state to a host status (loaded and active or activating is ``running``,
``inactive`` is ``stopped``, ``failed`` is ``failed``, not loaded is ``gone``). `unit_exit` reads how the
main process last ended, ``Result=`` included, and whether that was a death by the unit's limits
(``Result=oom-kill``, SIGXCPU, or the out-of-memory exit of `hosts.proc`). A transient unit that exits
cleanly is garbage-collected at once; the record its ``ExecStopPost`` wrote (`read_exit_record`, read
as a file the unit's user may control) is then the only account of how it ended.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

import msgspec

from lifecycle_es.files import read_regular

from .proc import resource_limit_death, signal_name
from .rundir import EXIT_FILE

SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainCode", "MainPID")
# ExecMainCode is the waitid() si_code of the main process: exited, killed, dumped core.
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3


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
    """How a unit ended, from the record its ``ExecStopPost`` wrote, or None.

    The record is ``$SERVICE_RESULT $EXIT_CODE $EXIT_STATUS`` (see `hosts.systemd_run.systemd_run_argv`).
    """
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


__all__ = ["SHOW_PROPERTIES", "UnitExit", "parse_show", "read_exit_record", "unit_exit", "unit_status"]
