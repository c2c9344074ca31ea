"""``lifecycle-es demo`` and ``lifecycle-es host``, driven through the real console script."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from waiting import wait_for

from hosts.local import LocalHost
from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms

CLI = str(Path(sys.executable).with_name("lifecycle-es"))
POLITE = ("import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nsys.stdin.read()\n"
          "open('ready','w').close()\ntime.sleep(120)\n")


def test_demo_runs_the_whole_story_and_its_audit_passes(tmp_path: Path) -> None:
    done = subprocess.run([CLI, "demo", "--dir", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    for step in ("Runner initialized", "parked lost-poll", "Proxy authority rotated", "SIGTERM sent (drain)",
                 "checked, authorized and run", "accepting again", "OK: the log is whole"):
        assert step in " ".join(done.stdout.split()), step  # the narration is wrapped
    assert "read models: none" not in done.stdout  # the demo keeps the read models, and the audit checks them
    with EventStore.open(tmp_path / "run" / "runners.db", read_only=True) as store:
        kinds = [recorded.type for recorded in store.read()]
    assert kinds.count("UnitStarted") == 3 and "HookAuthorized" in kinds and kinds[-1] == "ReclaimCompleted"


# The words a newcomer meets in the demo, each to be defined where the output first uses it (in any form:
# "parks", "sealed"), by a parenthesis or a dash right after it.
DEMO_TERMS = ("runner", "event", "log", "generation", "seq", "read model", "session", "lease", "proxy authority",
              "unit", "host driver", "park", "lost-poll", "rotate", "policy revision", "drain", "settle",
              "post-session hook", "receipt", "reclaim", "seal", "audit", "snapshot")
# What Python prints for its own values, which a reader of the demo should never have to decode.
REPRS = re.compile(r"=None|\bNone\b|\w+\(\w+=|<[^>]* object at 0x|\{'|\[\]|\bTrue\b|\bFalse\b")


def test_demo_prints_no_python_values_and_defines_each_term_where_it_first_uses_it(tmp_path: Path) -> None:
    done = subprocess.run([CLI, "demo", "--dir", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not REPRS.findall(done.stdout), REPRS.findall(done.stdout)
    for term in DEMO_TERMS:
        words = r"\s+".join(map(re.escape, term.split()))
        first = re.search(rf"(?<![\w-]){words}\w*", done.stdout, flags=re.I)
        assert first is not None, f"the demo never says {term!r}"
        after = done.stdout[first.end():first.end() + 60]
        assert re.match(r"\s*(\(|- |— )", after), f"{term!r} is first used undefined: ...{first.group()}{after}..."


def test_host_serves_a_runner_until_sigterm(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    db = tmp_path / "runners.db"
    now = lambda: time.time_ns() // 1_000_000  # noqa: E731
    with EventStore.open(db) as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(base),
                                    resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                                    post_session_hook_digest="sha256:" + "a" * 64)
        lifecycle.initialize()
        receipt = lifecycle.acquire_lease(session_id="s1", expected_generation=1, proxy_authority=ProxyAuthority(
            id="p", revision=1, issued_at=iso_ms(now() - 1000), expires_at=iso_ms(now() + 600_000)))
        first = LocalHost(lifecycle)
        handle = first.start(receipt, command=[sys.executable, "-c", POLITE], token="t")
        assert wait_for(lambda: (Path(handle.run_dir) / "work" / "ready").exists())
        first.close()  # hand the run directory over: its owner lock admits one host at a time
        server = subprocess.Popen([CLI, "host", str(db), "--runner", "runner-1", "--tick", "0.2"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            assert "serving runner-1" in server.stdout.readline()
            lifecycle.request_drain(expected_generation=1, timeout_ms=60_000)
            # The served host SIGTERMs the unit; it is this test's child, so it lingers as a zombie, which
            # the host counts as gone: the lease parks lost-poll and the runner parks with it.
            assert wait_for(lambda: lifecycle.snapshot().state == "parked")
            kinds = [recorded.type for recorded in store.read()]
            assert "UnitSignalled" in kinds and kinds[-1] == "RunnerParked"
        finally:
            server.send_signal(signal.SIGTERM)
            out, err = server.communicate(timeout=30)
            os.waitpid(handle.pid, os.WNOHANG) if handle.pid else None
    assert server.returncode == 0, err
    assert "signalled" in out and out.rstrip().endswith("lifecycle-es host: stopped")


def test_host_refuses_a_runner_the_log_does_not_have(tmp_path: Path) -> None:
    with EventStore.open(tmp_path / "runners.db"):
        pass
    db = tmp_path / "runners.db"
    for flag in ("--runner", "-r"):
        done = subprocess.run([CLI, "host", str(db), flag, "nobody"], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 66  # as show, events and timeline refuse a runner the log does not have
        assert done.stderr == (f"lifecycle-es host: error: no runner 'nobody' in {db} "
                               f"('lifecycle-es show {db}' lists the runners it has)\n")
