"""``lifecycle-es host`` in operation (issue 13, items 5 and 6): several runners from one process, JSON log
lines, Prometheus metrics on loopback, and systemd's notify protocol over a real AF_UNIX datagram socket."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from waiting import wait_for

from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.cli.notify import Notifier
from lifecycle_es.events import HostLeaseAcquired

CLI = str(Path(sys.executable).with_name("lifecycle-es"))


def runners(tmp_path: Path, *runner_ids: str, target: str = "local") -> Path:
    """A store with these runners initialized, each with its base dir on this machine."""
    db = tmp_path / "runners.db"
    with EventStore.open(db) as store:
        for runner_id in runner_ids:
            base = tmp_path / runner_id
            base.mkdir()
            RunnerLifecycle(store, runner_id=runner_id, target=target, base_dir=str(base),
                            resources=Resources(cpu_seconds=60, memory_bytes=1 << 30),
                            post_session_hook_digest="sha256:" + "a" * 64).initialize()
    return db


def serve(db: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], list[str]]:
    """A host process and the lines it printed so far (read by a thread)."""
    process = subprocess.Popen([CLI, "host", str(db), "--tick", "0.2", "--host-lease-ttl-ms", "3000", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **(env or {})})
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        lines.extend(process.stdout)

    threading.Thread(target=read, daemon=True).start()
    return process, lines


def stopped(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=30)


def test_one_process_drives_every_runner_of_its_target_each_under_its_own_lease(tmp_path: Path) -> None:
    db = runners(tmp_path, "runner-a", "runner-b")
    with EventStore.open(db) as store:
        RunnerLifecycle(store, runner_id="elsewhere", target="local", base_dir="/nonexistent/base",
                        resources=Resources(cpu_seconds=60, memory_bytes=1 << 30),
                        post_session_hook_digest="sha256:" + "a" * 64).initialize()
    process, lines = serve(db, "--all", "--log-format", "json")
    taken = lambda: [json.loads(line) for line in list(lines) if '"lease-taken"' in line]  # noqa: E731
    assert wait_for(lambda: len(taken()) == 2, 30), lines
    assert sorted(str(event["runner"]) for event in taken()) == ["runner-a", "runner-b"]
    assert stopped(process) == 0
    assert all(json.loads(line)["event"] for line in lines), "a line that is not one JSON object"
    with EventStore.open(db, read_only=True) as store:
        holders = {recorded.stream: recorded.event.holder for recorded in store.read()
                   if isinstance(recorded.event, HostLeaseAcquired)}
        # Released on SIGTERM: a standby may take each at once.
        assert store.host_lease("runner-a")[2] == 0 and store.host_lease("elsewhere") is None  # type: ignore[index]
    assert set(holders) == {"runner-a", "runner-b"} and len(set(holders.values())) == 1


def test_runners_named_twice_or_none_named_are_usage_errors(tmp_path: Path) -> None:
    db = runners(tmp_path, "runner-a")
    for args in ((), ("--all", "--runner", "runner-a")):
        done = subprocess.run([CLI, "host", str(db), *args], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 64, done.stderr
    done = subprocess.run([CLI, "host", str(db), "--all", "--target", "ssh"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 64 and "no runner of target ssh" in done.stderr


def test_metrics_are_served_on_loopback(tmp_path: Path) -> None:
    db = runners(tmp_path, "runner-1")
    now = time.time_ns() // 1_000_000
    with EventStore.open(db) as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(tmp_path / "runner-1"),
                                    resources=Resources(cpu_seconds=60, memory_bytes=1 << 30),
                                    post_session_hook_digest="sha256:" + "a" * 64)
        lifecycle.acquire_lease(session_id="s", expected_generation=1, proxy_authority=ProxyAuthority(
            id="p", revision=1, issued_at=iso_ms(now - 1000), expires_at=iso_ms(now + 600_000)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process, lines = serve(db, "-r", "runner-1", "--metrics", f"127.0.0.1:{port}")

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            return ""

    wanted = ('lifecycle_es_host_lease_token{runner="runner-1"} 1.0', 'lifecycle_es_leases{runner="runner-1",'
              'status="active"} 1.0', 'lifecycle_es_reconcile_seconds_count{runner="runner-1"}',
              'lifecycle_es_commit_seconds_count{runner="runner-1"}', 'lifecycle_es_host_fences_total{runner='
              '"runner-1"} 0.0', 'lifecycle_es_host_lease_seconds_left{runner="runner-1"}')
    assert wait_for(lambda: all(name in scrape() for name in wanted), 30), (scrape(), lines)
    assert stopped(process) == 0


def test_ready_and_watchdog_reach_the_notify_socket(tmp_path: Path) -> None:
    db = runners(tmp_path, "runner-1")
    address = str(tmp_path / "notify.sock")
    received: list[str] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(0.2)
        process, lines = serve(db, "-r", "runner-1", env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"})

        def heard() -> list[str]:
            with contextlib.suppress(TimeoutError):
                received.append(sock.recv(4096).decode())
            return received

        assert wait_for(lambda: heard().count("WATCHDOG=1") >= 3, 30), (received, lines)
        assert received[0] == "READY=1"
        assert stopped(process) == 0
        assert wait_for(lambda: "STOPPING=1" in heard(), 10)


def test_the_notifier_reads_its_environment() -> None:
    assert Notifier.from_environment({}) is None
    assert Notifier.from_environment({"NOTIFY_SOCKET": "relative"}) is None
    abstract = Notifier.from_environment({"NOTIFY_SOCKET": "@name", "WATCHDOG_USEC": "4000000"})
    assert abstract is not None and abstract.address == "\0name" and abstract.watchdog_interval() == 2.0
    other = Notifier.from_environment({"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"})
    assert other is not None and other.watchdog_interval() is None  # the watchdog is another process's


def test_json_log_lines_stay_whole_when_two_threads_report_at_once(capfd: object) -> None:
    from lifecycle_es.cli.host_log import HostLog

    log = HostLog("json")
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: a line written in two parts is split
    threads = [threading.Thread(target=lambda n=n: [log.report("renew-failed", {"runner": f"r{n}", "error": "x" * 300})
                                                    for _ in range(300)]) for n in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    out = capfd.readouterr().out  # type: ignore[attr-defined]
    lines = out.splitlines()
    assert len(lines) == 1200 and all(json.loads(line)["event"] == "renew-failed" for line in lines)
