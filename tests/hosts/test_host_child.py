"""hosts.child against real processes: start, token on stdin, status, stop, pid reuse, zombies, rlimits."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from waiting import returns_within, wait_for

import hosts.child_spawn as spawn_module
from hosts.child import ChildUnits
from hosts.proc import EXIT_OUT_OF_MEMORY, SAFE_PATH, UnitStartError, pid_alive, proc_stat
from hosts.rundir import RunDir
from lifecycle_es.errors import InvalidInputError
from lifecycle_es.events import UnitRecord
from lifecycle_es.values import GIB, MIB, Resources

TOKEN = "tok-3f9a1c77e2b84d05-secret"
ROOMY = Resources(cpu_seconds=600, memory_bytes=2 * GIB)

# Reads its token from stdin, reports what it saw as JSON in the work dir, then sleeps.
REPORTER = """\
import hashlib, json, os, sys, time
token = sys.stdin.buffer.read()
with open("report.json", "w") as f:
    json.dump({"sha": hashlib.sha256(token).hexdigest(), "env": dict(os.environ), "cwd": os.getcwd(),
               "pgid": os.getpgrp(), "sid": os.getsid(0), "pid": os.getpid(), "ppid": os.getppid()}, f)
print("reported", flush=True)
time.sleep(120)
"""


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def read_report(run: RunDir) -> dict:
    path = run.work / "report.json"
    assert wait_for(lambda: path.exists() and path.stat().st_size > 0)
    assert wait_for(lambda: b"reported" in run.log_path.read_bytes())
    return json.loads(path.read_text())


def test_start_hands_the_token_on_stdin_only_and_status_stop_reap(units: ChildUnits, run: RunDir) -> None:
    handle = units.start(py(REPORTER), run_dir=run.path, token=TOKEN, resources=ROOMY, env={"UNIT_EXTRA": "1"})
    assert handle.mode == "child" and handle.host == units.host_name and handle.boot_id == units.boot_id
    assert handle.run_dir == str(run.path) and isinstance(handle.start_ticks, int)
    report = read_report(run)
    assert report["sha"] == hashlib.sha256(TOKEN.encode()).hexdigest()  # the unit read it from stdin
    # The handle names the supervisor: it leads the session, the unit is its child in a group of its own.
    assert report["sid"] == report["ppid"] == handle.pid and report["pid"] == report["pgid"] != handle.pid
    assert report["cwd"] == str(run.work)
    assert report["env"]["PATH"] == SAFE_PATH and report["env"]["LANG"] == "C.UTF-8"
    assert set(report["env"]) <= {"PATH", "LANG", "HOME", "UNIT_EXTRA", "LC_CTYPE"}
    # The real process: the token is in neither its argv nor its environment; the log is 0600.
    for pid in (handle.pid, report["pid"]):
        for name in ("cmdline", "environ"):
            assert TOKEN.encode() not in Path(f"/proc/{pid}/{name}").read_bytes()
    assert stat.S_IMODE(run.log_path.stat().st_mode) == 0o600
    assert units.find(run.path) == handle  # what a host that crashed before recording it finds
    assert units.status(handle) == "running"

    assert units.stop(handle) == ("SIGTERM",)
    assert not pid_alive(handle.pid, handle.start_ticks)
    assert units.status(handle) == "stopped"  # the supervisor recorded the unit's end before it exited
    ended = units.reap(handle)
    assert ended is not None and ended.signal == "SIGTERM" and ended.code is None and not ended.resource_limit
    assert units.status(handle) == "stopped"
    assert units.reap(handle) == ended
    assert units.stop(handle) == ()  # nothing left to signal


def test_a_unit_that_ignores_sigterm_gets_sigkill(units: ChildUnits, run: RunDir) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('armed', flush=True); " \
           "time.sleep(120)"
    handle = units.start(py(code), run_dir=run.path, token=b"t", resources=ROOMY)
    assert wait_for(lambda: b"armed" in run.log_path.read_bytes())
    assert units.stop(handle, timeout_ms=200) == ("SIGTERM", "SIGKILL")
    ended = units.reap(handle, timeout_ms=5_000)
    assert ended is not None and ended.signal == "SIGKILL"


def spawn_grandchild(setsid: bool) -> str:
    """A unit that starts a grandchild (in its group, or in a new session), writes its pid, and sleeps."""
    return ("import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            f"start_new_session={setsid})\n"
            "open('grandchild.pid', 'w').write(str(g.pid))\n"
            "time.sleep(120)\n")


def grandchild_of(run: RunDir) -> int:
    path = run.work / "grandchild.pid"
    assert wait_for(lambda: path.exists() and path.read_text().strip())
    return int(path.read_text())


def test_stop_kills_the_whole_group(units: ChildUnits, run: RunDir) -> None:
    handle = units.start(py(spawn_grandchild(setsid=False)), run_dir=run.path, token=TOKEN, resources=ROOMY)
    grandchild = grandchild_of(run)
    ticks = proc_stat(grandchild).start_ticks  # type: ignore[union-attr]
    assert units.stop(handle) == ("SIGTERM",)
    assert wait_for(lambda: not pid_alive(grandchild, ticks))


@pytest.mark.parametrize("cgroup", [False, True], ids=["process-tree", "cgroup-if-writable"])
def test_stop_kills_a_setsid_grandchild(run: RunDir, cgroup: bool) -> None:
    # A grandchild in a session of its own is out of the unit's group, but the supervisor is its subreaper.
    units = ChildUnits(stop_timeout_ms=5_000, poll_ms=10, cgroup=cgroup)
    handle = units.start(py(spawn_grandchild(setsid=True)), run_dir=run.path, token=TOKEN, resources=ROOMY)
    grandchild = grandchild_of(run)
    ticks = proc_stat(grandchild).start_ticks  # type: ignore[union-attr]
    try:
        assert os.getsid(grandchild) == grandchild != os.getsid(handle.pid)
        assert units.stop(handle) == ("SIGTERM",)
        assert not pid_alive(handle.pid, handle.start_ticks)
        assert not pid_alive(grandchild, ticks)
        ended = units.reap(handle)
        assert ended is not None and ended.signal == "SIGTERM"
    finally:
        if pid_alive(grandchild, ticks):
            os.kill(grandchild, signal.SIGKILL)


def test_a_unit_s_leftovers_are_killed_when_it_ends(units: ChildUnits, run: RunDir) -> None:
    # The unit exits at once; its grandchild (orphaned, re-parented to the supervisor) would run on.
    # It waits for the test's go, so the grandchild is seen alive before the unit ends.
    code = "import os, subprocess, sys, time\n" \
           "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n" \
           "open('grandchild.pid', 'w').write(str(g.pid))\n" \
           "while not os.path.exists('go'): time.sleep(0.01)\n"
    handle = units.start(py(code), run_dir=run.path, token=TOKEN, resources=ROOMY)
    grandchild = grandchild_of(run)
    ticks = proc_stat(grandchild).start_ticks  # type: ignore[union-attr]
    (run.work / "go").touch()
    try:
        assert wait_for(lambda: units.status(handle) == "stopped")
        assert not pid_alive(grandchild, ticks)  # killed before the end was recorded
        ended = units.reap(handle)
        assert ended is not None and ended.code == 0
        assert units.stop(handle) == ()  # nothing left to signal
    finally:
        if pid_alive(grandchild, ticks):
            os.kill(grandchild, signal.SIGKILL)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that leads its own group: any wrong signal would kill it."""
    proc = subprocess.Popen(py("import time; time.sleep(120)"), start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_a_reused_pid_is_never_signalled(units: ChildUnits, bystander: subprocess.Popen[bytes],
                                         run: RunDir) -> None:
    real = proc_stat(bystander.pid)
    assert real is not None
    stale = UnitRecord(mode="child", host=units.host_name, boot_id=units.boot_id, run_dir=str(run.path),
                       pid=bystander.pid, start_ticks=real.start_ticks - 1)
    assert units.status(stale) == "gone"
    assert not units.signal(stale, signal.SIGKILL)
    assert units.stop(stale, timeout_ms=0) == ()
    assert units.reap(stale) is None
    assert bystander.poll() is None and pid_alive(bystander.pid, real.start_ticks)


@pytest.mark.parametrize("pid", [1, 0, -1, None])
def test_pids_that_name_groups_are_never_signalled(units: ChildUnits, run: RunDir, pid: int | None) -> None:
    handle = UnitRecord(mode="child", host=units.host_name, boot_id=units.boot_id, run_dir=str(run.path),
                        pid=pid, start_ticks=proc_stat(1).start_ticks if pid == 1 else 0)  # type: ignore[union-attr]
    assert units.status(handle) == "unknown"
    assert not units.signal(handle, signal.SIGTERM)
    assert units.stop(handle, timeout_ms=0) == ()


def test_handles_of_another_boot_or_host_are_left_alone(units: ChildUnits, bystander: subprocess.Popen[bytes],
                                                        run: RunDir) -> None:
    ticks = proc_stat(bystander.pid).start_ticks  # type: ignore[union-attr]
    mine = UnitRecord(mode="child", host=units.host_name, boot_id=units.boot_id, run_dir=str(run.path),
                      pid=bystander.pid, start_ticks=ticks)
    other_boot = msgspec.structs.replace(mine, boot_id="00000000-0000-0000-0000-000000000000")
    other_host = msgspec.structs.replace(mine, host=units.host_name + "-elsewhere")
    systemd = msgspec.structs.replace(mine, mode="systemd")
    assert units.status(other_boot) == "gone"
    assert units.status(other_host) == "unknown" and units.status(systemd) == "unknown"
    for handle in (other_boot, other_host, systemd):
        assert units.stop(handle, timeout_ms=0) == () and not units.signal(handle, signal.SIGKILL)
        assert units.reap(handle) is None
    assert bystander.poll() is None


def test_an_exited_unit_is_stopped_and_reaping_leaves_no_zombie(units: ChildUnits, run: RunDir) -> None:
    handle = units.start(py("import sys; sys.stdin.read(); sys.exit(3)"), run_dir=run.path, token=TOKEN,
                         resources=ROOMY)
    assert wait_for(lambda: (s := proc_stat(handle.pid)) is not None and s.state == "Z")
    assert units.status(handle) == "stopped"  # its supervisor recorded the end before it exited
    ended = units.reap(handle)
    assert ended is not None and ended.code == 3 and ended.signal is None and not ended.resource_limit
    assert proc_stat(handle.pid) is None  # the supervisor was collected
    assert units.status(handle) == "stopped"


def test_rlimit_cpu_kills_a_busy_loop_with_sigxcpu(units: ChildUnits, run: RunDir) -> None:
    handle = units.start(py("while True: pass"), run_dir=run.path, token=TOKEN,
                         resources=Resources(cpu_seconds=1, memory_bytes=GIB))
    ended = units.reap(handle, timeout_ms=30_000)
    assert ended is not None and ended.signal == "SIGXCPU" and ended.resource_limit
    assert ended.cpu_ms > 0  # rusage samples CPU time: close to the limit, not exact
    assert list((run.work).iterdir()) == []  # RLIMIT_CORE 0: no core file in the work dir


def test_a_unit_that_ignores_sigxcpu_dies_at_the_hard_limit_and_still_reads_as_resource_limit(
        units: ChildUnits, run: RunDir) -> None:
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass\n"
    handle = units.start(py(code), run_dir=run.path, token=TOKEN, resources=Resources(cpu_seconds=1, memory_bytes=GIB))
    ended = units.reap(handle, timeout_ms=30_000)
    assert ended is not None and ended.signal == "SIGKILL" and ended.cpu_ms >= 1_000 and ended.resource_limit


MEMORY_HOG = """\
import resource, sys
print(resource.getrlimit(resource.RLIMIT_AS), flush=True)
try:
    block = bytearray(1024 * 1024 * 1024)
except MemoryError:
    print("MemoryError", flush=True)
    {exit}
print("allocated", flush=True)
"""


def test_rlimit_as_makes_a_big_allocation_fail_and_the_convention_reads_it(units: ChildUnits, run: RunDir) -> None:
    limits = Resources(cpu_seconds=60, memory_bytes=128 * MIB)
    code = MEMORY_HOG.replace("{exit}", f"sys.exit({EXIT_OUT_OF_MEMORY})")
    handle = units.start(py(code), run_dir=run.path, token=TOKEN, resources=limits)
    ended = units.reap(handle, timeout_ms=30_000)
    log = run.log_path.read_text()
    assert f"({128 * MIB}, {128 * MIB})" in log and "MemoryError" in log and "allocated" not in log
    assert ended is not None and ended.code == EXIT_OUT_OF_MEMORY and ended.resource_limit


def test_an_uncaught_memory_error_is_not_put_down_to_the_limit(units: ChildUnits, run: RunDir) -> None:
    code = MEMORY_HOG.replace("{exit}", "raise")
    handle = units.start(py(code), run_dir=run.path, token=TOKEN, resources=Resources(cpu_seconds=60,
                                                                                      memory_bytes=128 * MIB))
    ended = units.reap(handle, timeout_ms=30_000)
    assert ended is not None and ended.code == 1 and not ended.resource_limit


def my_children() -> set[int]:
    """This process's children (zombies included), from /proc."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and (s := proc_stat(int(name))) is not None and s.ppid == os.getpid():
            found.add(s.pid)
    return found


def test_a_command_that_cannot_run_fails_start(units: ChildUnits, run: RunDir) -> None:
    before = my_children()
    with pytest.raises(UnitStartError, match="No such file"):
        units.start([str(run.path / "missing")], run_dir=run.path, token=TOKEN, resources=ROOMY)
    with pytest.raises(UnitStartError, match="chdir"):
        units.start(py("pass"), run_dir=run.path, work_dir=run.path / "nowhere", token=TOKEN, resources=ROOMY)
    assert units.find(run.path) is None  # the failed wrapper took its pid file back
    with pytest.raises(UnitStartError, match="unit log"):
        units.start(py("pass"), run_dir=run.path / "absent", token=TOKEN, resources=ROOMY)
    assert my_children() <= before  # the failed wrappers were reaped, not left as zombies


def test_a_token_nobody_reads_is_given_up_on_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawn_module, "_TOKEN_TIMEOUT_S", 0.05)
    r, w = os.pipe()
    try:
        os.set_blocking(w, False)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(w, b"x" * 4096)  # fill the pipe: as a unit that never reads would leave it
        assert not spawn_module.hand_token(w, b"token")
        assert spawn_module.hand_token(w, b"")  # nothing to hand: done at once
    finally:
        os.close(r)
        os.close(w)


def test_a_large_bytes_token_arrives_whole(units: ChildUnits, run: RunDir) -> None:
    token = os.urandom(65536)
    handle = units.start(py(REPORTER), run_dir=run.path, token=token, resources=ROOMY)
    assert read_report(run)["sha"] == hashlib.sha256(token).hexdigest()
    units.stop(handle)


def test_bad_arguments_are_refused_before_anything_starts(units: ChildUnits, run: RunDir) -> None:
    bad = [
        {"command": []}, {"token": ""}, {"token": 5}, {"env": {"BAD NAME": "x"}},
        {"resources": {"cpu_seconds": 0, "memory_bytes": GIB}}, {"run_dir": "relative"},
    ]
    for change in bad:
        args = {"command": py("pass"), "run_dir": run.path, "token": TOKEN, "resources": ROOMY, **change}
        with pytest.raises(InvalidInputError):
            units.start(args.pop("command"), **args)
    assert not run.log_path.exists()


def test_find_reads_only_a_well_formed_pid_file(units: ChildUnits, run: RunDir) -> None:
    assert units.find(run.path) is None
    for body in (b"", b"[]", b'{"pid": "1", "start_ticks": 2, "boot_id": "b", "host": "h"}'):
        (run.path / "unit.pid").write_bytes(body)
        assert units.find(run.path) is None
    good = {"pid": 1234, "start_ticks": 5, "boot_id": "b", "host": "h", "argv": ["sleep", "60"]}
    (run.path / "unit.pid").write_text(json.dumps(good))
    assert units.find(run.path, ["sleep", "60"]) == UnitRecord(mode="child", host="h", boot_id="b",
                                                               run_dir=str(run.path), pid=1234, start_ticks=5)
    assert units.find(run.path, ["sleep", "61"]) is None  # the pid file of a unit that ran another command
    assert units.find(run.path, None) is not None


@pytest.mark.parametrize("kind", ["fifo", "link", "nested"])
def test_find_refuses_a_pid_file_that_is_not_the_wrappers(units: ChildUnits, run: RunDir, tmp_path: Path,
                                                          kind: str) -> None:
    path = run.path / "unit.pid"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        (tmp_path / "elsewhere").write_text('{"pid": 1234, "start_ticks": 5, "boot_id": "b", "host": "h"}')
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_bytes(b"[" * 100_000)
    assert returns_within(lambda: units.find(run.path), 10, fifo=path if kind == "fifo" else None) is None


def test_the_wrapper_writes_the_pid_file_find_reads(units: ChildUnits, run: RunDir) -> None:
    command = py("import sys, time\nsys.stdin.read()\ntime.sleep(120)\n")
    handle = units.start(command, run_dir=run.path, token=TOKEN, resources=ROOMY)
    assert units.find(run.path, command) == handle


def test_a_unit_log_left_as_a_fifo_fails_the_start_without_hanging(units: ChildUnits, run: RunDir) -> None:
    os.mkfifo(run.log_path)
    with pytest.raises(UnitStartError, match="unit log"):
        returns_within(lambda: units.start(py("import time\ntime.sleep(120)"), run_dir=run.path, token=TOKEN,
                                           resources=ROOMY), 20, fifo=run.log_path)
