"""Spawning a child-mode unit: a wrapper between spawn and exec, its exec report, and the token on stdin.

    pid = spawn_unit(argv, cpu_seconds=60, memory_bytes=GIB, work_dir=run_dir / "work",
                     pid_file=run_dir / "unit.pid", host=host, boot_id=boot, env=env,
                     log_path=run_dir / "unit.log", token=b"secret")

The host spawns a tiny wrapper (this interpreter, isolated: ``-I -S``) with ``setsid``, the given
environment, stdin a pipe, stdout and stderr appended to the unit log (0600, opened without following a
link or waiting on a FIFO). The wrapper writes the pid file (pid, start ticks, boot id, host and argv:
`hosts.child.ChildUnits.find` reads it back, for a host that crashed before it recorded the start),
sets the rlimits (``RLIMIT_CPU`` soft ``cpu_seconds``, hard one more; ``RLIMIT_AS`` ``memory_bytes``;
``RLIMIT_CORE`` 0, so a SIGXCPU death writes no core into the work dir), changes into the work directory
and execs the command: same pid, same start ticks, so the handle names the unit itself. The wrapper
reports a failed exec through a close-on-exec pipe, so a command that cannot run fails the spawn rather
than leaving a pid of a dead process. The wrapper, not ``preexec_fn``, sets the limits because
``preexec_fn`` is not safe in a host that runs threads.

The token is written to the stdin pipe, which is then closed: the unit reads it to EOF. It is never
in argv, the environment or a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import sys
import time
from pathlib import Path
from stat import S_ISREG

from .proc import UnitStartError

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


def spawn_unit(argv: list[str], *, cpu_seconds: int, memory_bytes: int, work_dir: Path, pid_file: Path, host: str,
               boot_id: str, env: dict[str, str], log_path: Path, token: bytes) -> int:
    """posix_spawn the wrapper of `argv` in a new session, wait for its exec, hand it `token`; return the pid.

    The caller is the unit's parent and must reap it. Raises `UnitStartError` when the log cannot be
    opened, the wrapper cannot be spawned, the command cannot be run (the wrapper's report says why) or
    the token was not taken in time: nothing is left running then.
    """
    wrapper = [sys.executable, "-I", "-S", "-c", _WRAPPER, str(cpu_seconds), str(memory_bytes), str(work_dir),
               str(pid_file), host, boot_id, *argv]
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
            pid = os.posix_spawn(wrapper[0], wrapper, env, setsid=True, file_actions=[
                (os.POSIX_SPAWN_DUP2, stdin_r, 0), (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2), (os.POSIX_SPAWN_DUP2, report_w, 3),
            ])
        except OSError as exc:
            raise UnitStartError(f"cannot start the unit wrapper {wrapper[0]!r}: {exc.strerror}") from exc
        for fd in (stdin_r, report_w, log_fd):
            opened.remove(fd)
            os.close(fd)
        failure = _exec_report(report_r, pid)
        if failure is not None:
            os.waitpid(pid, 0)
            raise UnitStartError(f"cannot run {name!r}: {failure}")
        if not hand_token(stdin_w, token):
            os.killpg(pid, signal.SIGKILL)
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
    """What the wrapper wrote before dying, or None once its exec closed the pipe (EOF)."""
    deadline = time.monotonic() + _EXEC_REPORT_TIMEOUT_S
    chunks: list[bytes] = []
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


__all__ = ["hand_token", "spawn_unit"]
