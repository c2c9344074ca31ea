"""Lifecycle figures: durable commands against raw SQLite, the seed's JSON file and eventsourcing.

    python -m benchmarks.lifecycle [--quick]

- a durable command (acquire_lease / settle_lease pairs, one transaction each) vs a raw single-row
  ``INSERT+COMMIT`` (>= 0.8x) and vs an eventsourcing single-event save (>= 1.5x), in the same rounds;
- command p50 and p99 with 1k, 100k and (full mode) 1M events of other runners' history in the file
  (p50 within 1.2x of 1k);
- commands/s against the seed's JSON-file store holding 10, 256 and 1024 retained leases (>= 20x at 1024);
- a cold load (``RunnerLifecycle(...).snapshot()`` on a fresh store handle) of a 10,000-event runner,
  with and without snapshots, vs eventsourcing's reconstruction of a 10,000-event aggregate (>= 5x);
- ``projections.rebuild`` over the longest log (>= 300,000 events/s), shown beside the bare replay loop.

Every lifecycle here runs with a no-op base directory preflight, on both sides of every comparison
(the JSON store too): the figures compare storage and decision, not the probe file's extra fsync.
Figures whose code has not landed are "n/a".
"""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Callable

from lifecycle_es import EventStore
from lifecycle_es.events import encode

from . import history, runners
from .baselines import pyeventsourcing, raw_sqlite
from .measure import (
    Figure,
    Target,
    alternate,
    compared,
    latencies_us,
    percentile,
    quiesce,
    rate,
    settle,
    unavailable,
)
from .suite import Context, main

COLD_EVENTS = 10_000
COLD_TAIL = 100
JSON_LEASES = (10, 256, 1024)
JSON_CHUNK = 10
PREFLIGHT = "no-op base dir preflight on both sides"
ES_MISSING = "eventsourcing is not installed: pip install -e '.[bench]'"


def _scale(context: Context) -> dict[str, int]:
    if context.quick:
        return {"rounds": 30, "commands": 30, "latency_rounds": 7, "latency_pairs": 50, "json_chunks": 4,
                "json_rounds": 5, "cold_rounds": 7, "rebuild_rounds": 1}
    return {"rounds": 60, "commands": 50, "latency_rounds": 15, "latency_pairs": 150, "json_chunks": 4,
            "json_rounds": 9, "cold_rounds": 11, "rebuild_rounds": 2}


def _sizes(context: Context) -> list[int]:
    return [1_000, 100_000] if context.quick else [1_000, 100_000, 1_000_000]


def _raw_body() -> bytes:
    return encode(history.lease_pair("runner-raw", 0)[0])


# --- durable single command: raw INSERT+COMMIT and eventsourcing saves in the same rounds -------------


def _single(context: Context, scale: dict[str, int]) -> list[Figure]:
    title = "durable single command (acquire/settle)"
    store = EventStore.open(context.path("lifecycle-single.db"))
    conn = raw_sqlite.open_raw(context.path("raw-single.db"))
    fleet = pyeventsourcing.Fleet(context.path("es-single.db")) if pyeventsourcing.available() else None
    try:
        runner = runners.LifecycleRunner(store, "runner-single", context.workdir)
        body, seq = _raw_body(), itertools.count(1)
        count = scale["commands"]

        def raw_round() -> float:
            first = next(seq)
            rows = raw_sqlite.rows_like(body, stream="runner-raw", first_seq=first, first_version=first, count=count)
            for _ in range(count - 1):
                next(seq)

            def insert() -> int:
                for row in rows:
                    raw_sqlite.insert_commit(conn, row)
                return count
            return rate(insert)

        subjects: dict[str, Callable[[], float]] = {"ours": lambda: rate(lambda: runner.commands(count)),
                                                    "raw": raw_round}
        es_sync = None
        if fleet is not None:
            es_runner = fleet.new_runner("runner-single")
            es_sync = fleet.synchronous()
            pairs = itertools.count()

            def es_round() -> float:
                def saves() -> int:
                    return sum(fleet.acquire_settle(es_runner, next(pairs)) for _ in range(count // 2))
                return rate(saves)
            subjects["eventsourcing"] = es_round
        settle(context.path("lifecycle-single.db"))
        rates = alternate(subjects, scale["rounds"])
    finally:
        store.close()
        conn.close()
        if fleet is not None:
            fleet.close()
    ours = rates["ours"]
    figures = [compared("lifecycle.command.single", title, "cmd/s", ours, rates["raw"],
                        "raw apsw INSERT+COMMIT", Target(">=", 0.8), samples=rates,
                        note=f"one transaction per command, synchronous=FULL, {PREFLIGHT}; {scale['rounds']} "
                             f"alternating rounds of {count}")]
    if fleet is None:
        figures.append(compared("lifecycle.command.vs_eventsourcing", f"{title} vs eventsourcing save", "cmd/s",
                                ours, None, "eventsourcing: not installed", Target(">=", 1.5), note=ES_MISSING))
    else:
        figures.append(compared("lifecycle.command.vs_eventsourcing", f"{title} vs eventsourcing save", "cmd/s",
                                ours, rates["eventsourcing"], "eventsourcing single-event save",
                                Target(">=", 1.5), samples=rates,
                                note=f"eventsourcing {pyeventsourcing.version()} on its SQLite module, one event "
                                     f"per save, aggregate kept in memory; its PRAGMA synchronous={es_sync}"))
    return figures


# --- latency with history --------------------------------------------------------------------------


def _latency(context: Context, scale: dict[str, int]) -> list[Figure]:
    sizes = _sizes(context)
    stores = {size: EventStore.open(history.history_log(context, size)) for size in sizes}
    try:
        drivers = {size: runners.LifecycleRunner(store, "runner-latency", context.workdir)
                   for size, store in stores.items()}
        samples: dict[int, list[float]] = {size: [] for size in sizes}

        def one_round(size: int) -> Callable[[], float]:
            def measure() -> float:
                got = latencies_us(drivers[size].command, 2 * scale["latency_pairs"])
                samples[size].extend(got)
                return percentile(got, 50)
            return measure

        p50s = alternate({str(size): one_round(size) for size in sizes}, scale["latency_rounds"])
    finally:
        for store in stores.values():
            store.close()
    figures: list[Figure] = []
    small = sizes[0]
    for size in sizes[1:]:
        figures += [
            compared(f"lifecycle.latency.p50.{size}", f"command p50 at {size:,} events of history", "µs",
                     p50s[str(size)], p50s[str(small)], f"at {small:,}", Target("<=", 1.2),
                     samples=p50s, note=f"{len(samples[size]):,} commands per size, other runners' events"),
            compared(f"lifecycle.latency.p99.{size}", f"command p99 at {size:,} events of history", "µs",
                     percentile(samples[size], 99), percentile(samples[small], 99), f"at {small:,}", None),
        ]
    return figures


# --- against the seed's JSON file -------------------------------------------------------------------


def _vs_json(context: Context, scale: dict[str, int]) -> list[Figure]:
    """Each round: both sides start from the same number of retained leases, then run short alternating
    chunks of commands (ABBA), so both meet the same disk; the round's rate is its commands over its time."""
    path = context.path("lifecycle-vs-json.db")
    builder = EventStore.open(path, durability="normal")  # builds each round's runner; not measured
    store = EventStore.open(path)
    chunk, chunks = JSON_CHUNK, scale["json_chunks"]
    figures: list[Figure] = []
    rates: dict[str, list[float]] = {}
    try:
        for leases in JSON_LEASES:
            context.say(f"lifecycle: vs JSON file at {leases} leases")
            rates = {"ours": [], "seed": []}
            for round_ in range(scale["json_rounds"]):
                runner_id = f"runner-json-{leases}-{round_}"
                runners.LifecycleRunner(builder, runner_id, context.workdir).commands(2 * leases)
                # The build's WAL is checkpointed now, not by a measured commit.
                builder.backend.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                # Catches up with the log before the clock starts.
                runner = runners.LifecycleRunner(store, runner_id, context.workdir)
                seed, generation = runners.json_lifecycle(context.path(f"runner-{leases}.json"), context.workdir,
                                                          leases)
                chunk_rates = alternate({
                    "ours": lambda runner=runner: rate(lambda: runner.commands(chunk)),
                    "seed": lambda seed=seed, generation=generation: rate(
                        lambda: runners.json_pairs(seed, generation, chunk // 2)),
                }, chunks)
                for side, got in chunk_rates.items():
                    rates[side].append(len(got) * chunk / sum(chunk / value for value in got))
            figures.append(compared(
                f"lifecycle.vs_json.{leases}", f"commands/s vs JSON file at {leases} leases", "cmd/s",
                rates["ours"], rates["seed"], "seed's JSON file", Target(">=", 20) if leases == 1024 else None,
                samples=rates,
                note=f"each round starts from {leases} retained leases and runs {chunks} alternating chunks of "
                     f"{chunk} commands a side; {PREFLIGHT}" if leases == JSON_LEASES[0] else ""))
    finally:
        builder.close()
        store.close()
    return figures


# --- cold load against eventsourcing's reconstruction ------------------------------------------------


def _cold_load(context: Context, scale: dict[str, int]) -> list[Figure]:
    title = f"cold load of a {COLD_EVENTS:,}-event runner"
    api = runners.lifecycle_api()
    no_snapshots = "snapshot_every" in inspect.signature(api.RunnerLifecycle).parameters
    path = context.path("lifecycle-cold.db")
    context.say(f"lifecycle: building {COLD_EVENTS:,}-event runners")
    with EventStore.open(path, durability="normal") as builder:
        # Most of each runner is appended in batches; its last COLD_TAIL events are real commands, so the
        # snapshotted runner has snapshots at the lifecycle's own cadence (and a tail shorter than it).
        # Both histories first: they are stamped at history.AT, and the log never runs back in time after the
        # commands' own (the clock's) stamps.
        built = [(runner_id, every) for runner_id, every in (("runner-cold-snapshots", None),
                                                            ("runner-cold-plain", 10**12))
                 if every is None or no_snapshots]
        for runner_id, _ in built:
            history.append_runner(builder, runner_id, COLD_EVENTS - COLD_TAIL, base_dir=context.workdir)
        for runner_id, every in built:
            runners.LifecycleRunner(builder, runner_id, context.workdir, snapshot_every=every).commands(COLD_TAIL)
    quiesce()

    def ours(runner_id: str) -> Callable[[], float]:
        def load() -> float:
            with EventStore.open(path) as store:  # a fresh handle; opening it is not timed
                start = time.perf_counter_ns()
                lifecycle = runners.new_lifecycle(store, runner_id, context.workdir)
                lifecycle.snapshot()
                elapsed = time.perf_counter_ns() - start
                return store.stream_version(runner_id) * 1e9 / elapsed
        return load

    subjects = {"with snapshots": ours("runner-cold-snapshots")}
    if no_snapshots:
        subjects["without snapshots"] = ours("runner-cold-plain")
    fleet = pyeventsourcing.Fleet(context.path("es-cold.db")) if pyeventsourcing.available() else None
    try:
        if fleet is not None:
            aggregate = fleet.runner_with("runner-cold", COLD_EVENTS)
            quiesce()

            def es_load() -> float:
                fleet.reopen()
                start = time.perf_counter_ns()
                version = fleet.load(aggregate)
                return version * 1e9 / (time.perf_counter_ns() - start)
            subjects["eventsourcing"] = es_load
        rates = alternate(subjects, scale["cold_rounds"])
    finally:
        if fleet is not None:
            fleet.close()
    figures = []
    for variant, name in (("without snapshots", "plain"), ("with snapshots", "snapshots")):
        figure_name, figure_title = f"lifecycle.cold_load.{name}", f"{title}, {variant}"
        if variant not in rates:
            figures.append(unavailable(figure_name, figure_title, "eventsourcing reconstruction", Target(">=", 5),
                                       "RunnerLifecycle has no snapshot_every to build a runner without snapshots"))
        elif fleet is None:
            figures.append(compared(figure_name, figure_title, "ev/s", rates[variant], None,
                                    "eventsourcing: not installed", Target(">=", 5), note=ES_MISSING))
        else:
            figures.append(compared(figure_name, figure_title, "ev/s", rates[variant],
                                    rates["eventsourcing"], "eventsourcing reconstruction",
                                    Target(">=", 5), samples=rates,
                                    note="RunnerLifecycle(...).snapshot() on a fresh store handle vs "
                                         "app.repository.get() on a fresh application, no snapshots there"
                                    if name == "plain" else ""))
    return figures


# --- rebuild ----------------------------------------------------------------------------------------


def _rebuild(context: Context, scale: dict[str, int]) -> Figure:
    size = _sizes(context)[-1]
    title = f"projections.rebuild over {size:,} events"
    target = Target(">=", 300_000, of="value")
    try:
        from projections import rebuild
    except ImportError:
        return unavailable("lifecycle.rebuild", title, "bare replay loop", target, "projections.rebuild has not landed")
    path = history.history_log(context, size)

    def ours() -> float:
        with EventStore.open(path) as store:
            return rate(lambda: rebuild(store).events)

    rates = alternate({"ours": ours, "bare": lambda: rate(lambda: raw_sqlite.bare_replay(path))},
                      scale["rebuild_rounds"])
    return compared("lifecycle.rebuild", title, "ev/s", rates["ours"], rates["bare"],
                    "bare replay loop", target, samples=rates,
                    note="an absolute target (events/s): compare with the bare loop's rate measured beside it")


def run(context: Context) -> list[Figure]:
    """Every lifecycle figure ("n/a" while the lifecycle has not landed)."""
    scale = _scale(context)
    if runners.lifecycle_api() is None:
        why = "lifecycle_es.lifecycle.RunnerLifecycle has not landed"
        return [unavailable(name, title, base, target, why) for name, title, base, target in (
            ("lifecycle.command.single", "durable single command", "raw apsw INSERT+COMMIT", Target(">=", 0.8)),
            ("lifecycle.command.vs_eventsourcing", "single command vs eventsourcing save", "eventsourcing save",
             Target(">=", 1.5)),
            ("lifecycle.latency", "command p50 with history", "at 1k", Target("<=", 1.2)),
            ("lifecycle.vs_json.1024", "commands/s vs JSON file at 1024 leases", "seed's JSON file", Target(">=", 20)),
            ("lifecycle.cold_load", "cold load of a 10,000-event runner", "eventsourcing reconstruction",
             Target(">=", 5)),
        )] + [_rebuild(context, scale)]
    context.say("lifecycle: single commands")
    figures = _single(context, scale)
    context.say("lifecycle: latency with history")
    figures += _latency(context, scale)
    figures += _vs_json(context, scale)
    figures += _cold_load(context, scale)
    context.say("lifecycle: rebuild")
    figures.append(_rebuild(context, scale))
    return figures


if __name__ == "__main__":
    raise SystemExit(main(modules={"lifecycle": run}))
