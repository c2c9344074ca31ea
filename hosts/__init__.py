"""Side effects: the local host driver's primitives (processes, systemd units, run dirs, parking).

Modules: `hosts.proc` (/proc, the boot, how a death reads, running a command), `hosts.driver` (the
`UnitDriver` protocol: what the host needs of a mode's units), `hosts.child` (child mode units;
`hosts.child_spawn` starts them under `hosts.supervisor`, each unit's parent and subreaper),
`hosts.systemd` (systemd mode units; `hosts.systemd_run` builds their argv and `hosts.systemd_show`
reads what systemd says of them), `hosts.rundir` (a lease's held run directory), `hosts.unitfiles`
(the host's proof of the units it started, and a unit's result read safely), `hosts.park` (parking
and drain decisions from a unit's task report), `hosts.reconcile` (the pass that converges the log
and the machine) and `hosts.local` (`LocalHost`). Each imports lifecycle_es for its errors and
values; lifecycle_es never imports hosts.
"""

from .child import ChildExit, ChildUnits, UnitEndRecord, read_end
from .driver import DriverOptions, UnitDriver, UnitEnd
from .park import (
    LOCAL_PARK_THRESHOLD_MS,
    STATUS_LIMIT,
    Busy,
    BusyState,
    Idle,
    StatusReport,
    Task,
    Waiting,
    busy_state,
    drain_state,
    parse_status,
    read_status,
    write_status,
)
from .proc import (
    EXIT_OUT_OF_MEMORY,
    SAFE_PATH,
    CommandResult,
    Exec,
    HostError,
    ProcStat,
    UnitFileError,
    UnitRunningError,
    UnitStartError,
    UnitStopError,
    UnprovenUnitError,
    current_boot_id,
    pid_alive,
    proc_start_ticks,
    proc_stat,
    resource_limit_death,
    run_command,
)
from .rundir import RunDir, RunDirHeldError, open_run_dir, safe_run_root
from .supervisor import END_FILE, kill_descendants
from .systemd import DEFAULT_TOKEN_DIR, SystemdUnits
from .systemd_run import TERMINAL_EXITS, UNIT_SAFE, systemd_run_argv, unit_name
from .systemd_show import UnitExit, parse_show, unit_exit, unit_status
from .unitfiles import (
    HANDLE_FILE,
    RESULT_ENV,
    RESULT_LIMIT,
    RUN_DIR_ENV,
    HandleProof,
    read_proof,
    result_digest,
    unproven,
    write_proof,
)

__all__ = [
    "DEFAULT_TOKEN_DIR",
    "END_FILE",
    "EXIT_OUT_OF_MEMORY",
    "HANDLE_FILE",
    "LOCAL_PARK_THRESHOLD_MS",
    "RESULT_ENV",
    "RESULT_LIMIT",
    "RUN_DIR_ENV",
    "SAFE_PATH",
    "STATUS_LIMIT",
    "TERMINAL_EXITS",
    "UNIT_SAFE",
    "Busy",
    "BusyState",
    "ChildExit",
    "ChildUnits",
    "CommandResult",
    "DriverOptions",
    "Exec",
    "HandleProof",
    "HostError",
    "Idle",
    "ProcStat",
    "RunDir",
    "RunDirHeldError",
    "StatusReport",
    "SystemdUnits",
    "Task",
    "UnitDriver",
    "UnitEnd",
    "UnitEndRecord",
    "UnitExit",
    "UnitFileError",
    "UnitRunningError",
    "UnitStartError",
    "UnitStopError",
    "UnprovenUnitError",
    "Waiting",
    "busy_state",
    "current_boot_id",
    "drain_state",
    "kill_descendants",
    "open_run_dir",
    "parse_show",
    "parse_status",
    "pid_alive",
    "proc_start_ticks",
    "proc_stat",
    "read_end",
    "read_proof",
    "read_status",
    "resource_limit_death",
    "result_digest",
    "run_command",
    "safe_run_root",
    "systemd_run_argv",
    "unit_exit",
    "unit_name",
    "unit_status",
    "unproven",
    "write_proof",
    "write_status",
]
