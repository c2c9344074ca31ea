"""Where a PostgreSQL append's time goes: statements per command, and appends with fewer round trips.

Part of ``python -m benchmarks.postgres`` (it needs that run's cluster). Two measurements:

- the statements the server logs (``log_statement=all``, switched on for this part only) per durable
  command and per single-event append, on the store's own connection;
- a prototype append written in raw psycopg with the store's own statements on a real store schema,
  rows chained with `lifecycle_es.chain.links` (the store audits them afterwards), in three shapes:
  ``4 round trips`` as the backend once did it (identity; BEGIN + lock; tail read; INSERT +
  advance_head + NOTIFY + COMMIT), ``2`` (the identity and the tail read in the locking statement),
  and ``1`` (the head this connection committed last kept, so the whole transaction goes in one
  pipeline; advance_head refuses it when another writer moved the head, and the writer retries with
  two). Each against the store's own ``append_unchecked`` in the same rounds.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

import psycopg

from lifecycle_es import EventStore, chain
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import encode, encode_all

from . import history, runners
from .baselines import raw_postgres
from .cluster import Server
from .measure import Figure, alternate, compared, median, rate
from .suite import Context

SCHEMA = "bench_rounds"
STREAM = "runner-proto"


class Prototype:
    """Single-event appends to `stream` of the store in `schema`, by raw statements in `trips` round trips."""

    def __init__(self, conninfo: str, schema: str, stream: str, store: EventStore, trips: int) -> None:
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.schema, self.stream, self.trips = schema, stream, trips
        self.cached: tuple[int, bytes, int] | None = None  # (head seq, head hash, stream version) after our commit
        self.fallbacks = 0
        s = schema
        self.identity = (f"SELECT (SELECT system_identifier FROM pg_control_system()),"
                         f" (SELECT value FROM {s}.meta WHERE key = 'store_id')")
        self.lock = f"SELECT seq FROM {s}.head FOR UPDATE"
        self.tail = (f"SELECT (SELECT version FROM {s}.events WHERE stream = %s ORDER BY version DESC LIMIT 1),"
                     f" h.seq, h.hash, h.at FROM {s}.head h")
        self.lock_tail = (f"SELECT (SELECT version FROM {s}.events WHERE stream = %s ORDER BY version DESC LIMIT 1),"
                          f" h.seq, h.hash, (SELECT value FROM {s}.meta WHERE key = 'store_id'),"
                          " (SELECT system_identifier FROM pg_control_system()) FROM {s}.head h FOR UPDATE OF h"
                          ).replace("{s}", s)
        self.insert = (f"INSERT INTO {s}.events (seq, stream, version, type, at, body, prev, hash)"
                       " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
        self.advance = f"SELECT {s}.advance_head(%s, %s, %s, %s, %s)"
        self.notify = f"SELECT pg_notify('lifecycle_es_{s}', %s)"
        self.pairs = 0
        self.store = store

    def _row(self, version: int, seq: int, prev: bytes | None) -> tuple[Any, ...]:
        event = history.lease_pair(self.stream, self.pairs)[0]
        self.pairs += 1
        ((type_, body),) = encode_all([event])
        prev = prev if prev is not None else self.store._genesis
        at = iso_ms(time.time_ns() // 1_000_000)  # the wall clock, as the store stamps (commands share the log)
        (digest,) = chain.links(prev, seq, self.stream, version, at, [(type_, body)])
        return (seq + 1, self.stream, version + 1, type_, at, body, prev, digest)

    def _finish(self, row: tuple[Any, ...]) -> None:
        conn = self.conn
        conn.execute(self.insert, row)
        conn.execute(self.advance, (row[0], row[6], row[0], row[7], row[4]))
        conn.execute(self.notify, (str(row[0]),))
        conn.execute("COMMIT")

    def append(self) -> None:
        """One single-event append in `trips` round trips (1 falls back to 2 when its cached head is stale)."""
        conn = self.conn
        if self.trips == 4:
            conn.execute(self.identity).fetchone()
        if self.trips == 1 and self.cached is not None:
            seq, digest, version = self.cached
            row = self._row(version, seq, digest)
            try:
                with conn.pipeline() as pipeline:
                    conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                    conn.execute("SET LOCAL lock_timeout = '5000ms'")
                    conn.execute(self.lock)
                    self._finish(row)
                    pipeline.sync()
                self.cached = (row[0], row[7], row[2])
                return
            except psycopg.Error:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.execute("ROLLBACK")
                self.fallbacks += 1
        with conn.pipeline() as pipeline:
            conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            conn.execute("SET LOCAL lock_timeout = '5000ms'")
            if self.trips == 4:
                conn.execute(self.lock)
                pipeline.sync()
                version, seq, digest, _ = conn.execute(self.tail, (self.stream,)).fetchone()  # type: ignore[misc]
            else:
                version, seq, digest, _, _ = conn.execute(self.lock_tail, (self.stream,)).fetchone()  # type: ignore[misc]
            row = self._row(int(version or 0), int(seq), bytes(digest) if digest is not None else None)
            self._finish(row)
            pipeline.sync()
        self.cached = (row[0], row[7], row[2])

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class LeanPrototype(Prototype):
    """Single-event appends in four statements: BEGIN; the lock that reads the tail and the store id; one
    function that inserts, calls advance_head and sends the NOTIFY; COMMIT (the lock timeout set once per
    connection). `pipelined`: in two round trips, else four, without pipeline mode (whose per-statement
    client CPU is higher than a plain round trip's on a local socket). The function lives in a schema of
    its own (``<schema>_proto``), so the store's schema stays exact."""

    def __init__(self, conninfo: str, schema: str, stream: str, store: EventStore, *, pipelined: bool) -> None:
        super().__init__(conninfo, schema, stream, store, 2)
        self.pipelined = pipelined
        s, fn = schema, f"{schema}_proto.append_one"
        self.conn.execute("SET lock_timeout = '5000ms'")
        self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}_proto")  # type: ignore[arg-type]
        self.conn.execute(  # type: ignore[arg-type]
            f"CREATE OR REPLACE FUNCTION {fn}(a_seq bigint, a_stream text, a_version bigint, a_type text, a_at text,"
            " a_body bytea, a_prev bytea, a_hash bytea) RETURNS void LANGUAGE plpgsql AS $body$ BEGIN "
            f"INSERT INTO {s}.events (seq, stream, version, type, at, body, prev, hash) VALUES (a_seq, a_stream, "
            f"a_version, a_type, a_at, a_body, a_prev, a_hash); PERFORM {s}.advance_head(a_seq, a_prev, a_seq, a_hash,"
            f" a_at); PERFORM pg_notify('lifecycle_es_{s}', a_seq::text); END $body$")
        self.append_sql = f"SELECT {fn}(%s, %s, %s, %s, %s, %s, %s, %s)"

    def append(self) -> None:
        """One single-event append in four statements (two round trips when pipelined)."""
        conn = self.conn
        if self.pipelined:
            with conn.pipeline() as pipeline:
                conn.execute("BEGIN")
                version, seq, digest, _, _ = conn.execute(self.lock_tail, (self.stream,)).fetchone()  # type: ignore[misc]
                row = self._row(int(version or 0), int(seq), bytes(digest) if digest is not None else None)
                conn.execute(self.append_sql, row)
                conn.execute("COMMIT")
                pipeline.sync()
            return
        conn.execute("BEGIN")
        try:
            version, seq, digest, _, _ = conn.execute(self.lock_tail, (self.stream,)).fetchone()  # type: ignore[misc]
            row = self._row(int(version or 0), int(seq), bytes(digest) if digest is not None else None)
            conn.execute(self.append_sql, row)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def _statements(server: Server, operation: Callable[[], object], pid: int | None, count: int) -> float:
    """Statements the server logs for connection `pid` (any connection but this one's when None) per call of
    `operation`, over `count` calls."""
    with psycopg.connect(server.conninfo(), autocommit=True) as admin:
        admin_pid = admin.info.backend_pid
        admin.execute("ALTER SYSTEM SET log_statement = 'all'")
        admin.execute("SELECT pg_reload_conf()")
        time.sleep(0.3)  # the reload reaches the other backends at their next command
        operation()  # the first command after the reload can be the one that picks it up
        start = os.path.getsize(server.log)
        for _ in range(count):
            operation()
        admin.execute("ALTER SYSTEM RESET log_statement")
        admin.execute("SELECT pg_reload_conf()")
    with open(server.log, encoding="utf-8", errors="replace") as log:
        log.seek(start)
        found = re.findall(r"\[(\d+)\] LOG:  (?:statement|execute [^:]*):", log.read())
    return sum(int(who) == pid if pid is not None else int(who) != admin_pid for who in found) / count


def run(context: Context, server: Server, scale: dict[str, Any], fleet: Any = None) -> list[Figure]:
    """Statements per command and the round-trip prototypes' rates (see the module's docstring); `fleet`, an
    eventsourcing application on the same server, has its saves' statements counted too."""
    figures: list[Figure] = []
    store = EventStore.open(server.url(SCHEMA))
    raw = raw_postgres.RawTable(server.conninfo(), "raw_rounds")
    try:
        runner = runners.LifecycleRunner(store, "runner-rounds", context.workdir)
        pid = store.backend.conn.info.backend_pid  # type: ignore[attr-defined]
        count = scale["statement_commands"]
        per_command = _statements(server, runner.command, pid, count)
        ours_stream = _OursStream(store, "runner-ours")
        per_append = _statements(server, ours_stream.append, pid, count)
        note = (f"log_statement=all, {count} calls each; a command: BEGIN, the head table's lock, the head with "
                "the store's id and the stream's version, in one simple query (one trip; the server logs it as one "
                "statement); then append_one, whose row, proof and NOTIFY are one server function, and COMMIT, in "
                "another simple query (one trip, two statements)")
        figures.append(compared("postgres.statements.command", "statements per durable command (server log)",
                                "stmts", per_command, per_append, "per single-event append_unchecked", None, note=note))
        if fleet is not None:
            es_runner, pairs = fleet.new_runner("runner-rounds"), iter(range(10**9))
            per_save = _statements(server, lambda: fleet.acquire_settle(es_runner, next(pairs)), None, count // 2) / 2
            figures.append(compared("postgres.statements.eventsourcing", "statements per eventsourcing save",
                                    "stmts", per_save, per_command, "per durable command", None,
                                    note="BEGIN, SET LOCAL lock_timeout, LOCK TABLE, NOTIFY, INSERT, COMMIT: no reads"))
        protos: dict[str, Prototype] = {str(trips): Prototype(server.conninfo(), SCHEMA, f"{STREAM}-{trips}", store,
                                                              trips) for trips in (4, 2, 1)}
        for name, pipelined in (("lean4", False), ("lean2", True)):
            protos[name] = LeanPrototype(server.conninfo(), SCHEMA, f"{STREAM}-{name}", store, pipelined=pipelined)
        body = encode(history.lease_pair("runner-raw", 0)[0])
        try:
            n = scale["commands"]

            def raw_round() -> float:
                rows = raw.rows(body, "runner-raw", n)
                return rate(lambda: sum(raw.insert_commit(row) is None for row in rows))

            cpu: dict[str, list[float]] = {}
            subjects: dict[str, Callable[[], float]] = {
                "ours": lambda: rate(lambda: sum(ours_stream.append() or 1 for _ in range(n))), "raw": raw_round}
            for trips, proto in protos.items():
                subjects[trips] = lambda proto=proto: rate(lambda: sum(proto.append() or 1 for _ in range(n)))
            rates = alternate({name: cpu_per_op(name, subject, n, cpu) for name, subject in subjects.items()},
                              scale["rounds"])
            fallbacks = protos["1"].fallbacks
        finally:
            for proto in protos.values():
                proto.close()
        audited = store.verify()
    finally:
        store.close()
        raw.close()
    base = "raw autocommit INSERT, same rounds"
    shown_cpu = ", ".join(f"{name} {median(values):.0f}" for name, values in cpu.items())
    figures.append(compared("postgres.prototype.ours", "single-event append_unchecked", "ev/s", rates["ours"],
                            rates["raw"], base, None, samples=rates,
                            note=f"{scale['rounds']} alternating rounds of {n} appends, one writer; client CPU µs per "
                                 f"append (median of rounds): {shown_cpu}; {load()}"))
    shapes = {"4": "4 round trips, 9 statements (the first backend's shape)",
              "2": "2 round trips, identity + tail in the lock",
              "1": "1 round trip, cached head", "lean4": "4 statements, no pipeline, 4 round trips",
              "lean2": "4 statements, pipelined, 2 round trips"}
    for name, shape in shapes.items():
        figures.append(compared(
            f"postgres.prototype.{name}", f"prototype append: {shape}", "ev/s", rates[name], rates["raw"], base, None,
            samples=rates,
            note=f"raw psycopg, the store's statements, real chained rows (verify() passed over {audited.events:,} "
                 f"events after); {fallbacks} one-trip appends found the head moved and fell back to two; lean: "
                 "INSERT, advance_head and NOTIFY in one plpgsql function, lock_timeout set per connection"
            if name == "4" else ""))
    return figures


def cpu_per_op(name: str, subject: Callable[[], float], count: int,
               into: dict[str, list[float]]) -> Callable[[], float]:
    """`subject`, recording this process's CPU µs per operation of each round in ``into[name]``."""
    def measured() -> float:
        began = time.process_time()
        got = subject()
        into.setdefault(name, []).append((time.process_time() - began) * 1e6 / count)
        return got
    return measured


def load() -> str:
    """The load average, for the notes."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


class _OursStream:
    def __init__(self, store: EventStore, stream: str) -> None:
        self.store, self.stream, self.pairs = store, stream, 0
        self.version = store.stream_version(stream)

    def append(self) -> None:
        event = history.lease_pair(self.stream, self.pairs)[0]
        self.pairs += 1
        self.store.append_unchecked(self.stream, [event], expected_version=self.version)
        self.version += 1
