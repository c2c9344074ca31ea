"""Several real processes appending to one store at once (a file, or a schema on a PostgreSQL server):
nothing lost, no gap, one chain.

Each worker (tests/store_writer.py) appends to its own stream with expected_version, and every fourth
event to one shared stream by read-version-then-append, retrying on ConcurrencyError. The workers start
together (each says "ready", waits for a line on stdin, then opens the store), so their transactions
really interleave. A ConcurrencyError that appended anything would show as a duplicate in "shared".
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from targets import Places

from lifecycle_es import EventStore
from lifecycle_es.events import LeaseSettled, ReclaimCompleted

WRITER = str(Path(__file__).with_name("store_writer.py"))
WORKERS = 4
PER_WORKER = 60  # plus PER_WORKER // 4 to the shared stream
TIMEOUT_S = 120


def start_workers(path: str, names: list[str], count: int) -> list[subprocess.Popen[str]]:
    procs = [subprocess.Popen([sys.executable, WRITER, "worker", str(path), name, str(count)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in names]
    try:
        for proc in procs:
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            assert ready == "ready\n", f"worker did not start: {ready!r} {proc.stderr.read() if proc.stderr else ''}"
        for proc in procs:  # all of them are open and waiting: let them go at once
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.communicate()
        raise
    return procs


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, int]]:
    acks: list[tuple[int, str, int]] = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        assert proc.returncode == 0, err
        acks += [(int(seq), stream, int(version))
                 for seq, stream, version in (line.split() for line in out.splitlines())]
    return acks


@pytest.fixture
def path(store_target: str) -> str:
    EventStore.open(store_target).close()
    return store_target


def test_concurrent_writers_lose_nothing(path: str) -> None:
    names = [f"worker-{n}" for n in range(WORKERS)]
    acks = finish(start_workers(path, names, PER_WORKER))
    shared_each = PER_WORKER // 4
    total = WORKERS * (PER_WORKER + shared_each)
    assert len(acks) == total
    with EventStore.open(path) as store:
        report = store.verify()  # one chain, seqs 1..n without a gap, versions contiguous per stream
        assert report.events == total
        assert sorted(seq for seq, _, _ in acks) == list(range(1, total + 1))
        for seq, stream, version in acks:
            recorded = store.event_at(seq)
            assert recorded is not None and (recorded.stream, recorded.version) == (stream, version)
        for name in names:
            assert [r.event for r in store.read_stream(name)] == [
                ReclaimCompleted(generation=i) for i in range(1, PER_WORKER + 1)]
        shared = [r.event for r in store.read_stream("shared")]
        assert all(isinstance(event, LeaseSettled) for event in shared)
        lease_ids = Counter(event.lease_id for event in shared if isinstance(event, LeaseSettled))
        assert lease_ids == Counter(f"{name}-{i}" for name in names for i in range(4, PER_WORKER + 1, 4))
        assert store.streams() == sorted([*names, "shared"])


def test_concurrent_first_opens_of_a_new_path(places: Places) -> None:
    # Before the busy timeout was set ahead of the header check, about half of these failed with
    # StoreBusyError while another process was turning the new file to WAL. On a server the workers race
    # to create the store's schema.
    for _ in range(3):
        path = places.new()
        names = [f"opener-{n}" for n in range(WORKERS)]
        acks = finish(start_workers(path, names, 1))
        assert len(acks) == WORKERS
        with EventStore.open(path) as store:
            assert store.verify().events == WORKERS
            assert store.streams() == names
