"""hosts.supervisor for real: the unit's parent and subreaper, its cgroup where cgroup v2 allows, and
the end record a host reads back as hostile input."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from waiting import returns_within, wait_for

from hosts.child import ChildUnits, read_end
from hosts.proc import pid_alive, proc_stat
from hosts.rundir import RunDir
from hosts.supervisor import END_FILE, own_cgroup
from lifecycle_es.events import UnitRecord
from lifecycle_es.values import GIB, MIB, Resources

TOKEN = "tok-91c2-supervised"
ROOMY = Resources(cpu_seconds=600, memory_bytes=2 * GIB)
SLEEPS = "import sys, time\nsys.stdin.read()\nopen('ready', 'w').close()\ntime.sleep(120)\n"


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def unit_of(handle: UnitRecord) -> int:
    children = Path(f"/proc/{handle.pid}/task/{handle.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"process {pid} has no cgroup v2 line")


def cgroup_unavailable(*, memory: bool = False) -> str | None:
    """Why units get no cgroup of their own on this machine, or None when they do."""
    parent = own_cgroup()
    if parent is None:
        return "no cgroup v2 hierarchy is mounted here (no cgroup2 line in /proc/self/mountinfo)"
    probe = os.path.join(parent, f"les-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return f"this user cannot make a cgroup under {parent}: {exc.strerror}"
    try:
        if not os.path.exists(os.path.join(probe, "cgroup.kill")):
            return "this kernel's cgroup v2 has no cgroup.kill (Linux 5.14 added it)"
        if memory and "memory" not in Path(parent, "cgroup.controllers").read_text().split():
            return (f"the memory controller is not available in the cgroup v2 hierarchy at {parent} (bound to a "
                    "cgroup v1 hierarchy here, or not delegated): memory.max cannot be set, so the rlimit applies")
    finally:
        os.rmdir(probe)
    return None


def test_the_supervisor_is_the_unit_s_parent_and_relays_sigterm(units: ChildUnits, run: RunDir) -> None:
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (open('got-term', 'w').close(), sys.exit(7)))\n"
            "sys.stdin.read()\nopen('ready', 'w').close()\ntime.sleep(120)\n")
    handle = units.start(py(code), run_dir=run.path, token=TOKEN, resources=ROOMY)
    assert wait_for(lambda: (run.work / "ready").exists())
    unit = unit_of(handle)
    stat = proc_stat(unit)
    assert stat is not None and stat.ppid == handle.pid and stat.pgrp == unit and stat.session == handle.pid
    os.kill(handle.pid, signal.SIGTERM)  # to the supervisor alone, as an operator's kill would
    ended = units.reap(handle, timeout_ms=10_000)
    assert (run.work / "got-term").exists()
    assert ended is not None and ended.code == 7 and ended.signal is None


def test_a_daemon_the_unit_orphans_is_re_parented_to_the_supervisor(units: ChildUnits, run: RunDir) -> None:
    # The classic daemon: fork, setsid, fork again, the middle one exits. Without a subreaper it goes to init.
    code = ("import os, sys, time\nsys.stdin.read()\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        open('daemon.pid', 'w').write(str(os.getpid()))\n"
            "        time.sleep(120)\n"
            "    os._exit(0)\n"
            "time.sleep(120)\n")
    handle = units.start(py(code), run_dir=run.path, token=TOKEN, resources=ROOMY)
    path = run.work / "daemon.pid"
    assert wait_for(lambda: path.exists() and path.read_text().strip())
    daemon = int(path.read_text())
    ticks = proc_stat(daemon).start_ticks  # type: ignore[union-attr]
    try:
        assert wait_for(lambda: (stat := proc_stat(daemon)) is not None and stat.ppid == handle.pid)
        assert units.stop(handle) == ("SIGTERM",)
        assert not pid_alive(daemon, ticks)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon, signal.SIGKILL)


def test_the_end_record_names_its_supervisor_and_is_written_whole(units: ChildUnits, run: RunDir) -> None:
    handle = units.start(py("import sys\nsys.stdin.read()\nsys.exit(5)\n"), run_dir=run.path, token=TOKEN,
                         resources=ROOMY)
    assert units.reap(handle, timeout_ms=10_000) is not None
    record = json.loads((run.path / END_FILE).read_text())
    assert (record["supervisor_pid"], record["start_ticks"], record["code"]) == (handle.pid, handle.start_ticks, 5)
    assert [name for name in os.listdir(run.path) if name.endswith(".tmp")] == []


@pytest.mark.parametrize("kind", ["link", "fifo", "large", "other-supervisor", "both-code-and-signal", "garbage"])
def test_an_end_record_that_is_not_the_supervisor_s_says_nothing(run: RunDir, tmp_path: Path, kind: str) -> None:
    handle = UnitRecord(mode="child", host="h", boot_id="b", run_dir=str(run.path), pid=4242, start_ticks=9)
    good = {"supervisor_pid": 4242, "start_ticks": 9, "boot_id": "b", "unit_pid": 4243, "code": 0, "signal": None,
            "cpu_ms": 1, "cpu_seconds": 60, "oom_kill": False}
    path = run.path / END_FILE
    path.write_text(json.dumps(good))
    read = read_end(handle)
    assert read is not None and read.code == 0  # the well-formed record is read: each change below breaks it
    path.unlink()
    if kind == "link":
        (tmp_path / "elsewhere").write_text(json.dumps(good))
        path.symlink_to(tmp_path / "elsewhere")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "large":
        path.write_text(json.dumps(good) + " " * 5000)
    elif kind == "other-supervisor":
        path.write_text(json.dumps({**good, "start_ticks": 10}))
    elif kind == "both-code-and-signal":
        path.write_text(json.dumps({**good, "signal": 9}))
    else:
        path.write_bytes(b"[" * 3000)
    assert returns_within(lambda: read_end(handle), 10, fifo=path if kind == "fifo" else None) is None


def test_each_unit_gets_a_cgroup_of_its_own_which_its_end_removes(units: ChildUnits, run: RunDir) -> None:
    why = cgroup_unavailable()
    if why is not None:
        pytest.skip(why)
    code = ("import subprocess, sys, time\nsys.stdin.read()\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
            "open('grandchild.pid', 'w').write(str(g.pid))\ntime.sleep(120)\n")
    handle = units.start(py(code), run_dir=run.path, token=TOKEN, resources=ROOMY)
    path = run.work / "grandchild.pid"
    assert wait_for(lambda: path.exists() and path.read_text().strip())
    grandchild = int(path.read_text())
    ticks = proc_stat(grandchild).start_ticks  # type: ignore[union-attr]
    try:
        name = f"les-unit-{handle.pid}-{handle.start_ticks}"
        unit_cgroup = cgroup_of(unit_of(handle))
        assert unit_cgroup.endswith("/" + name) and cgroup_of(grandchild) == unit_cgroup
        assert cgroup_of(handle.pid) != unit_cgroup  # the supervisor stays outside: cgroup.kill spares it
        directory = os.path.join(own_cgroup() or "", name)
        assert os.path.isdir(directory)
        assert units.stop(handle) == ("SIGTERM",)
        assert not pid_alive(grandchild, ticks)
        assert not os.path.exists(directory)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


def test_an_oom_kill_in_the_unit_s_cgroup_reads_as_its_resource_limit(units: ChildUnits, run: RunDir) -> None:
    why = cgroup_unavailable(memory=True)
    if why is not None:
        pytest.skip(why)
    hog = "import sys\nsys.stdin.read()\nblock = b'x' * (512 * 1024 * 1024)\nprint('allocated', flush=True)\n"
    handle = units.start(py(hog), run_dir=run.path, token=TOKEN, resources=Resources(cpu_seconds=60,
                                                                                     memory_bytes=64 * MIB))
    ended = units.reap(handle, timeout_ms=30_000)
    assert ended is not None and ended.signal == "SIGKILL" and ended.resource_limit
    assert "allocated" not in run.log_path.read_text()
    assert json.loads((run.path / END_FILE).read_text())["oom_kill"] is True
