"""Raw apsw: the store's pragma profile and a table shaped like ours, and nothing else.

No chain, no encoding, no version check, no lifecycle: rows arrive precomputed. A single-row
``BEGIN IMMEDIATE; INSERT; COMMIT`` is the floor of a durable append on this machine, ``executemany``
of a batch in one transaction the floor of a batch, and `bare_replay` the floor of reading a log back
and hashing it. Written against apsw directly (not through lifecycle_es) so that it stays a baseline;
`profile` reads the pragmas back, so the store bench can show the two run under the same profile.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import apsw
import blake3
import msgspec

Row = tuple[int, str, int, str, str, bytes, bytes, bytes]
PROFILE = ("journal_mode", "synchronous", "foreign_keys", "trusted_schema", "busy_timeout")
TABLE = (
    "CREATE TABLE IF NOT EXISTS events ("
    " seq INTEGER PRIMARY KEY,"
    " stream TEXT NOT NULL,"
    " version INTEGER NOT NULL,"
    " type TEXT NOT NULL,"
    " at TEXT NOT NULL,"
    " body BLOB NOT NULL,"
    " prev BLOB NOT NULL,"
    " hash BLOB NOT NULL,"
    " UNIQUE (stream, version)) STRICT"
)
INSERT = "INSERT INTO events (seq, stream, version, type, at, body, prev, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
SELECT = "SELECT seq, stream, version, type, at, body, prev, hash FROM events ORDER BY seq"


def open_raw(path: str, *, busy_timeout_ms: int = 5000, synchronous: str = "FULL") -> apsw.Connection:
    """A connection with the store's pragma profile, and the events table created if missing."""
    conn = apsw.Connection(path)
    conn.set_busy_timeout(busy_timeout_ms)
    conn.execute("PRAGMA trusted_schema=OFF")
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute(TABLE)
    return conn


def profile(conn: apsw.Connection) -> dict[str, object]:
    """The profile's pragmas as the connection reports them."""
    return {name: conn.execute(f"PRAGMA {name}").fetchall()[0][0] for name in PROFILE}


def insert_commit(conn: apsw.Connection, row: Row) -> None:
    """One row, one durable transaction."""
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(INSERT, row)
    conn.execute("COMMIT")


def insert_many(conn: apsw.Connection, rows: Sequence[Row]) -> None:
    """A batch of rows in one durable transaction."""
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(INSERT, rows)
    conn.execute("COMMIT")


def rows_like(body: bytes, *, stream: str, first_seq: int, first_version: int, count: int,
              at: str = "2026-01-01T00:00:00.000Z", type_: str = "LeaseAcquired") -> list[Row]:
    """`count` rows shaped like ours (same body bytes, 32-byte prev and hash), ready to insert."""
    rows: list[Row] = []
    for i in range(count):
        seq = first_seq + i
        link = os.urandom(32)
        rows.append((seq, stream, first_version + i, type_, at, body, link, blake3.blake3(link).digest()))
    return rows


def bare_replay(path: str) -> int:
    """Read every row, decode its body, hash the row, keep a trivial state; the number of rows.

    What any replay of the same file must at least do, without framing, links or transition rules.
    """
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    decode = msgspec.json.decode
    versions: dict[str, int] = {}
    count = unlike = 0
    try:
        rows: Iterable[Row] = conn.execute(SELECT)
        for seq, stream, version, type_, at, body, prev, digest in rows:
            decode(body)
            hasher = blake3.blake3(prev)
            hasher.update(body)
            hasher.update(f"{seq}{stream}{version}{type_}{at}".encode())
            unlike += hasher.digest() != digest  # a comparison like a verifier's (this hash is not the chain's)
            versions[stream] = version
            count += 1
    finally:
        conn.close()
    return count
