"""Raw psycopg on the same server: a table shaped like the store's events, and nothing else.

No chain, no head row, no lock, no lifecycle: rows arrive precomputed. An autocommit ``INSERT`` (one
round trip, one WAL flush) is the floor of a durable append on the server; a binary ``COPY`` of a batch
in one transaction the floor of a batch; a ``NOTIFY`` seen by a ``LISTEN`` on another connection the
floor of a follower's wake-up. Written against psycopg directly (not through lifecycle_es), so it stays
a baseline.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Sequence
from typing import Any

import blake3
import psycopg

from ..measure import clock_ns

Row = tuple[int, str, int, str, str, bytes, bytes, bytes]
COLUMNS = "seq, stream, version, type, at, body, prev, hash"
COPY_TYPES = ("int8", "text", "int8", "text", "text", "bytea", "bytea", "bytea")


def table(schema: str) -> list[str]:
    """The statements that make `schema`.events with the store's columns and indexes (no triggers)."""
    return [f"CREATE SCHEMA IF NOT EXISTS {schema}",
            f"CREATE TABLE IF NOT EXISTS {schema}.events (seq bigint PRIMARY KEY, stream text NOT NULL,"
            " version bigint NOT NULL, type text NOT NULL, at text NOT NULL, body bytea NOT NULL,"
            " prev bytea NOT NULL, hash bytea NOT NULL, UNIQUE (stream, version))"]


class RawTable:
    """One connection (autocommit) to a raw events table in its own schema; seqs from a shared counter,
    so several of these may write one table at once."""

    def __init__(self, conninfo: str, schema: str, seqs: itertools.count[int] | None = None) -> None:
        self.schema = schema
        self.conn = psycopg.connect(conninfo, autocommit=True)
        for statement in table(schema):
            self.conn.execute(statement)  # type: ignore[arg-type]
        self.insert_sql = (f"INSERT INTO {schema}.events ({COLUMNS}) "
                           "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
        self.copy_sql = f"COPY {schema}.events ({COLUMNS}) FROM STDIN (FORMAT BINARY)"
        self.seqs = seqs if seqs is not None else itertools.count(1)
        self.versions: dict[str, itertools.count[int]] = {}

    def rows(self, body: bytes, stream: str, count: int, at: str = "2026-01-01T00:00:00.000Z",
             type_: str = "LeaseAcquired") -> list[Row]:
        """`count` rows of `stream` shaped like the store's (the same body bytes, 32-byte prev and hash)."""
        versions = self.versions.setdefault(stream, itertools.count(1))
        out: list[Row] = []
        for _ in range(count):
            link = os.urandom(32)
            out.append((next(self.seqs), stream, next(versions), type_, at, body, link, blake3.blake3(link).digest()))
        return out

    def insert_commit(self, row: Row) -> None:
        """One row, one durable transaction (autocommit: a single round trip)."""
        self.conn.execute(self.insert_sql, row)  # type: ignore[arg-type]

    def copy(self, rows: Sequence[Row]) -> None:
        """A batch of rows by binary COPY, in one durable transaction."""
        with self.conn.transaction(), self.conn.cursor() as cursor, cursor.copy(self.copy_sql) as copy:  # type: ignore[arg-type]
            copy.set_types(list(COPY_TYPES))
            for row in rows:
                copy.write_row(row)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class Notifier:
    """A raw NOTIFY on one connection and a LISTEN on another, the listener in a thread: the time from the
    NOTIFY's return to the listener's receipt is the floor of a follower's wake-up."""

    def __init__(self, conninfo: str, channel: str) -> None:
        self.channel = channel
        self.sender = psycopg.connect(conninfo, autocommit=True)
        self.listener = psycopg.connect(conninfo, autocommit=True)
        self.listener.execute(f"LISTEN {channel}")  # type: ignore[arg-type]
        self.received: queue.Queue[int] = queue.Queue()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._listen, name="raw-listener", daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        while not self.stop.is_set():
            for _ in self.listener.notifies(timeout=0.2):
                self.received.put(clock_ns())

    def wake(self) -> float:
        """One NOTIFY; microseconds from its return to the listener's receipt."""
        self.sender.execute(f"NOTIFY {self.channel}, 'x'")  # type: ignore[arg-type]
        sent = clock_ns()
        return (self.received.get(timeout=10) - sent) / 1000

    def close(self) -> None:
        """Stop the listener and close both connections."""
        self.stop.set()
        self.thread.join(timeout=5)
        self.sender.close()
        self.listener.close()


def settings(conn: Any) -> dict[str, str]:
    """The server settings a durable commit depends on, as the server reports them."""
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "commit_delay")
    return {name: conn.execute(f"SELECT current_setting('{name}')").fetchone()[0] for name in names}
