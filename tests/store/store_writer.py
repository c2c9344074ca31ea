"""A real writer process for the store's crash and concurrency tests (run with ``sys.executable``).

    store_writer.py crash PATH ROUND DURABILITY
        Append ReclaimCompleted(generation=i) to stream ``crash-ROUND`` for i = 1, 2, ... until killed,
        printing ``SEQ I`` after each append returns: a printed line is an acknowledged commit.
    store_writer.py threads PATH ROUND
        Sixteen threads append ReclaimCompleted(generation=i) to streams ``t-ROUND-N`` (N = 0..15), each
        through the store's group commit, until killed, printing ``SEQ STREAM I`` after each append returns.
    store_writer.py worker PATH NAME COUNT
        Print ``ready``, wait for a line on stdin, then open the store (creating it if need be: the
        workers race to), append COUNT events to stream NAME and COUNT // 4 to the shared stream
        ``shared`` (read its version, append with expected_version, retry on ConcurrencyError),
        printing ``SEQ STREAM VERSION`` for each acknowledged event.

Every line is flushed at once, so a parent that SIGKILLs this process knows what was acknowledged.
"""

from __future__ import annotations

import sys
import threading

from lifecycle_es import ConcurrencyError, EventStore
from lifecycle_es.events import LeaseSettled, ReclaimCompleted

# A runaway guard: a crash writer whose parent died without killing it stops on its own.
MAX_CRASH_APPENDS = 200_000
THREADS = 16


def crash(path: str, round_: int, durability: str) -> None:
    stream = f"crash-{round_}"
    with EventStore.open(path, durability=durability) as store:
        print("ready", flush=True)
        for i in range(1, MAX_CRASH_APPENDS):
            recorded = store.append_unchecked(stream, [ReclaimCompleted(generation=i)], expected_version=i - 1)
            print(recorded[0].seq, i, flush=True)


def threads(path: str, round_: int) -> None:
    printed = threading.Lock()  # one line at a time: print's text and newline may part between threads

    def append(store: EventStore, stream: str) -> None:
        for i in range(1, MAX_CRASH_APPENDS):
            recorded = store.append_unchecked(stream, [ReclaimCompleted(generation=i)], expected_version=i - 1)
            with printed:
                sys.stdout.write(f"{recorded[0].seq} {stream} {i}\n")
                sys.stdout.flush()

    with EventStore.open(path) as store:
        print("ready", flush=True)
        writers = [threading.Thread(target=append, args=(store, f"t-{round_}-{n}")) for n in range(THREADS)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()


def worker(path: str, name: str, count: int) -> None:
    print("ready", flush=True)
    sys.stdin.readline()
    with EventStore.open(path) as store:
        for i in range(1, count + 1):
            (recorded,) = store.append_unchecked(name, [ReclaimCompleted(generation=i)], expected_version=i - 1)
            print(recorded.seq, recorded.stream, recorded.version, flush=True)
            if i % 4:
                continue
            event = LeaseSettled(lease_id=f"{name}-{i}", lease_generation=i, result_digest="sha256:" + "0" * 64)
            while True:
                try:
                    (shared,) = store.append_unchecked("shared", [event],
                                                       expected_version=store.stream_version("shared"))
                    break
                except ConcurrencyError:
                    continue  # another worker appended between our read and our append: decide again
            print(shared.seq, shared.stream, shared.version, flush=True)


def main(argv: list[str]) -> None:
    mode, path, *rest = argv
    if mode == "crash":
        crash(path, int(rest[0]), rest[1])
    elif mode == "threads":
        threads(path, int(rest[0]))
    elif mode == "worker":
        worker(path, rest[0], int(rest[1]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
