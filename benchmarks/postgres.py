"""PostgreSQL figures: the store on a real server against raw SQL and eventsourcing on the same server.

    python -m benchmarks.postgres [--quick]

One throwaway cluster for the whole run (`benchmarks.cluster`: the machine's PostgreSQL binaries, a unix
socket, fsync and synchronous_commit on), every subject and its baseline on it, in alternating rounds:

- a durable command (acquire_lease / settle_lease pairs of a `RunnerLifecycle`, one transaction each) vs
  a raw autocommit ``INSERT`` into a table with the same columns and indexes (one round trip, one WAL
  flush: the floor), and vs eventsourcing's PostgreSQL recorder saving one event per save (>= 1.2x);
- a batch of 1000 events by ``append_unchecked`` vs a binary ``COPY`` of 1000 rows of the same bytes;
- follow wake-up latency p50 and p99 (`benchmarks.pgfollow`), NOTIFY on and ``notify=off``;
- 1, 4 and 8 writer processes (`benchmarks.pgwriters`), each with its own store handle, appending single
  events (chained, under the head row's lock) vs as many processes of raw autocommit INSERTs: events/s, p99;
- where the time goes (`benchmarks.pgrounds`): statements per command from the server log, and
  prototype appends with fewer round trips and statements, with the client's CPU per append.

The load average is printed beside the figures: on a shared machine, absolute rates move with it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import psycopg

from lifecycle_es import EventStore
from lifecycle_es.events import encode

from . import history, pgfollow, pgrounds, pgwriters, runners
from .baselines import pyeventsourcing, raw_postgres
from .cluster import NEED, Server, binaries, cluster
from .measure import Figure, Target, alternate, compared, median, rate, unavailable
from .pgrounds import load
from .suite import Context, main

BATCH = 1000
POLL = 0.05


def _scale(context: Context) -> dict[str, Any]:
    if context.quick:
        return {"rounds": 12, "commands": 30, "batch_rounds": 5, "wake_rounds": 6, "wakes": 20,
                "writer_rounds": 2, "writer_seconds": 1.5, "statement_commands": 20, "per_thread": 10}
    return {"rounds": 30, "commands": 40, "batch_rounds": 11, "wake_rounds": 10, "wakes": 40,
            "writer_rounds": 3, "writer_seconds": 3.0, "statement_commands": 50, "per_thread": 20}


def _body() -> bytes:
    return encode(history.lease_pair("runner-raw", 0)[0])


class _Stream:
    """One stream of a store appended to one event (or one batch) at a time, `append_unchecked`."""

    def __init__(self, store: EventStore, stream: str) -> None:
        self.store, self.stream = store, stream
        self.version = store.stream_version(stream)
        self.pairs = itertools.count()

    def events(self, count: int) -> list[Any]:
        out: list[Any] = []
        while len(out) < count:
            out.extend(history.lease_pair(self.stream, next(self.pairs)))
        return out[:count]

    def append(self, events: list[Any]) -> None:
        self.store.append_unchecked(self.stream, events, expected_version=self.version, at=history.AT)
        self.version += len(events)


# --- a durable command: raw INSERT and eventsourcing saves in the same rounds ------------------------


def _eventsourcing(server: Server) -> tuple[Any, str | None]:
    """eventsourcing's application on this server, or None and why it cannot run here."""
    problem = pyeventsourcing.postgres_problem()
    if problem is not None:
        return None, problem
    with psycopg.connect(server.conninfo(), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS es_bench")
    try:
        return pyeventsourcing.Fleet("postgres", env=pyeventsourcing.postgres_env(server.directory, "es_bench")), None
    except Exception as exc:  # the library's own failure on this server is what the figure reports
        return None, f"eventsourcing {pyeventsourcing.version()} failed on this server: {type(exc).__name__}: {exc}"


def _single(context: Context, server: Server, scale: dict[str, Any], fleet: Any, problem: str | None) -> list[Figure]:
    title = "PostgreSQL durable command (acquire/settle)"
    store = EventStore.open(server.url("bench_single"))
    raw = raw_postgres.RawTable(server.conninfo(), "raw_single")
    try:
        runner = runners.LifecycleRunner(store, "runner-single", context.workdir)
        count, body = scale["commands"], _body()

        def raw_round() -> float:
            rows = raw.rows(body, "runner-raw", count)
            return rate(lambda: sum(raw.insert_commit(row) is None for row in rows))

        subjects: dict[str, Callable[[], float]] = {
            "ours": lambda: rate(lambda: runner.commands(count)), "raw": raw_round}
        if fleet is not None:
            es_runner, pairs = fleet.new_runner("runner-single"), itertools.count()
            subjects["eventsourcing"] = lambda: rate(
                lambda: sum(fleet.acquire_settle(es_runner, next(pairs)) for _ in range(count // 2)))
        cpu: dict[str, list[float]] = {}
        rates = alternate({name: pgrounds.cpu_per_op(name, subject, count, cpu) for name, subject in subjects.items()},
                          scale["rounds"])
        audited = store.verify().events
    finally:
        store.close()
        raw.close()
    shown_cpu = ", ".join(f"{name} {median(values):.0f}" for name, values in cpu.items())
    note = (f"one transaction per command, synchronous_commit=on, no preflight; {scale['rounds']} alternating "
            f"rounds of {count}; client CPU µs per command or save (median of rounds): {shown_cpu}; {load()}")
    figures = [compared("postgres.command.single", title, "cmd/s", rates["ours"], rates["raw"],
                        "raw autocommit INSERT, same indexes", None, samples=rates, note=note)]
    es_title = f"{title} vs eventsourcing save"
    if fleet is None:
        figures.append(compared("postgres.command.vs_eventsourcing", es_title, "cmd/s", rates["ours"], None,
                                "eventsourcing: cannot run", Target(">=", 1.2), note=str(problem)))
    else:
        figures.append(compared("postgres.command.vs_eventsourcing", es_title, "cmd/s", rates["ours"],
                                rates["eventsourcing"], "eventsourcing PostgreSQL save", Target(">=", 1.2),
                                samples=rates,
                                note=f"eventsourcing {pyeventsourcing.version()}, PostgresApplicationRecorder, "
                                     "one event per save, aggregate kept in memory, same server; verify() passed "
                                     f"over our {audited:,} events"))
    return figures


# --- a batch: append_unchecked vs binary COPY ------------------------------------------------------------


def _batch(server: Server, scale: dict[str, Any]) -> Figure:
    store = EventStore.open(server.url("bench_batch"))
    raw = raw_postgres.RawTable(server.conninfo(), "raw_batch")
    try:
        stream = _Stream(store, "runner-batch")
        stream.append([history.initialized("runner-batch")])
        bodies = [encode(event) for event in stream.events(BATCH)]

        def ours() -> float:
            events = stream.events(BATCH)
            return rate(lambda: stream.append(events) or BATCH)

        def copy() -> float:
            versions = raw.versions.setdefault("runner-batch", itertools.count(1))
            rows = [(next(raw.seqs), "runner-batch", next(versions), "LeaseAcquired", history.AT, body,
                     os.urandom(32), os.urandom(32)) for body in bodies]
            return rate(lambda: raw.copy(rows) or BATCH)

        rates = alternate({"ours": ours, "copy": copy}, scale["batch_rounds"])
    finally:
        store.close()
        raw.close()
    return compared("postgres.batch", f"PostgreSQL batch of {BATCH} events (append_unchecked)", "ev/s",
                    rates["ours"], rates["copy"], "binary COPY, same bytes, one transaction", None, samples=rates,
                    note=f"{scale['batch_rounds']} alternating rounds; ours encodes, chains and pipelines INSERTs; "
                         f"{load()}")


def _crowd(context: Context, server: Server, scale: dict[str, Any]) -> list[Figure]:
    """64 threads of commands on one store (group commit) against a lone command, on the server."""
    from .throughput import THREADS, _Crowd

    store = EventStore.open(server.url("bench_crowd"))
    try:
        crowd = _Crowd(store, context.workdir, THREADS)
        lone = runners.LifecycleRunner(store, "runner-lone", context.workdir)
        count = scale["commands"]
        # As many commands a thread as benchmarks.throughput gives each on SQLite: a round long enough that
        # starting 64 threads is not most of it.
        per_thread = scale["per_thread"]
        rates = alternate({"concurrent": lambda: crowd.round(per_thread),
                           "lone": lambda: rate(lambda: lone.commands(count))}, scale["rounds"])
        mean_batch = crowd.commands / max(1, crowd.batches)
        latencies = sorted(crowd.latencies)
    finally:
        store.close()
    p99_ms = (latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0) / 1000
    note = (f"group commit; {THREADS} threads x {scale['per_thread']} commands per round; mean batch "
            f"{mean_batch:.1f}; command p99 under that load {p99_ms:,.1f} ms; {load()}")
    return [compared("postgres.concurrent_64", f"{THREADS} concurrent commands on {THREADS} runners, one store",
                     "cmd/s", rates["concurrent"], rates["lone"], "lone command, same store", Target(">=", 5),
                     samples=rates, note=note)]


def run(context: Context) -> list[Figure]:
    """Every PostgreSQL figure, on one throwaway cluster started for the run."""
    if binaries() is None:
        return [unavailable("postgres.command.single", "PostgreSQL durable command (acquire/settle)",
                            "raw autocommit INSERT, same indexes", None, NEED, missing="no PostgreSQL server")]
    scale = _scale(context)
    with cluster() as server:
        context.say(f"postgres: cluster at {server.directory}")
        context.say("postgres: durable commands")
        fleet, problem = _eventsourcing(server)
        try:
            figures = _single(context, server, scale, fleet, problem)
            context.say("postgres: batches")
            figures.append(_batch(server, scale))
            context.say("postgres: follow wake-up")
            figures += pgfollow.run(server, scale)
            context.say("postgres: concurrent writers")
            figures += pgwriters.run(server, scale)
            context.say("postgres: 64 concurrent commands (group commit)")
            figures += _crowd(context, server, scale)
            context.say("postgres: statements and round trips per command")
            figures += pgrounds.run(context, server, scale, fleet)
        finally:
            if fleet is not None:
                fleet.close()
    return figures


if __name__ == "__main__":
    raise SystemExit(main(modules={"postgres": run}))
