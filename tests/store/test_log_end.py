"""What a SQLite connection knows of the log's end (``sqlite_write.LogEnd``) is always what the file says.

The tail an append decides against is answered without a statement while the connection can prove
nothing moved it; here hypothesis drives one store through appends (lone, several in one transaction,
a batch's commands under savepoints, some refused after writing), another connection's appends, rows
written past the store, snapshots and rollbacks, and after each step every stream's tail as the
backend answers it must equal the tail read from the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle_es import EventStore
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.sqlite import _TAIL
from lifecycle_es.store import WriteTransaction

STREAMS = ("runner-1", "runner-2", "runner-3")


class Refused(Exception):
    """A command's own failure, after it wrote."""


def file_tail(store: EventStore, stream: str) -> tuple[Any, ...]:
    rows = store.backend.execute(_TAIL, (stream,))  # type: ignore[attr-defined]
    return (rows[0][0] or 0, *rows[0][1:]) if rows else (0, 0, None, None)


def append(tx: WriteTransaction, stream: str) -> None:
    tx.append_unchecked(stream, [ReclaimCompleted(generation=tx.stream_version(stream) + 1)],
                        expected_version=tx.stream_version(stream))


def raw_row(store: EventStore, stream: str) -> None:
    """A row put in past the store's append, at the next seq and version (its hash is no link: no chain is checked)."""
    backend: Any = store.backend
    version, seq, digest, at = file_tail(store, stream)
    backend.execute("INSERT INTO events (seq, stream, version, type, at, body, prev, hash)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (seq + 1, stream, version + 1, "ReclaimCompleted", at or "2026-01-01T00:00:00.000Z",
                     b'{"generation":1,"type":"ReclaimCompleted"}', digest or bytes(32), bytes(32)))


def step(store: EventStore, other: EventStore, kind: str, streams: list[str]) -> None:
    backend: Any = store.backend
    if kind == "lone":
        store.commit("lone", lambda tx: append(tx, streams[0]))
    elif kind == "several":
        def several(tx: WriteTransaction) -> None:
            for stream in streams:
                append(tx, stream)
        store.commit("several", several)
    elif kind == "batch":  # as a group commit runs a batch: each command under a savepoint, every other one refused
        with store.transaction("batch") as tx:
            for index, stream in enumerate(streams):
                try:
                    with backend.savepoint("command"):
                        append(tx, stream)
                        if index % 2:
                            raise Refused
                except Refused:
                    pass
    elif kind == "other":
        other.append_unchecked(streams[0], [ReclaimCompleted(generation=1)])
    elif kind == "raw_in_tx":
        with store.transaction("raw") as tx:
            tx.stream_version(streams[0])
            raw_row(store, streams[-1])
    elif kind == "raw_after_commit":
        store.commit("lone", lambda tx: append(tx, streams[0]))
        with store.lock:
            raw_row(store, streams[-1])  # autocommit, outside any transaction of the store
    elif kind == "snapshot":
        with store.transaction("snapshot") as tx:
            append(tx, streams[0])
            backend.put_snapshot(streams[-1], 1, 1, b"state", bytes(32))
            append(tx, streams[-1])
    elif kind in ("trigger", "trigger_instead"):
        # A trigger on the snapshots table that writes to the log as a snapshot is put: after the snapshot's
        # row, or in its place (the row skipped, so the statement changed one row all the same).
        when, then = ("AFTER", "") if kind == "trigger" else ("BEFORE", " SELECT RAISE(IGNORE);")
        with store.transaction("trigger") as tx:
            append(tx, streams[0])
            backend.execute(f"CREATE TRIGGER hostile {when} INSERT ON snapshots BEGIN INSERT INTO events"
                            " SELECT max(seq) + 1, 'runner-3', (SELECT coalesce(max(version), 0) + 1 FROM events"
                            " WHERE stream = 'runner-3'), 'ReclaimCompleted', max(at), x'7b7d', zeroblob(32),"
                            f" zeroblob(32) FROM events;{then} END")
            fresh = f"snapshot-{len(backend.execute('SELECT stream FROM snapshots'))}"  # an insert, not an update
            backend.put_snapshot(fresh, 1, 1, b"state", bytes(32))
            backend.execute("DROP TRIGGER hostile")
            assert backend.tail("runner-3") == file_tail(store, "runner-3")  # in the transaction the trigger wrote in
    elif kind == "rolled_back":
        with pytest.raises(Refused), store.transaction("rolled back") as tx:
            append(tx, streams[0])
            raise Refused


STEPS = st.lists(st.tuples(st.sampled_from(["lone", "several", "batch", "other", "raw_in_tx", "raw_after_commit",
                                            "snapshot", "trigger", "trigger_instead", "rolled_back"]),
                           st.lists(st.sampled_from(STREAMS), min_size=1, max_size=4)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
def test_the_tail_a_connection_knows_is_the_file_s_after_any_steps(tmp_path: Path,
                                                                   steps: list[tuple[str, list[str]]]) -> None:
    path = tmp_path / f"events-{len(list(tmp_path.iterdir()))}.db"  # one store per example
    with EventStore.open(path) as store, EventStore.open(path) as other:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])
        for kind, streams in steps:
            step(store, other, kind, streams)
            with store.transaction("check"):
                for stream in (*STREAMS, "runner-new"):
                    # The backend's answer first (from what it knows), then the file's.
                    assert store.backend.tail(stream) == file_tail(store, stream), (kind, streams, stream)
                    assert store.backend.head_at() == file_tail(store, stream)[3]
