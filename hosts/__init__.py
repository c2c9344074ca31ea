"""Side effects: the local host driver's primitives (processes, systemd units, run dirs, parking).

Modules: `hosts.proc` (/proc, the boot, how a death reads, running a command), `hosts.child` (child
mode units), `hosts.systemd` (systemd mode units), `hosts.rundir` (a lease's held run directory) and
`hosts.park` (parking and drain decisions from a unit's task report). Each imports lifecycle_es for its
errors and values; lifecycle_es never imports hosts.
"""

from .child import ChildExit, ChildUnits
from .park import (
    LOCAL_PARK_THRESHOLD_MS,
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
    UnitStartError,
    UnitStopError,
    current_boot_id,
    pid_alive,
    proc_start_ticks,
    proc_stat,
    resource_limit_death,
    run_command,
)
from .rundir import RunDir, RunDirHeldError, open_run_dir
from .systemd import (
    DEFAULT_TOKEN_DIR,
    TERMINAL_EXITS,
    UNIT_SAFE,
    SystemdUnits,
    UnitExit,
    parse_show,
    systemd_run_argv,
    unit_exit,
    unit_name,
    unit_status,
)

__all__ = [
    "DEFAULT_TOKEN_DIR",
    "EXIT_OUT_OF_MEMORY",
    "LOCAL_PARK_THRESHOLD_MS",
    "SAFE_PATH",
    "TERMINAL_EXITS",
    "UNIT_SAFE",
    "Busy",
    "BusyState",
    "ChildExit",
    "ChildUnits",
    "CommandResult",
    "Exec",
    "HostError",
    "Idle",
    "ProcStat",
    "RunDir",
    "RunDirHeldError",
    "StatusReport",
    "SystemdUnits",
    "Task",
    "UnitExit",
    "UnitStartError",
    "UnitStopError",
    "Waiting",
    "busy_state",
    "current_boot_id",
    "drain_state",
    "open_run_dir",
    "parse_show",
    "parse_status",
    "pid_alive",
    "proc_start_ticks",
    "proc_stat",
    "read_status",
    "resource_limit_death",
    "run_command",
    "systemd_run_argv",
    "unit_exit",
    "unit_name",
    "unit_status",
    "write_status",
]
