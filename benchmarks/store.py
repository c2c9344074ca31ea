"""Store figures: durable appends against raw apsw, verify against a bare replay, and flat costs.

    python -m benchmarks.store [--quick]

- single-event durable append vs a raw ``BEGIN IMMEDIATE; INSERT; COMMIT`` of the same bytes (>= 0.9x);
- a 1000-event batch in one transaction vs ``executemany`` of 1000 precomputed rows (>= 0.5x);
- ``verify()`` vs a bare loop that reads, decodes and hashes every row of the same file (>= 0.8x);
- append p50, a stream read and verify per event at 1k vs 100k events of history (and 1M in full
  mode), each within 1.2x; verify's peak memory on the longest log within 1.1x of a 5x shorter one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import apsw

from lifecycle_es import EventStore
from lifecycle_es.events import encode

from . import history
from .baselines import raw_sqlite
from .measure import (
    Figure,
    Target,
    alternate,
    compared,
    latencies_us,
    peak_rss_kib,
    percentile,
    rate,
)
from .suite import Context, main

RAW = "raw apsw"
SMALL = 1_000


def _scale(context: Context) -> dict[str, int]:
    if context.quick:
        return {"rounds": 30, "singles": 30, "batch_rounds": 7, "batches": 3, "batch": 1000, "latency": 100,
                "growth_rounds": 5, "growth_verify_rounds": 5, "verify_log": 20_000, "verify_rounds": 5}
    return {"rounds": 60, "singles": 50, "batch_rounds": 15, "batches": 5, "batch": 1000, "latency": 300,
            "growth_rounds": 7, "growth_verify_rounds": 3, "verify_log": 200_000, "verify_rounds": 7}


def _sizes(context: Context) -> list[int]:
    return [SMALL, 100_000] if context.quick else [SMALL, 100_000, 1_000_000]


class _Stream:
    """One stream of a store that a benchmark appends to, one event or one batch at a time."""

    def __init__(self, store: EventStore, stream: str) -> None:
        self.store = store
        self.stream = stream
        self.version = store.stream_version(stream)
        self.pairs = itertools.count()

    def events(self, count: int) -> list[history.Event]:
        out: list[history.Event] = []
        while len(out) < count:
            out.extend(history.lease_pair(self.stream, next(self.pairs)))
        return out[:count]

    def append(self, events: list[history.Event]) -> None:
        self.store.append_unchecked(self.stream, events, expected_version=self.version, at=history.AT)
        self.version += len(events)

    def append_each(self, events: list[history.Event]) -> int:
        for event in events:
            self.append([event])
        return len(events)


class _RawStream:
    """The same, on raw apsw: precomputed rows of the same body bytes."""

    def __init__(self, conn: apsw.Connection, body: bytes) -> None:
        self.conn = conn
        self.body = body
        self.seq = 0

    def rows(self, count: int) -> list[raw_sqlite.Row]:
        rows = raw_sqlite.rows_like(self.body, stream="runner-raw", first_seq=self.seq + 1,
                                    first_version=self.seq + 1, count=count)
        self.seq += count
        return rows

    def insert_each(self, rows: list[raw_sqlite.Row]) -> int:
        for row in rows:
            raw_sqlite.insert_commit(self.conn, row)
        return len(rows)

    def insert_batches(self, batches: list[list[raw_sqlite.Row]]) -> int:
        for rows in batches:
            raw_sqlite.insert_many(self.conn, rows)
        return sum(map(len, batches))


def _appends(context: Context, scale: dict[str, int]) -> list[Figure]:
    """Single-event and batch appends, each against raw apsw on a fresh file of its own."""
    store = EventStore.open(context.path("store-appends.db"))
    conn = raw_sqlite.open_raw(context.path("raw-appends.db"))
    try:
        ours_profile = raw_sqlite.profile(store.backend.conn)  # type: ignore[attr-defined]
        raw_profile = raw_sqlite.profile(conn)
        same = "same pragma profile" if ours_profile == raw_profile else (
            f"PROFILES DIFFER: ours {ours_profile}, raw {raw_profile}")
        stream = _Stream(store, "runner-append")
        stream.append([history.initialized("runner-append")])
        body = encode(stream.events(1)[0])
        raw = _RawStream(conn, body)
        singles, batch, batches = scale["singles"], scale["batch"], scale["batches"]

        def ours_single() -> float:
            events = stream.events(singles)
            return rate(lambda: stream.append_each(events))

        def raw_single() -> float:
            rows = raw.rows(singles)
            return rate(lambda: raw.insert_each(rows))

        single = alternate({"ours": ours_single, "raw": raw_single}, scale["rounds"])

        def ours_batch() -> float:
            work = [stream.events(batch) for _ in range(batches)]

            def append_batches() -> int:
                for events in work:
                    stream.append(events)
                return batch * batches
            return rate(append_batches)

        def raw_batch() -> float:
            work = [raw.rows(batch) for _ in range(batches)]
            return rate(lambda: raw.insert_batches(work))

        batched = alternate({"ours": ours_batch, "raw": raw_batch}, scale["batch_rounds"])
    finally:
        store.close()
        conn.close()
    return [
        compared("store.append.single", "durable single-event append", "ops/s", single["ours"],
                 single["raw"], f"{RAW} INSERT+COMMIT", Target(">=", 0.9),
                 note=f"{len(body)}-byte body, synchronous=FULL, {scale['rounds']} alternating rounds of "
                      f"{singles}; {same}", samples=single),
        compared("store.append.batch", f"batch append of {batch} events, one transaction", "ev/s",
                 batched["ours"], batched["raw"], f"{RAW} executemany", Target(">=", 0.5),
                 samples=batched),
    ]


def _verify(context: Context, scale: dict[str, int]) -> Figure:
    """verify() against the bare replay loop, on the same file."""
    path = history.history_log(context, scale["verify_log"])
    store = EventStore.open(path)
    try:
        rates = alternate({"ours": lambda: rate(lambda: store.verify().events),
                           "bare": lambda: rate(lambda: raw_sqlite.bare_replay(path))}, scale["verify_rounds"])
    finally:
        store.close()
    return compared("store.verify", f"verify() over {scale['verify_log']:,} events", "ev/s", rates["ours"],
                    rates["bare"], "bare replay loop", Target(">=", 0.8),
                    note="the bare loop reads each row, msgspec-decodes its body, blake3-hashes it, keeps "
                         "a version per stream; verify() checks seq, versions, links and framed hashes "
                         "(it does not decode bodies)", samples=rates)


def _growth(context: Context, scale: dict[str, int]) -> list[Figure]:
    """Append latency, a stream read and verify per event, on a 1k log against each longer one."""
    sizes = _sizes(context)
    paths = {size: history.history_log(context, size) for size in sizes}
    stores = {size: EventStore.open(path) for size, path in paths.items()}
    try:
        streams = {size: _Stream(store, f"runner-growth-{size}") for size, store in stores.items()}
        for stream in streams.values():
            stream.append([history.initialized(stream.stream)])
        read_stream = history.other_runner(0)  # in every log, with 1000 events

        def append_p50s(size: int) -> Callable[[], float]:
            def one_round() -> float:
                stream = streams[size]
                events = stream.events(scale["latency"])
                samples = latencies_us(lambda i: stream.append([events[i]]), len(events))
                append_samples[size].extend(samples)
                return percentile(samples, 50)
            return one_round

        def read_cost(size: int) -> Callable[[], float]:
            store = stores[size]

            def one_round() -> float:
                samples = latencies_us(lambda _: sum(1 for _ in store.read_stream(read_stream)), 20)
                return percentile(samples, 50)
            return one_round

        def verify_cost(size: int) -> Callable[[], float]:
            store = stores[size]

            def one_round() -> float:
                return 1_000_000 / rate(lambda: store.verify().events)  # µs per event
            return one_round

        append_samples: dict[int, list[float]] = {size: [] for size in sizes}
        appends = alternate({str(size): append_p50s(size) for size in sizes}, scale["growth_rounds"])
        reads = alternate({str(size): read_cost(size) for size in sizes}, scale["growth_rounds"])
        verifies = alternate({str(size): verify_cost(size) for size in sizes}, scale["growth_verify_rounds"])
    finally:
        for store in stores.values():
            store.close()
    figures = []
    small = str(SMALL)
    for size in sizes[1:]:
        key = str(size)
        tail = (f"p99 {percentile(append_samples[size], 99):,.0f} µs at {size:,} vs "
                f"{percentile(append_samples[SMALL], 99):,.0f} µs at 1k")
        figures += [
            compared(f"store.growth.append.{size}", f"append p50 at {size:,} events", "µs",
                     appends[key], appends[small], "at 1k", Target("<=", 1.2), note=tail,
                     samples=appends),
            compared(f"store.growth.read.{size}", f"read a 1000-event stream at {size:,}", "µs",
                     reads[key], reads[small], "at 1k", Target("<=", 1.2), samples=reads),
            compared(f"store.growth.verify.{size}", f"verify per event at {size:,}", "µs",
                     verifies[key], verifies[small], "at 1k", Target("<=", 1.2),
                     samples=verifies),
        ]
    return figures


def _verify_memory(context: Context, scale: dict[str, int]) -> Figure:
    """Peak RSS of a fresh process verifying the verify log against one verifying the longest log.

    Both logs are past the fixed buffers (SQLite's page cache, one page of rows), so memory that grows
    with the log shows as a ratio above 1, and the fixed buffers do not.
    """
    small, big = scale["verify_log"], _sizes(context)[-1]
    setup = "from lifecycle_es import EventStore\nstore = EventStore.open({path!r})"
    peaks = {size: peak_rss_kib(setup.format(path=history.history_log(context, size)), "store.verify()")
             for size in (small, big)}
    return compared(f"store.memory.verify.{big}", f"verify peak RSS at {big:,} events", "KiB",
                    peaks[big][1], peaks[small][1], f"at {small:,}", Target("<=", 1.1),
                    note=f"peak RSS of a child process; verify itself added {peaks[big][1] - peaks[big][0]:,} KiB "
                         f"at {big:,} vs {peaks[small][1] - peaks[small][0]:,} KiB at {small:,}")


def run(context: Context) -> list[Figure]:
    """Every store figure."""
    scale = _scale(context)
    context.say("store: appends")
    figures = _appends(context, scale)
    context.say("store: verify")
    figures.append(_verify(context, scale))
    context.say("store: growth with log length")
    figures += _growth(context, scale)
    context.say("store: verify's memory")
    figures.append(_verify_memory(context, scale))
    return figures


if __name__ == "__main__":
    raise SystemExit(main(modules={"store": run}))
