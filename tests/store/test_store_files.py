"""The store's files: what it refuses to open, what it creates, keys, seals, fences and the pragma profile.

Every failure is asserted as its exact StoreError kind (never a raw apsw error), and every refusal that
could have touched a file is checked to have left it byte-identical.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from waiting import returns_within, wait_for

from lifecycle_es import (
    EventStore,
    InvalidInputError,
    StoreBehindSealError,
    StoreBusyError,
    StoreError,
    StoreFencedError,
    StoreFormatError,
    StoreIOError,
    StoreKeyError,
    StorePragmaError,
    audit,
    chain,
    sqlite_files,
)
from lifecycle_es.canonical import canonical_bytes, iso_ms
from lifecycle_es.events import ReclaimCompleted, RunnerParked, encode
from lifecycle_es.signing import generate_key, load_signer
from lifecycle_es.sqlite_profile import apply_profile, set_foreign_keys
from lifecycle_es.sqlite_schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from lifecycle_es.store import WriteTransaction

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
SQLITE_HEADER = b"SQLite format 3\x00"


def raises_exactly(kind: type[BaseException]) -> pytest.RaisesExc:
    """pytest.raises that refuses a subclass: each case names the one kind the store must raise."""
    return pytest.raises(kind, check=lambda exc: type(exc) is kind)


def file_digests(path: Path) -> dict[str, str | None]:
    """Digests of the durable files (the db and its WAL); -shm is a rebuildable index, not data."""
    digests: dict[str, str | None] = {}
    for suffix in ("", "-wal", "-journal"):
        part = Path(f"{path}{suffix}")
        digests[suffix] = hashlib.sha256(part.read_bytes()).hexdigest() if part.exists() else None
    return digests


def make_store(path: Path, events: int = 3, *, key: bytes | None = None) -> None:
    with EventStore.open(path, key=key) as store:
        for n in range(1, events + 1):
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=n)])


def write_pragmas(path: Path, *statements: str) -> None:
    conn = apsw.Connection(str(path))
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


# --- files that are not stores -----------------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=8192))
def test_random_bytes_are_refused_and_left_alone(tmp_path: Path, data: bytes) -> None:
    assume(not data.startswith(SQLITE_HEADER))
    path = tmp_path / f"random-{hashlib.sha256(data).hexdigest()[:16]}.db"
    path.write_bytes(data)
    with raises_exactly(StoreFormatError):
        EventStore.open(path)
    assert path.read_bytes() == data
    assert not Path(f"{path}-wal").exists()


def test_empty_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with raises_exactly(StoreFormatError):
        EventStore.open(path)
    assert path.read_bytes() == b""


def test_foreign_sqlite_file_is_refused_and_not_converted_to_wal(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    write_pragmas(path, "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)",
                  "INSERT INTO notes (text) VALUES ('someone else''s data')")
    before = file_digests(path)
    with raises_exactly(StoreFormatError):
        EventStore.open(path)
    # Refusing must happen before the profile: journal_mode=wal would rewrite another app's file header.
    assert file_digests(path) == before


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    make_store(path)
    write_pragmas(path, f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    before = file_digests(path)
    with raises_exactly(StoreFormatError) as info:
        EventStore.open(path)
    assert "newer" in str(info.value)
    assert file_digests(path) == before


def test_our_application_id_without_a_schema_is_refused(tmp_path: Path) -> None:
    no_version = tmp_path / "no-version.db"
    write_pragmas(no_version, f"PRAGMA application_id={APPLICATION_ID}", "CREATE TABLE t (x)")
    with raises_exactly(StoreFormatError):
        EventStore.open(no_version)
    no_tables = tmp_path / "no-tables.db"
    write_pragmas(no_tables, f"PRAGMA application_id={APPLICATION_ID}", f"PRAGMA user_version={SCHEMA_VERSION}",
                  "CREATE TABLE t (x)")
    with raises_exactly(StoreFormatError):
        EventStore.open(no_tables)


def test_store_without_store_id_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "no-id.db"
    make_store(path, events=0)
    write_pragmas(path, "DELETE FROM meta WHERE key = 'store_id'")
    with raises_exactly(StoreFormatError):
        EventStore.open(path)


# --- paths -------------------------------------------------------------------------------------------


def test_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a-directory.db"
    path.mkdir()
    with raises_exactly(StoreFormatError):
        EventStore.open(path)


def test_symlink_is_refused_even_to_a_valid_store(tmp_path: Path) -> None:
    real = tmp_path / "real.db"
    make_store(real)
    before = file_digests(real)
    link = tmp_path / "link.db"
    link.symlink_to(real)
    with raises_exactly(StoreFormatError):
        EventStore.open(link)
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "nowhere.db")
    with raises_exactly(StoreFormatError):
        EventStore.open(dangling)
    assert not (tmp_path / "nowhere.db").exists()
    assert file_digests(real) == before


def test_missing_parent_directory_is_refused(tmp_path: Path) -> None:
    with raises_exactly(StoreIOError):
        EventStore.open(tmp_path / "missing" / "events.db")
    assert not (tmp_path / "missing").exists()
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with raises_exactly(StoreIOError):
        EventStore.open(not_a_dir / "events.db")


def test_directory_where_no_file_can_be_created(tmp_path: Path) -> None:
    # procfs refuses to create files for everyone, root included.
    with raises_exactly(StoreIOError):
        EventStore.open("/proc/lifecycle-es-test.db")


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """chattr +i for the block. Tests run as root, which ignores mode bits but not the immutable flag."""
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot make {path} immutable (chattr +i: {done.stderr.strip()}); as root, mode bits "
                    "alone cannot make a directory read-only")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.skipif(shutil.which("chattr") is None, reason="chattr is not installed: no way to make a "
                    "directory read-only for root")
def test_read_only_directory_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "read-only"
    directory.mkdir()
    with immutable(directory):
        with raises_exactly(StoreIOError):
            EventStore.open(directory / "events.db")
        assert os.listdir(directory) == []


@pytest.mark.skipif(shutil.which("chattr") is None, reason="chattr is not installed: no way to make a "
                    "file read-only for root")
def test_a_follower_of_a_store_opened_immutable_raises_once_a_writer_opens_it(tmp_path: Path) -> None:
    # A reader that may not write the file, opened with no -wal there, reads it immutable: no locks, no WAL.
    # A writer that opens the store later commits to a -wal that reader never reads, so its follower would
    # wait for ever (and its reads could meet a checkpoint's half-written pages): it must say so instead.
    path = tmp_path / "events.db"
    make_store(path)
    assert not os.path.exists(f"{path}-wal")
    with immutable(path):
        reader = EventStore.open(path, read_only=True)
    try:
        assert reader.backend.immutable  # type: ignore[attr-defined]
        stop = threading.Event()
        following = reader.follow(after=3, poll_interval=0.01, stop=stop)
        with EventStore.open(path) as writer:
            writer.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
            try:
                with raises_exactly(StoreFencedError) as info:
                    returns_within(lambda: next(following, None))
            finally:
                stop.set()  # a follower that would wait for ever ends here, its thread with it
        assert f"{path}-wal" in info.value.cause and "reopen the store" in info.value.cause
    finally:
        reader.close()


def test_invalid_open_arguments(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    for kwargs in ({"durability": "sometimes"}, {"busy_timeout_ms": -1}, {"busy_timeout_ms": True},
                   {"key": b"short"}, {"key": "0" * 32}, {"now": 5}):
        with raises_exactly(InvalidInputError):
            EventStore.open(path, **kwargs)  # type: ignore[arg-type]
    for bad in ("", "a\0b", b"bytes.db"):
        with raises_exactly(InvalidInputError):
            EventStore.open(bad)  # type: ignore[arg-type]
    assert not path.exists()


# --- what the store creates --------------------------------------------------------------------------


def test_files_are_created_0600_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    old = os.umask(0)  # with umask 0 the store's own mode is all that stands between the file and 0666
    try:
        with EventStore.open(path, key=KEY) as store:
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])
            store.seal()
            for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}.seal")):
                assert stat.S_IMODE(name.stat().st_mode) == 0o600, name
    finally:
        os.umask(old)
    assert [name for name in os.listdir(tmp_path) if ".creating-" in name or ".tmp-" in name] == []


def test_concurrent_opens_of_one_new_path_share_one_store(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    barrier = threading.Barrier(4)
    ids: list[bytes] = []
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            barrier.wait()
            with EventStore.open(path) as store:
                ids.append(store.store_id)
        except BaseException as exc:  # collected and re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(ids) == 4 and len(set(ids)) == 1


def test_open_waits_for_a_lock_held_elsewhere_up_to_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    holder = apsw.Connection(str(path))
    # EXCLUSIVE locking mode keeps the lock after the first write, so even reading the header must wait.
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    # (The row is gone again at the commit: a meta key the store never writes would make a writer refuse it.)
    holder.execute("BEGIN IMMEDIATE; INSERT INTO meta (key, value) VALUES ('held', x'00');"
                   " DELETE FROM meta WHERE key = 'held'; COMMIT")
    try:
        with raises_exactly(StoreBusyError):
            EventStore.open(path, busy_timeout_ms=0)
        release = threading.Timer(0.2, holder.close)
        release.start()
        try:
            # Before the fix the header was read with no busy timeout: this failed at once.
            with EventStore.open(path, busy_timeout_ms=30_000) as store:
                assert store.head().seq == 3
        finally:
            release.join()
    finally:
        holder.close()


def test_busy_error_is_also_a_timeout_error(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path, busy_timeout_ms=0) as store:
        before = file_digests(path)
        holder = apsw.Connection(str(path))
        holder.execute("BEGIN IMMEDIATE")
        try:
            with raises_exactly(StoreBusyError) as info:
                store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
            assert isinstance(info.value, TimeoutError)
            assert file_digests(path) == before
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        assert store.head().seq == 4


# --- keys ---------------------------------------------------------------------------------------------


def test_keyed_store_needs_its_key(tmp_path: Path) -> None:
    path = tmp_path / "keyed.db"
    make_store(path, key=KEY)
    with raises_exactly(StoreKeyError):
        EventStore.open(path, key=OTHER_KEY)
    with EventStore.open(path) as store:  # no key: it opens, read-only
        assert store.keyed and [r.version for r in store.read()] == [1, 2, 3]
        before = file_digests(path)
        with raises_exactly(StoreKeyError):
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        with raises_exactly(StoreKeyError):
            store.verify()
        with raises_exactly(StoreKeyError):
            store.verify(key=OTHER_KEY)
        with raises_exactly(StoreKeyError):
            store.seal()
        assert file_digests(path) == before
        assert store.verify(key=KEY).events == 3
    with EventStore.open(path, key=KEY) as store:
        assert store.verify().events == 3
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])


def test_unkeyed_store_with_events_refuses_a_key(tmp_path: Path) -> None:
    path = tmp_path / "plain.db"
    make_store(path)
    with raises_exactly(StoreKeyError):
        EventStore.open(path, key=KEY)
    with EventStore.open(path) as store, raises_exactly(StoreKeyError):
        store.verify(key=KEY)


def test_keyed_hashes_differ_from_unkeyed(tmp_path: Path) -> None:
    path = tmp_path / "keyed.db"
    make_store(path, events=1, key=KEY)
    with EventStore.open(path, key=KEY) as store:
        (first,) = store.read()
        unkeyed = chain.link(chain.genesis(store.store_id), 1, first.stream, 1, first.type, first.at, first.body)
        assert first.hash != unkeyed
        assert first.hash == chain.link(first.prev, 1, first.stream, 1, first.type, first.at, first.body, KEY)


# --- seals --------------------------------------------------------------------------------------------


def tamper_seal(path: Path, change: dict[str, object]) -> None:
    document = msgspec.json.decode(path.read_bytes())
    for key, value in change.items():
        if key == "mac":
            document["mac"] = value
        else:
            document["seal"][key] = value
    path.write_bytes(msgspec.json.encode(document))


@pytest.mark.parametrize("key", [None, KEY], ids=["checksum", "mac"])
@pytest.mark.parametrize("change", [{"seq": 1}, {"hash": "00" * 32}, {"at": "2020-01-01T00:00:00.000Z"},
                                    {"mac": "00" * 32}], ids=["seq", "hash", "at", "mac"])
def test_tampered_seal_is_refused(tmp_path: Path, key: bytes | None, change: dict[str, object]) -> None:
    path = tmp_path / "events.db"
    make_store(path, key=key)
    with EventStore.open(path, key=key) as store:
        store.seal()
    tamper_seal(Path(f"{path}.seal"), change)
    with raises_exactly(StoreFormatError):
        EventStore.open(path, key=key)


def test_garbage_seal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    Path(f"{path}.seal").write_bytes(b"not a seal")
    with raises_exactly(StoreFormatError):
        EventStore.open(path)
    Path(f"{path}.seal").write_bytes(b"{" * 5000)
    with raises_exactly(StoreFormatError):
        EventStore.open(path)


def test_seal_of_another_store_is_refused(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "mine.db", tmp_path / "theirs.db"
    make_store(mine)
    make_store(theirs)
    with EventStore.open(theirs) as store:
        store.seal(f"{mine}.seal")
    with raises_exactly(StoreBehindSealError):
        EventStore.open(mine)


def test_log_ahead_of_its_seal_opens(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store:
        sealed = store.seal()
        assert sealed.seq == 3 and sealed.hash == store.head().hash.hex()
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
    with EventStore.open(path) as store:
        assert store.verify(seal=f"{path}.seal").events == 4


def test_seal_of_an_empty_store(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        assert store.seal().seq == 0
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])


@pytest.mark.parametrize("how", ["commit", "transaction"])
@pytest.mark.parametrize("what", ["seal", "checkpoint"])
def test_a_seal_or_checkpoint_inside_a_write_is_refused_and_writes_nothing(tmp_path: Path, what: str,
                                                                           how: str) -> None:
    """The head inside a write is not committed yet: sealed or signed there and then rolled back, it would leave
    the log behind its seal for good. Refused as the store refuses any nested transaction; no file is written."""
    path = tmp_path / "events.db"
    make_store(path)
    generate_key(tmp_path / "ops.key", name="ops")
    signer = load_signer(tmp_path / "ops.key")
    with EventStore.open(path) as store:
        head = store.head()

        def work(tx: WriteTransaction) -> None:
            tx.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
            if what == "seal":
                store.seal(tmp_path / "inside.seal")
            else:
                store.checkpoint(signer, tmp_path / "inside.checkpoints")

        with raises_exactly(StoreError) as refused:
            if how == "commit":
                store.commit("seals inside", work)
            else:
                with store.transaction("seals inside") as tx:
                    work(tx)
        assert f"cannot {what} the head within a write transaction" in str(refused.value)
        assert store.head() == head  # the work's append rolled back with it
        assert not (tmp_path / "inside.seal").exists() and not (tmp_path / "inside.checkpoints").exists()
        assert store.seal().seq == head.seq  # outside a write, as ever
    with EventStore.open(path, seal=f"{path}.seal") as store:
        assert store.verify().events == head.seq


def test_explicit_missing_seal_is_an_io_error(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    with raises_exactly(StoreIOError):
        EventStore.open(path, seal=tmp_path / "missing.seal")


def resealed(path: Path, change: dict[str, object]) -> None:
    """Edit the unkeyed seal at `path` and recompute its checksum, as anyone who can write it can."""
    document = msgspec.json.decode(path.read_bytes())
    document["seal"].update(change)
    document["mac"] = chain.seal_mac(None, canonical_bytes(document["seal"]))
    path.write_bytes(msgspec.json.encode(document))


@pytest.mark.parametrize("change", [
    {"seq": -1}, {"seq": -(2**63)}, {"seq": 2**53}, {"seq": 2**64},
    {"hash": "zz" * 32}, {"hash": "AB" * 32}, {"hash": "ab" * 31}, {"hash": "ab" * 32 + "\n"},
    {"store_id": "00" * 15}, {"store_id": "xy" * 16}, {"key_id": "k"},
    {"at": "2026-01-01T00:00:00Z"}, {"at": "2026-13-01T00:00:00.000Z"}, {"at": "yesterday"},
    {"extra": 1},
], ids=lambda change: "-".join(f"{key}={value!r}"[:24] for key, value in change.items()))
def test_a_checksummed_seal_with_a_field_out_of_range_is_malformed(tmp_path: Path, change: dict[str, object]) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store:
        store.seal()
    seal = Path(f"{path}.seal")
    resealed(seal, {})
    EventStore.open(path).close()  # recomputing the checksum alone breaks nothing
    resealed(seal, change)
    before = file_digests(path)
    with raises_exactly(StoreFormatError) as info:
        EventStore.open(path)
    assert "malformed" in str(info.value) or "not a seal file" in str(info.value)
    assert file_digests(path) == before


@pytest.mark.parametrize("target", ["a-valid-seal", "nowhere"])
def test_a_seal_that_is_a_link_is_refused_dangling_or_not(tmp_path: Path, target: str) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store:
        store.seal(tmp_path / "a-valid-seal")
    os.symlink(tmp_path / target, f"{path}.seal")
    before = file_digests(path)
    # The default seal beside the store and one named: the same refusal, never followed, never skipped.
    for seal in (None, f"{path}.seal"):
        with raises_exactly(StoreFormatError) as info:
            EventStore.open(path, seal=seal)
        assert "symbolic link" in str(info.value)
    with EventStore.open(path, seal=tmp_path / "a-valid-seal") as store, raises_exactly(StoreFormatError):
        store.verify(seal=f"{path}.seal")
    assert file_digests(path) == before
    assert not (tmp_path / "nowhere").exists()


OPEN_IN_A_CHILD = """
import sys
from lifecycle_es import EventStore
try:
    EventStore.open(sys.argv[1], seal=sys.argv[2] if len(sys.argv) > 2 else None).close()
except Exception as exc:
    print(type(exc).__name__, exc)
else:
    print("opened")
"""


@pytest.mark.parametrize("named", [False, True], ids=["beside-the-store", "named"])
def test_a_seal_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path, named: bool) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    fifo = Path(f"{path}.seal") if not named else tmp_path / "fifo.seal"
    os.mkfifo(fifo)
    before = file_digests(path)
    # A child, so a regression hangs it, not this process: the timeout ends it and fails the test.
    done = subprocess.run([sys.executable, "-c", OPEN_IN_A_CHILD, str(path), *([str(fifo)] if named else [])],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.startswith("StoreFormatError ") and "a FIFO" in done.stdout, (done.stdout, done.stderr)
    assert file_digests(path) == before


def test_a_seal_that_is_a_device_or_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    (tmp_path / "events.db.seal").mkdir()
    for seal in (None, "/dev/zero"):
        with raises_exactly(StoreFormatError):
            EventStore.open(path, seal=seal)


@pytest.mark.parametrize("bad", ["x\udcff.db", "x\ud800.db"])
def test_a_path_that_is_not_utf8_is_invalid_input_naming_its_field(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    before = file_digests(path)
    for call, field in ((lambda: EventStore.open(f"{tmp_path}/{bad}"), "path"),
                        (lambda: EventStore.open(path, seal=f"{tmp_path}/{bad}"), "seal")):
        with raises_exactly(InvalidInputError) as info:
            call()
        assert info.value.field == field
    with EventStore.open(path) as store:
        for call, field in ((lambda: store.seal(f"{tmp_path}/{bad}"), "path"),
                            (lambda: store.check_seal(f"{tmp_path}/{bad}"), "path"),
                            (lambda: store.verify(seal=f"{tmp_path}/{bad}"), "seal")):
            with raises_exactly(InvalidInputError) as info:
                call()
            assert info.value.field == field
    assert file_digests(path) == before
    assert not [name for name in os.listdir(tmp_path) if name.startswith("x")]  # nothing made at a refused path


# --- fences ------------------------------------------------------------------------------------------


def test_fence_refuses_every_later_write(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store:
        store.fence("a newer process took over")
        before = file_digests(path)
        for _ in range(2):  # nothing is retried on a fenced store: the second try fails the same way
            with raises_exactly(StoreFencedError) as info:
                store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
            assert info.value.cause == "a newer process took over"
        with raises_exactly(StoreFencedError), store.transaction():
            pass
        store.fence("a later cause does not replace the first")
        assert store.fenced == "a newer process took over"
        assert file_digests(path) == before
        assert store.head().seq == 3 and store.verify().events == 3  # reads go on


@pytest.mark.parametrize("remove_wal", [True, False], ids=["wal-removed-too", "only-the-db-replaced"])
def test_file_replaced_underneath_fences_the_store(tmp_path: Path, remove_wal: bool) -> None:
    path, other = tmp_path / "events.db", tmp_path / "other.db"
    make_store(path)
    make_store(other, events=1)
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])  # its frames sit in <path>-wal
        os.replace(other, path)
        if remove_wal:  # what a careful restore does
            for suffix in ("-wal", "-shm"):
                os.unlink(f"{path}{suffix}")
        replaced = path.read_bytes()
        with raises_exactly(StoreFencedError):
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=5)])
        assert store.fenced is not None and "replaced" in store.fenced
        with raises_exactly(StoreFencedError):
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=5)])
        assert path.read_bytes() == replaced  # the fenced store never wrote into the file now at the path
    # Closing the old store must not leave its WAL for the new file: SQLite skips the checkpoint of a
    # moved file and would leave <path>-wal full of the old store's pages, replayed into the new one.
    with EventStore.open(path) as store:
        assert store.head().seq == 1
        assert store.verify().events == 1


def test_file_removed_underneath_fences_and_a_new_store_there_starts_clean(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        os.unlink(path)
        with raises_exactly(StoreFencedError):
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=5)])
        assert store.fenced is not None
    with EventStore.open(path) as store:
        assert store.head().seq == 0
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])
        assert store.verify().events == 1


def test_a_fence_for_a_file_gone_names_its_cause_once(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store:
        os.unlink(path)
        for _ in range(2):
            with raises_exactly(StoreFencedError) as info:
                store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
            assert str(info.value) == f"the store is fenced: {info.value.cause}"
            assert info.value.cause == store.fenced and "is gone" in store.fenced
            assert not store.fenced.startswith("the store is fenced")


def replace_side_file(side: Path, how: str) -> None:
    """Remove `side`, or put a copy of it in its place (the same bytes under another inode)."""
    kept = side.read_bytes()
    os.unlink(side)
    if how == "replaced":
        side.write_bytes(kept)


def settle(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Make `directory` count as settled (still long enough for its ctime to vouch for the side files) at
    once, by shortening how long that takes to 20 ms and waiting for that."""
    monkeypatch.setattr(sqlite_files, "SETTLED_NS", 20_000_000)

    def still_for_40_ms() -> bool:  # twice the shortened bound: past it whatever the clock's tick
        return time.time_ns() - directory.stat().st_ctime_ns > 40_000_000

    assert wait_for(still_for_40_ms)


@pytest.mark.parametrize("directory", ["changing", "settled"])
@pytest.mark.parametrize("how", ["removed", "replaced"])
@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_a_side_file_removed_or_replaced_underneath_fences_the_store(tmp_path: Path, suffix: str, how: str,
                                                                    directory: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Its WAL or the WAL's index gone from under the connection: a commit would land in a file no other
    # connection reads (lost when this process dies), or be indexed where no other writer looks. In a
    # settled directory the side files are not stat'ed again until the directory's ctime moves, as it
    # does here.
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store:
        if directory == "settled":
            settle(monkeypatch, tmp_path)
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        replace_side_file(Path(f"{path}{suffix}"), how)
        before = file_digests(path)
        with raises_exactly(StoreFencedError) as info:
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=5)])
        cause = info.value.cause
        assert f"{path}{suffix}" in cause and how in cause and "reopen the store" in cause
        assert store.fenced == cause and str(info.value).count("the store is fenced") == 1
        assert file_digests(path) == before  # the refused write appended nothing
        with raises_exactly(StoreFencedError):
            store.transaction().__enter__()
        with raises_exactly(StoreFencedError):
            store.backend.data_version()  # a follower's poll says so too, not a number that never moves
        assert store.head().seq == 4  # reads go on


def test_a_settled_directory_spares_the_side_files_a_stat_until_it_changes(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # A stat of the -wal before its next fdatasync costs that sync a journal commit more: a directory whose
    # ctime has not moved since it settled vouches for its side files instead.
    path = tmp_path / "events.db"
    make_store(path)
    looked: list[object] = []
    real = sqlite_files.changed_file
    monkeypatch.setattr(sqlite_files, "changed_file", lambda recorded: looked.append(recorded) or real(recorded))
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        assert looked  # the directory was just made: not settled, so the side files are checked
        settle(monkeypatch, tmp_path)
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=5)])  # settles, checking them once more
        looked.clear()
        for generation in range(6, 9):
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=generation)])
        assert looked == []
        (tmp_path / "neighbour").write_bytes(b"")  # any entry made in the directory moves its ctime
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=9)])
        assert looked


@pytest.mark.parametrize("read_only", [False, True])
def test_other_processes_opening_and_closing_the_store_never_fence_a_long_lived_handle(tmp_path: Path,
                                                                                    read_only: bool) -> None:
    # SQLite removes the -wal and -shm when the last connection closes; a handle open in another process holds
    # its shared lock on the file the whole time, so a process that opens, writes and closes is never the last.
    path = tmp_path / "events.db"
    make_store(path)
    code = ("import sys\n"
            "from lifecycle_es import EventStore\n"
            "from lifecycle_es.events import ReclaimCompleted\n"
            "with EventStore.open(sys.argv[1], read_only=sys.argv[2] == 'ro') as store:\n"
            "    if sys.argv[2] == 'rw':\n"
            "        store.append_unchecked('runner-2', [ReclaimCompleted(generation=1)])\n"
            "    store.head()\n")
    with EventStore.open(path, read_only=read_only) as store:
        store.head()
        sides = [os.stat(f"{path}{suffix}").st_ino for suffix in ("-wal", "-shm")]
        for mode in ("rw", "ro", "rw"):
            subprocess.run([sys.executable, "-c", code, str(path), mode], check=True)
            if not read_only:
                store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
            store.backend.data_version()
            store.check_followed(store.head().seq)
        assert store.fenced is None
        assert [os.stat(f"{path}{suffix}").st_ino for suffix in ("-wal", "-shm")] == sides
        assert store.head().seq == (5 if read_only else 8)


def test_a_wal_removed_under_a_writer_that_then_dies_loses_no_acknowledged_write(tmp_path: Path) -> None:
    # A real process: its WAL unlinked by someone else, it appends and is SIGKILLed. Whatever it
    # acknowledged after that must be in the file another process opens.
    path = tmp_path / "events.db"
    make_store(path)
    code = ("import os, signal, sys\n"
            "from lifecycle_es import EventStore, StoreFencedError\n"
            "from lifecycle_es.events import ReclaimCompleted\n"
            f"store = EventStore.open({str(path)!r})\n"
            "store.head()\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"
            "try:\n"
            "    store.append_unchecked('runner-1', [ReclaimCompleted(generation=4)])\n"
            "    print('acknowledged', flush=True)\n"
            "except StoreFencedError:\n"
            "    print('fenced', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"
        os.unlink(f"{path}-wal")
        child.stdin.write("\n")
        child.stdin.flush()
        said = child.stdout.readline()
    finally:
        child.kill()
        child.wait()
    with EventStore.open(path) as store:
        if said == "acknowledged\n":
            assert store.head().seq == 4, "an acknowledged append was lost with the removed WAL"
        assert said == "fenced\n"
        assert store.head().seq == 3 and store.verify().events == 3


def test_a_store_file_cut_short_underneath_fences_the_store(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        size = path.stat().st_size
        assert size > 4096
        os.truncate(path, 4096)  # below the size it had at its last commit: pages of the log are gone
        before = file_digests(path)
        with raises_exactly(StoreFencedError) as info:
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=5)])
        cause = info.value.cause
        assert str(path) in cause and f"{size:,}" in cause and "4,096" in cause and store.fenced == cause
        assert file_digests(path) == before


def test_a_store_file_cut_short_seen_inside_a_transaction_still_fences_at_its_commit(tmp_path: Path) -> None:
    # Inside its own write transaction the connection cannot count the pages the files hold (some are only in
    # its cache): a shrink seen there is judged after the commit, not taken as the new least size.
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        with raises_exactly(StoreIOError) as info, store.transaction() as tx:
            os.truncate(path, 4096)
            store.check_followed(4)  # the same thread, inside the transaction
            tx.append_unchecked("runner-1", [ReclaimCompleted(generation=5)])
        assert info.value.outcome_unknown and "cut short" in str(info.value)
        assert store.fenced is not None and "cut short" in store.fenced


def test_a_store_file_shrunk_by_another_processs_vacuum_is_no_fence(tmp_path: Path) -> None:
    # VACUUM, and the checkpoint after it, shrink the file legitimately (free pages given back): SQLite's own
    # connections follow it, so a handle open meanwhile must not call its store cut short.
    path = tmp_path / "events.db"
    make_store(path)
    conn = apsw.Connection(str(path))  # free pages, as deleted leases and cleared snapshots leave them
    conn.execute("CREATE TABLE spare (b BLOB)")
    conn.executemany("INSERT INTO spare VALUES (randomblob(8000))", [()] * 64)
    conn.execute("DROP TABLE spare")
    conn.close()
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        size = path.stat().st_size
        code = ("import apsw, sys\n"
                "conn = apsw.Connection(sys.argv[1])\n"
                "conn.execute('VACUUM')\n"
                "conn.execute('PRAGMA wal_checkpoint(TRUNCATE)')\n"
                "conn.close()\n")
        subprocess.run([sys.executable, "-c", code, str(path)], check=True)
        assert path.stat().st_size < size
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=5)])
        store.check_followed(5)
        assert store.fenced is None and store.verify().events == 5
        # The shrunk size is the least from now on: later writes take no read transaction to check it again.
        assert store.backend.files.size < size  # type: ignore[attr-defined]


def test_a_store_restored_under_an_open_handle_behind_what_it_committed_fences_at_the_next_write(
        tmp_path: Path) -> None:
    # Another process restores an older copy into the live file through SQLite (the backup API, as the sqlite3
    # shell's .restore does): the same file, its size maybe the same, every SQLite connection following. A
    # handle that committed seqs 4 and 5 must not chain seq 4 again onto the copy's head: that forks the log.
    path, old = tmp_path / "events.db", tmp_path / "old.db"
    make_store(path)
    with EventStore.open(path) as store:
        source, copy = apsw.Connection(str(path)), apsw.Connection(str(old))
        with copy.backup("main", source, "main") as backup:
            backup.step()
        source.close()
        copy.close()
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4), ReclaimCompleted(generation=5)])
        code = ("import apsw, sys\n"
                "live = apsw.Connection(sys.argv[1])\n"
                "copy = apsw.Connection(sys.argv[2], flags=apsw.SQLITE_OPEN_READONLY)\n"
                "with live.backup('main', copy, 'main') as backup:\n"
                "    backup.step()\n"
                "live.close()\n")
        subprocess.run([sys.executable, "-c", code, str(path), str(old)], check=True)
        before = file_digests(path)
        with raises_exactly(StoreBehindSealError) as info:
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        assert "seq 5" in str(info.value) and "seq 3" in str(info.value) and str(path) in str(info.value)
        assert store.fenced is not None and file_digests(path) == before
        assert store.head().seq == 3


def test_a_store_file_that_grows_under_another_writer_is_no_fence(tmp_path: Path) -> None:
    # Another process's checkpoints grow the file; only a file shorter than at this handle's last commit fences.
    path = tmp_path / "events.db"
    make_store(path)
    with EventStore.open(path) as store, EventStore.open(path) as other:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        for generation in range(5, 400):
            other.append_unchecked("runner-2", [RunnerParked(cause="drain-idle", generation=generation)])
        other.backend.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[attr-defined]
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=5)])
        assert store.fenced is None and store.verify().events == 400


def test_data_version_raises_once_the_store_file_is_replaced(tmp_path: Path) -> None:
    path, other = tmp_path / "events.db", tmp_path / "other.db"
    make_store(path)
    make_store(other, events=1)
    with EventStore.open(path) as store:
        store.backend.data_version()
        os.replace(other, path)
        with raises_exactly(StoreFencedError) as info:
            store.backend.data_version()
        assert "replaced" in info.value.cause and str(path) in info.value.cause


@pytest.mark.parametrize("change", ["store-replaced", "wal-removed"])
def test_check_followed_raises_fenced_once_the_files_changed(tmp_path: Path, change: str) -> None:
    path, other = tmp_path / "events.db", tmp_path / "other.db"
    make_store(path)
    make_store(other, events=5)  # a head past the followed one: only the files' identity tells
    with EventStore.open(path) as store:
        store.check_followed(3)
        if change == "store-replaced":
            os.replace(other, path)
        else:
            os.unlink(f"{path}-wal")
        with raises_exactly(StoreFencedError) as info:
            store.check_followed(3)
        assert store.fenced == info.value.cause and "reopen the store" in info.value.cause


def test_orphan_wal_is_not_replayed_into_a_new_store(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    # What a writer SIGKILLed after its store file was removed leaves behind: a WAL full of frames.
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
        orphan = Path(f"{path}-wal").read_bytes()
    assert orphan
    os.unlink(path)
    Path(f"{path}-wal").write_bytes(orphan)
    with raises_exactly(StoreFormatError):
        EventStore.open(path)
    assert not path.exists()
    os.unlink(f"{path}-wal")
    with EventStore.open(path) as store:
        assert store.head().seq == 0


# --- the pragma profile ------------------------------------------------------------------------------


def test_pragma_that_does_not_take_in_memory() -> None:
    conn = apsw.Connection(":memory:")
    try:
        with raises_exactly(StorePragmaError) as info:
            apply_profile(conn, durability="full", busy_timeout_ms=1000)
    finally:
        conn.close()
    assert (info.value.pragma, info.value.wanted, info.value.got) == ("journal_mode", "wal", "memory")


def test_pragma_that_does_not_take_on_a_vfs_without_shared_memory(tmp_path: Path) -> None:
    # unix-dotfile has no shared-memory primitives, so SQLite keeps the rollback journal: a real file,
    # opened through the store's own entry point, where WAL cannot be had.
    with raises_exactly(StorePragmaError) as info:
        EventStore.open(tmp_path / "events.db", vfs="unix-dotfile")
    assert (info.value.pragma, info.value.wanted, info.value.got) == ("journal_mode", "wal", "delete")


def test_foreign_keys_do_not_take_inside_a_transaction(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    conn = apsw.Connection(str(path))
    try:
        conn.execute("BEGIN")
        # SQLite documents PRAGMA foreign_keys as a no-op inside a transaction: the read-back catches it.
        with raises_exactly(StorePragmaError) as info:
            set_foreign_keys(conn)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    assert (info.value.pragma, info.value.wanted, info.value.got) == ("foreign_keys", 1, 0)


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_profile_reads_back_on_open(tmp_path: Path, durability: str) -> None:
    with EventStore.open(tmp_path / "events.db", durability=durability, busy_timeout_ms=1234) as store:
        values = {name: store.backend.execute(f"PRAGMA {name}")[0][0] for name in (
            "journal_mode", "synchronous", "foreign_keys", "busy_timeout", "trusted_schema", "application_id",
            "user_version")}
    assert values == {"journal_mode": "wal", "synchronous": 2 if durability == "full" else 1, "foreign_keys": 1,
                      "busy_timeout": 1234, "trusted_schema": 0, "application_id": APPLICATION_ID,
                      "user_version": SCHEMA_VERSION}


# --- the migration ladder ----------------------------------------------------------------------------


def test_version_1_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    store_id = os.urandom(16)
    at = iso_ms(1_767_225_600_000)
    events = [ReclaimCompleted(generation=1), RunnerParked(cause="drain-idle", generation=2)]
    rows, prev = [], chain.genesis(store_id)
    for seq, event in enumerate(events, start=1):
        body = encode(event)
        digest = chain.link(prev, seq, "runner-1", seq, type(event).__struct_config__.tag, at, body)
        rows.append((seq, "runner-1", seq, type(event).__struct_config__.tag, at, body, prev, digest))
        prev = digest
    conn = apsw.Connection(str(path))
    try:
        conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
        conn.execute("BEGIN")
        for statement in MIGRATIONS[1]:
            conn.execute(statement)
        conn.execute("INSERT INTO meta (key, value) VALUES ('store_id', ?)", (store_id,))
        conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute("PRAGMA user_version=1")
        conn.execute("COMMIT")
    finally:
        conn.close()

    with EventStore.open(path) as store:
        assert store.backend.execute("PRAGMA user_version")[0][0] == SCHEMA_VERSION
        tables = {row[0] for row in store.backend.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
        assert {"meta", "events", "snapshots", "host_leases"} <= tables
        assert store.schema_problems() == [] and store.host_lease("runner-1") is None
        assert store.store_id == store_id
        assert [r.event for r in store.read()] == events
        assert store.verify().events == 2
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=3)], expected_version=2)
    with EventStore.open(path) as store:
        assert store.verify().events == 3


# --- read-only opening -------------------------------------------------------------------------------


def test_read_only_open_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    make_store(path)
    before = path.read_bytes()
    with EventStore.open(path, read_only=True) as store:
        assert store.verify().events == 3
        with raises_exactly(StoreIOError):
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=4)])
    assert path.read_bytes() == before
    # A WAL reader needs a -wal to exist; a read-only one may leave it behind, but with no frames in it.
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    with raises_exactly(StoreIOError):
        EventStore.open(tmp_path / "missing.db", read_only=True)
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.parametrize("length", [4097, 70_000])
def test_a_path_longer_than_4096_characters_is_refused_as_input(tmp_path: Path, length: int) -> None:
    long = str(tmp_path) + "/" + "a" * (length - len(str(tmp_path)) - 1)
    assert len(long) == length
    for field, call in (("path", lambda: EventStore.open(long)),
                        ("target", lambda: audit(long)),
                        ("seal", lambda: EventStore.open(str(tmp_path / "events.db"), seal=long))):
        with pytest.raises(InvalidInputError) as info:
            call()
        assert info.value.field == field
        assert "4096" in str(info.value) and long not in str(info.value)
    with EventStore.open(str(tmp_path / "events.db")) as store:
        for call in (lambda: store.seal(long), lambda: store.check_seal(long)):
            with pytest.raises(InvalidInputError) as info:
                call()
            assert info.value.field == "path"
    assert sorted(os.listdir(tmp_path)) == ["events.db"]
