"""Audit and rebuild figures: ``lifecycle-es audit`` and ``projections.rebuild`` against a bare loop, with
worker processes, and the audit's peak memory.

    python -m benchmarks.audit [--quick]

- the audit at ``--jobs 1`` (chain, every transition through the rules, caches, all in one process)
  against the bare replay loop (read rows, msgspec-decode, blake3-hash) on the same file (>= 0.5x);
- the audit at ``--jobs 2`` (this process and one worker process, each checking half the chain and
  replaying half the runners) against ``--jobs 1`` (>= 1.6x), wall clock, worker start-up included, with
  the load average beside it (the ratio needs two idle CPUs to show);
- ``projections.rebuild`` (replay every event through the rules, write every snapshot and read-model
  row) on a copy of the same file, against the same bare loop (>= 0.5x);
- the audit's peak RSS, as a process of its own (``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a parent
  that ran only it), on 100k events against 400k (quick) or 2M (full) (<= 1.1x: flat);
- for information, the same ratio as the first on a log whose runners sit at the 1024-lease retention
  bound (no target: every lease event copies the retained-lease tuple, so the cost per event grows
  with the leases a runner retains, not with the log).

The logs are a fixed fleet of runners living a life the rules allow, every command its own ``at``:
leases acquired (up to a few at once) and settled, now and then one parked for a lost poll, proxy
authorities rotated every four minutes, drains that park the runner (settled, idle or expired),
post-session hooks authorized, and reclaims that cut the retained leases back to 256. The fleet
does not grow with the log, so a longer log is a longer life, not more runners.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable

from lifecycle_es import EventStore, ProxyAuthority, Resources
from lifecycle_es.canonical import iso_ms, receipt_digest
from lifecycle_es.events import (
    RUNNER_SCHEMA,
    DrainExpired,
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
)
from lifecycle_es.log import RecordedEvent
from lifecycle_es.replay import Folded, write_snapshot
from lifecycle_es.runner import HOOK_DOMAIN, apply, hook_receipt_material
from lifecycle_es.state import RunnerState

from .baselines import raw_sqlite
from .measure import Figure, Target, alternate, compared, quiesce, rate
from .suite import Context, main

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STEP_MS = 20  # between two commands of the fleet
FLEET = 64
DIGEST = "sha256:" + "cd" * 32
HOOK = "sha256:" + "ef" * 32
RESOURCES = Resources(cpu_seconds=3600, memory_bytes=1 << 30)
ROTATE_AFTER_MS = 4 * 60 * 1000  # freshness allows 5 minutes
AUTHORITY_LIFE_MS = 30 * 60 * 1000
COMMIT_EVERY = 2000  # events per write transaction while building


def _scale(context: Context) -> dict[str, int]:
    if context.quick:
        return {"rate_log": 100_000, "rounds": 5, "small": 100_000, "big": 400_000, "cap_log": 60_000}
    return {"rate_log": 400_000, "rounds": 5, "small": 100_000, "big": 2_000_000, "cap_log": 200_000}


class _Runner:
    """One runner of the fleet: decides its next command from its state, as a careful host would."""

    def __init__(self, runner_id: str, rng: random.Random, *, cycle: int | None, park_rate: float) -> None:
        self.id = runner_id
        self.rng = rng
        self.cycle = cycle  # leases between drains; None: never drain (leases pile up to the bound)
        self.park_rate = park_rate  # of lease ends, parked for a lost poll (the last one parks the runner)
        self.state: RunnerState | None = None
        self.revision = 0
        self.issued_ms = 0
        self.since_cycle = 0
        self.hooked = False

    def _authority(self, now_ms: int) -> ProxyAuthority:
        return ProxyAuthority(id=f"proxy-{self.id}", revision=self.revision, issued_at=iso_ms(self.issued_ms),
                              expires_at=iso_ms(self.issued_ms + AUTHORITY_LIFE_MS))

    def _fresh_authority(self, now_ms: int) -> ProxyAuthority:
        self.revision += 1
        self.issued_ms = now_ms
        return self._authority(now_ms)

    def decide(self, now_ms: int, at: str) -> list[Event]:
        """The events of this runner's next command (a consequence included, as the lifecycle does)."""
        state = self.state
        if state is None:
            self.issued_ms = now_ms
            self.revision = 1
            return [RunnerInitialized(schema=RUNNER_SCHEMA, runner_id=self.id, target="local",
                                      base_dir=f"/srv/runners/{self.id}", resources=RESOURCES,
                                      post_session_hook_digest=HOOK)]
        active = [lease for lease in state.leases if lease.status == "active"] if state.state != "parked" else []
        if state.state == "reclaiming":
            return [ReclaimCompleted(generation=state.generation + 1)]
        if state.state == "parked":
            ended = state.leases[-1] if state.leases else None
            if not self.hooked and ended is not None and ended.result_digest and ended.hook_receipt_digest is None:
                self.hooked = True
                material = hook_receipt_material(runner_id=self.id, runner_generation=state.generation,
                                                 lease_id=ended.id, lease_generation=ended.generation,
                                                 result_digest=ended.result_digest, hook_digest=HOOK)
                return [HookAuthorized(lease_id=ended.id, lease_generation=ended.generation,
                                       runner_generation=state.generation, result_digest=ended.result_digest,
                                       hook_digest=HOOK, receipt_digest=receipt_digest(HOOK_DOMAIN, material))]
            self.since_cycle, self.hooked = 0, False
            return [ReclaimBegun(proxy_authority=self._fresh_authority(now_ms), generation=state.generation + 1)]
        if state.state == "draining":
            assert state.drain is not None
            if iso_ms(now_ms) >= state.drain.deadline_at:
                expired = tuple(lease.id for lease in active)
                return [DrainExpired(lease_ids=expired, deadline_at=state.drain.deadline_at)]
            return [LeaseSettled(lease_id=active[0].id, lease_generation=active[0].generation, result_digest=DIGEST)]
        if now_ms - self.issued_ms >= ROTATE_AFTER_MS:
            return [ProxyRotated(proxy_authority=self._fresh_authority(now_ms), generation=state.generation + 1,
                                 policy_revision=state.policy_revision + 1)]
        if self.cycle is not None and self.since_cycle >= self.cycle and self.rng.random() < 0.2:
            return [DrainRequested(signal="SIGTERM", requested_at=at, deadline_at=iso_ms(now_ms + 30_000),
                                   generation=state.generation + 1)]
        if active and (len(active) >= 3 or self.rng.random() < 0.5):
            lease = active[0]
            if self.rng.random() < self.park_rate:
                return [LeaseParked(lease_id=lease.id, lease_generation=lease.generation, result_digest=DIGEST,
                                    reason="lost-poll")]
            return [LeaseSettled(lease_id=lease.id, lease_generation=lease.generation, result_digest=DIGEST)]
        self.since_cycle += 1
        return [LeaseAcquired(lease_id=f"lease-{self.rng.getrandbits(128):032x}",
                              session_id=f"session-{self.rng.getrandbits(64):016x}",
                              lease_generation=state.generation, issued_at=at,
                              expires_at=iso_ms(now_ms + 600_000), proxy_authority=self._authority(now_ms))]

    def apply(self, events: list[Event], now_ms: int, at: str) -> list[Event]:
        """Apply the command through the rules (a bug here fails the build, never the audit), with the
        RunnerParked a pending park requires; the events to append."""
        state = self.state
        for event in events:
            state = apply(state, event, now_ms, at)
        assert state is not None
        if state.pending_park is not None:
            parked = RunnerParked(cause=state.pending_park, generation=state.generation + 1)
            state = apply(state, parked, now_ms, at)
            events = [*events, parked]
        self.state = state
        return events


def build(path: str, events: int, *, cycle: int | None = 200, park_rate: float = 0.005, fleet: int = FLEET,
          seed: int = 7, snapshot_tail: int | None = None) -> str:
    """A store at `path` holding `events` rule-valid events of a fleet's life (about: whole commands).

    Appended raw (``append_unchecked``), `COMMIT_EVERY` events a transaction: the build is not what is
    measured. `snapshot_tail`: when about that many events are left to write, every runner's tagged
    snapshot is taken (as commands take one every so many events), so a reader has a tail to catch up.
    """
    rng = random.Random(seed)
    runners = [_Runner(f"runner-{n:03d}", rng, cycle=cycle, park_rate=park_rate) for n in range(fleet)]
    now_ms, written, turn = T0_MS, 0, 0
    last: dict[str, RecordedEvent] = {}
    snapped = snapshot_tail is None
    with EventStore.open(path, durability="normal") as store:
        while written < events:
            with store.transaction("build") as tx:
                batch = 0
                while batch < COMMIT_EVERY and written + batch < events:
                    runner = runners[turn % fleet]
                    turn += 1
                    now_ms += STEP_MS
                    at = iso_ms(now_ms)
                    decided = runner.apply(runner.decide(now_ms, at), now_ms, at)
                    last[runner.id] = tx.append_unchecked(runner.id, decided, at=at)[-1]
                    batch += len(decided)
                if not snapped and written + batch >= events - (snapshot_tail or 0):
                    snapped = True
                    for runner in runners:
                        if runner.state is not None:
                            end = last[runner.id]
                            write_snapshot(store, runner.id, Folded(runner.state, end.version, end.seq), end.hash)
            written += batch
    return path


_BUILT: dict[tuple[str, str, int], str] = {}


def _log(context: Context, name: str, events: int, **options: float | None) -> str:
    """A log built once per run (keyed apart from `context.logs`, which holds other modules' histories)."""
    key = (context.workdir, name, events)
    path = _BUILT.get(key)
    if path is None or not os.path.exists(path):
        context.say(f"audit: building a {name} log of {events:,} events")
        path = build(context.path(f"audit-{name}-{events}.db"), events, **options)  # type: ignore[arg-type]
        _BUILT[key] = path
        quiesce()
    return path


def _audit_rate(path: str, jobs: int) -> Callable[[], float]:
    from lifecycle_es import audit

    def one_round() -> float:
        def whole() -> int:
            report = audit(path, jobs=jobs)
            assert report.ok, report.first_problem
            assert report.jobs == jobs, (report.jobs, jobs)
            return report.events
        return rate(whole)
    return one_round


def _rebuild_rate(path: str, jobs: int = 1) -> Callable[[], float]:
    from projections import rebuild

    def one_round() -> float:
        with EventStore.open(path) as store:
            return rate(lambda: rebuild(store, jobs=jobs).events)
    return one_round


def _bare_rate(path: str) -> Callable[[], float]:
    return lambda: rate(lambda: raw_sqlite.bare_replay(path))


def _peak_rss_kib(path: str) -> int:
    """Peak RSS of ``lifecycle-es audit --jobs 1`` as a process of its own, from a parent that runs only it."""
    script = os.path.join(os.path.dirname(sys.executable), "lifecycle-es")
    probe = ("import resource, subprocess, sys\n"
             "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
             "assert done.returncode == 0, done.returncode\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", probe, script, "audit", path, "--jobs", "1", "--json"],
                         capture_output=True, text=True, check=True, timeout=3600)
    return int(out.stdout.split()[-1])


def run(context: Context) -> list[Figure]:
    """Every audit figure."""
    scale = _scale(context)
    figures: list[Figure] = []
    path = _log(context, "fleet", scale["rate_log"])

    context.say("audit: --jobs 1 and rebuild against the bare loop")
    copy = context.path("audit-rebuild.db")
    shutil.copy(path, copy)
    copy2 = context.path("audit-rebuild-2.db")
    shutil.copy(path, copy2)
    before = os.getloadavg()
    one = alternate({"ours": _audit_rate(path, 1), "bare": _bare_rate(path), "rebuild": _rebuild_rate(copy),
                     "rebuild2": _rebuild_rate(copy2, jobs=2)}, scale["rounds"])
    after = os.getloadavg()
    figures.append(compared(
        "audit.rebuild", f"projections.rebuild over {scale['rate_log']:,} events", "ev/s", one["rebuild"],
        one["bare"], "bare replay loop", Target(">=", 0.5), samples=one,
        note="every event decoded and stepped through the rules, then every runner's snapshot and read-model "
             "rows written, in one transaction"))
    figures.append(compared(
        "audit.rebuild.jobs2", f"projections.rebuild(jobs=2) over {scale['rate_log']:,} events (load average "
        f"{before[0]:.2f} before, {after[0]:.2f} after)", "ev/s", one["rebuild2"], one["bare"], "bare replay loop",
        Target(">=", 0.5), samples=one,
        note=f"this process and one worker each fold half the runners (balanced by their events), reading only "
             f"those runners' rows; {os.cpu_count()} CPU(s), shared with whatever else runs"))
    figures.append(compared(
        "audit.rate.jobs1", f"audit --jobs 1 over {scale['rate_log']:,} events", "ev/s", one["ours"], one["bare"],
        "bare replay loop", Target(">=", 0.5), samples=one,
        note="the audit checks seq, versions, links and framed hashes, decodes every body into its event and "
             "applies it through the transition rules, and checks snapshots, read models and caches; the bare "
             "loop reads, msgspec-decodes (untyped) and hashes each row"))

    context.say("audit: --jobs 2 against --jobs 1")
    before = os.getloadavg()
    two = alternate({"jobs2": _audit_rate(path, 2), "jobs1": _audit_rate(path, 1)}, scale["rounds"])
    after = os.getloadavg()
    load = f"load average {before[0]:.2f} before, {after[0]:.2f} after"
    figures.append(compared(
        "audit.rate.jobs2", f"audit --jobs 2 over {scale['rate_log']:,} events ({load})", "ev/s", two["jobs2"],
        two["jobs1"], "audit --jobs 1", Target(">=", 1.6), samples={**two, "loadavg": [before, after]},
        note=f"the auditing process and one worker each check half the chain and replay half the runners "
             f"(balanced by their events), reading only those rows; {os.cpu_count()} "
             f"CPU(s), shared with whatever else runs ({load}; the 1-minute figure counts this run's own "
             "processes too): the ratio needs two idle CPUs to show"))

    context.say("audit: peak memory against log length")
    small, big = scale["small"], scale["big"]
    peaks = {size: _peak_rss_kib(_log(context, "fleet", size)) for size in (small, big)}
    figures.append(compared(
        f"audit.memory.{big}", f"audit peak RSS at {big:,} events", "KiB", peaks[big], peaks[small],
        f"at {small:,}", Target("<=", 1.1),
        note=f"ru_maxrss of `lifecycle-es audit --jobs 1` as a child process; a fleet of {FLEET} runners"))

    context.say("audit: runners at the retention bound")
    capped = _log(context, "capped", scale["cap_log"], cycle=None, park_rate=0.0, fleet=16)
    cap = alternate({"ours": _audit_rate(capped, 1), "bare": _bare_rate(capped)}, scale["rounds"])
    figures.append(compared(
        "audit.rate.capped", f"audit --jobs 1, 16 runners at 1024 leases ({scale['cap_log']:,} events)", "ev/s",
        cap["ours"], cap["bare"], "bare replay loop", None, samples=cap,
        note="for information: never drained, each runner retains 1024 leases, and every lease event copies "
             "that tuple"))
    return figures


if __name__ == "__main__":
    raise SystemExit(main(modules={"audit": run}))
