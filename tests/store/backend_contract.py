"""What the backend contract (``test_backend_contract.py``) writes and reads: log rows as an append makes
them, read-model rows of the tables' shape, and an `EventStore` over a backend. Nothing here names a
database: every backend's case uses the same rows.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from lifecycle_es import EventStore, chain
from lifecycle_es.backend import Backend, Row
from lifecycle_es.canonical import iso_ms
from lifecycle_es.read_model import LEASE_COLUMNS, RUNNER_COLUMNS
from lifecycle_es.testing import START_MS, FakeClock

KEY_ID = chain.key_id(bytes(range(32))).encode()
"""A key id as a keyed store records it in its metadata (the one meta key a store writes besides its id)."""


class LogRows:
    """Rows as appends make them: seqs 1, 2, ..., each stream's versions from 1, ``at`` rising by 1 ms.

    The links are distinct digests (not a chain a key could prove): a backend stores rows, it never
    checks their hashes, so the contract needs them only to tell rows apart.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.versions: Counter[str] = Counter()
        self.prev = bytes(32)

    def next(self, *streams: str, size: int = 16) -> list[Row]:
        """One row per stream named, in that order, each with a body of `size` bytes."""
        rows: list[Row] = []
        for stream in streams:
            self.seq += 1
            self.versions[stream] += 1
            seq = self.seq
            digest = hashlib.blake2b(f"{seq}:{stream}".encode(), digest_size=32).digest()
            body = (f"{seq}:".encode() + b"x" * size)[:size]
            rows.append((seq, stream, self.versions[stream], "ReclaimCompleted", iso_ms(START_MS + seq), body,
                         self.prev, digest))
            self.prev = digest
        return rows


def commit(backend: Backend, rows: Sequence[Row]) -> None:
    """Insert `rows` in one write transaction."""
    with backend.write("insert rows"):
        backend.insert(rows)


def flat(pages: Iterable[list[Row]]) -> list[Row]:
    """Every row of `pages`, in order."""
    return [row for page in pages for row in page]


def store_over(backend: Backend) -> EventStore:
    """An unkeyed EventStore over `backend`, stamped by a fake clock."""
    return EventStore(backend, key=None, now=FakeClock())


def runner_row(runner_id: str, version: int) -> tuple[Any, ...]:
    """A ``runners`` row (one column per `RUNNER_COLUMNS`) for `runner_id` at `version`."""
    row = (runner_id, "target-1", "accepting", 1, 1, 1, "/srv/runner", 60, 1 << 30, "proxy-1", 1, "a" * 64,
           None, None, None, 0, 0, 0, iso_ms(START_MS), version, version)
    assert len(row) == len(RUNNER_COLUMNS)
    return row


def lease_row(runner_id: str, lease_id: str, status: str = "active") -> tuple[Any, ...]:
    """A ``leases`` row (one column per `LEASE_COLUMNS`) for `lease_id` of `runner_id`."""
    row = (runner_id, lease_id, f"session-{lease_id}", 1, iso_ms(START_MS), iso_ms(START_MS + 60_000), status,
           None, None)
    assert len(row) == len(LEASE_COLUMNS)
    return row
