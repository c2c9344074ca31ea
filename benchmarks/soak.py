"""Soak: several writer processes and an observer on one store file for minutes; nothing lost, nothing slower.

    python -m benchmarks.soak [--minutes N] [--processes 4] [--runners 20] [--seed S] [--out DIR]

`--processes` writer processes each drive `--runners` runners of their own through a weighted random
walk of valid commands (acquire, settle, park a lease, rotate the proxy, drain, park an expired drain,
authorize a post-session hook, begin and complete a reclaim), each command chosen from the runner's
current state, on a clock that is the real one plus whatever the writer skipped ahead (to reach a
drain's deadline without waiting for it). Every committed command is acknowledged in the writer's
JSON-lines file: the seq, stream, version and type of each event it appended (taken from a projector
attached to the store, so only what the transaction wrote), and the command's latency. A fifth process
audits the file over and over (``lifecycle-es audit FILE --json --jobs 1``: one process, so the load
the writers share the CPUs with stays the same as the log grows) and follows it (`EventStore.follow`).

At the end:

- nothing lost: every acknowledged event is in the log with the same stream, version and type;
- the final audit passes (exit 0), and every audit run during the soak passed too;
- the follower saw every event of the log, in order, once;
- the command latency of the last minute is within 1.5x of the first (p50 and p99 per minute shown).

Not part of ``make test``, and left out of ``python -m benchmarks --quick`` (it runs for minutes);
``python -m benchmarks`` runs it for two minutes. The figures go to ``benchmarks/results/`` as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lifecycle_es import EventStore, LifecycleError, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms, parse_iso_ms
from lifecycle_es.state import RunnerState

from .measure import Figure, Target, compared, failed, number, percentile, table, unavailable
from .suite import RESULTS, Context, environment

CLI = shutil.which("lifecycle-es", path=os.path.dirname(sys.executable)) or "lifecycle-es"
DIGEST = "sha256:" + "5a" * 32
HOOK = "sha256:" + "e7" * 32
RESOURCES = Resources(cpu_seconds=600, memory_bytes=1 << 30)
BUSY_TIMEOUT_MS = 60_000  # four writers share one lock: a wait is latency, measured, not an error
LEASE_TTL_MS = 60 * 60 * 1000
MAX_ACTIVE = 4
PROXY_LIFE_MS = 30 * 60 * 1000
LATENCY_TARGET = Target("<=", 1.5)
# How much more often one command is chosen than another, among those valid in the runner's state.
WEIGHTS = {"acquire_lease": 30, "settle_lease": 24, "park_lease": 4, "rotate_proxy_authority": 4,
           "request_drain": 3, "park_expired_drain": 6, "authorize_post_session_hook": 6, "begin_reclaim": 10,
           "complete_reclaim": 10}


class WriterClock:
    """The real clock in epoch ms plus the time this writer skipped ahead; never goes back."""

    def __init__(self) -> None:
        self.skipped = 0
        self._last = 0

    def __call__(self) -> int:
        """Now, in epoch milliseconds."""
        self._last = max(self._last, time.time_ns() // 1_000_000 + self.skipped)
        return self._last

    def skip_to(self, epoch_ms: int) -> None:
        """Move this clock to `epoch_ms` at least (a drain's deadline, without waiting for it)."""
        self.skipped += max(0, epoch_ms - self())


class Acknowledged:
    """A projector that sees what each append wrote, inside its transaction; acknowledged after the commit."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, str, int, str]] = []

    def catch_up(self, store: EventStore) -> None:
        """Nothing to catch up: only this writer's own appends are acknowledged."""

    def apply(self, store: EventStore, recorded: Sequence[Any]) -> None:
        """Note what the transaction appended (it may still roll back: only a returned command acknowledges)."""
        self.pending += [(event.seq, event.stream, event.version, event.type) for event in recorded]


# --- the writers --------------------------------------------------------------------------------------


def _authority(clock: WriterClock, proxy_id: str, revision: int) -> ProxyAuthority:
    now = clock()
    return ProxyAuthority(id=proxy_id, revision=revision, issued_at=iso_ms(now - 1000),
                          expires_at=iso_ms(now + PROXY_LIFE_MS))


def _hookable(state: RunnerState) -> list[Any]:
    return [lease for lease in state.leases
            if lease.status != "active" and lease.result_digest and lease.hook_receipt_digest is None]


def choose(rng: random.Random, runner: RunnerLifecycle, state: RunnerState, clock: WriterClock,
           sessions: Any) -> tuple[str, dict[str, Any]]:
    """A command valid in `state`, drawn by `WEIGHTS`, with its arguments (may move `clock` to a deadline)."""
    active = state.active_leases()
    generation, proxy = state.generation, state.proxy_authority
    proxy_id = f"proxy-{state.runner_id}" if proxy.id == "unbound" else proxy.id
    options: list[str] = []
    if state.state == "accepting":
        options += ["rotate_proxy_authority", "request_drain"]
        options += ["acquire_lease"] if len(active) < MAX_ACTIVE else []
    if state.state in ("accepting", "draining") and active:
        options += ["settle_lease", "park_lease"]
    if state.state == "draining":
        options.append("park_expired_drain")
    if state.state in ("draining", "parked") and _hookable(state):
        options.append("authorize_post_session_hook")
    if state.state == "parked":
        options.append("begin_reclaim")
    if state.state == "reclaiming":
        options.append("complete_reclaim")
    name = rng.choices(options, weights=[WEIGHTS[option] for option in options])[0]
    if name == "acquire_lease":
        return name, {"session_id": f"s-{next(sessions)}", "expected_generation": generation, "ttl_ms": LEASE_TTL_MS,
                      "proxy_authority": _authority(clock, proxy_id, max(1, proxy.revision))}
    if name in ("settle_lease", "park_lease"):
        lease = rng.choice(active)
        kwargs: dict[str, Any] = {"lease_id": lease.id, "lease_generation": lease.generation, "result_digest": DIGEST}
        if name == "park_lease":
            kwargs["reason"] = rng.choice(("checkout-failure", "lost-poll", "resource-limit"))
        return name, kwargs
    if name in ("rotate_proxy_authority", "begin_reclaim"):
        # The same id as the runner's, as the seed's fence wants: "unbound" itself while no lease bound one.
        return name, {"expected_generation": generation,
                      "proxy_authority": _authority(clock, proxy.id, proxy.revision + rng.randint(1, 2))}
    if name == "request_drain":
        return name, {"expected_generation": generation, "timeout_ms": rng.randint(1, 2000)}
    if name == "park_expired_drain":
        assert state.drain is not None
        clock.skip_to(parse_iso_ms(state.drain.deadline_at))
        return name, {"expected_generation": generation}
    if name == "authorize_post_session_hook":
        lease = rng.choice(_hookable(state))
        return name, {"expected_runner_generation": generation, "lease_id": lease.id,
                      "lease_generation": lease.generation, "result_digest": lease.result_digest,
                      "hook_digest": HOOK}
    return name, {"expected_generation": generation}


def writer_main(index: int, path: str, runners: int, seed: int, workdir: str, ready: Any, go: Any,
                start: Any, seconds: float) -> None:
    """One writer process: initialize its runners, wait for the start, then walk them until the deadline."""
    summary: dict[str, Any] = {"writer": index, "commands": 0, "refused": {}, "messages": [], "error": None}
    acks_path = os.path.join(workdir, f"acks-{index}.jsonl")
    try:
        rng = random.Random(seed * 1000 + index)
        clock = WriterClock()
        store = EventStore.open(path, busy_timeout_ms=BUSY_TIMEOUT_MS, now=clock)
        from projections import attach  # the read models ride in every append's transaction, as in a host

        attach(store)
        acks = Acknowledged()
        store.attach(acks)
        base = Path(workdir) / "base"
        lifecycles = []
        for n in range(runners):
            runner_dir = base / f"w{index}-r{n:02d}"
            runner_dir.mkdir(parents=True, exist_ok=True)
            lifecycles.append(RunnerLifecycle(store, runner_id=f"w{index}-r{n:02d}", target="local",
                                              base_dir=runner_dir, resources=RESOURCES,
                                              post_session_hook_digest=HOOK, now=clock))
        sessions = iter(range(1, 1 << 62))
        refused: Counter[str] = Counter()
        with open(acks_path, "w", encoding="utf-8") as out:
            for lifecycle in lifecycles:  # acknowledged too, before the clock starts (t < 0)
                acks.pending.clear()
                lifecycle.initialize()
                out.write(json.dumps({"t": -1, "us": 0, "cmd": "initialize", "events": acks.pending}) + "\n")
            ready.wait(timeout=300)
            go.wait()
            began = start.value
            deadline = began + seconds
            while time.time() < deadline:
                lifecycle = rng.choice(lifecycles)
                name, kwargs = choose(rng, lifecycle, lifecycle.state(), clock, sessions)
                acks.pending.clear()
                started = time.perf_counter_ns()
                try:
                    getattr(lifecycle, name)(**kwargs)
                except LifecycleError as exc:  # a valid command refused is a finding: counted and shown
                    refused[f"{name}: {type(exc).__name__}"] += 1
                    if len(summary["messages"]) < 5:
                        summary["messages"].append(f"{name}: {exc}")
                    continue
                latency_us = (time.perf_counter_ns() - started) // 1000
                summary["commands"] += 1
                out.write(json.dumps({"t": round(time.time() - began, 3), "us": latency_us, "cmd": name,
                                      "events": acks.pending}) + "\n")
        summary["refused"] = dict(refused)
        # How many leases each runner retains at the end: a command's cost may grow with them.
        summary["retained_leases"] = [len(lifecycle.state().leases) for lifecycle in lifecycles]
        store.close()
    except BaseException as exc:
        summary["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        raise
    finally:
        with open(os.path.join(workdir, f"writer-{index}.json"), "w", encoding="utf-8") as handle:
            json.dump(summary, handle)


# --- the observer: audits over and over, and follows -------------------------------------------------


def audit_once(path: str) -> dict[str, Any]:
    """One run of the console script: its exit code, how long it took, and what its report says."""
    started = time.monotonic()
    done = subprocess.run([CLI, "audit", path, "--json", "--jobs", "1"], capture_output=True, text=True,
                          timeout=1800, check=False)
    seconds = time.monotonic() - started
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = {}
    return {"code": done.returncode, "seconds": round(seconds, 3), "events": report.get("events"),
            "reason": report.get("reason") or done.stderr.strip()[-500:] or None}


def observer_main(path: str, workdir: str, ready: Any, go: Any, done: Any) -> None:
    """The fifth process: a follower thread on `EventStore.follow`, and the audit loop, until the writers end."""
    result: dict[str, Any] = {"audits": [], "followed": 0, "in_order": True, "first_disorder": None,
                              "matches_log": None, "error": None}
    seen: list[tuple[int, str, int, str]] = []
    stop = threading.Event()
    follow_error: list[str] = []

    def follow() -> None:
        try:
            with EventStore.open(path, read_only=True, busy_timeout_ms=BUSY_TIMEOUT_MS) as store:
                for recorded in store.follow(after=0, poll_interval=0.01, stop=stop):
                    if recorded.seq != len(seen) + 1 and result["in_order"]:
                        result["in_order"] = False
                        result["first_disorder"] = f"seq {recorded.seq} after {len(seen)}"
                    seen.append((recorded.seq, recorded.stream, recorded.version, recorded.type))
        except BaseException as exc:
            follow_error.append(f"{type(exc).__name__}: {exc}")

    try:
        follower = threading.Thread(target=follow, name="follower", daemon=True)
        follower.start()
        ready.wait(timeout=300)
        go.wait()
        began = time.time()
        while not done.is_set():
            audit = audit_once(path)
            audit["t"] = round(time.time() - began, 1)
            result["audits"].append(audit)
        with EventStore.open(path, read_only=True) as store:
            head = store.head().seq
            log = [(event.seq, event.stream, event.version, event.type) for event in store.read()]
        waited = time.monotonic()
        while len(seen) < head and follower.is_alive() and time.monotonic() - waited < 120:
            time.sleep(0.05)
        stop.set()
        follower.join(timeout=30)
        result["followed"] = len(seen)
        result["matches_log"] = seen == log
        result["error"] = follow_error[0] if follow_error else None
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        raise
    finally:
        with open(os.path.join(workdir, "observer.json"), "w", encoding="utf-8") as handle:
            json.dump(result, handle)


# --- the run and its figures -------------------------------------------------------------------------


def soak(workdir: str, *, minutes: float, processes: int, runners: int, seed: int,
         say: Any = print) -> tuple[list[Figure], dict[str, Any]]:
    """Run the soak in `workdir`; the figures and the details (per minute, audits, writers)."""
    path = os.path.join(workdir, "soak.db")
    EventStore.open(path).close()  # created once, before anyone races to
    context = multiprocessing.get_context("spawn")  # never a fork: no SQLite state crosses into a child
    ready = context.Barrier(processes + 2)
    go, done = context.Event(), context.Event()
    start = context.Value("d", 0.0)
    seconds = minutes * 60
    observer = context.Process(target=observer_main, args=(path, workdir, ready, go, done), name="observer")
    writers = [context.Process(target=writer_main, args=(index, path, runners, seed, workdir, ready, go, start,
                                                         seconds), name=f"writer-{index}")
               for index in range(processes)]
    for process in (observer, *writers):
        process.start()
    try:
        ready.wait(timeout=300)
    except threading.BrokenBarrierError:
        # One of them died setting up (its summary says why); release the rest rather than wait forever.
        say("soak: a process failed before the start")
        ready.abort()
    start.value = time.time()
    go.set()
    say(f"soak: {processes} writers x {runners} runners, an auditor and a follower on {path} for {minutes:g} min")
    for writer in writers:
        writer.join(timeout=seconds + 600)
        if writer.is_alive():
            writer.kill()  # ours, by its handle
            writer.join()
    done.set()
    observer.join(timeout=3600)
    say("soak: writers done; final audit")
    final = audit_once(path)
    return _figures(workdir, path, final, minutes=minutes, processes=processes, runners=runners)


def _read_json(path: str, missing: dict[str, Any]) -> dict[str, Any]:
    """The JSON object a process left at `path`, or `missing` when it left none."""
    try:
        with open(path, encoding="utf-8") as handle:
            return dict(json.load(handle))
    except FileNotFoundError:
        return missing


def _load_acks(workdir: str, processes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    acks: list[dict[str, Any]] = []
    summaries = []
    for index in range(processes):
        acks_path = os.path.join(workdir, f"acks-{index}.jsonl")
        if os.path.exists(acks_path):
            with open(acks_path, encoding="utf-8") as handle:
                acks += [json.loads(line) for line in handle if line.strip()]
        summary_path = os.path.join(workdir, f"writer-{index}.json")
        summaries.append(_read_json(summary_path, {"writer": index, "error": "no summary: the process died"}))
    return acks, summaries


def _lost(path: str, acks: list[dict[str, Any]]) -> tuple[int, int, int, list[str]]:
    """(acknowledged events, of them lost or different, log events nobody acknowledged, examples)."""
    acknowledged = {seq: (stream, version, type_) for ack in acks for seq, stream, version, type_ in ack["events"]}
    lost, examples, unacknowledged = 0, [], 0
    with EventStore.open(path, read_only=True) as store:
        for event in store.read():
            wanted = acknowledged.pop(event.seq, None)
            if wanted is None:
                unacknowledged += 1
            elif wanted != (event.stream, event.version, event.type):
                lost += 1
                if len(examples) < 5:
                    examples.append(f"seq {event.seq}: acknowledged {wanted}, log holds "
                                    f"{(event.stream, event.version, event.type)}")
    lost += len(acknowledged)  # acknowledged seqs the log does not reach
    examples += [f"seq {seq}: acknowledged {wanted}, missing from the log"
                 for seq, wanted in list(acknowledged.items())[:5]]
    total = sum(len(ack["events"]) for ack in acks)
    return total, lost, unacknowledged, examples


def _per_minute(acks: list[dict[str, Any]], minutes: float) -> list[dict[str, Any]]:
    buckets: dict[int, list[float]] = {}
    last = max(0, int(minutes * 60 - 1e-9) // 60)
    for ack in acks:
        if ack["t"] >= 0:
            buckets.setdefault(min(int(ack["t"] // 60), last), []).append(ack["us"] / 1000)
    return [{"minute": minute + 1, "commands": len(samples), "p50_ms": percentile(samples, 50),
             "p99_ms": percentile(samples, 99)} for minute, samples in sorted(buckets.items())]


def _figures(workdir: str, path: str, final: dict[str, Any], *, minutes: float, processes: int,
             runners: int) -> tuple[list[Figure], dict[str, Any]]:
    acks, writers = _load_acks(workdir, processes)
    observer = _read_json(os.path.join(workdir, "observer.json"), {
        "audits": [], "followed": 0, "in_order": False, "matches_log": False, "error": "no summary: it died"})
    total, lost, unacknowledged, examples = _lost(path, acks)
    with EventStore.open(path, read_only=True) as store:
        head = store.head().seq
    minutes_table = _per_minute(acks, minutes)
    commands = sum(1 for ack in acks if ack["t"] >= 0)
    audits = observer["audits"]
    bad_audits = [audit for audit in audits if audit["code"] != 0]
    refused = sum(sum(writer.get("refused", {}).values()) for writer in writers)
    errors = [f"writer {writer['writer']}: {writer['error'].splitlines()[0]}"
              for writer in writers if writer.get("error")]
    errors += [f"observer: {observer['error'].splitlines()[0]}"] if observer.get("error") else []
    label = f"{processes}x{runners} runners, {minutes:g} min"
    figures = [
        compared("soak.lost", f"acknowledged events lost or changed ({label})", "events", lost, None, "",
                 Target("<=", 0, "value"), note=f"{total:,} events acknowledged in {len(acks):,} commands; the "
                 f"log holds {head:,} ({unacknowledged:,} not acknowledged)" + (f"; e.g. {examples[0]}" if examples
                                                                                else "")),
        compared("soak.audit.final", "final audit exit code", "", final["code"], None, "", Target("<=", 0, "value"),
                 note=f"final audit of {final['events']} events in {final['seconds']:.1f} s"
                      + (f": {final['reason']}" if final["code"] else "")),
        compared("soak.audit.during", "audits that failed during the soak", "audits", len(bad_audits), None, "",
                 Target("<=", 0, "value"), note=f"{len(audits)} audits ran while the writers wrote"
                 + (f"; first failure: exit {bad_audits[0]['code']}: {bad_audits[0]['reason']}" if bad_audits
                    else "")),
        compared("soak.follower", "events the follower missed or saw out of order", "events",
                 abs(head - observer["followed"]) + (0 if observer["in_order"] and observer["matches_log"] else 1),
                 None, "", Target("<=", 0, "value"),
                 note=f"followed {observer['followed']:,} of {head:,} events; in order: {observer['in_order']}; "
                      f"equal to the log: {observer['matches_log']}"),
        compared("soak.refused", "valid commands refused", "commands", refused, None, "", Target("<=", 0, "value"),
                 note="; ".join(f"{k} x{v}" for writer in writers for k, v in writer.get("refused", {}).items())
                 or f"{commands:,} commands, {commands / (minutes * 60):,.0f}/s"),
    ]
    retained = [count for writer in writers for count in writer.get("retained_leases", [])]
    leases = (f"runners retained {sum(retained) / len(retained):,.0f} leases on average at the end (max "
              f"{max(retained):,}; the rules keep up to 1024, 256 after a reclaim)") if retained else ""
    if len(minutes_table) >= 2:
        first, last = minutes_table[0], minutes_table[-1]
        for q in ("p50", "p99"):
            figures.append(compared(f"soak.latency.{q}", f"command {q}, minute {last['minute']} vs minute 1", "ms",
                                    last[f"{q}_ms"], first[f"{q}_ms"], "minute 1", LATENCY_TARGET,
                                    note=leases if q == "p50" else ""))
    else:
        figures.append(unavailable("soak.latency", "command latency, last minute vs first", "minute 1",
                                   LATENCY_TARGET, "the soak ran for less than two minutes: no last minute to "
                                   "compare with the first", missing="run two minutes or more"))
    figures += [failed(f"soak.error.{n}", "a soak process failed", error) for n, error in enumerate(errors)]
    details = {"minutes": minutes_table, "audits": audits, "writers": writers, "head": head,
               "acknowledged_events": total, "commands": commands, "final_audit": final,
               "follower": {key: observer.get(key) for key in ("followed", "in_order", "first_disorder",
                                                                "matches_log", "error")}}
    return figures, details


def minute_table(minutes: list[dict[str, Any]]) -> str:
    """Per-minute latency as a fixed-width table."""
    rows = [("minute", "commands", "p50", "p99")] + [
        (str(row["minute"]), f"{row['commands']:,}", f"{number(row['p50_ms'])} ms", f"{number(row['p99_ms'])} ms")
        for row in minutes]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def run(context: Context) -> list[Figure]:
    """The suite's entry: a two-minute soak, the shortest with a first and a last minute (``--quick`` runs
    it only when ``--only`` names it, and then for as long)."""
    workdir = os.path.join(context.workdir, "soak")
    os.makedirs(workdir)
    figures, details = soak(workdir, minutes=2, processes=4, runners=20, seed=1, say=context.say)
    context.say("soak: per minute\n" + minute_table(details["minutes"]))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.soak``: run, print the figures and per-minute latency, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="how long the writers write (default: %(default)s)")
    parser.add_argument("--processes", type=int, default=4, help="writer processes (default: %(default)s)")
    parser.add_argument("--runners", type=int, default=20, help="runners per writer (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random walks (default: %(default)s)")
    parser.add_argument("--out", default=str(RESULTS), help="directory for the JSON figures (default: %(default)s)")
    parser.add_argument("--data-dir", default=None, help="where the store is made (default: a temporary directory)")
    parser.add_argument("--keep-data", action="store_true", help="leave the store and the acknowledgements in place")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.processes < 1 or args.runners < 1:
        parser.error("--minutes, --processes and --runners must be positive")
    if args.data_dir:
        os.makedirs(args.data_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="lifecycle-es-soak-", dir=args.data_dir)
    env = environment()
    started = time.monotonic()
    try:
        figures, details = soak(workdir, minutes=args.minutes, processes=args.processes, runners=args.runners,
                                seed=args.seed, say=lambda message: print(message, file=sys.stderr, flush=True))
    finally:
        if not args.keep_data:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    command = "python -m benchmarks.soak " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"lifecycle-es soak, {env['date']}: {command.strip()}")
    print(f"Python {env['python']}, SQLite {env['sqlite']} (apsw {env['apsw']}); {env['cpus']} CPUs, "
          f"{env['platform']}")
    print()
    print(minute_table(details["minutes"]))
    print()
    print(table(figures))
    print()
    print(f"total {elapsed:.1f} s; {len(details['audits'])} audits during the soak; log head seq {details['head']:,}")
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = os.path.join(args.out, f"{stamp}-soak.json")
    with open(out, "w", encoding="utf-8") as handle:
        json.dump({"mode": "soak", "elapsed_s": round(elapsed, 1), "environment": env,
                   "arguments": {"minutes": args.minutes, "processes": args.processes, "runners": args.runners,
                                 "seed": args.seed},
                   "figures": [figure.as_json() for figure in figures], "details": details}, handle, indent=2)
        handle.write("\n")
    print(f"figures written to {out}")
    return 1 if any(figure.status == "error" or figure.met is False for figure in figures) else 0


if __name__ == "__main__":
    raise SystemExit(main())
