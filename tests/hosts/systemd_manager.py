"""A real, private systemd user manager for tests, on a machine whose PID 1 is not systemd.

The recipe (root, a cgroup v1 hybrid with the unified hierarchy at /sys/fs/cgroup/unified):

1. ``unshare --mount --propagation private`` gives the manager its own mount namespace, where
   ``/run`` becomes a fresh tmpfs holding ``/run/systemd/system`` (all systemd checks to believe it
   was booted with systemd). Nothing of that is seen outside the namespace.
2. The manager is moved into its own cgroup, ``<name>`` under both ``/sys/fs/cgroup/unified`` and
   ``/sys/fs/cgroup/systemd``, so its units' cgroups are its own and can be killed and removed.
3. It runs as ``XDG_RUNTIME_DIR=/run SYSTEMD_UNIT_PATH=<dir> /lib/systemd/systemd --user`` with a clean
   environment, where ``<dir>`` holds stub ``default.target`` and ``basic.target`` and copies of
   ``app.slice``, ``exit.target``, ``shutdown.target`` and ``systemd-exit.service``. It is up in about
   0.1 s and listens on ``/run/systemd/private`` in its namespace.
4. Commands reach it from inside the namespace: `exec` wraps argv as ``nsenter --target <manager pid>
   --mount -- ...`` with ``XDG_RUNTIME_DIR=/run``, so ``systemctl --user`` and ``systemd-run --user``
   find it. A user manager refuses ``User=``, hence ``SystemdUnits(scope="user", exec=manager.exec)``.

Teardown: SIGTERM (the manager starts exit.target and exits), SIGKILL if it lingers, SIGKILL every
process left in its cgroups, then remove the cgroups deepest first. `leftovers()` says what is left
(processes, cgroups, the namespace's mounts seen from outside); the fixture fails a test run that
leaves anything.

Use from a test file (the fixture is module-scoped: one manager per test module that imports it)::

    from systemd_manager import systemd_manager  # noqa: F401  (a pytest fixture)

    @pytest.mark.systemd
    def test_x(systemd_manager: SystemdUserManager) -> None:
        units = SystemdUnits(scope="user", exec=systemd_manager.exec, token_dir=...)

Where it cannot run (not Linux, not root, no unshare/nsenter/systemd, another cgroup layout) the
fixture skips with the reason (`unavailable_reason`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import pytest

from hosts.proc import CommandResult, run_command

SYSTEMD = "/lib/systemd/systemd"
USER_UNITS = Path("/usr/lib/systemd/user")
COPIED_UNITS = ("app.slice", "exit.target", "shutdown.target", "systemd-exit.service")
CGROUP_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0

# Runs inside the new mount namespace; $1 the cgroup name. exec keeps the pid: the manager is it.
_NAMESPACE_SCRIPT = """\
set -e
mount -n -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/systemd/system
for root in /sys/fs/cgroup/unified /sys/fs/cgroup/systemd; do
    mkdir "$root/$1"
    echo $$ > "$root/$1/cgroup.procs"
done
exec /lib/systemd/systemd --user
"""


def unavailable_reason() -> str | None:
    """Why a private user manager cannot run here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "systemd tests need Linux"
    if os.geteuid() != 0:
        return "systemd tests need root (unshare --mount, cgroups)"
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"systemd tests need {tool} (util-linux)"
    if not os.access(SYSTEMD, os.X_OK) or shutil.which("systemctl") is None or shutil.which("systemd-run") is None:
        return f"systemd tests need {SYSTEMD}, systemctl and systemd-run"
    missing = [name for name in COPIED_UNITS if not (USER_UNITS / name).exists()]
    if missing:
        return f"systemd tests need the user units {', '.join(missing)} in {USER_UNITS}"
    for root in CGROUP_ROOTS:
        if not (root / "cgroup.procs").exists():
            return f"systemd tests need the cgroup v1 hybrid layout ({root} is missing)"
    return None


def _mounts() -> set[str]:
    """This namespace's mount table (mount point and source), to prove teardown left it as it was."""
    with open("/proc/self/mountinfo") as f:
        return {" ".join(line.split()[3:5]) for line in f}


class SystemdUserManager:
    """One private systemd user manager: `start`, `exec` commands against it, `stop` it.

    `workdir` is a directory of the test's (unit files and the manager's log go there).
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.name = f"lifecycle-es-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.unit_dir = workdir / "units"
        self.log_path = workdir / "manager.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._mounts_before = _mounts()

    @property
    def pid(self) -> int:
        """The manager's pid (also the pid whose mount namespace commands enter)."""
        if self.proc is None:
            raise RuntimeError("the manager is not started")
        return self.proc.pid

    def cgroups(self) -> list[Path]:
        """The manager's cgroup directories in both hierarchies, deepest first."""
        found: list[Path] = []
        for root in CGROUP_ROOTS:
            top = root / self.name
            if top.is_dir():
                found += sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
        return found

    def cgroup_pids(self) -> set[int]:
        """Every process still in one of the manager's cgroups."""
        pids: set[int] = set()
        for cgroup in self.cgroups():
            with contextlib.suppress(OSError):
                pids |= {int(x) for x in (cgroup / "cgroup.procs").read_text().split()}
        return pids

    def _write_units(self) -> None:
        self.unit_dir.mkdir(parents=True, exist_ok=True)
        (self.unit_dir / "default.target").write_text("[Unit]\nDescription=Private test manager default\n")
        (self.unit_dir / "basic.target").write_text("[Unit]\nDescription=Private test manager basic\n")
        for name in COPIED_UNITS:
            shutil.copyfile(USER_UNITS / name, self.unit_dir / name)

    def start(self) -> None:
        """Start the manager and wait until it answers; raise with its log if it does not."""
        self._write_units()
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
               "HOME": "/root", "XDG_RUNTIME_DIR": "/run", "SYSTEMD_UNIT_PATH": str(self.unit_dir),
               # Its log goes to stderr (our log file), not to /dev/console.
               "SYSTEMD_LOG_TARGET": "console", "SYSTEMD_LOG_LEVEL": "info"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _NAMESPACE_SCRIPT,
                 "sh", self.name], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            state = self.exec(["systemctl", "--user", "is-system-running"], timeout_ms=5_000)
            if state.stdout.strip() in ("running", "degraded"):
                return
            if self.proc.poll() is not None or time.monotonic() >= deadline:
                log_text = self.log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"the private systemd user manager did not come up ({state.stdout.strip()!r} "
                                   f"{state.last_line()!r}); its log:\n{log_text}")
            time.sleep(0.02)

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_ms: int = 30_000) -> CommandResult:
        """Run `argv` in the manager's mount namespace (hosts.systemd's Exec seam)."""
        wrapped = ["nsenter", f"--target={self.pid}", "--mount", "--", *argv]
        return run_command(wrapped, input=input, timeout_ms=timeout_ms, env={"XDG_RUNTIME_DIR": "/run"})

    def stop(self) -> None:
        """Stop the manager and everything it ran, and remove its cgroups."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self.cgroups() and time.monotonic() < deadline:
            for pid in self.cgroup_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for cgroup in self.cgroups():
                with contextlib.suppress(OSError):
                    cgroup.rmdir()  # busy until its processes are gone: tried again next round
            time.sleep(0.02)

    def leftovers(self) -> list[str]:
        """What this manager left on the machine: processes, cgroups, mounts. Empty when clean."""
        left = [f"cgroup {c}" for c in self.cgroups()]
        if self.proc is not None and self.proc.poll() is None:
            left.append(f"manager process {self.proc.pid}")
        left += [f"mount {m}" for m in sorted(_mounts() - self._mounts_before)]
        return left

    def __enter__(self) -> SystemdUserManager:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@pytest.fixture(scope="module")
def systemd_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdUserManager]:
    """A started private systemd user manager; skips where one cannot run, fails if it leaves anything."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    manager = SystemdUserManager(tmp_path_factory.mktemp("systemd"))
    with manager:
        yield manager
    left = manager.leftovers()
    if left:
        pytest.fail(f"the private systemd manager left: {', '.join(left)}")
