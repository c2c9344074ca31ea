"""A read-only open: possible on a closed WAL store, and it never writes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from lifecycle_es import EventStore, StoreIOError
from lifecycle_es.events import ReclaimCompleted


def file_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))


def test_read_only_open_of_a_closed_store_reads_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        store.append("runner-1", [ReclaimCompleted(generation=2)])
    # The last writer closed: SQLite removed -wal and -shm. A plain SQLITE_OPEN_READONLY would fail here.
    assert not (tmp_path / "events.db-shm").exists()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with EventStore.open(path, read_only=True) as reader:
        assert [r.type for r in reader.read()] == ["ReclaimCompleted"]
        assert reader.verify().events == 1
        with pytest.raises(StoreIOError, match="read-only"):
            reader.append("runner-1", [ReclaimCompleted(generation=3)])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_read_only_open_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreIOError, match="does not exist"):
        EventStore.open(tmp_path / "missing.db", read_only=True)
    assert list(tmp_path.iterdir()) == []

