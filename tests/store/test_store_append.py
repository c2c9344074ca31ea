"""Appending: a refused append leaves the store byte-identical; a batch is all or nothing. On both backends.

"Byte-identical" is checked on what is durable (`targets.durable_state`): a file's db and -wal, hashed
before and after with the store left open, or every row of a server store's schema.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from targets import durable_state, raw_insert

from lifecycle_es import ConcurrencyError, EventStore, IntegrityError, InvalidInputError, StoreError
from lifecycle_es.backend import MAX_EVENT_BYTES
from lifecycle_es.backends import is_url
from lifecycle_es.canonical import MAX_EPOCH_MS, canonical_ms, iso_ms, timestamp
from lifecycle_es.events import LeaseSettled, ReclaimCompleted, RunnerParked, UnitStopped, encode
from lifecycle_es.log import RecordedEvent
from lifecycle_es.testing import FakeClock

EVENT = ReclaimCompleted(generation=1)


@pytest.fixture
def started(store: EventStore) -> EventStore:
    """A store with two streams in it, so the WAL holds frames a stray write would change."""
    store.append_unchecked("runner-1", [ReclaimCompleted(generation=1), RunnerParked(cause="drain-idle", generation=2)])
    store.append_unchecked("runner-2", [ReclaimCompleted(generation=1)])
    return store


def stopped(reason_length: int) -> UnitStopped:
    """A UnitStopped whose reason is `reason_length` characters, made past any check of the event's own
    (the store's bound on the encoded body is what is under test)."""
    event = UnitStopped(lease_id="lease-1", reason="")
    msgspec.structs.force_setattr(event, "reason", "x" * reason_length)
    return event


REFUSED: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("slash-in-stream", {"stream": "a/b"}, InvalidInputError),
    ("empty-stream", {"stream": ""}, InvalidInputError),
    ("stream-not-str", {"stream": 7}, InvalidInputError),
    ("stream-too-long", {"stream": "r" * 257}, InvalidInputError),
    ("no-events", {"events": []}, InvalidInputError),
    ("one-event-not-a-list", {"events": EVENT}, InvalidInputError),
    ("not-events", {"events": [1, 2]}, InvalidInputError),
    ("a-string", {"events": "events"}, InvalidInputError),
    ("a-dict-among-events", {"events": [EVENT, {"type": "ReclaimCompleted", "generation": 2}]}, InvalidInputError),
    ("generator", {"events": (e for e in [EVENT])}, InvalidInputError),
    ("expected-version-behind", {"expected_version": 1}, ConcurrencyError),
    ("expected-version-ahead", {"expected_version": 3}, ConcurrencyError),
    ("expected-version-new-stream", {"stream": "runner-9", "expected_version": 1}, ConcurrencyError),
    ("expected-version-negative", {"expected_version": -1}, InvalidInputError),
    ("expected-version-bool", {"expected_version": True}, InvalidInputError),
    ("expected-version-str", {"expected_version": "2"}, InvalidInputError),
    ("at-garbage", {"at": "yesterday"}, InvalidInputError),
    ("at-no-offset", {"at": "2026-01-01T00:00:00"}, InvalidInputError),
    ("at-naive-datetime", {"at": datetime(2026, 1, 1)}, InvalidInputError),  # naive: no offset
    ("at-int", {"at": 1_767_225_600_000}, InvalidInputError),
    ("at-before-the-head", {"at": "2025-12-31T23:59:59.999Z"}, InvalidInputError),  # time never runs backwards
    ("body-beyond-the-bound", {"events": [stopped(MAX_EVENT_BYTES)]}, InvalidInputError),
]


@pytest.mark.parametrize(("kwargs", "error"), [(k, e) for _, k, e in REFUSED], ids=[n for n, _, _ in REFUSED])
def test_refused_append_leaves_the_files_byte_identical(
        started: EventStore, kwargs: dict[str, Any], error: type[Exception]) -> None:
    call: dict[str, Any] = {"stream": "runner-1", "events": [ReclaimCompleted(generation=3)]} | kwargs
    before = durable_state(started.path)
    head = started.head()
    with pytest.raises(error, check=lambda exc: type(exc) is error):
        started.append_unchecked(call.pop("stream"), call.pop("events"), **call)
    assert durable_state(started.path) == before
    assert started.head() == head
    assert started.verify().events == 3


def test_concurrency_error_names_stream_expected_and_actual(started: EventStore) -> None:
    with pytest.raises(ConcurrencyError) as info:
        started.append_unchecked("runner-1", [EVENT], expected_version=5)
    assert (info.value.stream, info.value.expected, info.value.actual) == ("runner-1", 5, 2)
    assert started.append_unchecked("runner-1", [EVENT], expected_version=2)[0].version == 3


def test_clock_that_returns_a_non_integer_is_refused(store_target: str) -> None:
    for bad in (1.5e12, -1, "now", None):
        with EventStore.open(store_target, now=lambda bad=bad: bad) as store:
            before = durable_state(store.path)
            with pytest.raises(InvalidInputError):
                store.append_unchecked("runner-1", [EVENT])
            assert durable_state(store.path) == before


def test_time_never_runs_backwards(store: EventStore, clock: FakeClock) -> None:
    (first,) = store.append_unchecked("runner-1", [EVENT])
    assert first.at == "2026-01-01T00:00:00.000Z"
    clock.advance(-60_000)  # the clock steps back a minute (NTP, a VM restored from a snapshot)
    (second,) = store.append_unchecked("runner-2", [EVENT])
    assert second.at == first.at  # stamped at the head's time, not before it
    with pytest.raises(InvalidInputError, match=r"2025-12-31T23:59:00\.000Z is earlier than 2026-01-01T00:00:00\.000Z"
                       ) as info:
        store.append_unchecked("runner-1", [EVENT], at="2025-12-31T23:59:00.000Z")
    assert info.value.field == "at"
    assert store.append_unchecked("runner-1", [EVENT], at=first.at)[0].at == first.at  # the same instant is not earlier
    clock.advance(120_000)
    with store.transaction() as tx:
        assert tx.head_at() == first.at
        tx.append_unchecked("runner-1", [EVENT])
        assert tx.head_at() == "2026-01-01T00:01:00.000Z"
    assert store.verify().events == 4


def test_a_body_beyond_the_bound_is_refused_naming_its_size(started: EventStore) -> None:
    room = MAX_EVENT_BYTES - len(encode(stopped(0)))
    (recorded,) = started.append_unchecked("runner-1", [stopped(room)])
    assert len(recorded.body) == MAX_EVENT_BYTES  # the bound itself is allowed
    with pytest.raises(InvalidInputError, match=rf"event 1 \(UnitStopped\) is {MAX_EVENT_BYTES + 1:,} bytes") as info:
        started.append_unchecked("runner-1", [EVENT, stopped(room + 1)])
    assert info.value.field == "events" and f"{MAX_EVENT_BYTES:,}" in str(info.value)
    assert started.head().seq == 4


def test_at_is_stored_canonical(store: EventStore, clock: FakeClock) -> None:
    (recorded,) = store.append_unchecked("runner-1", [EVENT])
    assert recorded.at == "2026-01-01T00:00:00.000Z"
    clock.advance(1_234)
    (recorded,) = store.append_unchecked("runner-1", [EVENT])
    assert recorded.at == "2026-01-01T00:00:01.234Z"
    (recorded,) = store.append_unchecked("runner-1", [EVENT], at="2026-06-01T02:00:00.5+02:00")
    assert recorded.at == "2026-06-01T00:00:00.500Z"
    assert store.verify().events == 3


class Failing:
    """A projector whose read model write fails inside the event transaction."""

    def __init__(self) -> None:
        self.armed = False
        self.applied: list[int] = []

    def catch_up(self, store: EventStore) -> None:
        if is_url(store.path):
            # A table of this connection's own: one in the store's schema would be a schema altered.
            store.backend.execute("CREATE TEMP TABLE IF NOT EXISTS seen (seq bigint PRIMARY KEY)")
        else:
            store.backend.execute("CREATE TABLE IF NOT EXISTS seen (seq INTEGER PRIMARY KEY) STRICT")

    def apply(self, store: EventStore, recorded: Sequence[RecordedEvent]) -> None:
        insert = "INSERT INTO seen (seq) VALUES (%s)" if is_url(store.path) else "INSERT INTO seen (seq) VALUES (?)"
        for r in recorded:
            store.backend.execute(insert, (r.seq,))
        if self.armed:
            raise RuntimeError("read model broke")
        self.applied.extend(r.seq for r in recorded)


def test_batch_is_all_or_nothing(started: EventStore) -> None:
    projector = Failing()
    started.attach(projector)
    started.append_unchecked("runner-3", [EVENT])
    before = durable_state(started.path)
    projector.armed = True
    with pytest.raises(RuntimeError):
        started.append_unchecked("runner-3", [ReclaimCompleted(generation=2), ReclaimCompleted(generation=3)])
    # Rows inserted and the read model written, then the failure: all of it rolled back.
    assert durable_state(started.path) == before
    assert started.stream_version("runner-3") == 1
    assert started.backend.execute("SELECT seq FROM seen") == [(4,)]
    projector.armed = False
    started.append_unchecked("runner-3", [ReclaimCompleted(generation=2)], expected_version=1)
    assert started.verify().events == 5


def test_transaction_commits_several_appends_together_or_none(started: EventStore) -> None:
    with started.transaction() as tx:
        tx.append_unchecked("runner-1", [ReclaimCompleted(generation=3)], expected_version=2)
        assert tx.stream_version("runner-1") == 3
        tx.append_unchecked("runner-2", [LeaseSettled(lease_id="l", lease_generation=1,
                                                      result_digest="sha256:" + "0" * 64)])
    assert (started.stream_version("runner-1"), started.stream_version("runner-2")) == (3, 2)
    before = durable_state(started.path)
    with pytest.raises(ConcurrencyError), started.transaction() as tx:
        tx.append_unchecked("runner-1", [ReclaimCompleted(generation=4)], expected_version=3)
        tx.append_unchecked("runner-2", [ReclaimCompleted(generation=4)], expected_version=0)  # stale: undoes both
    assert durable_state(started.path) == before
    assert started.verify().events == 5


def test_a_tail_read_in_a_transaction_is_reused_only_while_nothing_was_written(started: EventStore) -> None:
    # A command reads the stream's version under the lock and its append reuses that read; anything
    # written in between (here a row put in by hand) must make the append read the tail afresh.
    with started.transaction() as tx:
        assert tx.stream_version("runner-1") == 2
        head = started.head()
        forged = (head.seq + 1, "runner-1", 3, "ReclaimCompleted", "2026-01-01T00:00:00.000Z",
                  b'{"generation":3,"type":"ReclaimCompleted"}', head.hash, bytes(32))
        started.backend.insert([forged])
        with pytest.raises(ConcurrencyError):
            tx.append_unchecked("runner-1", [ReclaimCompleted(generation=3)], expected_version=2)
        (recorded,) = tx.append_unchecked("runner-1", [ReclaimCompleted(generation=4)], expected_version=3)
        assert (recorded.seq, recorded.version, recorded.prev) == (head.seq + 2, 4, bytes(32))
        assert tx.stream_version("runner-1") == 4
        assert tx.stream_version("runner-2") == 1
    with started.transaction() as tx:
        assert tx.stream_version("runner-1") == 4
        (recorded,) = tx.append_unchecked("runner-1", [ReclaimCompleted(generation=5)], expected_version=4)
        assert recorded.seq == head.seq + 3


def test_the_head_a_commit_left_is_reused_only_while_nothing_else_changed_the_file(started: EventStore) -> None:
    # The backend keeps the head its last commit made, while the connection's data version says
    # nothing changed since; any other writer, a raw write after the append, or a rollback must make
    # the next append read the head afresh, so the chain never forks.
    other = EventStore.open(started.path)
    try:
        started.append_unchecked("runner-1", [ReclaimCompleted(generation=3)], expected_version=2)
        other.append_unchecked("runner-1", [ReclaimCompleted(generation=4)], expected_version=3)
        with pytest.raises(ConcurrencyError):
            started.append_unchecked("runner-1", [ReclaimCompleted(generation=4)], expected_version=3)
        head = other.head()
        (recorded,) = started.append_unchecked("runner-1", [ReclaimCompleted(generation=5)], expected_version=4)
        assert (recorded.seq, recorded.prev) == (6, head.hash)
        (recorded,) = other.append_unchecked("runner-2", [ReclaimCompleted(generation=2)], expected_version=1)
        assert recorded.seq == 7
        (recorded,) = started.append_unchecked("runner-1", [ReclaimCompleted(generation=6)], expected_version=5)
        assert recorded.seq == 8
        # A row written after the append, in the same transaction: the commit's head is not the append's.
        with started.transaction() as tx:
            (appended,) = tx.append_unchecked("runner-1", [ReclaimCompleted(generation=7)], expected_version=6)
            raw_insert(started, (10, "runner-3", 1, "ReclaimCompleted", appended.at,
                                 b'{"generation":1,"type":"ReclaimCompleted"}', appended.hash, bytes(32)))
        (recorded,) = started.append_unchecked("runner-1", [ReclaimCompleted(generation=8)], expected_version=7)
        assert (recorded.seq, recorded.prev) == (11, bytes(32))
        # A transaction that appended and then failed leaves nothing to reuse.
        with pytest.raises(RuntimeError), started.transaction() as tx:
            tx.append_unchecked("runner-1", [ReclaimCompleted(generation=9)], expected_version=8)
            raise RuntimeError("undo")
        (recorded,) = started.append_unchecked("runner-1", [ReclaimCompleted(generation=9)], expected_version=8)
        assert (recorded.seq, recorded.version) == (12, 9)
        # A row written in the next transaction before its append: the last commit's head is not the head.
        with started.transaction() as tx:
            raw_insert(started, (13, "runner-3", 2, "ReclaimCompleted", recorded.at,
                                 b'{"generation":2,"type":"ReclaimCompleted"}', recorded.hash, bytes(range(32))))
            (appended,) = tx.append_unchecked("runner-1", [ReclaimCompleted(generation=10)], expected_version=9)
        assert (appended.seq, appended.prev) == (14, bytes(range(32)))
    finally:
        other.close()


def test_body_tag_differing_from_type_column_is_an_integrity_error(store: EventStore) -> None:
    (recorded,) = store.append_unchecked("runner-1", [EVENT])
    forged = RecordedEvent(*recorded.row()[:3], "RunnerParked", *recorded.row()[4:])
    with pytest.raises(IntegrityError) as info:
        _ = forged.event
    assert info.value.seq == 1
    garbage = RecordedEvent(*recorded.row()[:5], b"{not json", *recorded.row()[6:])
    with pytest.raises(IntegrityError):
        _ = garbage.event



@given(st.integers(min_value=-10**6, max_value=MAX_EPOCH_MS), st.integers(min_value=0, max_value=23),
       st.text(alphabet="0123456789:.-+TZz \u0663\uff10", max_size=3))
def test_an_at_the_append_keeps_as_given_is_one_timestamp_would_return_unchanged(millis: int, position: int,
                                                                               patch: str) -> None:
    # The append keeps an `at` that canonical_ms reads (a command's own stamp) without normalizing it:
    # for every such text, the normalization would have returned the very same text.
    text = iso_ms(millis)
    for candidate in (text, text[:position] + patch + text[position + len(patch) or position + 1:]):
        if canonical_ms(candidate) is not None:
            assert timestamp(candidate, "at") == candidate


def test_a_write_transaction_kept_past_its_block_or_used_from_another_thread_writes_nothing(
        started: EventStore) -> None:
    # Past its block (returned by a commit's work, or an async function's coroutine run later) a transaction's
    # append ran outside any transaction (on a server, its rows were kept for a COMMIT that never came: an
    # append acknowledged and never written); from another thread it wrote inside the open one, without the lock.
    before = durable_state(started.path)
    kept = started.commit("keeps", lambda tx: tx)
    refused: list[BaseException] = []
    with started.transaction("open") as tx:
        def elsewhere() -> None:
            try:
                tx.append_unchecked("runner-1", [ReclaimCompleted(generation=3)], expected_version=2)
            except StoreError as exc:
                refused.append(exc)

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join(20)
        assert tx.stream_version("runner-1") == 2  # open in this thread
    assert len(refused) == 1 and "not open in this thread" in str(refused[0])
    for call in (lambda: kept.append_unchecked("runner-1", [ReclaimCompleted(generation=3)], expected_version=2),
                 lambda: kept.append("runner-3", [ReclaimCompleted(generation=3)]),
                 lambda: kept.put_host_lease("runner-1", "host", 1, 1), lambda: kept.stream_version("runner-1")):
        with pytest.raises(StoreError, match="not open in this thread"):
            call()
    assert durable_state(started.path) == before
    assert started.verify().events == 3
