"""hosts.rundir: the run directory's layout and modes, and its owner lock against a real second process."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import returns_within

from hosts.proc import HostError
from hosts.rundir import OWNER_LOCK, RunDirHeldError, open_run_dir, safe_run_root
from lifecycle_es.errors import EXIT_HELD, InvalidInputError

# A second host: tries to hold the run dir and exits with what it got (0 held, 76 held elsewhere).
SECOND_HOST = """\
import sys, time
from hosts.rundir import RunDirHeldError, open_run_dir
try:
    run = open_run_dir(sys.argv[1], sys.argv[2])
except RunDirHeldError as exc:
    sys.exit(exc.exit_code)
print("held", flush=True)
if len(sys.argv) > 3:
    time.sleep(60)
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def second_host(root: Path, lease: str, *, hold: bool = False) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", SECOND_HOST, str(root), lease] + (["hold"] if hold else [])
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def test_layout_and_modes(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    with open_run_dir(root, "lease-1") as run:
        assert run.held and run.path == root / "lease-1" and run.work == run.path / "work"
        assert mode(root) == 0o700 and mode(run.path) == 0o700 and mode(run.work) == 0o700
        assert mode(run.path / OWNER_LOCK) == 0o600
        assert run.log_path.parent == run.path and run.status_path.parent == run.path
        assert "held" in repr(run)
    assert not run.held
    run.close()  # a second close does nothing


def test_an_existing_directory_is_reused_and_its_mode_set(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    (root / "lease-1" / "work").mkdir(parents=True)
    (root / "lease-1" / "work" / "kept").write_text("x")
    os.chmod(root / "lease-1", 0o755)
    with open_run_dir(root, "lease-1") as run:
        assert mode(run.path) == 0o700 and (run.work / "kept").read_text() == "x"


def test_a_second_holder_in_this_process_is_refused_with_exit_held(tmp_path: Path) -> None:
    with open_run_dir(tmp_path, "lease-1"), pytest.raises(RunDirHeldError) as err:
        open_run_dir(tmp_path, "lease-1")
    assert err.value.exit_code == EXIT_HELD == 76 and err.value.path == tmp_path / "lease-1"
    with open_run_dir(tmp_path, "lease-1") as again:  # released: held again
        assert again.held
    with open_run_dir(tmp_path, "lease-1"), open_run_dir(tmp_path, "lease-2") as other:
        assert other.held  # another lease's directory is another lock


def test_a_real_second_process_gets_exit_held_until_the_lock_is_released(tmp_path: Path) -> None:
    with open_run_dir(tmp_path, "lease-1"):
        refused = second_host(tmp_path, "lease-1")
        assert refused.wait(30) == EXIT_HELD
    allowed = second_host(tmp_path, "lease-1")
    assert allowed.wait(30) == 0 and allowed.stdout is not None and allowed.stdout.read() == "held\n"


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    holder = second_host(tmp_path, "lease-1", hold=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunDirHeldError):
            open_run_dir(tmp_path, "lease-1")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            with open_run_dir(tmp_path, "lease-1") as run:
                assert run.held
            break
        except RunDirHeldError:
            assert time.monotonic() < deadline, "the killed holder's lock was never released"
            time.sleep(0.01)


@pytest.mark.parametrize("lease", ["..", ".", "", "../x", "a/b", "/abs", ".hidden", "a\0b", "x" * 257, 7, None])
def test_lease_ids_outside_the_id_pattern_are_refused(tmp_path: Path, lease: object) -> None:
    with pytest.raises(InvalidInputError) as err:
        open_run_dir(tmp_path, lease)  # type: ignore[arg-type]
    assert err.value.field == "lease_id"
    assert sorted(os.listdir(tmp_path)) == []


def test_links_and_relative_roots_are_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "runs").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "runs" / "lease-1")
    with pytest.raises(HostError, match="not a directory"):
        open_run_dir(tmp_path / "runs", "lease-1")
    os.symlink(tmp_path / "elsewhere", tmp_path / "linked-root")
    with pytest.raises(HostError, match="not a directory"):
        open_run_dir(tmp_path / "linked-root", "lease-1")
    (tmp_path / "runs" / "lease-2").mkdir()
    os.symlink(tmp_path / "elsewhere" / "lock", tmp_path / "runs" / "lease-2" / OWNER_LOCK)
    with pytest.raises(HostError, match="symbolic link"):
        open_run_dir(tmp_path / "runs", "lease-2")
    assert os.listdir(tmp_path / "elsewhere") == []
    with pytest.raises(InvalidInputError):
        open_run_dir("relative/runs", "lease-1")


@pytest.mark.parametrize("root", ["/tmp/runs-\ud800", "/tmp/runs-\udc80", "/tmp/runs\0x", ""])
def test_a_run_root_that_is_not_text_a_path_can_hold_is_refused_naming_it(root: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        safe_run_root(root)
    assert err.value.field == "run_root"
    if root:
        with pytest.raises(InvalidInputError) as err:
            open_run_dir(root, "lease-1")
        assert err.value.field == "run_root"


def test_an_owner_lock_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    (tmp_path / "lease-1").mkdir(mode=0o700)
    lock = tmp_path / "lease-1" / OWNER_LOCK
    os.mkfifo(lock)
    with pytest.raises(HostError, match="not a regular file"):
        returns_within(lambda: open_run_dir(tmp_path, "lease-1"), 10, fifo=lock)
