"""Tampering with the log: every edit an attacker with the file can make is caught, by the chain or the seal.

The attacker opens the file with plain apsw, drops the append-only triggers first (they are in the file,
so whoever can write the file can drop them), edits rows, and puts the triggers back as they were (a
schema left altered makes a writer refuse the file and the audit fail: see test_store_schema.py).
`verify` must then raise IntegrityError naming the first bad seq; what the chain cannot see (a shorter
log, an older copy) the seal must.
"""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from fleets import attack, smuggle
from hypothesis import HealthCheck, example, given, reject, settings
from hypothesis import strategies as st

from lifecycle_es import (
    EventStore,
    IntegrityError,
    StoreBehindSealError,
    StoreError,
    StoreKeyError,
    chain,
)
from lifecycle_es.events import Event, LeaseSettled, ReclaimCompleted, RunnerParked, encode, type_of
from lifecycle_es.testing import FakeClock

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
COLUMNS = ("seq", "stream", "version", "type", "at", "body", "prev", "hash")
TEXT = {"stream", "type", "at"}
DIGEST = "sha256:" + "ab" * 32


def history() -> list[tuple[str, list[Event]]]:
    """Twelve events in three streams, in batches: the log every tamper case starts from."""
    return [
        ("runner-1", [ReclaimCompleted(generation=1)]),
        ("runner-2", [ReclaimCompleted(generation=1), RunnerParked(cause="drain-idle", generation=2)]),
        ("runner-1", [LeaseSettled(lease_id="lease-a", lease_generation=1, result_digest=DIGEST)]),
        ("runner-3", [ReclaimCompleted(generation=7)]),
        ("runner-1", [RunnerParked(cause="lease-parked", generation=2), ReclaimCompleted(generation=3)]),
        ("runner-2", [ReclaimCompleted(generation=3)]),
        ("runner-3", [LeaseSettled(lease_id="lease-b", lease_generation=7, result_digest=DIGEST),
                      RunnerParked(cause="drain-settled", generation=8)]),
        ("runner-1", [ReclaimCompleted(generation=4)]),
        ("runner-2", [ReclaimCompleted(generation=4)]),
    ]


EVENTS = sum(len(events) for _, events in history())


def build(path: Path, key: bytes | None) -> None:
    """The history, written at fixed times, so two stores built alike differ only in their store id."""
    clock = FakeClock()
    with EventStore.open(path, key=key, now=clock.now) as store:
        for stream, events in history():
            clock.advance(1_000)
            store.append_unchecked(stream, events)
        store.seal()  # <path>.seal; copies made with copy_of() have none


@pytest.fixture(scope="module", params=[None, KEY], ids=["plain", "keyed"])
def base(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes | None]:
    key: bytes | None = request.param
    path = tmp_path_factory.mktemp("base") / "events.db"
    build(path, key)
    return path, key


def copy_of(source: Path, directory: Path) -> Path:
    """A copy of a closed store (one file; its WAL was checkpointed on close), without its seal."""
    target = directory / f"{uuid.uuid4().hex}.db"
    shutil.copyfile(source, target)
    return target


def rows_of(path: Path) -> list[tuple[Any, ...]]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute(f"SELECT {', '.join(COLUMNS)} FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()


def verify_fails_at(path: Path, key: bytes | None) -> IntegrityError:
    with EventStore.open(path, key=key) as store, pytest.raises(IntegrityError) as info:
        store.verify()
    return info.value


def one_byte_changed(value: int | str | bytes, position: int, xor: int) -> int | bytes:
    """`value` with one byte of its stored form XORed: 8 big-endian bytes for an integer, UTF-8 for text."""
    if isinstance(value, int):
        raw = bytearray(struct.pack(">q", value))
        raw[position % 8] ^= xor
        return struct.unpack(">q", raw)[0]  # type: ignore[no-any-return]
    raw = bytearray(value.encode() if isinstance(value, str) else value)
    raw[position % len(raw)] ^= xor
    return bytes(raw)


# --- the chain -------------------------------------------------------------------------------------------


def test_untouched_copy_verifies(base: tuple[Path, bytes | None], tmp_path: Path) -> None:
    path, key = base
    copy = copy_of(path, tmp_path)
    attack(copy)  # dropping the triggers and putting them back changes no event
    with EventStore.open(copy, key=key) as store:
        assert store.verify().events == EVENTS


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=st.integers(1, EVENTS), column=st.sampled_from(COLUMNS), position=st.integers(0, 255),
       xor=st.integers(1, 255))
@example(seq=EVENTS, column="seq", position=0, xor=0x80)  # the last row moved to a negative seq
@example(seq=3, column="seq", position=0, xor=0x40)  # a row moved past the head
@example(seq=1, column="stream", position=0, xor=0x80)  # a stream that is no longer UTF-8
@example(seq=5, column="version", position=7, xor=0x10)
@example(seq=2, column="type", position=0, xor=0x20)
@example(seq=EVENTS, column="at", position=12, xor=0x01)
@example(seq=6, column="body", position=3, xor=0x01)
@example(seq=1, column="prev", position=31, xor=0xFF)
@example(seq=EVENTS, column="hash", position=0, xor=0x01)
def test_one_changed_byte_in_any_column_fails_verify_at_its_seq(
        base: tuple[Path, bytes | None], tmp_path: Path, seq: int, column: str, position: int, xor: int) -> None:
    path, key = base
    copy = copy_of(path, tmp_path)
    original = rows_of(copy)[seq - 1][COLUMNS.index(column)]
    changed = one_byte_changed(original, position, xor)
    # Text is changed as bytes (the result need not be UTF-8): SQLite stores whatever a TEXT column is given.
    value = "CAST(? AS TEXT)" if column in TEXT else "?"
    try:
        attack(copy, (f"UPDATE events SET {column} = {value} WHERE seq = ?", (changed, seq)))
    except apsw.ConstraintError:
        reject()  # the new seq, or (stream, version), belongs to another row: that is a swap, tested below
    failure = verify_fails_at(copy, key)
    # A changed seq leaves a hole where the row was: the first bad seq is still the row's own. (A last
    # row moved to seq <= 0 is outside the walk; verify counts rows to catch it, at that same seq.)
    assert failure.seq == seq, failure


@pytest.mark.parametrize("seq", range(1, EVENTS))  # deleting the last row is a truncation: see the seal
def test_deleted_row_fails_verify(base: tuple[Path, bytes | None], tmp_path: Path, seq: int) -> None:
    path, key = base
    copy = copy_of(path, tmp_path)
    attack(copy, ("DELETE FROM events WHERE seq = ?", (seq,)))
    assert verify_fails_at(copy, key).seq == seq


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=st.lists(st.integers(1, EVENTS), min_size=2, max_size=2, unique=True))
def test_swapped_rows_fail_verify(base: tuple[Path, bytes | None], tmp_path: Path, pair: list[int]) -> None:
    path, key = base
    first, second = sorted(pair)
    copy = copy_of(path, tmp_path)
    rows = {row[0]: row for row in rows_of(copy)}
    attack(copy,
           ("DELETE FROM events WHERE seq IN (?, ?)", (first, second)),
           ("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (first, *rows[second][1:])),
           ("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (second, *rows[first][1:])))
    assert verify_fails_at(copy, key).seq == first


def test_rows_spliced_from_another_store_fail_verify(base: tuple[Path, bytes | None], tmp_path: Path) -> None:
    path, key = base
    donor = tmp_path / "donor.db"
    build(donor, key)  # the same events, streams, versions and times: only the store id differs
    donor_rows = rows_of(donor)
    assert [row[:6] for row in donor_rows] == [row[:6] for row in rows_of(path)]
    for seq in range(1, EVENTS + 1):
        copy = copy_of(path, tmp_path)
        attack(copy, ("DELETE FROM events WHERE seq = ?", (seq,)),
               ("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", donor_rows[seq - 1]))
        assert verify_fails_at(copy, key).seq == seq
    # The whole donor log, every link intact, still fails at seq 1: its genesis is the donor's store id.
    copy = copy_of(path, tmp_path)
    attack(copy, ("DELETE FROM events", ()),
           *(("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row) for row in donor_rows))
    failure = verify_fails_at(copy, key)
    assert failure.seq == 1 and "prev" in failure.reason


def test_text_that_is_not_utf8_is_an_integrity_error_at_its_seq(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    build(path, None)
    attack(path, ("UPDATE events SET stream = CAST(? AS TEXT) WHERE seq = 4", (b"runner-\xff",)))
    with EventStore.open(path) as store:
        with pytest.raises(IntegrityError) as info:
            store.verify()
        assert info.value.seq == 4
        with pytest.raises(IntegrityError) as info:
            store.event_at(4)
        assert info.value.seq == 4
        assert store.event_at(3) is not None
        with pytest.raises(IntegrityError):
            store.streams()


# --- keys -------------------------------------------------------------------------------------------------


def rechain(rows: list[tuple[Any, ...]], start: int, prev: bytes, key: bytes | None,
            body: bytes) -> list[tuple[Any, ...]]:
    """Rows from seq `start` on, the one at `start` given a new body, linked again under `key`."""
    out = []
    for seq, stream, version, type_, at, old_body, _, _ in rows[start - 1:]:
        new_body = body if seq == start else old_body
        digest = chain.link(prev, seq, stream, version, type_, at, new_body, key)
        out.append((seq, stream, version, type_, at, new_body, prev, digest))
        prev = digest
    return out


@pytest.mark.parametrize("forger_key", [None, OTHER_KEY], ids=["unkeyed", "another-key"])
@pytest.mark.parametrize("start", [1, 5, EVENTS])
def test_keyed_store_rechained_without_its_key_fails_verify(
        tmp_path: Path, forger_key: bytes | None, start: int) -> None:
    path = tmp_path / "keyed.db"
    build(path, KEY)
    os.unlink(f"{path}.seal")  # this is about the chain alone
    rows = rows_of(path)
    forged = ReclaimCompleted(generation=999)
    assert type_of(forged) == rows[start - 1][3]
    new_rows = rechain(rows, start, rows[start - 1][6], forger_key, encode(forged))
    attack(path, ("DELETE FROM events WHERE seq >= ?", (start,)),
           *(("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row) for row in new_rows))
    assert verify_fails_at(path, KEY).seq == start


def test_keyed_store_turned_unkeyed_is_refused_with_the_key(tmp_path: Path) -> None:
    path = tmp_path / "keyed.db"
    build(path, KEY)
    os.unlink(f"{path}.seal")
    with EventStore.open(path, key=KEY) as store:
        store_id = store.store_id
    rows = rechain(rows_of(path), 1, chain.genesis(store_id), None, encode(ReclaimCompleted(generation=999)))
    attack(path, ("DELETE FROM events", ()), ("DELETE FROM meta WHERE key = 'key_id'", ()),
           *(("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row) for row in rows))
    # Without the key the forgery is a valid unkeyed chain; whoever holds the key is not fooled.
    with EventStore.open(path) as store:
        assert store.verify().events == EVENTS
    with pytest.raises(StoreKeyError):
        EventStore.open(path, key=KEY)


@pytest.mark.parametrize("field", ["version", "seq"])
def test_forged_chain_with_a_gap_fails_verify_on_the_rules(tmp_path: Path, field: str) -> None:
    # Every hash valid (an unkeyed chain re-linked by the forger), but a version or seq skips one:
    # verify checks the numbering itself, not only the links.
    path = tmp_path / "events.db"
    build(path, None)
    os.unlink(f"{path}.seal")
    rows = [list(row) for row in rows_of(path)]
    at = 6
    if field == "version":
        later = [row for row in rows[at - 1:] if row[1] == rows[at - 1][1]]
        for row in later:
            row[2] += 1
    else:
        for row in rows[at - 1:]:
            row[0] += 1
    with EventStore.open(path) as store:
        prev = chain.genesis(store.store_id)
    for row in rows:
        row[6] = prev
        row[7] = prev = chain.link(prev, row[0], row[1], row[2], row[3], row[4], row[5])
    attack(path, ("DELETE FROM events", ()),
           *(("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", tuple(row)) for row in rows))
    failure = verify_fails_at(path, None)
    assert failure.seq == at and field in failure.reason


@pytest.mark.parametrize(("at", "reason"), [
    ("2025-01-01T00:00:00.000Z", "time ran backwards"),  # a year before the event before it
    # The same instant as 2025-12-29, spelled so that it sorts after every 2026 time: not the store's form.
    ("2026-W01-1T00:00:00.000Z", "not a time as the store writes one"),
    ("2026-01-01T05:00:00.000+05:00", "not a time as the store writes one"),
])
def test_forged_chain_whose_time_runs_backwards_fails_verify(tmp_path: Path, at: str, reason: str) -> None:
    path = tmp_path / "events.db"
    build(path, None)
    os.unlink(f"{path}.seal")
    rows = [list(row) for row in rows_of(path)]
    seq = 7
    rows[seq - 1][4] = at
    with EventStore.open(path) as store:
        prev = chain.genesis(store.store_id)
    for row in rows:  # every link valid: an unkeyed chain re-linked by the forger
        row[6] = prev
        row[7] = prev = chain.link(prev, row[0], row[1], row[2], row[3], row[4], row[5])
    attack(path, ("DELETE FROM events", ()),
           *(("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", tuple(row)) for row in rows))
    failure = verify_fails_at(path, None)
    assert failure.seq == seq and reason in failure.reason, failure


# --- the seal: what the chain alone cannot see ---------------------------------------------------------


def test_truncated_tail_is_caught_by_the_seal(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    build(path, None)
    with EventStore.open(path) as store:
        store.seal(tmp_path / "elsewhere.seal")
    attack(path, ("DELETE FROM events WHERE seq > ?", (EVENTS - 3,)))
    with pytest.raises(StoreBehindSealError) as info:
        EventStore.open(path)
    assert (info.value.sealed_seq, info.value.head_seq) == (EVENTS, EVENTS - 3)
    assert "shorter" in info.value.reason
    # The chain alone is fine with a shorter log; the seal passed to verify is not.
    os.unlink(f"{path}.seal")
    with EventStore.open(path) as store:
        assert store.verify().events == EVENTS - 3
        with pytest.raises(StoreBehindSealError):
            store.verify(seal=tmp_path / "elsewhere.seal")


def test_restored_older_copy_is_caught_by_the_seal(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=2)])
    older = tmp_path / "t1-copy.db"
    shutil.copyfile(path, older)  # closed: the copy is the whole store at T1
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=3)])
        store.seal()
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
    # Restore T1 as an operator would: the old file back, and no -wal/-shm of the newer one left over.
    shutil.copyfile(older, path)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with pytest.raises(StoreBehindSealError) as info:
        EventStore.open(path)
    assert (info.value.sealed_seq, info.value.head_seq) == (3, 2)
    assert "shorter" in info.value.reason
    with EventStore.open(older) as store:  # the copy itself, with no seal beside it, is a valid log
        assert store.verify().events == 2


def test_unkeyed_history_rewritten_at_the_sealed_seq_is_caught_by_the_seal(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    build(path, None)  # sealed at its head
    with EventStore.open(path) as store:
        store_id = store.store_id
    rows = rechain(rows_of(path), 1, chain.genesis(store_id), None, encode(ReclaimCompleted(generation=999)))
    attack(path, ("DELETE FROM events", ()),
           *(("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row) for row in rows))
    # An unkeyed chain can be forged whole (documented); the seal still holds the old head's hash.
    with pytest.raises(StoreBehindSealError) as info:
        EventStore.open(path)
    assert (info.value.sealed_seq, info.value.head_seq) == (EVENTS, EVENTS)
    assert "not the one sealed" in info.value.reason


# --- the append-only triggers, through the store's own connection ---------------------------------------


@pytest.fixture
def filled(tmp_path: Path, clock: FakeClock) -> Iterator[EventStore]:
    """A store file with the history in it. SQLite only: the edits below are the file's own SQL dialect
    (test_postgres.py tries the same edits on a server's store)."""
    with EventStore.open(tmp_path / "events.db", now=clock.now) as store:
        for stream, events in history():
            store.append_unchecked(stream, events)
        yield store


@pytest.mark.parametrize("sql", [
    "UPDATE events SET body = x'00' WHERE seq = 1",
    "UPDATE events SET at = '2020-01-01T00:00:00.000Z'",
    "DELETE FROM events WHERE seq = 12",
    "DELETE FROM events",
    "INSERT OR REPLACE INTO events SELECT seq, stream, version, type, at, x'00', prev, hash FROM events WHERE seq = 1",
    "REPLACE INTO events SELECT 99, stream, version, type, at, body, prev, hash FROM events WHERE seq = 1",
], ids=["update", "update-all", "delete", "delete-all", "insert-or-replace", "replace-by-version"])
def test_append_only_triggers_refuse_through_the_store(filled: EventStore, sql: str) -> None:
    before = list(filled.read())
    with pytest.raises(StoreError, check=lambda exc: type(exc) is StoreError) as info:
        filled.backend.execute(sql)
    assert "append-only" in str(info.value)
    assert list(filled.read()) == before
    assert filled.verify().events == EVENTS


def test_refused_edit_inside_a_transaction_rolls_back_its_appends(filled: EventStore) -> None:
    with pytest.raises(StoreError), filled.transaction() as tx:
        tx.append_unchecked("runner-9", [ReclaimCompleted(generation=1)])
        filled.backend.execute("DELETE FROM events WHERE seq = 1")
    assert filled.head().seq == EVENTS
    assert filled.stream_version("runner-9") == 0
    assert filled.verify().events == EVENTS


@pytest.mark.parametrize("hash_", ["NULL", "zeroblob(16)", "zeroblob(2000)"], ids=["null", "short", "oversized"])
def test_an_append_onto_a_head_whose_hash_no_append_leaves_is_refused(tmp_path: Path, hash_: str) -> None:
    # Chaining onto it would bury the edit under events that verify against it.
    path = tmp_path / "head.db"
    with EventStore.open(path) as store:
        store.append_unchecked("r", [ReclaimCompleted(generation=g) for g in (1, 2, 3)])
    smuggle(path, (f"UPDATE events SET hash = {hash_} WHERE seq = 3", ()))
    before = path.read_bytes()
    with EventStore.open(path) as store:
        with pytest.raises(IntegrityError) as info:
            store.append_unchecked("r", [ReclaimCompleted(generation=4)])
        assert info.value.seq == 3 and "audit it" in str(info.value)
        assert store.head().seq == 3
    assert path.read_bytes() == before
