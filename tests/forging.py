"""Appending to a log as someone holding an unkeyed store file could: plain SQLite, the chain made valid.

`forge` writes rows the store's own append would refuse (a time before the head's, a body beyond its
size bound) and no rule is looked at: only the replay of the rules can tell the log is not one the
commands wrote. The store must be unkeyed and closed (or idle).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import apsw

from lifecycle_es import chain
from lifecycle_es.events import Event, encode_all


def forge(path: str | Path, stream: str, events: Sequence[Event], at: str) -> list[int]:
    """Append `events` to `stream`, all stamped `at`, chained onto the head; the seqs they got."""
    return forge_stamped(path, stream, [(at, event) for event in events])


def forge_stamped(path: str | Path, stream: str, stamped: Sequence[tuple[str, Event]]) -> list[int]:
    """Append ``(at, event)`` pairs to `stream` in one transaction, chained onto the head; their seqs."""
    conn = apsw.Connection(str(path))
    try:
        with conn:
            head = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchall()
            if head:
                seq, prev = head[0]
            else:
                store_id = conn.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchall()[0][0]
                seq, prev = 0, chain.genesis(store_id)
            version = conn.execute("SELECT COALESCE(MAX(version), 0) FROM events WHERE stream = ?",
                                   (stream,)).fetchall()[0][0]
            rows = []
            for at, event in stamped:
                ((type_, body),) = encode_all([event])
                (digest,) = chain.links(prev, seq, stream, version, at, [(type_, body)])
                seq, version = seq + 1, version + 1
                rows.append((seq, stream, version, type_, at, body, prev, digest))
                prev = digest
            conn.executemany("INSERT INTO events (seq, stream, version, type, at, body, prev, hash) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    finally:
        conn.close()
    return [row[0] for row in rows]
