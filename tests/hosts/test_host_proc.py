"""hosts.proc against real processes: start ticks, zombies, the boot id, groups, and running commands."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from hosts.proc import (
    EXIT_OUT_OF_MEMORY,
    MAX_TOKEN_BYTES,
    SAFE_PATH,
    current_boot_id,
    group_members,
    pid_alive,
    proc_start_ticks,
    proc_stat,
    resource_limit_death,
    run_command,
    safe_command,
    safe_env,
    signal_name,
    token_bytes,
)
from lifecycle_es.errors import InvalidInputError


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_start_ticks_of_this_process_match_field_22() -> None:
    with open(f"/proc/{os.getpid()}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    assert proc_start_ticks(os.getpid()) == int(fields[19])
    assert pid_alive(os.getpid(), int(fields[19]))
    assert not pid_alive(os.getpid(), int(fields[19]) + 1)


@pytest.mark.parametrize("pid", [0, -1, -os.getpid(), True, 2**40])
def test_no_start_ticks_for_impossible_pids(pid: int) -> None:
    assert proc_start_ticks(pid) is None
    assert proc_stat(pid) is None


def test_a_command_name_with_parentheses_and_spaces_is_parsed_after_the_last_paren(sleeper) -> None:
    ticks = proc_start_ticks(sleeper.pid)
    # comm can say anything: a name like "a) b c) Z 1" must not shift the fields that follow it.
    renamer = subprocess.Popen(
        [sys.executable, "-c", "import time; open('/proc/self/comm', 'w').write('x) R 1 2 ) Z 9'); time.sleep(60)"])
    try:
        assert wait_for(lambda: ") Z 9" in Path(f"/proc/{renamer.pid}/comm").read_text())
        stat = proc_stat(renamer.pid)
        assert stat is not None and stat.state in "RS" and stat.ppid == os.getpid()
        assert proc_start_ticks(renamer.pid) == stat.start_ticks
    finally:
        renamer.kill()
        renamer.wait()
    assert proc_start_ticks(sleeper.pid) == ticks


def test_a_zombie_has_no_start_ticks_but_its_stat_still_names_it() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks_seen = proc_stat(proc.pid)
    assert wait_for(lambda: (s := proc_stat(proc.pid)) is not None and s.dead)
    assert proc_start_ticks(proc.pid) is None
    assert not pid_alive(proc.pid, ticks_seen.start_ticks if ticks_seen else 0)
    zombie = proc_stat(proc.pid)
    assert zombie is not None and zombie.state == "Z"
    proc.wait()
    assert proc_stat(proc.pid) is None and proc_start_ticks(proc.pid) is None


def test_boot_id_is_this_boots_uuid() -> None:
    boot = current_boot_id()
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", boot)
    assert boot == current_boot_id()


def test_group_members_are_the_live_processes_of_a_group(sleeper) -> None:
    assert group_members(sleeper.pid) == [sleeper.pid]
    assert group_members(1) == [] and group_members(0) == []
    os.kill(sleeper.pid, signal.SIGKILL)
    assert wait_for(lambda: group_members(sleeper.pid) == [])  # a zombie is no member


def test_how_a_death_reads() -> None:
    assert resource_limit_death(code=None, signum=signal.SIGXCPU)
    assert resource_limit_death(code=EXIT_OUT_OF_MEMORY, signum=None)
    assert resource_limit_death(code=None, signum=signal.SIGKILL, cpu_ms=1_000, cpu_seconds=1)
    assert not resource_limit_death(code=None, signum=signal.SIGKILL, cpu_ms=999, cpu_seconds=1)
    assert not resource_limit_death(code=None, signum=signal.SIGKILL)
    assert not resource_limit_death(code=1, signum=None)
    assert not resource_limit_death(code=None, signum=signal.SIGTERM)
    assert signal_name(24) == "SIGXCPU" and signal_name(9) == "SIGKILL" and signal_name(200) == "SIG200"


def test_tokens_are_str_or_bytes_and_bounded() -> None:
    assert token_bytes("tök") == "tök".encode()
    assert token_bytes(b"\x00raw") == b"\x00raw"
    for bad in ("", b"", 42, None, "x" * (MAX_TOKEN_BYTES + 1)):
        with pytest.raises(InvalidInputError) as err:
            token_bytes(bad)  # type: ignore[arg-type]
        assert err.value.field == "token"
    with pytest.raises(InvalidInputError) as err:
        token_bytes("s3cret-" * 20000)
    assert "s3cret" not in str(err.value)


def test_commands_and_environments_are_checked() -> None:
    assert safe_command(("a", "b")) == ["a", "b"]
    for bad in ([], "ls", ["a\0b"], [""], [1]):
        with pytest.raises(InvalidInputError):
            safe_command(bad)  # type: ignore[arg-type]
    assert safe_env(None) == {} and safe_env({"A_1": "x y"}) == {"A_1": "x y"}
    for bad in ({"1A": "x"}, {"A=B": "x"}, {"A": "x\ny"}, {"A": "\0"}, {"A": 1}, ["A"]):
        with pytest.raises(InvalidInputError):
            safe_env(bad)  # type: ignore[arg-type]


def test_run_command_passes_input_and_a_minimal_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAKY_SECRET", "must-not-pass")
    code = "import os, sys; print(sorted(os.environ)); print(os.environ['PATH']); print(sys.stdin.read())"
    result = run_command([sys.executable, "-c", code], input=b"on stdin", env={"EXTRA": "1"})
    assert result.ok and result.code == 0 and not result.timed_out
    names, path, data = result.stdout.splitlines()[:3]
    assert "LEAKY_SECRET" not in names and "'EXTRA'" in names
    assert path == SAFE_PATH and data == "on stdin"


def test_run_command_reports_failures_without_raising() -> None:
    failed = run_command([sys.executable, "-c", "import sys; sys.stderr.write('one\\ntwo\\n'); sys.exit(3)"])
    assert failed.code == 3 and not failed.ok and failed.last_line() == "two"
    missing = run_command(["/nonexistent/tool"])
    assert missing.code == 127 and "cannot run" in missing.stderr


def test_run_command_timeout_settles_even_when_a_grandchild_keeps_the_pipes(tmp_path) -> None:
    # The grandchild inherits stdout and outlives its parent: reading to EOF would wait for it.
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; "
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            f"open({str(pid_file)!r}, 'w').write(str(g.pid)); time.sleep(30)")
    result = run_command([sys.executable, "-c", code], timeout_ms=1_000)
    assert result.timed_out and result.code is None and not result.ok
    grandchild = int(pid_file.read_text())
    os.kill(grandchild, signal.SIGKILL)
