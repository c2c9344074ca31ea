"""The ExecStopPost exit record: how a collected transient unit ended, written and parsed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from waiting import returns_within

from hosts.systemd_run import systemd_run_argv
from hosts.systemd_show import read_exit_record
from lifecycle_es import InvalidInputError


def test_argv_records_the_exit_with_full_privileges_and_literal_dollars(tmp_path: Path) -> None:
    argv = systemd_run_argv(unit="les-a", command=["/bin/true"], scope="user", exit_file=tmp_path / "unit.exit")
    line = argv[argv.index("-p", argv.index("StartLimitIntervalSec=0")) + 1:]
    posts = [arg for arg in line if arg.startswith("ExecStopPost=")]
    assert posts == [f"ExecStopPost=+/bin/sh -c 'echo $$SERVICE_RESULT $$EXIT_CODE $$EXIT_STATUS > "
                     f"{tmp_path / 'unit.exit'}'"]


@pytest.mark.parametrize("bad", ["/tmp/it's", "/tmp/a$b", "/tmp/a%b", '/tmp/a"b', "/tmp/a`b"])
def test_argv_refuses_an_exit_file_that_would_break_the_shell_line(bad: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        systemd_run_argv(unit="les-a", command=["/bin/true"], scope="user", exit_file=bad)
    assert caught.value.field == "exit_file"


@pytest.mark.parametrize(("text", "code", "signal", "limit"), [
    ("success exited 0\n", 0, None, False),
    ("exit-code exited 3\n", 3, None, False),
    ("exit-code exited 71\n", 71, None, True),
    ("signal killed TERM\n", None, "SIGTERM", False),
    ("signal killed XCPU\n", None, "SIGXCPU", True),
    ("oom-kill killed KILL\n", None, "SIGKILL", True),
])
def test_exit_record_parses(tmp_path: Path, text: str, code: int | None, signal: str | None, limit: bool) -> None:
    (tmp_path / "unit.exit").write_text(text)
    ended = read_exit_record(tmp_path / "unit.exit")
    assert ended is not None
    assert (ended.code, ended.signal, ended.resource_limit) == (code, signal, limit)


@pytest.mark.parametrize("text", ["", "garbage", "success weird 0", "success exited x", "a b c d"])
def test_exit_record_that_cannot_be_read_is_none(tmp_path: Path, text: str) -> None:
    (tmp_path / "unit.exit").write_text(text)
    assert read_exit_record(tmp_path / "unit.exit") is None
    assert read_exit_record(tmp_path / "missing") is None


@pytest.mark.parametrize("kind", ["fifo", "link", "large"])
def test_an_exit_record_that_is_not_a_small_regular_file_is_none(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "unit.exit"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        (tmp_path / "elsewhere").write_text("success exited 0\n")
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_text("success exited 0" + " " * 300 + "\n")
    assert returns_within(lambda: read_exit_record(path), 10, fifo=path if kind == "fifo" else None) is None
