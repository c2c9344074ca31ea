"""A writer SIGKILLed at random points loses nothing it acknowledged, and leaves a log that verifies.

The writer (tests/store_writer.py, a real process) prints ``SEQ I`` after each append returns; a line
that reached us is an acknowledged commit. After each kill the file must open, verify, and hold every
acknowledged event at its seq, unchanged. Rounds alternate durability "full" and "normal": a process
crash (unlike a power loss) must lose nothing under either.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from lifecycle_es import EventStore
from lifecycle_es.events import ReclaimCompleted

WRITER = str(Path(__file__).with_name("store_writer.py"))
ROUNDS = 15
GUARD_S = 60  # kill a writer that never gets going, so a broken test fails instead of hanging


def killed_writer(args: list[str], rng: random.Random, acks_before_kill: int) -> tuple[list[list[str]], str]:
    """Run store_writer.py with `args`, SIGKILL it once it printed `acks_before_kill` acknowledgements (0: at a
    random moment of its start), and return the fields of every whole line it acknowledged, and its stderr."""
    proc = subprocess.Popen([sys.executable, WRITER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    guard = threading.Timer(GUARD_S, proc.kill)
    guard.start()
    lines: list[str] = []
    try:
        if acks_before_kill == 0:
            # Anywhere from interpreter start-up to the first commits (creating the file, its first open).
            time.sleep(rng.uniform(0, 0.4))
        else:
            for line in proc.stdout:
                lines.append(line)
                if len(lines) > acks_before_kill:  # the first line is "ready"
                    break
            # Then a little more, so the kill lands mid-append (or mid-batch) as often as between them.
            time.sleep(rng.uniform(0, 0.01))
        os.kill(proc.pid, signal.SIGKILL)
        # The same file object: lines it has buffered but not yet handed out are acknowledgements too.
        output = "".join(lines) + proc.stdout.read()
        errors = proc.stderr.read()
    finally:
        guard.cancel()
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, f"the writer ended by itself ({proc.returncode}): {errors}"
    # Only whole lines count: a line cut by the kill was never fully acknowledged.
    return [line.split() for line in output.splitlines(keepends=True)
            if line.endswith("\n") and line != "ready\n"], errors


def run_round(path: Path, round_: int, rng: random.Random) -> list[tuple[int, int]]:
    """One writer, killed at a random point; the (seq, i) pairs it acknowledged before it died."""
    durability = "full" if round_ % 2 == 0 else "normal"
    acks, _ = killed_writer(["crash", str(path), str(round_), durability], rng,
                            rng.choice([0, 0, 1, 2, 5, 17, 40, 90]))
    return [(int(seq), int(i)) for seq, i in acks]


def test_sigkilled_writer_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    acknowledged: dict[int, tuple[int, int]] = {}  # seq -> (round, i)
    some_acknowledged = 0
    for round_ in range(ROUNDS):
        acks = run_round(path, round_, rng)
        some_acknowledged += bool(acks)
        for seq, i in acks:
            acknowledged[seq] = (round_, i)
        with EventStore.open(path) as store:
            report = store.verify()
            assert report.head.seq == store.head().seq
            for seq, (ack_round, i) in acknowledged.items():
                assert seq <= report.head.seq, f"seed {seed}: acknowledged seq {seq} is past the head"
                recorded = store.event_at(seq)
                assert recorded is not None
                assert (recorded.stream, recorded.version) == (f"crash-{ack_round}", i), f"seed {seed}"
                assert recorded.event == ReclaimCompleted(generation=i), f"seed {seed}"
            # Within a round the stream is contiguous: nothing acknowledged, then lost, then more written.
            mine = [r.version for r in store.read_stream(f"crash-{round_}")]
            assert mine == list(range(1, len(mine) + 1))
            assert len(mine) >= sum(1 for r, _ in acknowledged.values() if r == round_)
    # Not vacuous: rounds that waited for acknowledgements (3 in 4 of them, at random) got them in.
    assert some_acknowledged >= 3, f"seed {seed}: too few rounds committed anything before the kill"


def test_sigkilled_group_commit_of_sixteen_threads_loses_nothing_acknowledged(tmp_path: Path) -> None:
    # Sixteen threads of one process commit through its group commit, in batches; the process is killed
    # while batches are in flight. Every append a thread printed (returned to it) is in the log, at its seq.
    path = tmp_path / "threads.db"
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    acknowledged: dict[int, tuple[str, int]] = {}
    for round_ in range(4):
        wanted = rng.choice([1, 16, 100, 400])
        acks, errors = killed_writer(["threads", str(path), str(round_)], rng, wanted)
        assert len(acks) >= wanted, f"seed {seed}: {errors}"
        for seq, stream, i in acks:
            acknowledged[int(seq)] = (stream, int(i))
        with EventStore.open(path) as store:
            report = store.verify()
            for seq, (stream, i) in acknowledged.items():
                recorded = store.event_at(seq)
                assert recorded is not None, f"seed {seed}: acknowledged seq {seq} is past the head {report.head.seq}"
                assert (recorded.stream, recorded.version) == (stream, i), f"seed {seed}"
                assert recorded.event == ReclaimCompleted(generation=i), f"seed {seed}"
