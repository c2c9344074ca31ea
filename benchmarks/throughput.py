"""Throughput figures (issue 14): commands of many threads in one store's group commit, and the lone command.

    python -m benchmarks.throughput [--quick]

- 64 concurrent commands: 64 threads, each driving its own runner with acquire_lease / settle_lease
  commands on one store, against the rate of a lone thread's commands on the same store, in
  alternating rounds (>= 10x on SQLite);
- their p99 latency under that load (no target: reported beside the lone command's p99), with the
  mean batch the group commit formed;
- the lone durable command against a raw ``BEGIN IMMEDIATE; INSERT; COMMIT`` into a table with the same
  columns and indexes (``benchmarks.baselines.raw_sqlite``), the two taking turns every ten commands
  within each round (>= 0.7x);
- asyncio: 64 tasks' commands through ``lifecycle_es.aio`` (rate against the threads', and the event
  loop's worst heartbeat lag while they commit, against the time they took: no target).

Command p50 at 1M events of history is ``python -m benchmarks.lifecycle`` (full mode), unchanged by the
group commit: a lone command runs the same transaction it ran before. Every command here runs with a
no-op base directory preflight (both sides compare storage and decisions, not the probe's fsync).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from lifecycle_es import EventStore
from lifecycle_es.events import encode

from . import history, runners
from .baselines import raw_sqlite
from .measure import NS, Figure, Target, alternate, clock_ns, compared, median, percentile, settle
from .suite import Context, main

THREADS = 64
CHUNK = 10  # lone commands and raw inserts take turns this many at a time


def _scale(context: Context) -> dict[str, int]:
    if context.quick:
        return {"rounds": 6, "per_thread": 10, "lone": 60}
    return {"rounds": 12, "per_thread": 20, "lone": 120}


class _Crowd:
    """64 threads, each with its own runner, released together for `per_thread` commands each."""

    def __init__(self, store: EventStore, workdir: str, threads: int) -> None:
        self.drivers = [runners.LifecycleRunner(store, f"runner-{n:02d}", workdir) for n in range(threads)]
        self.latencies: list[float] = []
        self.group = store.group_commit
        self.batches = self.commands = 0
        self.cpu_us: list[float] = []  # the process's CPU per command, each round (every thread's)

    def round(self, per_thread: int) -> float:
        """One round's rate (commands/s), from the release to the last command's return."""
        start = threading.Barrier(len(self.drivers) + 1)
        samples: list[list[float]] = [[] for _ in self.drivers]

        def drive(index: int) -> None:
            driver, mine = self.drivers[index], samples[index]
            start.wait()
            for _ in range(per_thread):
                began = clock_ns()
                driver.command()
                mine.append((clock_ns() - began) / 1000)

        threads = [threading.Thread(target=drive, args=(n,)) for n in range(len(self.drivers))]
        for thread in threads:
            thread.start()
        batches, commands = self.group.batches, self.group.commands
        start.wait()
        began, cpu = clock_ns(), time.process_time()
        for thread in threads:
            thread.join()
        elapsed = clock_ns() - began
        self.cpu_us.append((time.process_time() - cpu) * 1e6 / (len(self.drivers) * per_thread))
        self.batches += self.group.batches - batches
        self.commands += self.group.commands - commands
        for mine in samples:
            self.latencies.extend(mine)
        return len(self.drivers) * per_thread * NS / elapsed


def _concurrent(context: Context, scale: dict[str, int]) -> list[Figure]:
    store = EventStore.open(context.path("throughput.db"))
    conn = raw_sqlite.open_raw(context.path("raw.db"))
    try:
        crowd = _Crowd(store, context.workdir, THREADS)
        lone = runners.LifecycleRunner(store, "runner-lone", context.workdir)
        lone_latencies: list[float] = []
        body = encode(history.lease_pair("runner-raw", 0)[0])  # the bytes a command writes
        seq = itertools.count(1)

        raw_rates: list[float] = []

        def lone_and_raw_round() -> float:
            """The lone command's rate in this round; the raw insert's, measured in the same moments, is kept.

            The two take turns every `CHUNK` commands (which goes first swapping each turn), so a disk
            whose fsync slows or speeds up during the round (other processes' writeback) weighs on both
            alike: their ratio is of the same moments, not of neighbouring ones.
            """
            count = scale["lone"]
            first = next(seq)
            rows = raw_sqlite.rows_like(body, stream="runner-raw", first_seq=first, first_version=first, count=count)
            for _ in range(count - 1):
                next(seq)
            spent = {"lone": 0, "raw": 0}

            def lone_chunk(start: int) -> None:
                chunk_began = clock_ns()
                for _ in range(start, min(start + CHUNK, count)):
                    began = clock_ns()
                    lone.command()
                    lone_latencies.append((clock_ns() - began) / 1000)
                spent["lone"] += clock_ns() - chunk_began

            def raw_chunk(start: int) -> None:
                began = clock_ns()
                for row in rows[start:start + CHUNK]:
                    raw_sqlite.insert_commit(conn, row)
                spent["raw"] += clock_ns() - began

            for turn, start in enumerate(range(0, count, CHUNK)):
                for chunk in (lone_chunk, raw_chunk) if turn % 2 == 0 else (raw_chunk, lone_chunk):
                    chunk(start)
            raw_rates.append(count * NS / max(1, spent["raw"]))
            return count * NS / max(1, spent["lone"])

        settle(context.path("throughput.db"))
        rates = alternate({"concurrent": lambda: crowd.round(scale["per_thread"]), "lone": lone_and_raw_round},
                          scale["rounds"])
        rates["raw"] = raw_rates
        mean_batch = crowd.commands / max(1, crowd.batches)
        # What bounds the ratio: under load every command's Python runs under one GIL, so the 64 threads
        # command at most about 1/c, c the CPU a command costs there; the lone command takes 1/lone.
        cpu = median(crowd.cpu_us)
        ceiling = 1e6 / cpu / median(rates["lone"])
        share = cpu * median(rates["concurrent"]) / 1e6  # the cores the process had while the 64 ran
    finally:
        store.close()
        conn.close()
    rounds = scale["rounds"]
    return [
        compared("throughput.concurrent_64", f"{THREADS} concurrent commands on {THREADS} runners, one store",
                 "cmd/s", rates["concurrent"], rates["lone"], "lone command, same store", Target(">=", 10),
                 samples=rates, note=f"{THREADS} threads x {scale['per_thread']} acquire/settle commands per round, "
                                     f"{rounds} rounds alternating with the lone command and raw; mean batch under "
                                     f"load {mean_batch:.1f} commands; CPU per command under load {cpu:.0f} µs (all "
                                     f"threads), so the 64 reach at most about {1e6 / cpu:,.0f} cmd/s on a core of "
                                     f"their own, {ceiling:.1f}x the lone rate here (the lone command waits "
                                     f"{1e6 / median(rates['lone']):.0f} µs, mostly its fsync); they had "
                                     f"{share:.2f} of a core (other processes' load takes the rest)"),
        compared("throughput.concurrent_64.p99", f"command p99 under {THREADS} concurrent commands", "µs",
                 percentile(crowd.latencies, 99), percentile(lone_latencies, 99), "lone command p99", None,
                 note=f"p50 {percentile(crowd.latencies, 50):,.0f} µs under load, lone p50 "
                      f"{percentile(lone_latencies, 50):,.0f} µs; {len(crowd.latencies):,} commands"),
        compared("throughput.lone_vs_raw", "lone durable command (acquire/settle)", "cmd/s", rates["lone"],
                 rates["raw"], "raw apsw INSERT+COMMIT, same indexes", Target(">=", 0.7), samples=rates,
                 note="raw: the store's pragmas, a STRICT table with the events table's columns, primary key and "
                      f"UNIQUE (stream, version); one row, one durable transaction; the two take turns every {CHUNK} "
                      "commands within a round, so both meet the same fsync latency"),
    ]


async def _aio_round(store: Any, lifecycles: list[Any], per_task: int) -> tuple[float, float, float]:
    """(commands/s, the heartbeat's worst lag in ms, the round's length in ms) for one round of tasks."""
    lags: list[float] = []
    stop = asyncio.Event()

    async def heartbeat() -> None:
        while not stop.is_set():
            began = clock_ns()
            await asyncio.sleep(0.001)
            lags.append((clock_ns() - began) / 1e6 - 1)

    async def drive(driver: Any) -> None:
        for _ in range(per_task):
            await driver()

    beat = asyncio.ensure_future(heartbeat())
    began = clock_ns()
    await asyncio.gather(*(drive(each) for each in lifecycles))
    elapsed = clock_ns() - began
    stop.set()
    await beat
    return len(lifecycles) * per_task * NS / elapsed, max(lags, default=0.0), elapsed / 1e6


def _aio(context: Context, scale: dict[str, int], threads_rate: float) -> list[Figure]:
    from lifecycle_es.aio import AsyncEventStore

    async def run() -> tuple[list[float], list[float], list[float]]:
        async with await AsyncEventStore.open(context.path("aio.db")) as store:
            drivers = [runners.LifecycleRunner(store.store, f"runner-{n:02d}", context.workdir)
                       for n in range(THREADS)]

            def awaited(driver: runners.LifecycleRunner) -> Callable[[], Any]:
                return lambda: store.run(driver.command)
            calls = [awaited(driver) for driver in drivers]
            rates, lags, lengths = [], [], []
            for _ in range(scale["rounds"]):
                got = await _aio_round(store, calls, scale["per_thread"])
                rates.append(got[0])
                lags.append(got[1])
                lengths.append(got[2])
            return rates, lags, lengths

    rates, lags, lengths = asyncio.run(run())
    return [
        compared("throughput.aio_64", f"{THREADS} asyncio tasks' commands (lifecycle_es.aio)", "cmd/s", rates,
                 threads_rate, f"{THREADS} threads' commands", None,
                 note="the same commands awaited through the store's pool of 64 threads"),
        compared("throughput.aio_64.loop_lag", "event loop's worst heartbeat lag while 64 commands commit", "ms",
                 median(lags), median(lengths), "the round's length", None,
                 note="a 1 ms heartbeat's worst overshoot per round (median of rounds); the loop waits on "
                      "nothing but the GIL"),
    ]


def run(context: Context) -> list[Figure]:
    """Every throughput figure."""
    scale = _scale(context)
    context.say("throughput: 64 concurrent commands, the lone command, raw")
    figures = _concurrent(context, scale)
    context.say("throughput: asyncio")
    figures += _aio(context, scale, figures[0].ours or 0.0)
    return figures


if __name__ == "__main__":
    raise SystemExit(main(modules={"throughput": run}))
