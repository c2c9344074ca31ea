"""The end-to-end demo (`lifecycle-es demo`, what `make demo` runs), on real child processes.

It narrates a runner's life: initialized; three sessions leased and started as units; one unit killed
and its lease parked ``lost-poll``; a proxy rotation; a drain delivering SIGTERM; leases settled and
the runner parked; the post-session hook checked against its sha256, authorized and run; reclaim; and
accepting again. Then it seals the log and audits it. The file stays for the reader to inspect.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from projections import attach

from .local import LocalHost

RUNNER = "runner-demo"
AGENT = """\
import signal, sys, time
def finish(*_):
    open("../result", "w").write("session finished cleanly after SIGTERM\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, finish)
token = sys.stdin.read()
open("ready", "w").write("token of %d bytes read from stdin\\n" % len(token))
time.sleep(600)
"""
HOOK = """\
import sys
print("post-session hook: lease", sys.argv[1], "receipt", sys.argv[2][:23] + "...")
"""


def _now() -> int:
    return time.time_ns() // 1_000_000


def _proxy(revision: int) -> ProxyAuthority:
    return ProxyAuthority(id="proxy-demo", revision=revision, issued_at=iso_ms(_now() - 1_000),
                          expires_at=iso_ms(_now() + 3_600_000))


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


class Narrator:
    """Prints numbered steps and what the log now says."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self.out = out
        self.step = 0

    def __call__(self, title: str, *details: str) -> None:
        """Print the next step's title and its detail lines."""
        self.step += 1
        self.out(f"\n{self.step:>2}. {title}")
        for detail in details:
            self.out(f"      {detail}")


def run(directory: Path, say: Narrator) -> Path:
    """Run the demo in `directory` (created if missing) and return the log file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    base = directory / "runner-base"
    base.mkdir(exist_ok=True)
    db = directory / "runners.db"
    for stale in directory.glob("runners.db*"):
        stale.unlink()
    hook = directory / "post-session-hook.py"
    hook.write_text(HOOK)
    hook_digest = "sha256:" + hashlib.sha256(hook.read_bytes()).hexdigest()

    with EventStore.open(db) as store:
        attach(store)  # the runners/leases read models, kept in each event's transaction
        runner = RunnerLifecycle(store, runner_id=RUNNER, target="local", base_dir=str(base),
                                 resources=Resources(cpu_seconds=120, memory_bytes=1 << 30),
                                 post_session_hook_digest=hook_digest)
        snap = runner.initialize()
        say("Runner initialized", f"{RUNNER}: {snap.state}, generation {snap.generation}, log {db}")

        host = LocalHost(runner, mode="child", stop_timeout_ms=5_000)
        receipts, handles = [], []
        for number in (1, 2, 3):
            receipt = runner.acquire_lease(session_id=f"session-{number}", expected_generation=snap.generation,
                                           proxy_authority=_proxy(1))
            handle = host.start(receipt, command=[sys.executable, "-c", AGENT], token=f"secret-{os.urandom(8).hex()}")
            receipts.append(receipt)
            handles.append(handle)
        _wait(lambda: all((Path(h.run_dir) / "work" / "ready").exists() for h in handles))
        say("Three sessions leased and started as units (child processes, token on stdin only)",
            *(f"session-{n}: {receipt.lease.id} -> pid {handle.pid}"
              for n, (receipt, handle) in enumerate(zip(receipts, handles, strict=True), 1)))

        os.kill(handles[0].pid, signal.SIGKILL)
        _wait(lambda: host.status(handles[0]) != "running")
        actions = host.reconcile()
        say("Unit of session-1 killed (SIGKILL); reconcile notices and parks its lease",
            *(f"{a.kind}: {a.detail}".rstrip(": ") for a in actions))

        snap = runner.rotate_proxy_authority(expected_generation=runner.snapshot().generation,
                                             proxy_authority=_proxy(2))
        say("Proxy authority rotated", f"proxy-demo revision {snap.proxy_authority.revision}; "
            f"generation {snap.generation}, policy revision {snap.policy_revision}")

        snap = runner.request_drain(expected_generation=snap.generation, timeout_ms=30_000)
        actions = host.reconcile()
        say("Drain requested: the runner stops accepting and SIGTERMs its units",
            f"state {snap.state}, generation {snap.generation}",
            *(f"{a.kind}: {a.detail}" for a in actions))
        _wait(lambda: (host.reconcile() or True) and runner.snapshot().state == "parked")
        snap = runner.snapshot()
        say("Units finished; their leases settled with their results; the last one parked the runner",
            f"state {snap.state}, generation {snap.generation}: {snap.settled_lease_count} settled, "
            f"{snap.parked_lease_count} parked, {snap.active_lease_count} active")

        settled = next(lease for lease in runner.state().leases if lease.status == "settled")
        actual = "sha256:" + hashlib.sha256(hook.read_bytes()).hexdigest()
        if actual != hook_digest:
            raise SystemExit(f"post-session hook {hook} does not match its digest: refusing to run it")
        receipt = runner.authorize_post_session_hook(
            expected_runner_generation=snap.generation, lease_id=settled.id, lease_generation=settled.generation,
            result_digest=settled.result_digest or "", hook_digest=hook_digest)
        ran = subprocess.run([sys.executable, str(hook), settled.id, receipt.receipt_digest], check=True,
                             capture_output=True, text=True, timeout=30)
        say("Post-session hook checked against its sha256, authorized and run",
            f"digest {hook_digest[:23]}... matches; receipt {receipt.receipt_digest[:23]}...",
            ran.stdout.strip())

        snap = runner.begin_reclaim(expected_generation=snap.generation, proxy_authority=_proxy(3))
        say("Reclaim begun", f"state {snap.state}, generation {snap.generation}, proxy revision 3")
        snap = runner.complete_reclaim(expected_generation=snap.generation)
        say("Reclaim completed: accepting again", f"state {snap.state}, generation {snap.generation}")
        host.close()
        sealed = store.seal()
        say("Log sealed", f"head seq {sealed.seq}, hash {sealed.hash[:16]}... in {db}.seal")
    return db


def main(argv: list[str] | None = None) -> int:
    """`lifecycle-es demo [--dir DIR]`: run the demo, then audit the log it wrote."""
    parser = argparse.ArgumentParser(prog="lifecycle-es demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="demo-run", help="where to write the log (default: ./demo-run)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    print("lifecycle-es demo: one runner's life on real child processes, every step an event in the log")
    say = Narrator(print)
    db = run(Path(args.dir).absolute(), say)
    audit = subprocess.run([sys.executable, "-m", "lifecycle_es.cli", "audit", str(db)], text=True,
                           capture_output=True, timeout=120, check=False)
    say(f"Audit of the log: lifecycle-es audit {db}", *(audit.stdout + audit.stderr).strip().splitlines())
    print(f"\nDone in {time.monotonic() - started:.1f} s. Inspect it: lifecycle-es show {db}; "
          f"lifecycle-es events {db}")
    return audit.returncode


if __name__ == "__main__":
    raise SystemExit(main())
