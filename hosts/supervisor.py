"""The unit supervisor: the small process each child-mode unit runs under, its parent and subreaper.

    python -I -S hosts/supervisor.py CONFIG_JSON COMMAND...     # started by hosts.child_spawn, never by hand
    python -m hosts.supervisor CONFIG_JSON COMMAND...           # the same, where the package is importable

`hosts.child_spawn` starts it in a new session (it leads its session and process group) with the
unit's environment, stdin the pipe the token comes down, stdout and stderr the unit log, and fd 3 the
host's exec-report pipe. CONFIG_JSON holds nothing secret (``run_dir``, ``work_dir``, ``host``,
``boot_id``, ``cpu_seconds``, ``memory_bytes``, ``cgroup``); the token is never in argv or the
environment: the supervisor never reads its stdin, the unit inherits it and reads the token there.
It imports only the standard library (it runs isolated, ``-I -S``: no site packages, no PYTHON*
variables), so it starts fast and nothing installed can change it. What it does:

1. ``prctl(PR_SET_CHILD_SUBREAPER)``: every process the unit starts and orphans (a ``setsid`` daemon
   included) is re-parented to the supervisor, not to init, so it stays a descendant it can find.
2. Writes ``unit.pid`` (its own pid and start ticks, boot, host, the unit's argv) for a host that dies
   before it records the start, and removes an earlier unit's ``unit.end``.
3. Where cgroup v2 is mounted and its own cgroup is writable (and ``cgroup`` is true), makes a cgroup
   for the unit (``les-unit-<pid>-<ticks>`` under its own): ``cgroup.kill`` ends the unit's every
   process, and with the memory controller there ``memory.max`` = ``memory_bytes`` (swap 0,
   ``memory.oom.group`` 1) replaces the address-space rlimit, so the kernel's OOM kill enforces it
   and ``memory.events`` says it happened. Anything refused on the way: no cgroup, the rlimit stays.
4. Forks the unit: its own process group, the cgroup, rlimits (``RLIMIT_CORE`` 0, ``RLIMIT_CPU``
   ``cpu_seconds`` soft and one more hard, ``RLIMIT_AS`` ``memory_bytes`` unless the cgroup holds
   memory), the work directory, exec. A failed step is reported on fd 3 (``<step>: <reason>``) and the
   supervisor exits 127 having taken its pid file back; a successful exec closes fd 3 (EOF).
   The unit's parent-death signal is SIGKILL: a supervisor killed outright takes its unit with it.
5. Relays SIGTERM, SIGINT and SIGHUP to the unit's process group and to every other live descendant.
6. When the unit's main process ends, kills (SIGKILL, and ``cgroup.kill``) whatever it left running,
   reaps it all, removes the cgroup, and writes ``unit.end`` into the run directory atomically
   (temporary file, fsync, rename, directory fsync): supervisor pid, start ticks and boot (whose end
   it is), the unit's exit code or signal number, CPU used, the CPU limit, and whether the cgroup saw
   an OOM kill. Then it exits 0. A host that is not its parent (restarted, or another) finds the
   supervisor gone and the record there, and settles the unit's end as its parent would have.

A stop (`hosts.child.ChildUnits.stop`): SIGTERM to the supervisor (relayed), then, past the timeout,
SIGKILL to every descendant of the supervisor (`kill_descendants`, which the host calls too); the
supervisor then records the end as above. The host reads ``unit.end`` as hostile input
(`hosts.child.read_end`): no link, a regular file, bounded, and naming the supervisor of the handle.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import sys
import time
from typing import Any

PID_FILE = "unit.pid"
END_FILE = "unit.end"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
REPORT_FD = 3
# How long the supervisor waits for what the unit left behind to die after SIGKILL before it records the end.
_CLEANUP_S = 10.0
_unit_pid = 0
_exec_reported = False  # fd 3 closed: from here on the host holds a started unit


def _stat(pid: int | str) -> tuple[bytes, int, int, int] | None:
    """(state, ppid, pgrp, start ticks) of a process from ``/proc/<pid>/stat``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return rest[0], int(rest[1]), int(rest[2]), int(rest[19])
    except (IndexError, ValueError):
        return None


def descendants(root: int) -> list[tuple[int, int, int]]:
    """The live (not zombie) descendants of `root` as (pid, start ticks, process group), from /proc."""
    children: dict[int, list[int]] = {}
    seen: dict[int, tuple[bytes, int, int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(name)) is not None:
            seen[int(name)] = stat
            children.setdefault(stat[1], []).append(int(name))
    found: list[tuple[int, int, int]] = []
    todo = [root]
    while todo:
        for kid in children.get(todo.pop(), ()):
            todo.append(kid)
            state, _, pgrp, ticks = seen[kid]
            if state not in (b"Z", b"X"):
                found.append((kid, ticks, pgrp))
    return found


def signal_exact(pid: int, ticks: int, signum: int) -> bool:
    """Send `signum` to `pid` only if it is still the process that started at `ticks` (a pidfd pins it)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            return False  # gone already
        stat = _stat(pid)  # a kernel before 5.3: check, then signal by pid (a reuse in between is the risk left)
        if stat is None or stat[3] != ticks:
            return False
        with contextlib.suppress(OSError):
            os.kill(pid, signum)
            return True
        return False
    try:
        stat = _stat(pid)
        if stat is None or stat[3] != ticks:
            return False  # the pid was reused between the scan and the open
        signal.pidfd_send_signal(fd, signum)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def kill_descendants(root: int, signum: int = signal.SIGKILL, *, skip_group: int = 0) -> int:
    """Send `signum` to every live descendant of `root` (one scan; members of `skip_group` left out).

    Returns how many were signalled. Safe against pid reuse (`signal_exact`).
    """
    return sum(signal_exact(pid, ticks, signum) for pid, ticks, pgrp in descendants(root) if pgrp != skip_group)


# --- cgroup v2 ---------------------------------------------------------------------------------------


def own_cgroup() -> str | None:
    """The directory of this process's cgroup v2, or None where there is no v2 hierarchy."""
    mount = None
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"] and left.split()[3] == "/":
                mount = left.split()[4].replace("\\040", " ")
                break
    if mount is None:
        return None
    with contextlib.suppress(OSError), open("/proc/self/cgroup", encoding="utf-8", errors="replace") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and controllers == "" and path.startswith("/") and "/../" not in path + "/":
                return os.path.normpath(mount + path)
    return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read(65536)


def make_cgroup(name: str, memory_bytes: int) -> tuple[str | None, bool]:
    """(the unit's new cgroup, whether it enforces `memory_bytes`); (None, False) where one cannot be made."""
    parent = own_cgroup()
    if parent is None:
        return None, False
    path = f"{parent}/{name}"
    try:
        os.mkdir(path, 0o755)
    except OSError:
        return None, False
    if not os.path.exists(f"{path}/cgroup.kill"):
        remove_cgroup(path)  # a kernel before 5.14: no cgroup.kill, nothing to gain over the walk
        return None, False
    memory = False
    with contextlib.suppress(OSError):
        if "memory" not in _read(f"{parent}/cgroup.subtree_control").split():
            _write(f"{parent}/cgroup.subtree_control", "+memory")
    with contextlib.suppress(OSError):
        _write(f"{path}/memory.max", str(memory_bytes))
        memory = True
        for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            with contextlib.suppress(OSError):
                _write(f"{path}/{knob}", value)
    return path, memory


def oom_killed(path: str | None) -> bool:
    """Whether the cgroup's memory controller killed something for ``memory.max``."""
    if path is None:
        return False
    with contextlib.suppress(OSError, ValueError):
        for line in _read(f"{path}/memory.events").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and int(value) > 0:
                return True
    return False


def remove_cgroup(path: str | None) -> None:
    """Remove the unit's cgroup once its processes are gone (a few tries: the kernel frees it lazily)."""
    if path is None:
        return
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


# --- the supervisor ----------------------------------------------------------------------------------


def _relay(signum: int, _frame: object) -> None:
    if _unit_pid:
        with contextlib.suppress(OSError):
            os.killpg(_unit_pid, signum)
        kill_descendants(os.getpid(), signum, skip_group=_unit_pid)


def _atomic_write(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _lower(kind: int, soft: int, hard: int) -> None:
    _, old_hard = resource.getrlimit(kind)
    if old_hard != resource.RLIM_INFINITY:
        hard = min(hard, old_hard)
    resource.setrlimit(kind, (min(soft, hard), hard))


def _unit(command: list[str], config: dict[str, Any], cgroup: str | None, memory_in_cgroup: bool,
          report_w: int, supervisor: int) -> None:
    """In the forked child: become the unit (never returns)."""
    stage = "setup"
    try:
        for signum in (*RELAYED, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)  # Python ignores SIGPIPE and SIGXFSZ; the unit must not
        # A supervisor killed outright (SIGKILL) takes its unit with it, rather than leave it to init.
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        if os.getppid() != supervisor:
            os._exit(127)  # it died before the line above
        os.setpgid(0, 0)
        if cgroup is not None:
            stage = "cgroup"
            _write(f"{cgroup}/cgroup.procs", "0")
        stage = "rlimit"
        cpu, mem = int(config["cpu_seconds"]), int(config["memory_bytes"])
        _lower(resource.RLIMIT_CORE, 0, 0)
        _lower(resource.RLIMIT_CPU, cpu, cpu + 1)
        if not memory_in_cgroup:
            _lower(resource.RLIMIT_AS, mem, mem)
        stage = "chdir"
        os.chdir(str(config["work_dir"]))
        stage = "exec"
        os.execvp(command[0], command)
    except BaseException as exc:
        reason = exc.strerror if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(BaseException):
            os.write(report_w, f"{stage}: {reason}".encode())
    finally:
        os._exit(127)


def _fail(report: bytes, pid_file: str | None) -> int:
    if pid_file is not None:
        with contextlib.suppress(OSError):
            os.unlink(pid_file)
    with contextlib.suppress(OSError):
        os.write(REPORT_FD, report)
    return 127


def _reap_all(cgroup: str | None) -> None:
    """Kill and reap everything the unit left behind, within `_CLEANUP_S`."""
    deadline = time.monotonic() + _CLEANUP_S
    while time.monotonic() < deadline:
        if cgroup is not None:
            with contextlib.suppress(OSError):
                _write(f"{cgroup}/cgroup.kill", "1")
        kill_descendants(os.getpid())
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            if not descendants(os.getpid()):
                return
        time.sleep(0.01)


def main(argv: list[str]) -> int:
    """Run the unit `argv[2:]` as `argv[1]` (the config JSON) says; the supervisor's exit code.

    Anything that goes wrong before the unit's exec is reported on fd 3, so the host never takes a
    supervisor that failed for a started unit.
    """
    try:
        config = json.loads(argv[1])
        command = argv[2:]
        if not isinstance(config, dict) or not command:
            raise ValueError("usage: supervisor.py CONFIG_JSON COMMAND...")
    except (IndexError, ValueError) as exc:
        return _fail(f"supervisor: {exc}".encode(), None)
    try:
        return _supervise(config, command)
    except Exception as exc:
        if _exec_reported:
            raise  # the unit ran: the traceback goes to the unit log, and no unit.end says its end is unknown
        return _fail(f"supervisor: {type(exc).__name__}: {exc}".encode(),
                     os.path.join(str(config.get("run_dir", "")), PID_FILE))


def _supervise(config: dict[str, Any], command: list[str]) -> int:
    global _unit_pid, _exec_reported
    run_dir = str(config["run_dir"])
    pid_file, end_file = os.path.join(run_dir, PID_FILE), os.path.join(run_dir, END_FILE)
    os.set_inheritable(REPORT_FD, False)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return _fail(f"subreaper: {os.strerror(ctypes.get_errno())}".encode(), pid_file)
    me = os.getpid()
    stat = _stat(me)
    ticks = stat[3] if stat is not None else 0
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(end_file)
        record = {"pid": me, "start_ticks": ticks, "boot_id": config["boot_id"], "host": config["host"],
                  "argv": command}
        _atomic_write(pid_file, json.dumps(record).encode())
    except OSError as exc:
        return _fail(f"pid file: {exc.strerror}".encode(), pid_file)
    cgroup, memory = (make_cgroup(f"les-unit-{me}-{ticks}", int(config["memory_bytes"]))
                      if config.get("cgroup") else (None, False))
    for signum in RELAYED:
        signal.signal(signum, _relay)
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _unit(command, config, cgroup, memory, report_w, me)
    _unit_pid = pid
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also done by the child: whichever runs first, the group exists for the relay
    os.close(report_w)
    failure = b""
    while chunk := os.read(report_r, 4096):
        failure += chunk
    os.close(report_r)
    if failure:
        os.waitpid(pid, 0)
        remove_cgroup(cgroup)
        return _fail(failure, pid_file)
    os.close(REPORT_FD)  # the exec happened: the host reads EOF
    _exec_reported = True
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the unit holds the token pipe; the supervisor lets go of it
    os.close(null)
    while True:
        reaped, status, usage = os.wait4(-1, 0)
        if reaped == pid:
            break
    _reap_all(cgroup)
    oom = oom_killed(cgroup)
    remove_cgroup(cgroup)
    end = {"supervisor_pid": me, "start_ticks": ticks, "boot_id": config["boot_id"], "unit_pid": pid,
           "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
           "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
           "cpu_ms": int((usage.ru_utime + usage.ru_stime) * 1000), "cpu_seconds": int(config["cpu_seconds"]),
           "oom_kill": oom}
    _atomic_write(end_file, json.dumps(end).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
