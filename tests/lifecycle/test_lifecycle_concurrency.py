"""Real processes race commands on one runner in one store, at the same expected generation: a file, and
again a schema on a PostgreSQL server (where the head row's lock serializes them).

Four worker processes (``sys.executable -c``) each hold their own connection and RunnerLifecycle
handle. For every race the test hands each worker a command, waits until all report ``ready``, then
releases them together (a line on each stdin is the barrier). Each worker prints its outcome, the
error class name when refused. Whatever order the store's write lock serializes them in:

- exactly one wins a generation fence (drain, park of an expired drain, reclaim, rotation, the one
  lease a session may hold), and every other gets StaleFenceError, except where the seed checks
  something first: a rotation or reclaim whose revision the winner's has caught up with is refused
  as InvalidInputError (the seed validates the revision minimum before the generation fence);
- commands that do not conflict (leases for distinct sessions) all win: no update is lost;
- every winner's events are in the log, the chain verifies, the read models and a replay equal the
  state every handle sees.
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import projections
from lifecycle_es import EventStore, RunnerLifecycle
from lifecycle_es.caches import check_read_models
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import (
    DrainExpired,
    DrainRequested,
    LeaseAcquired,
    ProxyRotated,
    ReclaimBegun,
    ReclaimCompleted,
    RunnerParked,
)
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS

WORKERS = 4
CYCLES = 3
RUNNER_ID = RUNNER_DEFAULTS["runner_id"]
PROXY_ID = "proxy-race"
# How long to wait for a worker's line before calling it hung: a guard against a stuck test, not a
# timing assertion (a healthy race answers in milliseconds).
HANG_GUARD_S = 120

WORKER = r"""
import json, sys
import projections
from lifecycle_es import EventStore, LifecycleError, Resources, RunnerLifecycle

path, base_dir, index = sys.argv[1], sys.argv[2], sys.argv[3]
clock = [0]
drawn = [0]

def random_id():
    drawn[0] += 1
    return f"w{index}-{drawn[0]}"

store = EventStore.open(path, busy_timeout_ms=60_000, now=lambda: clock[0])
projections.attach(store)
lifecycle = RunnerLifecycle(store, runner_id=sys.argv[4], target="local", base_dir=base_dir,
                            resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                            post_session_hook_digest=sys.argv[5], now=lambda: clock[0], random_id=random_id)
print("up", flush=True)
while True:
    command = json.loads(sys.stdin.readline())
    if command["op"] == "exit":
        break
    clock[0] = command["now"]
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: released when every worker is ready
    try:
        result = getattr(lifecycle, command["op"])(**command["kwargs"])
    except LifecycleError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        continue
    lease = getattr(result, "lease", None)
    print(json.dumps({"error": None, "lease_id": lease.id if lease is not None else None,
                      "generation": getattr(result, "generation", getattr(result, "runner_generation", None)),
                      "state": result.state}), flush=True)
store.close()
"""


class Worker:
    """One worker process and its pipes."""

    def __init__(self, index: int, path: str, base_dir: Path) -> None:
        self.index = index
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), str(base_dir), str(index), RUNNER_ID,
             RUNNER_DEFAULTS["post_session_hook_digest"]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)

    def send(self, message: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(message + "\n")
        self.process.stdin.flush()

    def line(self) -> str:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(HANG_GUARD_S):
                self.process.kill()
                pytest.fail(f"worker {self.index} is hung; stderr: {self.stderr()}")
        text = self.process.stdout.readline()
        if not text:
            pytest.fail(f"worker {self.index} died (exit {self.process.wait()}); stderr: {self.stderr()}")
        return text.strip()

    def stderr(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        assert self.process.stderr is not None
        return self.process.stderr.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.send(json.dumps({"op": "exit"}))
                self.process.wait(timeout=HANG_GUARD_S)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


class Race:
    """The runner under test: the workers, the main process's own handle, and the race clock."""

    def __init__(self, path: str, base_dir: Path) -> None:
        self.now = START_MS
        self.base_dir = base_dir
        self.store = EventStore.open(path, busy_timeout_ms=60_000, now=lambda: self.now)
        projections.attach(self.store)
        self.lifecycle = self.handle()
        self.lifecycle.initialize()
        self.workers: list[Worker] = []
        for index in range(WORKERS):
            self.workers.append(Worker(index, path, base_dir))
        for worker in self.workers:
            assert worker.line() == "up"

    def handle(self) -> RunnerLifecycle:
        """A handle of the main process (it only reads, and sets up the runner)."""
        return RunnerLifecycle(self.store, **RUNNER_DEFAULTS, base_dir=self.base_dir, now=lambda: self.now)

    def proxy(self, revision: int) -> dict[str, Any]:
        return {"id": PROXY_ID, "revision": revision, "issued_at": iso_ms(self.now),
                "expires_at": iso_ms(self.now + 3_600_000)}

    def run(self, op: str, kwargs: dict[str, Any] | list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
        """Release every worker on `op` at once (one kwargs for all, or one each); outcomes and new events."""
        self.now += 1_000
        before = self.store.head().seq
        for worker in self.workers:
            own = kwargs[worker.index] if isinstance(kwargs, list) else kwargs
            worker.send(json.dumps({"op": op, "kwargs": own, "now": self.now}))
        for worker in self.workers:
            assert worker.line() == "ready"
        for worker in self.workers:
            worker.send("go")
        outcomes = [json.loads(worker.line()) for worker in self.workers]
        return outcomes, [recorded.event for recorded in self.store.read(after=before)]

    def generation(self) -> int:
        return self.lifecycle.snapshot().generation

    def revision(self) -> int:
        return self.lifecycle.snapshot().proxy_authority.revision

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.store.close()


@pytest.fixture
def race(tmp_path: Path, store_target: str) -> Iterator[Race]:
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    started = Race(store_target, base_dir)
    try:
        yield started
    finally:
        started.close()


def winners(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [outcome for outcome in outcomes if outcome["error"] is None]


def one_winner(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """Exactly one outcome won; every other lost on a stale fence."""
    won = winners(outcomes)
    assert len(won) == 1, outcomes
    assert sorted(outcome["error"] for outcome in outcomes if outcome["error"]) == ["StaleFenceError"] * (
        WORKERS - 1), outcomes
    return won[0]


def one_revision_winner(outcomes: list[dict[str, Any]], revisions: list[int], revision_after: int) -> None:
    """Exactly one rotation won; a loser is stale when its revision was above the winner's, else invalid."""
    won = [index for index, outcome in enumerate(outcomes) if outcome["error"] is None]
    assert len(won) == 1, outcomes
    assert revisions[won[0]] == revision_after
    for index, outcome in enumerate(outcomes):
        if index != won[0]:
            wanted = "StaleFenceError" if revisions[index] > revision_after else "InvalidInputError"
            assert outcome["error"] == wanted, (index, revisions, revision_after, outcomes)


def test_racing_processes_fence_every_generation_and_lose_nothing(race: Race) -> None:
    acquired: set[str] = set()
    for cycle in range(CYCLES):
        # One session, one active lease: exactly one of the racers gets it.
        generation = race.generation()
        outcomes, events = race.run("acquire_lease", {
            "session_id": f"shared-{cycle}", "expected_generation": generation, "proxy_authority":
            race.proxy(max(1, race.revision()))})
        won = one_winner(outcomes)
        assert [type(event) for event in events] == [LeaseAcquired] and events[0].lease_id == won["lease_id"]
        acquired.add(won["lease_id"])

        # Distinct sessions do not conflict: every racer wins and every lease is in the log.
        outcomes, events = race.run("acquire_lease", [{
            "session_id": f"own-{cycle}-{index}", "expected_generation": generation,
            "proxy_authority": race.proxy(race.revision())} for index in range(WORKERS)])
        assert winners(outcomes) == outcomes, outcomes
        assert {event.lease_id for event in events} == {outcome["lease_id"] for outcome in outcomes}
        acquired.update(outcome["lease_id"] for outcome in outcomes)

        # Rotation: one wins the generation; the rest are stale, or below the new revision minimum.
        base = race.revision()
        revisions = [base + 1 + (index * 3 + cycle) % WORKERS for index in range(WORKERS)]
        outcomes, events = race.run("rotate_proxy_authority", [
            {"expected_generation": generation, "proxy_authority": race.proxy(revision)} for revision in revisions])
        assert [type(event) for event in events] == [ProxyRotated]
        one_revision_winner(outcomes, revisions, race.revision())
        assert race.generation() == generation + 1

        # Drain (leases are active, so the runner drains), then park it once the deadline passed.
        generation = race.generation()
        outcomes, events = race.run("request_drain", {"expected_generation": generation, "timeout_ms": 1})
        assert one_winner(outcomes)["state"] == "draining"
        assert [type(event) for event in events] == [DrainRequested]
        outcomes, events = race.run("park_expired_drain", {"expected_generation": generation + 1})
        assert one_winner(outcomes)["state"] == "parked"
        assert [type(event) for event in events] == [DrainExpired, RunnerParked]

        # Reclaim: begin (revision rules as rotation), complete.
        generation, base = race.generation(), race.revision()
        revisions = [base + 1 + (index + cycle) % WORKERS for index in range(WORKERS)]
        outcomes, events = race.run("begin_reclaim", [
            {"expected_generation": generation, "proxy_authority": race.proxy(revision)} for revision in revisions])
        assert [type(event) for event in events] == [ReclaimBegun]
        one_revision_winner(outcomes, revisions, race.revision())
        outcomes, events = race.run("complete_reclaim", {"expected_generation": generation + 1})
        assert one_winner(outcomes)["state"] == "accepting"
        assert [type(event) for event in events] == [ReclaimCompleted]

    store = race.store
    logged = {recorded.event.lease_id for recorded in store.read_stream(RUNNER_ID)
              if isinstance(recorded.event, LeaseAcquired)}
    assert logged == acquired and len(acquired) == CYCLES * (WORKERS + 1)
    store.verify()
    replayed = projections.replay(store)[RUNNER_ID]
    assert replayed == race.handle().state() == race.lifecycle.state()
    states = {}
    for recorded, state in projections.replay_all(store):
        states[recorded.stream] = (state, recorded.version, recorded.seq)
    assert check_read_models(store, states) == []
    # Every worker's own handle, caught up, sees the same runner.
    outcomes, events = race.run("snapshot", {})
    assert events == []
    assert {(outcome["state"], outcome["generation"]) for outcome in outcomes} == {
        (replayed.state, replayed.generation)}
