"""hosts.systemd: the pure argv and show rules, the start/stop flow through a fake exec, and the same
units against a real private systemd user manager (tests/systemd_manager.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec
import pytest
from systemd_manager import SystemdUserManager, systemd_manager  # noqa: F401  (a pytest fixture)
from waiting import wait_for

from hosts.proc import SAFE_PATH, CommandResult, UnitStartError, UnitStopError, pid_alive, proc_stat
from hosts.rundir import RunDir, open_run_dir
from hosts.systemd import SystemdUnits
from hosts.systemd_run import systemd_run_argv, unit_name
from hosts.systemd_show import parse_show, unit_exit, unit_status
from lifecycle_es.errors import InvalidInputError
from lifecycle_es.events import UnitRecord
from lifecycle_es.values import GIB, Resources

TOKEN = "tok-9d2e7a41c0b35f68-secret"
LIMITS = Resources(cpu_seconds=60, memory_bytes=GIB)
OK = CommandResult(code=0, timed_out=False, stdout="", stderr="")


# --- the argv, pure ---------------------------------------------------------------------------------


def test_system_scope_argv_is_the_seeds() -> None:
    argv = systemd_run_argv(
        unit="les-l1-abc", command=["/usr/bin/agent", "--x"], scope="system", user="agent", group="agent",
        stop_timeout_ms=30_000, resources=LIMITS, token_file="/run/lifecycle-es/les-l1-abc.token",
        work_dir="/srv/runs/l1/work", env={"A": "1", "PATH": "/evil"})
    assert argv == [
        "/usr/bin/systemd-run", "--unit=les-l1-abc", "--description=lifecycle-es unit les-l1-abc",
        "--service-type=exec", "--quiet",
        "-p", "KillMode=control-group", "-p", "TimeoutStopSec=30s",
        "-p", "Restart=on-failure", "-p", "RestartSec=1", "-p", "RestartPreventExitStatus=65 70 75 76 71 SIGXCPU",
        "-p", "StartLimitIntervalSec=0",
        "-p", "User=agent", "-p", "Group=agent",
        "-p", "LimitCPU=60:61", "-p", "LimitCORE=0", "-p", f"MemoryMax={GIB}",
        "-p", "StandardInput=file:/run/lifecycle-es/les-l1-abc.token",
        "--working-directory=/srv/runs/l1/work",
        "--setenv=A=1", f"--setenv=PATH={SAFE_PATH}", "--setenv=LANG=C.UTF-8",
        "--", "/usr/bin/agent", "--x",
    ]


def test_user_scope_argv_says_user_and_names_no_user() -> None:
    argv = systemd_run_argv(unit="u1", command=["/bin/true"], scope="user", restart=False, stop_timeout_ms=1,
                            log_file="/srv/unit.log")
    assert argv[:2] == ["/usr/bin/systemd-run", "--user"]
    assert not any(a.startswith(("User=", "Group=", "Restart")) for a in argv)
    assert "TimeoutStopSec=1s" in argv and "StartLimitIntervalSec=0" in argv
    assert "StandardOutput=append:/srv/unit.log" in argv and "StandardError=append:/srv/unit.log" in argv
    assert argv[-2:] == ["--", "/bin/true"]


@pytest.mark.parametrize(("change", "field"), [
    ({"scope": "system", "user": None}, "user"),
    ({"scope": "user", "user": "agent"}, "user"),
    ({"scope": "session"}, "scope"),
    ({"unit": "bad/unit"}, "unit"),
    ({"unit": "x" * 201}, "unit"),
    ({"unit": "a b"}, "unit"),
    ({"user": "ag ent"}, "user"),
    ({"command": []}, "command"),
    ({"token_file": "relative"}, "token_file"),
    ({"token_file": "/run/with space"}, "token_file"),
    ({"log_file": "/x\n-p ExecStart=/bin/sh"}, "log_file"),
    ({"env": {"A": "x\ny"}}, "env"),
    ({"description": "two\nlines"}, "description"),
    ({"stop_timeout_ms": -1}, "stop_timeout_ms"),
])
def test_argv_refuses_what_it_cannot_say_safely(change: dict, field: str) -> None:
    args = {"unit": "u1", "command": ["/bin/true"], "scope": "system", "user": "agent", "group": "agent", **change}
    with pytest.raises(InvalidInputError) as err:
        systemd_run_argv(**args)
    assert err.value.field == field


def test_root_must_name_the_user_in_system_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(InvalidInputError, match="root"):
        SystemdUnits(scope="system", exec=FakeSystemd())
    assert SystemdUnits(scope="system", user="agent", exec=FakeSystemd()).group == "agent"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "getgid", lambda: 1001)
    units = SystemdUnits(scope="system", exec=FakeSystemd())
    assert (units.user, units.group) == ("1000", "1001")


def test_unit_names_are_safe_whatever_the_lease_id() -> None:
    assert unit_name("lease-1", prefix="les-", now_ms=0, salt=0) == "les-lease-1-000"
    name = unit_name("a@b+c:" + "x" * 250, prefix="les-", now_ms=1_767_225_600_000, salt=1295)
    assert len(name) == 200 and name.startswith("les-a_b_c:xxx") and name.endswith("zz")
    assert int(name.rsplit("-", 1)[1][:-2], 36) == 1_767_225_600_000
    with pytest.raises(InvalidInputError):
        unit_name("../x", prefix="les-", now_ms=0, salt=0)
    with pytest.raises(InvalidInputError):
        unit_name("lease", prefix="bad prefix ", now_ms=0, salt=0)


# --- show, pure -------------------------------------------------------------------------------------


def test_parse_show_and_unit_status() -> None:
    show = parse_show("LoadState=loaded\nActiveState=active\nSubState=running\nDescription=a=b\nnoise\n=x\n")
    assert show == {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Description": "a=b"}
    cases = {
        ("loaded", "active"): "running", ("loaded", "activating"): "running",
        ("loaded", "deactivating"): "running", ("loaded", "reloading"): "running",
        ("loaded", "refreshing"): "running", ("loaded", "failed"): "failed", ("loaded", "inactive"): "stopped",
        ("loaded", "maintenance"): "unknown", ("not-found", "inactive"): "gone", (None, None): "gone",
    }
    for (load, active), expected in cases.items():
        show = {k: v for k, v in (("LoadState", load), ("ActiveState", active)) if v is not None}
        assert unit_status(show) == expected, (load, active)


def test_unit_exit_reads_code_signal_and_limits() -> None:
    assert unit_exit({"ExecMainCode": "0", "ExecMainStatus": "0"}) is None
    assert unit_exit({"ExecMainCode": "x"}) is None
    ended = unit_exit({"ExecMainCode": "1", "ExecMainStatus": "75", "Result": "exit-code"})
    assert ended is not None and (ended.code, ended.signal, ended.resource_limit) == (75, None, False)
    xcpu = unit_exit({"ExecMainCode": "2", "ExecMainStatus": "24", "Result": "signal"})
    assert xcpu is not None and (xcpu.code, xcpu.signal, xcpu.resource_limit) == (None, "SIGXCPU", True)
    oom = unit_exit({"ExecMainCode": "2", "ExecMainStatus": "9", "Result": "oom-kill"})
    assert oom is not None and oom.signal == "SIGKILL" and oom.resource_limit
    assert unit_exit({"ExecMainCode": "1", "ExecMainStatus": "71", "Result": "exit-code"}).resource_limit


# --- the flow, through a fake exec ----------------------------------------------------------------------


class FakeSystemd:
    """An Exec that answers from a table by verb and records what it ran and what the token file held."""

    def __init__(self, answers: dict[str, CommandResult] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[list[str]] = []
        self.token_at_run: bytes | None = None

    def __call__(self, argv: Sequence[str], *, input: bytes | None = None, timeout_ms: int = 30_000) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0].endswith("systemd-run"):
            prop = next(a for a in argv if a.startswith("StandardInput=file:"))
            path = Path(prop.removeprefix("StandardInput=file:"))
            self.token_at_run = path.read_bytes()
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
            return self.answers.get("run", OK)
        verb = next(a for a in argv[1:] if not a.startswith("--"))
        return self.answers.get(verb, OK)

    def verbs(self) -> list[str]:
        return ["run" if c[0].endswith("systemd-run") else next(a for a in c[1:] if not a.startswith("--"))
                for c in self.calls]


def fake_units(tmp_path: Path, fake: FakeSystemd, **kw) -> SystemdUnits:
    return SystemdUnits(scope="user", exec=fake, token_dir=tmp_path / "tokens", now=lambda: 0, **kw)


def test_start_puts_the_token_in_a_root_only_file_then_empties_it(tmp_path: Path) -> None:
    fake = FakeSystemd()
    units = fake_units(tmp_path, fake)
    handle = units.start(["/bin/agent"], lease_id="lease-1", run_dir=tmp_path / "run", token=TOKEN, resources=LIMITS)
    assert fake.token_at_run == TOKEN.encode()
    assert handle.mode == "systemd" and handle.unit and handle.unit.startswith("les-lease-1-")
    path = units.token_file(handle.unit)
    assert path.read_bytes() == b"" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(path.parent)) == [path.name]
    assert all(TOKEN not in arg for call in fake.calls for arg in call)
    assert f"--working-directory={tmp_path / 'run' / 'work'}" in fake.calls[0]

    units.stop(handle)
    assert fake.verbs() == ["run", "stop", "reset-failed"] and not path.exists()


def test_a_name_chosen_beforehand_is_used(tmp_path: Path) -> None:
    fake = FakeSystemd()
    units = fake_units(tmp_path, fake)
    chosen = units.new_unit_name("lease-1")
    assert units.start(["/bin/agent"], lease_id="lease-1", run_dir=tmp_path, token=TOKEN, resources=LIMITS,
                       unit=chosen).unit == chosen
    with pytest.raises(InvalidInputError):
        units.start(["/bin/agent"], lease_id="lease-1", run_dir=tmp_path, token=TOKEN, resources=LIMITS,
                    unit="../../etc/x")


def test_a_failed_start_cleans_up_and_says_why(tmp_path: Path) -> None:
    fake = FakeSystemd({"run": CommandResult(code=1, timed_out=False, stdout="", stderr="x\nJob failed.\n")})
    units = fake_units(tmp_path, fake)
    with pytest.raises(UnitStartError, match="exit 1: Job failed"):
        units.start(["/bin/agent"], lease_id="lease-1", run_dir=tmp_path, token=TOKEN, resources=LIMITS)
    assert fake.verbs() == ["run", "stop", "reset-failed"]
    assert os.listdir(tmp_path / "tokens") == []


def test_stop_of_a_collected_unit_is_a_stop_and_a_stuck_one_raises(tmp_path: Path) -> None:
    handle = UnitRecord(mode="systemd", host="h", boot_id="b", run_dir=str(tmp_path), unit="u1")
    gone = FakeSystemd({"stop": CommandResult(code=5, timed_out=False, stdout="", stderr="not loaded")})
    fake_units(tmp_path, gone, host_name="h", boot_id="b").stop(handle)
    assert gone.verbs() == ["stop", "reset-failed"]
    stuck = FakeSystemd({"stop": CommandResult(code=None, timed_out=True, stdout="", stderr=""),
                         "show": CommandResult(code=0, timed_out=False, stdout="LoadState=loaded\nActiveState="
                                               "deactivating\n", stderr="")})
    with pytest.raises(UnitStopError, match="timed out"):
        fake_units(tmp_path, stuck, host_name="h", boot_id="b").stop(handle)


def test_status_of_handles_it_cannot_see(tmp_path: Path) -> None:
    down = FakeSystemd({"show": CommandResult(code=1, timed_out=False, stdout="", stderr="Failed to connect")})
    units = fake_units(tmp_path, down, host_name="h", boot_id="b")
    mine = UnitRecord(mode="systemd", host="h", boot_id="b", run_dir=str(tmp_path), unit="u1")
    assert units.status(mine) == "unknown"  # an unreachable manager says nothing about the unit
    assert units.status(msgspec.structs.replace(mine, host="other")) == "unknown"
    assert units.status(msgspec.structs.replace(mine, mode="child")) == "unknown"
    assert units.status(msgspec.structs.replace(mine, boot_id="old")) == "gone"
    assert units.status(msgspec.structs.replace(mine, unit="../x")) == "unknown"
    assert not units.signal(msgspec.structs.replace(mine, boot_id="old"), signal.SIGTERM)
    units.stop(msgspec.structs.replace(mine, host="other"))
    assert down.verbs() == ["show"]


# --- against a real systemd user manager -------------------------------------------------------------------


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.fixture
def run(tmp_path: Path) -> Iterator[RunDir]:
    with open_run_dir(tmp_path / "runs", "lease-1") as held:
        yield held


@pytest.fixture
def real(systemd_manager: SystemdUserManager, tmp_path: Path) -> Iterator[SystemdUnits]:  # noqa: F811
    units = SystemdUnits(scope="user", exec=systemd_manager.exec, token_dir=tmp_path / "tokens",
                         stop_timeout_ms=5_000)
    started: list[UnitRecord] = []
    original = units.start

    def tracked(*args, **kwargs) -> UnitRecord:
        handle = original(*args, **kwargs)
        started.append(handle)
        return handle

    units.start = tracked  # type: ignore[method-assign]
    yield units
    for handle in started:
        units.stop(handle)


def prop(units: SystemdUnits, handle: UnitRecord, name: str) -> str:
    result = units.exec([units.systemctl, "--user", "show", f"{handle.unit}.service", f"--property={name}"])
    return parse_show(result.stdout).get(name, "")


READ_TOKEN = "import hashlib, sys, time; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest(), flush=True); " \
             "time.sleep(120)"


@pytest.mark.systemd
def test_real_start_status_stop_with_the_token_on_stdin_only(real: SystemdUnits, run: RunDir) -> None:
    handle = real.start(py(READ_TOKEN), lease_id="lease-1", run_dir=run.path, token=TOKEN, resources=LIMITS,
                        log_file=run.log_path)
    assert real.status(handle) == "running"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert wait_for(lambda: run.log_path.exists() and digest in run.log_path.read_text())  # read from stdin
    main_pid = int(prop(real, handle, "MainPID"))
    assert main_pid > 1
    for name in ("cmdline", "environ"):
        assert TOKEN.encode() not in Path(f"/proc/{main_pid}/{name}").read_bytes()
    assert Path(f"/proc/{main_pid}/cwd").resolve() == run.work
    token_file = real.token_file(handle.unit or "")
    assert token_file.read_bytes() == b""  # emptied once systemd-run returned

    real.stop(handle)
    assert real.status(handle) in ("stopped", "gone") and not token_file.exists()
    assert not pid_alive(main_pid, proc_stat(main_pid).start_ticks if proc_stat(main_pid) else -1)
    real.stop(handle)  # stopping a collected unit again (systemctl exits 5) is still a stop


@pytest.mark.systemd
def test_real_restart_prevent_exit_status_holds_for_75(real: SystemdUnits, run: RunDir) -> None:
    code = "import sys; open('starts', 'a').write('x\\n'); sys.exit(75)"
    handle = real.start(py(code), lease_id="lease-1", run_dir=run.path, token=TOKEN, resources=LIMITS)
    # A restart would pass through auto-restart; failed means systemd decided against it.
    assert wait_for(lambda: real.status(handle) == "failed")
    assert prop(real, handle, "NRestarts") == "0"
    assert (run.work / "starts").read_text() == "x\n"
    ended = real.exit(handle)
    assert ended is not None and ended.result == "exit-code" and ended.code == 75 and not ended.resource_limit


@pytest.mark.systemd
def test_real_restart_on_failure_restarts_exit_1(real: SystemdUnits, run: RunDir) -> None:
    code = "import sys; open('starts', 'a').write('x\\n'); sys.exit(1)"
    handle = real.start(py(code), lease_id="lease-1", run_dir=run.path, token=TOKEN, resources=LIMITS)
    assert wait_for(lambda: (run.work / "starts").exists() and (run.work / "starts").read_text().count("x") >= 2)
    assert int(prop(real, handle, "NRestarts")) >= 1
    assert real.status(handle) == "running"  # between restarts it is activating: still the lease's unit


@pytest.mark.systemd
def test_real_kill_mode_control_group_kills_a_setsid_grandchild(real: SystemdUnits, run: RunDir) -> None:
    code = ("import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
            "open('grandchild.pid', 'w').write(str(g.pid))\n"
            "time.sleep(120)\n")
    handle = real.start(py(code), lease_id="lease-1", run_dir=run.path, token=TOKEN, resources=LIMITS)
    pid_file = run.work / "grandchild.pid"
    assert wait_for(lambda: pid_file.exists() and pid_file.read_text())
    grandchild = int(pid_file.read_text())
    ticks = proc_stat(grandchild).start_ticks  # type: ignore[union-attr]
    assert os.getsid(grandchild) == grandchild  # it left the unit's session and group
    real.stop(handle)
    assert wait_for(lambda: not pid_alive(grandchild, ticks))


@pytest.mark.systemd
def test_real_limit_cpu_kills_a_busy_loop_with_sigxcpu_and_it_is_not_restarted(real: SystemdUnits,
                                                                               run: RunDir) -> None:
    handle = real.start(py("while True: pass"), lease_id="lease-1", run_dir=run.path, token=TOKEN,
                        resources=Resources(cpu_seconds=1, memory_bytes=GIB))
    assert wait_for(lambda: real.status(handle) == "failed", timeout_s=30)
    show = real.show(handle)
    assert show is not None and show["Result"] == "signal" and show["ExecMainStatus"] == "24"
    ended = real.exit(handle)
    assert ended is not None and ended.signal == "SIGXCPU" and ended.resource_limit
    assert prop(real, handle, "NRestarts") == "0"


@pytest.mark.systemd
def test_real_signal_reaches_the_unit(real: SystemdUnits, run: RunDir) -> None:
    handle = real.start(py("import time; time.sleep(120)"), lease_id="lease-1", run_dir=run.path, token=TOKEN,
                        resources=LIMITS)
    assert real.signal(handle, signal.SIGTERM)
    assert wait_for(lambda: real.status(handle) in ("stopped", "gone"))  # SIGTERM is a clean end: no restart


@pytest.mark.systemd
def test_real_start_of_a_missing_command_fails_and_leaves_nothing(real: SystemdUnits, run: RunDir) -> None:
    with pytest.raises(UnitStartError):
        real.start([str(run.path / "missing")], lease_id="lease-1", run_dir=run.path, token=TOKEN,
                   resources=LIMITS, unit="les-missing-1")
    assert os.listdir(real.token_dir) == []
    gone = UnitRecord(mode="systemd", host=real.host_name, boot_id=real.boot_id, run_dir=str(run.path),
                      unit="les-missing-1")
    assert real.status(gone) == "gone"


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A 0755 directory under /tmp: reachable by any user, so only the modes the code sets protect."""
    path = Path(tempfile.mkdtemp(prefix="lifecycle-es-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


TOKEN_PROBE = """\
import hashlib, os, sys, time
data = sys.stdin.buffer.read()
try:
    open(sys.argv[1], "rb").close()
    probe = "readable"
except PermissionError:
    probe = "denied"
print(os.getuid(), os.getgid(), hashlib.sha256(data).hexdigest(), probe, flush=True)
time.sleep(120)
"""


@pytest.mark.systemd
def test_real_system_scope_runs_as_the_named_user_who_gets_the_token_but_cannot_open_its_file(
        systemd_manager: SystemdUserManager, shared_tmp: Path) -> None:  # noqa: F811
    # Plain systemd-run/systemctl as root reach this manager too, and a manager running as root applies
    # User=/Group= (only an unprivileged user manager refuses them): the system scope's argv, for real.
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("needs /usr/bin/python3, which an unprivileged user can run")
    units = SystemdUnits(scope="system", user="65534", group="65534", exec=systemd_manager.exec,
                         token_dir=shared_tmp / "tokens", stop_timeout_ms=5_000)
    unit = units.new_unit_name("lease-1")
    log = shared_tmp / "unit.log"
    handle = units.start([python, "-I", "-c", TOKEN_PROBE, str(units.token_file(unit))], lease_id="lease-1",
                         run_dir=shared_tmp, work_dir="/", token=TOKEN, resources=LIMITS, log_file=log, unit=unit)
    try:
        assert wait_for(lambda: log.exists() and log.read_text().strip())
        uid, gid, digest, probe = log.read_text().split()
        assert (uid, gid) == ("65534", "65534")
        assert digest == hashlib.sha256(TOKEN.encode()).hexdigest() and probe == "denied"
        assert stat.S_IMODE(units.token_dir.stat().st_mode) == 0o700
    finally:
        units.stop(handle)
    assert not units.token_file(unit).exists()


@pytest.mark.systemd
def test_harness_teardown_leaves_the_machine_as_it_was(tmp_path: Path) -> None:
    from systemd_manager import unavailable_reason
    if (reason := unavailable_reason()) is not None:
        pytest.skip(reason)
    code = ("import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
            "open('grandchild.pid', 'w').write(str(g.pid))\n"
            "time.sleep(120)\n")
    run_dir = tmp_path / "run"
    (run_dir / "work").mkdir(parents=True)
    with SystemdUserManager(tmp_path / "manager") as manager:
        units = SystemdUnits(scope="user", exec=manager.exec, token_dir=tmp_path / "tokens")
        units.start(py(code), lease_id="lease-1", run_dir=run_dir, token=TOKEN, resources=LIMITS)
        pid_file = run_dir / "work" / "grandchild.pid"
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text())
        grandchild = int(pid_file.read_text())
        ticks = proc_stat(grandchild).start_ticks  # type: ignore[union-attr]
        manager_pid, cgroups = manager.pid, manager.cgroups()
        assert cgroups and grandchild in manager.cgroup_pids()
    assert manager.leftovers() == []
    assert not pid_alive(grandchild, ticks) and proc_stat(manager_pid) is None
    assert not any(c.exists() for c in cgroups)
