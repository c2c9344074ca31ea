"""The end-to-end demo (`lifecycle-es demo`, what `make demo` runs), on real child processes.

It narrates a runner's life: initialized; three sessions leased and started as units; one unit killed
and its lease parked ``lost-poll``; a proxy rotation; a drain delivering SIGTERM; leases settled and
the runner parked; the post-session hook checked against its sha256, authorized and run; reclaim; and
accepting again. Then it seals the log and audits it. The file stays for the reader to inspect.

It is written for someone who has never seen the project: each term is defined in a short phrase where
the output first uses it, and after each step come the events it appended, described in words (never
printed as Python values).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import (
    DrainRequested,
    Event,
    HookAuthorized,
    LeaseAcquired,
    LeaseParked,
    LeaseSettled,
    ProxyRotated,
    ReclaimBegun,
    ReclaimCompleted,
    RunnerInitialized,
    RunnerParked,
    UnitExited,
    UnitSignalled,
    UnitStarted,
    UnitStarting,
    UnitStopped,
)
from projections import attach

from .local import LocalHost

RUNNER = "runner-demo"
WIDTH = 110  # the narration's lines are wrapped to this many characters
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


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, width=WIDTH, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


class Narrator:
    """Prints numbered steps in plain words, then the events each step appended to the log.

    The words define each term the first time the output uses it (a parenthesis right after it), so a
    reader new to the project follows without a glossary; the events are described from their fields,
    never printed as Python values.
    """

    def __init__(self, out: Callable[[str], None], store: EventStore) -> None:
        self.out = out
        self.store = store
        self.step = 0
        self.seen = store.head().seq
        self.sessions: dict[str, str] = {}  # lease id -> session id, to name a lease by its session

    def __call__(self, title: str, *details: str) -> None:
        """Print the next step's title, its detail lines, and the events appended since the last step."""
        self.step += 1
        head = f"{self.step:>2}. "
        self.out("")
        for number, line in enumerate(_wrap(title, " " * len(head))):
            self.out(head + line.lstrip() if number == 0 else line)
        for detail in details:
            for line in _wrap(detail, "      "):
                self.out(line)
        events = list(self.store.read(after=self.seen))
        if events:
            self.seen = events[-1].seq
            self.out("      events appended:")
            for recorded in events:
                self.out(f"        #{recorded.seq:<3} {recorded.type:<17} {self.describe(recorded.event)}".rstrip())

    def lease(self, lease_id: str) -> str:
        """A lease named by its session (the ids are long random hex)."""
        session = self.sessions.get(lease_id)
        return f"{session}'s lease" if session else lease_id

    def describe(self, event: Event) -> str:
        """One event's fields in words."""
        match event:
            case RunnerInitialized():
                return f"{event.runner_id}, target {event.target}"
            case LeaseAcquired():
                self.sessions[event.lease_id] = event.session_id
                return f"{event.lease_id} for {event.session_id}, until {event.expires_at}"
            case UnitStarting():
                return f"{self.lease(event.lease_id)}: its unit is about to start (intent first, outcome after)"
            case UnitStarted():
                return f"{self.lease(event.lease_id)}: unit running, pid {event.handle.pid}"
            case UnitExited():
                how = f"exit code {event.code}" if event.code is not None else f"killed by {event.signal}"
                return f"{self.lease(event.lease_id)}: unit {how}; outcome {event.outcome}"
            case UnitSignalled():
                return f"{self.lease(event.lease_id)}: {event.signal} sent ({event.reason})"
            case UnitStopped():
                return f"{self.lease(event.lease_id)}: unit stopped ({event.reason})"
            case LeaseParked():
                return f"{self.lease(event.lease_id)} parked {event.reason}"
            case LeaseSettled():
                return f"{self.lease(event.lease_id)} settled, result {event.result_digest[:19]}..."
            case ProxyRotated():
                return (f"{event.proxy_authority.id} revision {event.proxy_authority.revision}, generation "
                        f"{event.generation}, policy revision {event.policy_revision}")
            case DrainRequested():
                return f"{event.signal} to every unit, deadline {event.deadline_at}, generation {event.generation}"
            case RunnerParked():
                return f"cause {event.cause}, generation {event.generation}"
            case HookAuthorized():
                return f"{self.lease(event.lease_id)}, receipt {event.receipt_digest[:19]}..."
            case ReclaimBegun():
                return f"under proxy revision {event.proxy_authority.revision}, generation {event.generation}"
            case ReclaimCompleted():
                return f"generation {event.generation}"
        return ""


def run(directory: Path, out: Callable[[str], None] = print) -> Path:
    """Run the demo in `directory` (created if missing), narrated through `out`; return the log's path."""
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
        say = Narrator(out, store)
        runner = RunnerLifecycle(store, runner_id=RUNNER, target="local", base_dir=str(base),
                                 resources=Resources(cpu_seconds=120, memory_bytes=1 << 30),
                                 post_session_hook_digest=hook_digest)
        snap = runner.initialize()
        say("Runner initialized",
            f"{RUNNER} is {snap.state} (it takes new work); its generation (a counter of the runner's terms that "
            "every change to them raises: each command names the generation it was decided on, and is refused "
            f"if the runner has moved on since) is {snap.generation}.",
            f"The log is {db}; every event gets a seq (its position in the log), and read models (tables of each "
            "runner's current state, kept in step with the log) ride along.")

        host = LocalHost(runner, mode="child", stop_timeout_ms=5_000)
        receipts, handles = [], []
        for number in (1, 2, 3):
            receipt = runner.acquire_lease(session_id=f"session-{number}", expected_generation=snap.generation,
                                           proxy_authority=_proxy(1))
            handle = host.start(receipt, command=[sys.executable, "-c", AGENT], token=f"secret-{os.urandom(8).hex()}")
            receipts.append(receipt)
            handles.append(handle)
        _wait(lambda: all((Path(h.run_dir) / "work" / "ready").exists() for h in handles))
        say("Three sessions (pieces of agent work; here each a small Python program) begin",
            "Each holds a lease (the right to run on this runner until it expires, 10 minutes from now), granted "
            "under a proxy authority (the proxy that fronts the runner: an id, and a revision number that never "
            "goes back).",
            "Each runs as a unit (the process of one lease, which the host driver - the part that runs units and "
            "records what they do - starts and watches; here a child process under a small supervisor process, its "
            "secret token on stdin only):",
            *(f"session-{n}: {receipt.lease.id}, supervisor pid {handle.pid}"
              for n, (receipt, handle) in enumerate(zip(receipts, handles, strict=True), 1)))

        host.driver.signal(handles[0], signal.SIGKILL)  # the unit and all it started; its supervisor records it
        _wait(lambda: host.status(handles[0]) != "running")
        host.reconcile()
        say("The unit of session-1 is killed with SIGKILL; the host driver notices and parks (ends unfinished) its "
            "lease as lost-poll (the session stopped answering: here, its process died)")

        snap = runner.rotate_proxy_authority(expected_generation=runner.snapshot().generation,
                                             proxy_authority=_proxy(2))
        say("Proxy authority rotated (replaced by revision 2, as when the proxy's credentials are renewed)",
            f"The generation is now {snap.generation}, and the policy revision (a count of proxy rotations, telling "
            f"readers that the terms of access changed) is {snap.policy_revision}.")

        snap = runner.request_drain(expected_generation=snap.generation, timeout_ms=30_000)
        host.reconcile()
        say("Drain (the runner stops taking new work, and its sessions must finish within 30 s) requested",
            f"The runner is {snap.state}, generation {snap.generation}; the host driver sends SIGTERM to its "
            "units.")
        _wait(lambda: (host.reconcile() or True) and runner.snapshot().state == "parked")
        snap = runner.snapshot()
        say("The units finish; their leases are settled (ended with a result: the digest of what the session "
            "produced); the last one to end parks the runner",
            "A parked runner has no active lease and takes no work until a reclaim (bringing it back into service, "
            f"under a newer proxy revision: step 8). State {snap.state}, "
            f"generation {snap.generation}: {snap.settled_lease_count} leases settled, {snap.parked_lease_count} "
            f"parked, {snap.active_lease_count} active.")

        settled = next(lease for lease in runner.state().leases if lease.status == "settled")
        actual = "sha256:" + hashlib.sha256(hook.read_bytes()).hexdigest()
        if actual != hook_digest:
            raise SystemExit(f"post-session hook {hook} does not match its digest: refusing to run it")
        hook_receipt = runner.authorize_post_session_hook(
            expected_runner_generation=snap.generation, lease_id=settled.id, lease_generation=settled.generation,
            result_digest=settled.result_digest or "", hook_digest=hook_digest)
        ran = subprocess.run([sys.executable, str(hook), settled.id, hook_receipt.receipt_digest], check=True,
                             capture_output=True, text=True, timeout=30)
        say("Post-session hook (a program run after a session ends, to collect its results or clean up) checked, "
            "authorized and run",
            f"Its file still has the sha256 the runner was initialized with ({hook_digest[:23]}...); the log records "
            "a receipt (proof that this hook may run for this lease, as a digest: "
            f"{hook_receipt.receipt_digest[:23]}...), "
            "and only then does it run (a hook is authorized only for a lease that has ended, while the runner is "
            "draining or parked). It printed:", ran.stdout.strip())

        snap = runner.begin_reclaim(expected_generation=snap.generation, proxy_authority=_proxy(3))
        say("Reclaim begun, under proxy revision 3",
            f"The runner is {snap.state}, generation {snap.generation}.")
        snap = runner.complete_reclaim(expected_generation=snap.generation)
        say("Reclaim completed: accepting again", f"The runner is {snap.state}, generation {snap.generation}.")
        host.close()
        sealed = store.seal()
        say("Log sealed (its head - the last seq and its hash - written to a side file, so a copy rolled back or "
            "cut short later is caught)", f"Head seq {sealed.seq}, hash {sealed.hash[:16]}..., in {db}.seal.")
    return db


def main(argv: list[str] | None = None) -> int:
    """`lifecycle-es demo [--dir DIR]`: run the demo, then audit the log it wrote."""
    parser = argparse.ArgumentParser(prog="lifecycle-es demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="demo-run", help="where to write the log (default: ./demo-run)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    for line in _wrap("lifecycle-es demo: the life of a runner (a place where agents do work; here, this machine), on "
                      "real child processes. Each step below appends events (facts, never changed or deleted) to "
                      "the log (one SQLite file, each event's hash chained to the one before), and lists them.", ""):
        print(line)
    db = run(Path(args.dir).absolute())
    audit = subprocess.run([sys.executable, "-m", "lifecycle_es.cli", "audit", str(db)], text=True,
                           capture_output=True, timeout=120, check=False)
    title = (f"Audit (a second, independent reading of the log: every hash checked, every event replayed through "
             f"the rules, snapshots - saved states a replay may start from - and read models compared with that "
             f"replay): lifecycle-es audit {db}")
    print()
    for number, line in enumerate(_wrap(title, "    ")):
        print(f"11. {line.lstrip()}" if number == 0 else line)
    for line in (audit.stdout + audit.stderr).strip().splitlines():
        print(f"      {line}")
    print(f"\nDone in {time.monotonic() - started:.1f} s. Look at it yourself:")
    for command in (f"show {db}", f"events {db} -n 10", f"timeline {db} -o timeline.svg"):
        print(f"    lifecycle-es {command}")
    return audit.returncode


if __name__ == "__main__":
    raise SystemExit(main())
