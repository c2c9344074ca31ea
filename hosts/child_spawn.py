"""Spawning a child-mode unit: its supervisor, the unit's exec report, and the token on stdin.

    pid = spawn_unit(argv, cpu_seconds=60, memory_bytes=GIB, work_dir=run_dir / "work", run_dir=run_dir,
                     host=host, boot_id=boot, env=env, log_path=run_dir / "unit.log", token=b"secret")

The host spawns the unit's supervisor (`hosts.supervisor`: this interpreter, isolated, ``-I -S``) with
``setsid``, the given environment, stdin a pipe, stdout and stderr appended to the unit log (0600,
opened without following a link or waiting on a FIFO), and fd 3 a report pipe. The supervisor writes
the pid file (its pid and start ticks, boot id, host and the unit's argv: `hosts.child.ChildUnits.find`
reads it back, for a host that crashed before it recorded the start), forks the unit, which sets its
rlimits, changes into the work directory and execs the command. A step that fails is reported through
the pipe, so a command that cannot run fails the spawn rather than leaving the pid of a dead process;
the unit's exec closes it. The supervisor, not ``preexec_fn``, sets the limits because ``preexec_fn``
is not safe in a host that runs threads.

The token is written to the stdin pipe, which is then closed: the supervisor never reads it, the unit
inherits the pipe and reads it to EOF. It is never in argv, the environment or a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import sys
import time
from pathlib import Path
from stat import S_ISREG

from .proc import UnitStartError
from .supervisor import kill_descendants

# The supervisor runs as a script, isolated (no site packages, no PYTHON* variables): it imports only
# the standard library, and nothing installed or set in the environment changes what it does.
SUPERVISOR = Path(__file__).with_name("supervisor.py")
# Descriptors handed to posix_spawn are moved at or above this, so no dup2 onto 0..3 clobbers a source.
_HIGH_FD = 10
_EXEC_REPORT_TIMEOUT_S = 30.0
_TOKEN_TIMEOUT_S = 30.0


def spawn_unit(argv: list[str], *, cpu_seconds: int, memory_bytes: int, work_dir: Path, run_dir: Path, host: str,
               boot_id: str, env: dict[str, str], log_path: Path, token: bytes, cgroup: bool = True) -> int:
    """posix_spawn the supervisor of `argv` in a new session, wait for the unit's exec, hand the unit
    `token`; return the supervisor's pid.

    The caller is the supervisor's parent and reaps it. Raises `UnitStartError` when the log cannot be
    opened, the supervisor cannot be spawned, the command cannot be run (the supervisor's report says
    why) or the token was not taken in time: nothing is left running then.
    """
    config = {"run_dir": str(run_dir), "work_dir": str(work_dir), "host": host, "boot_id": boot_id,
              "cpu_seconds": cpu_seconds, "memory_bytes": memory_bytes, "cgroup": cgroup}
    supervisor = [sys.executable, "-I", "-S", str(SUPERVISOR), json.dumps(config), *argv]
    name = argv[0]
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
            pid = os.posix_spawn(supervisor[0], supervisor, env, setsid=True, file_actions=[
                (os.POSIX_SPAWN_DUP2, stdin_r, 0), (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2), (os.POSIX_SPAWN_DUP2, report_w, 3),
            ])
        except OSError as exc:
            raise UnitStartError(f"cannot start the unit supervisor {supervisor[0]!r}: {exc.strerror}") from exc
        for fd in (stdin_r, report_w, log_fd):
            opened.remove(fd)
            os.close(fd)
        failure = _exec_report(report_r, pid)
        if failure is not None:
            os.waitpid(pid, 0)
            raise UnitStartError(f"cannot run {name!r}: {failure}")
        if not hand_token(stdin_w, token):
            kill_descendants(pid)
            os.kill(pid, signal.SIGKILL)
            kill_descendants(pid)
            os.waitpid(pid, 0)
            raise UnitStartError(f"{name!r} did not read its token within {_TOKEN_TIMEOUT_S:.0f} s")
        return pid
    finally:
        for fd in opened:
            with contextlib.suppress(OSError):
                os.close(fd)


def hand_token(stdin_w: int, token: bytes) -> bool:
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


def _exec_report(report_r: int, pid: int) -> str | None:
    """What the supervisor wrote before exiting, or None once the unit's exec let it close the pipe (EOF)."""
    deadline = time.monotonic() + _EXEC_REPORT_TIMEOUT_S
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([report_r], [], [], max(0.0, left))
        if not ready:
            # A supervisor whose unit neither execs nor fails is stuck: end both rather than hand out its pid.
            kill_descendants(pid)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "the unit did not exec in time"
        chunk = os.read(report_r, 4096)
        if not chunk:
            return b"".join(chunks).decode("utf-8", "replace") if chunks else None
        chunks.append(chunk)


__all__ = ["hand_token", "spawn_unit"]
