"""Concurrent writers on PostgreSQL: N processes, each with its own store handle, appending single events (part
of ``python -m benchmarks.postgres``, on its cluster).

Processes, not threads: a thread's append costs several hundred µs of Python, so N threads of one
process would measure the GIL before the head row's lock. Each worker process is started once per N and
kept across rounds; a round tells every worker which side to run (``ours``: ``append_unchecked`` of one
event to its own stream, chained under the head row's lock; ``raw``: an autocommit INSERT into a table
with the same indexes) and a start time on the machine's monotonic clock, so all begin together. The
round's rate is every worker's operations over the round's length; p99 is over every operation's latency.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import time
from multiprocessing.connection import Connection
from typing import Any

from lifecycle_es import EventStore

from . import history
from .baselines import raw_postgres
from .cluster import Server
from .measure import Figure, alternate, clock_ns, compared, percentile
from .pgrounds import load

WRITERS = (1, 4, 8)


def _worker(url: str, conninfo: str, raw_schema: str, index: int, stride: int, pipe: Connection) -> None:
    """In the child: open a store handle and a raw connection, then run the rounds the parent sends."""
    from lifecycle_es import EventStore
    from lifecycle_es.events import encode

    from . import history
    from .baselines import raw_postgres

    stream = f"runner-w{index}"
    with EventStore.open(url) as store:
        raw = raw_postgres.RawTable(conninfo, raw_schema, itertools.count(index + 1, stride))
        version, pairs = store.stream_version(stream), 0
        body = encode(history.lease_pair("runner-raw", 0)[0])
        pipe.send("ready")
        while (order := pipe.recv()) is not None:
            side, start, seconds = order
            latencies: list[float] = []
            while clock_ns() < start:
                time.sleep(0.0005)
            deadline = start + int(seconds * 1e9)
            while (began := clock_ns()) < deadline:
                if side == "ours":
                    event = history.lease_pair(stream, pairs // 2)[pairs % 2]
                    store.append_unchecked(stream, [event], expected_version=version, at=history.AT)
                    version, pairs = version + 1, pairs + 1
                else:
                    raw.insert_commit(raw.rows(body, f"w{index}", 1)[0])
                latencies.append((clock_ns() - began) / 1000)
            pipe.send(latencies)
        raw.close()


def _round(pipes: list[Connection], side: str, seconds: float, into: list[float]) -> float:
    """One round of `side` on every worker at once: operations per second, all workers together."""
    start = clock_ns() + 200_000_000  # every worker is waiting by then
    for pipe in pipes:
        pipe.send((side, start, seconds))
    done = 0
    for pipe in pipes:
        if not pipe.poll(seconds + 120):
            raise TimeoutError(f"a writer process did not report its {side} round")
        got = pipe.recv()
        done += len(got)
        into.extend(got)
    return done / seconds


def run(server: Server, scale: dict[str, Any]) -> list[Figure]:
    """The writer figures for N = 1, 4, 8 (see the module's docstring)."""
    context = multiprocessing.get_context("spawn")
    figures: list[Figure] = []
    seconds = scale["writer_seconds"]
    for count in WRITERS:
        pipes, processes = [], []
        # The store, its streams and the raw table are made here, before any worker opens them: eight
        # processes creating one store at once collided ("relation meta already exists"), and a handle opened
        # while another appended was refused ("its head row says seq 1, but the log's last event is seq 2":
        # the open's check reads the head row and the last event in two statements).
        raw_postgres.RawTable(server.conninfo(), f"raw_writers_{count}").close()
        with EventStore.open(server.url(f"bench_writers_{count}")) as store:
            for index in range(count):
                stream = f"runner-w{index}"
                store.append_unchecked(stream, [history.initialized(stream)], expected_version=0, at=history.AT)
        try:
            for index in range(count):
                mine, theirs = context.Pipe()
                process = context.Process(target=_worker, name=f"writer-{count}-{index}", daemon=True, args=(
                    server.url(f"bench_writers_{count}"), server.conninfo(), f"raw_writers_{count}", index, count,
                    theirs))
                process.start()
                pipes.append(mine)
                processes.append(process)
            for pipe in pipes:
                if not pipe.poll(120) or pipe.recv() != "ready":
                    raise RuntimeError(f"a writer process of {count} did not start")
            latencies: dict[str, list[float]] = {"ours": [], "raw": []}

            rates = alternate({name: (lambda name=name, pipes=pipes, into=latencies[name]: _round(pipes, name, seconds,
                                                                                                  into))
                               for name in ("ours", "raw")}, scale["writer_rounds"])
        finally:
            for pipe in pipes:
                with contextlib.suppress(OSError):  # a worker that died has closed its end
                    pipe.send(None)
            for process in processes:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
                    process.join()
        noun = "writer" if count == 1 else "writers"
        figures.append(compared(f"postgres.writers.{count}", f"{count} {noun}, single-event appends", "ev/s",
                                rates["ours"], rates["raw"], "raw autocommit INSERTs, as many processes", None,
                                samples=rates,
                                note=f"processes, each with its own store handle and stream, {scale['writer_rounds']} "
                                     f"alternating rounds of {seconds} s; {load()}"))
        figures.append(compared(f"postgres.writers.{count}.p99", f"{count} {noun}, append p99", "µs",
                                percentile(latencies["ours"], 99), percentile(latencies["raw"], 99),
                                "raw autocommit INSERT p99", None))
    return figures
