"""Appending to a log as someone holding an unkeyed store could: plain SQL, the chain made valid.

`forge` writes rows the store's own append would refuse (a time before the head's, a body beyond its
size bound) and no rule is looked at: only the replay of the rules can tell the log is not one the
commands wrote. The store must be unkeyed and closed (or idle). A file is written with plain SQLite; a
store on a PostgreSQL server (its URL) as a superuser would, the head row advanced with the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import apsw

from lifecycle_es import chain
from lifecycle_es.backends import is_url, server_target
from lifecycle_es.events import Event, encode_all

Rows = list[tuple[Any, ...]]


def forge(path: str | Path, stream: str, events: Sequence[Event], at: str) -> list[int]:
    """Append `events` to `stream`, all stamped `at`, chained onto the head; the seqs they got."""
    return forge_stamped(path, stream, [(at, event) for event in events])


def forge_stamped(path: str | Path, stream: str, stamped: Sequence[tuple[str, Event]]) -> list[int]:
    """Append ``(at, event)`` pairs to `stream` in one transaction, chained onto the head; their seqs."""
    if is_url(str(path)):
        return _forge_on_server(str(path), stream, stamped)
    conn = apsw.Connection(str(path))
    try:
        with conn:
            def query(sql: str, params: tuple[Any, ...] = ()) -> Rows:
                return conn.execute(sql, params).fetchall()

            rows = _chained(query, "?", "", stream, stamped)
            conn.executemany("INSERT INTO events (seq, stream, version, type, at, body, prev, hash) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    finally:
        conn.close()
    return [row[0] for row in rows]


def _forge_on_server(url: str, stream: str, stamped: Sequence[tuple[str, Event]]) -> list[int]:
    import psycopg

    target = server_target(url)
    s = target.schema
    with psycopg.connect(target.conninfo) as conn:  # one transaction, committed as the block ends
        conn.execute(f"SELECT seq FROM {s}.head FOR UPDATE")  # type: ignore[arg-type]

        def query(sql: str, params: tuple[Any, ...] = ()) -> Rows:
            return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]

        rows = _chained(query, "%s", f"{s}.", stream, stamped)
        with conn.cursor() as cursor:
            cursor.executemany(f"INSERT INTO {s}.events (seq, stream, version, type, at, body, prev, hash) "  # type: ignore[arg-type]
                               "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", rows)
        first, last = rows[0], rows[-1]
        conn.execute(f"SELECT {s}.advance_head(%s, %s, %s, %s, %s)",  # type: ignore[arg-type]
                     (first[0], first[6], last[0], last[7], last[4]))
    return [row[0] for row in rows]


def _chained(query: Callable[..., Rows], mark: str, prefix: str, stream: str,
             stamped: Sequence[tuple[str, Event]]) -> Rows:
    """The rows of `stamped`, chained onto the log's head as the store chains them."""
    head = query(f"SELECT seq, hash FROM {prefix}events ORDER BY seq DESC LIMIT 1")
    if head:
        seq, prev = head[0][0], bytes(head[0][1])
    else:
        store_id = bytes(query(f"SELECT value FROM {prefix}meta WHERE key = 'store_id'")[0][0])
        seq, prev = 0, chain.genesis(store_id)
    version = query(f"SELECT COALESCE(MAX(version), 0) FROM {prefix}events WHERE stream = {mark}", (stream,))[0][0]
    rows: Rows = []
    for at, event in stamped:
        ((type_, body),) = encode_all([event])
        (digest,) = chain.links(prev, seq, stream, version, at, [(type_, body)])
        seq, version = seq + 1, version + 1
        rows.append((seq, stream, version, type_, at, body, prev, digest))
        prev = digest
    return rows
