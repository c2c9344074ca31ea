"""Follow wake-up latency on PostgreSQL: from an append's return in this process to a follower's yield of the
event in another (part of ``python -m benchmarks.postgres``, on its cluster).

Each follower runs in a child process of its own, so the writer's and the follower's Python never share
a GIL (in one process, the follower thread often ran before the writer's thread got back from COMMIT,
and the latency came out negative). Both read ``time.perf_counter_ns``, the machine's monotonic clock.
Subjects, in alternating rounds, each on a schema of its own, one append at a time, each waited for:

- ``store.follow()`` with NOTIFY on (the default);
- ``store.follow()`` with ``notify=off`` in the URL (it polls the head every `POLL` seconds);
- a prototype follower: on a NOTIFY, one read of ``seq > last`` with the store's page columns, without
  first re-reading the store's identity and head row, as ``follow`` does today;
- the baseline: a raw ``NOTIFY`` on one connection seen by a raw ``LISTEN`` on another, timed from the
  NOTIFY's call (from its return, the listener often wins the race and the latency comes out negative).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from lifecycle_es import EventStore

from . import history
from .cluster import Server
from .measure import Figure, clock_ns, compared, percentile
from .measure import alternate as alternated
from .pgrounds import load

POLL = 0.05
TIMEOUT = 10.0
# Why a wake-up can come out below zero: the commit is visible to the follower before the writer's Python is back.
_RACE = ("timed from the append's return: below zero when the follower yielded the event before the writer's "
         "append_unchecked returned (the commit is visible once the server has it, before the client has read its "
         "reply)")


def _child(kind: str, target: str, schema: str, after: int, pipe: Connection, stop: Any) -> None:
    """In the child: follow `target` and send ``(seq, perf_counter_ns)`` for each event (``(0, ns)`` for
    each raw NOTIFY); ``None`` once listening."""
    if kind == "store":
        with EventStore.open(target) as store:
            pipe.send(None)
            for recorded in store.follow(after=after, poll_interval=POLL, stop=stop):
                pipe.send((recorded.seq, clock_ns()))
        return
    import psycopg

    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute(f"LISTEN {'lifecycle_es_' + schema if kind == 'one read' else schema}")  # type: ignore[arg-type]
        pipe.send(None)
        query = (f"SELECT seq, stream, version, type, at, body, prev, hash FROM {schema}.events"
                 " WHERE seq > %s ORDER BY seq LIMIT 1000")
        last = after
        while not stop.is_set():
            woke = False
            for _ in conn.notifies(timeout=POLL, stop_after=1):
                woke = True
            if kind == "raw":
                if woke:
                    pipe.send((0, clock_ns()))
                continue
            for row in conn.execute(query, (last,)).fetchall():  # type: ignore[arg-type]
                last = row[0]
                pipe.send((last, clock_ns()))


class Follower:
    """A follower in a child process, and the writer in this one: `wake` writes once and returns the
    microseconds from the write's return to the follower's receipt."""

    def __init__(self, kind: str, target: str, schema: str, write: Callable[[], int], after: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.write = write
        # A raw NOTIFY often reaches its listener before the sender is back from the call: timed from the
        # call, so the baseline is the delivery itself (never below zero), not a race between two processes.
        self.from_call = kind == "raw"
        self.pipe, theirs = context.Pipe()
        self.stop = context.Event()
        self.process = context.Process(target=_child, args=(kind, target, schema, after, theirs, self.stop),
                                       name=f"follower-{kind}", daemon=True)
        self.process.start()
        if not self.pipe.poll(60):
            raise TimeoutError(f"the {kind} follower did not start within 60 s")
        self.pipe.recv()
        self.wake()  # the first wake-up pays for the follower's first reads: not a sample

    def wake(self) -> float:
        called = clock_ns()
        seq = self.write()
        returned = called if self.from_call else clock_ns()
        while self.pipe.poll(TIMEOUT):
            seen, at = self.pipe.recv()
            if seen == seq:
                return (at - returned) / 1000
        raise TimeoutError(f"the follower did not see seq {seq} within {TIMEOUT} s")

    def close(self) -> None:
        self.stop.set()
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class _Writer:
    """Single-event appends to one stream of a store; `append` returns the event's seq."""

    def __init__(self, url: str, stream: str) -> None:
        self.store = EventStore.open(url)
        self.stream = stream
        self.store.append_unchecked(stream, [history.initialized(stream)], expected_version=0, at=history.AT)
        self.version, self.pairs = 1, 0

    def append(self) -> int:
        event = history.lease_pair(self.stream, self.pairs)[self.pairs % 2]
        self.pairs += 1
        (recorded,) = self.store.append_unchecked(self.stream, [event], expected_version=self.version, at=history.AT)
        self.version += 1
        return recorded.seq


def run(server: Server, scale: dict[str, Any]) -> list[Figure]:
    """The follow figures (see the module's docstring)."""
    import psycopg

    writers = {"notify": _Writer(server.url("bench_follow"), "runner-follow"),
               "poll": _Writer(server.url("bench_poll", notify="off"), "runner-poll"),
               "one read": _Writer(server.url("bench_proto"), "runner-proto")}
    sender = psycopg.connect(server.conninfo(), autocommit=True)

    def notify() -> int:
        sender.execute("NOTIFY bench_raw, 'x'")
        return 0

    followers: dict[str, Follower] = {}
    try:
        followers["notify"] = Follower("store", server.url("bench_follow"), "", writers["notify"].append,
                                       writers["notify"].store.head().seq)
        followers["poll"] = Follower("store", server.url("bench_poll", notify="off"), "", writers["poll"].append,
                                     writers["poll"].store.head().seq)
        followers["one read"] = Follower("one read", server.conninfo(), "bench_proto", writers["one read"].append,
                                         writers["one read"].store.head().seq)
        followers["raw"] = Follower("raw", server.conninfo(), "bench_raw", notify, 0)
        samples: dict[str, list[float]] = {name: [] for name in followers}

        def subject(name: str) -> Callable[[], float]:
            def round_() -> float:
                got = [followers[name].wake() for _ in range(scale["wakes"])]
                samples[name].extend(got)
                return percentile(got, 50)
            return round_

        p50s = alternated({name: subject(name) for name in followers}, scale["wake_rounds"])
    finally:
        for follower in followers.values():
            follower.close()
        for writer in writers.values():
            writer.store.close()
        sender.close()
    figures = []
    for name, how in (("notify", "NOTIFY on"), ("poll", f"notify=off, polled every {POLL * 1000:.0f} ms"),
                      ("one read", "prototype: NOTIFY, then one read")):
        key = name.replace(" ", "_")
        # Percentiles of all samples, not the median of per-round ratios: a round of 20 wake-ups is too few.
        figures.append(compared(f"postgres.follow.{key}.p50", f"follow wake-up p50, {how}", "µs",
                                percentile(samples[name], 50), percentile(samples["raw"], 50),
                                "raw NOTIFY, from its call, to LISTEN", None, samples=p50s,
                                note=f"{len(samples[name])} appends, each waited for, the follower in another process; "
                                     f"from the append's return to the follower's yield; {load()}"
                                if name == "notify" else _RACE if name == "one read" else ""))
        figures.append(compared(f"postgres.follow.{key}.p99", f"follow wake-up p99, {how}", "µs",
                                percentile(samples[name], 99), percentile(samples["raw"], 99),
                                "raw NOTIFY, from its call, to LISTEN", None))
    return figures
