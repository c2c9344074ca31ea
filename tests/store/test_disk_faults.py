"""Disk faults under a running store: a full disk, I/O errors, a read-only file system, a file gone.

Each append here runs through `faultvfs.FaultVFS`, which makes one chosen write (every write an
append does is tried in turn) or sync fail with SQLITE_FULL or an SQLITE_IOERR code. The store must
raise exactly StoreFullError or StoreIOError, show nothing of the failed batch (not on the same
connection, not after a crash that keeps every byte written, not after a clean reopen), and append
again once the disk behaves. A file system that turns read-only (the VFS, and a real read-only bind
mount where the machine allows one) gives StoreIOError; a store file deleted or restored from a copy
after a fault fences the store.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw
import pytest
from faultvfs import FaultVFS, KeepEverything, LoseEverything

from lifecycle_es import EventStore, RecordedEvent, StoreError, StoreFencedError, StoreFullError, StoreIOError
from lifecycle_es.events import Event, UnitStopped

_names = itertools.count()
_bodies = itertools.count()
WRITE_ERRORS = [
    pytest.param(apsw.SQLITE_FULL, StoreFullError, id="SQLITE_FULL"),
    pytest.param(apsw.SQLITE_IOERR_WRITE, StoreIOError, id="SQLITE_IOERR_WRITE"),
    pytest.param(apsw.SQLITE_IOERR, StoreIOError, id="SQLITE_IOERR"),
]


def events(count: int, size: int) -> list[Event]:
    """Distinct events; `size` 5000 spills each over several pages (more writes per append)."""
    return [UnitStopped(lease_id=f"lease-{n}", reason=f"{n}:" + "x" * size)
            for n in (next(_bodies) for _ in range(count))]


def rows(store: EventStore) -> list[tuple[object, ...]]:
    return [recorded.row() for recorded in store.read()]


def reopened_rows(path: Path) -> list[tuple[object, ...]]:
    """The events a fresh process sees (no fault VFS), after the whole chain verified."""
    with EventStore.open(path) as store:
        found = rows(store)
        assert store.verify().events == len(found)
    return found


def raises_exactly(kind: type[BaseException]) -> pytest.RaisesExc:
    """pytest.raises that refuses a subclass: each case names the one kind the store must raise."""
    return pytest.raises(kind, check=lambda exc: type(exc) is kind)


@contextmanager
def fault_vfs() -> Iterator[FaultVFS]:
    vfs = FaultVFS(f"fault-disk-{next(_names)}")
    try:
        yield vfs
    finally:
        vfs.unregister()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cleanly closed store with two events; each case starts from a copy (creating one costs fsyncs)."""
    path = tmp_path_factory.mktemp("template") / "runners.db"
    with EventStore.open(path) as store:
        store.append_unchecked("runner-a", events(2, 8))
    return path


@contextmanager
def faulty(template: Path, directory: Path, vfs: FaultVFS, durability: str,
           warm: bool) -> Iterator[tuple[Path, EventStore]]:
    """A copy of `template` open through `vfs`; `warm`: one more append, so the WAL is written."""
    directory.mkdir()
    path = directory / "runners.db"
    shutil.copyfile(template, path)
    store = EventStore.open(path, vfs=vfs.name, durability=durability)
    try:
        if warm:
            store.append_unchecked("runner-b", events(1, 8))
        yield path, store
    finally:
        try:
            store.close()
        except StoreError:
            if vfs.powered:  # with the power off, the checkpoint on close fails, as it should
                raise


def writes_of_append(template: Path, directory: Path, durability: str, size: int, warm: bool) -> int:
    """How many writes the append under test makes (measured on a store set up the same way)."""
    with fault_vfs() as vfs, faulty(template, directory, vfs, durability, warm) as (_, store):
        before = vfs.counts["write"]
        store.append_unchecked("runner-a", events(3, size))
        return vfs.counts["write"] - before


# --- a write fails during an append ---------------------------------------------------------------


@pytest.mark.parametrize("durability", ["full", "normal"])
@pytest.mark.parametrize("warm", [False, True], ids=["first-commit", "later-commit"])
@pytest.mark.parametrize("size", [8, 5000], ids=["one-page", "overflow-pages"])
@pytest.mark.parametrize(("code", "kind"), WRITE_ERRORS)
def test_failed_write_leaves_nothing_and_the_store_goes_on(template: Path, tmp_path: Path, code: int,
                                                          kind: type[Exception], size: int, warm: bool,
                                                          durability: str) -> None:
    total = writes_of_append(template, tmp_path / "dry", durability, size, warm)
    assert total >= 2  # a frame header and a page at least: the loop below tries each
    for at in range(1, total + 1):
        directory = tmp_path / f"continue-{at}"
        with fault_vfs() as vfs, faulty(template, directory, vfs, durability, warm) as (path, store):
            before, head = rows(store), store.head()
            vfs.inject("write", code, at=at)
            with raises_exactly(kind):
                store.append_unchecked("runner-a", events(3, size))
            assert store.head() == head, f"write {at}: the head moved"
            assert rows(store) == before
            assert store.verify().events == len(before)
            later = store.append_unchecked("runner-a", events(2, size))  # the fault has passed: writes succeed
            assert [r.seq for r in later] == [head.seq + 1, head.seq + 2]
            assert store.verify().events == len(before) + 2
        assert reopened_rows(path) == before + [r.row() for r in later]

        # The same failure, then the process dies with every byte it wrote on the disk: the WAL holds
        # the frames written before the fault, and recovery must not take any of them.
        directory = tmp_path / f"crash-{at}"
        with fault_vfs() as vfs, faulty(template, directory, vfs, durability, warm) as (path, store):
            before = rows(store)
            vfs.inject("write", code, at=at)
            with raises_exactly(kind):
                store.append_unchecked("runner-a", events(3, size))
            vfs.power_off()
        vfs.power_cut(KeepEverything())
        assert reopened_rows(path) == before, f"write {at}: part of a failed append came back"


def test_a_disk_that_stays_full_refuses_until_space_is_freed(template: Path, tmp_path: Path) -> None:
    with fault_vfs() as vfs, faulty(template, tmp_path / "full", vfs, "full", True) as (path, store):
        before = rows(store)
        vfs.inject("write", apsw.SQLITE_FULL, at=1, count=None)
        for _ in range(3):  # nothing changes while the disk is full, however often the caller tries
            with raises_exactly(StoreFullError):
                store.append_unchecked("runner-a", events(2, 5000))
            assert rows(store) == before
        vfs.clear_faults()
        later = store.append_unchecked("runner-a", events(2, 5000))
        assert store.verify().events == len(before) + 2
    assert reopened_rows(path) == before + [r.row() for r in later]


# --- the commit's sync fails ------------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_full_syncs_every_commit_and_normal_does_not(template: Path, tmp_path: Path, durability: str) -> None:
    # The durability option at the level of the disk: what the power-loss tests rely on.
    with fault_vfs() as vfs, faulty(template, tmp_path / "s", vfs, durability, True) as (_, store):
        for _ in range(3):
            before = vfs.counts["sync"]
            store.append_unchecked("runner-a", events(1, 8))
            assert vfs.counts["sync"] - before == (1 if durability == "full" else 0)


def test_failed_sync_leaves_the_outcome_unknown_and_fences_the_store(template: Path, tmp_path: Path) -> None:
    # fsyncgate: after a failed fsync nobody knows what reached the disk, and a retry could duplicate or
    # chain onto a lost batch. The store says so (outcome_unknown), fences itself, and a reopen learns.
    with fault_vfs() as vfs, faulty(template, tmp_path / "s", vfs, "full", True) as (path, store):
        before = rows(store)
        vfs.inject("sync", apsw.SQLITE_IOERR_FSYNC, at=1, count=None)
        with raises_exactly(StoreIOError) as caught:
            store.append_unchecked("runner-a", events(3, 5000))
        assert caught.value.outcome_unknown
        assert store.fenced is not None and "unknown" in store.fenced
        vfs.clear_faults()
        with raises_exactly(StoreFencedError):
            store.append_unchecked("runner-a", events(1, 8))
        assert rows(store) == before
    with EventStore.open(path) as reopened:
        later = reopened.append_unchecked("runner-a", events(1, 8))
        assert reopened.verify().events == len(reopened_rows(path))
    assert reopened_rows(path)[-1] == later[-1].row()


@pytest.mark.parametrize("keep", [True, False], ids=["disk-kept-the-writes", "disk-lost-the-writes"])
def test_failed_sync_then_a_crash_shows_the_batch_whole_or_not_at_all(template: Path, tmp_path: Path,
                                                                      keep: bool) -> None:
    # A commit whose fsync failed has an unknown outcome, in SQLite as in any database: its frames
    # were written and may be on the disk. What must hold is all or nothing, and a chain that verifies.
    with fault_vfs() as vfs, faulty(template, tmp_path / "s", vfs, "full", True) as (path, store):
        before = rows(store)
        vfs.inject("sync", apsw.SQLITE_IOERR_FSYNC, at=1)
        failed = events(3, 5000)
        with raises_exactly(StoreIOError):
            store.append_unchecked("runner-a", failed)
        vfs.power_off()
    vfs.power_cut(KeepEverything() if keep else LoseEverything())
    after = reopened_rows(path)
    assert after[:len(before)] == before
    extra = [RecordedEvent(*row).event for row in after[len(before):]]
    # Today SQLite's recovery takes the batch back when its frames reached the disk; a store that
    # scrubbed them would pass too. A part of the batch never may.
    assert extra in ([], failed) if keep else extra == []


# --- a read-only file system ------------------------------------------------------------------------


def digests(path: Path) -> dict[str, bytes | None]:
    found: dict[str, bytes | None] = {}
    for suffix in ("", "-wal"):
        part = Path(f"{path}{suffix}")
        found[suffix] = part.read_bytes() if part.exists() else None
    return found


def test_file_system_turning_read_only_under_an_open_store(template: Path, tmp_path: Path) -> None:
    with fault_vfs() as vfs, faulty(template, tmp_path / "ro", vfs, "full", True) as (path, store):
        before, head = rows(store), store.head()
        vfs.read_only = True  # the kernel remounted it read-only after an error
        for _ in range(2):
            with raises_exactly(StoreIOError) as caught:
                store.append_unchecked("runner-a", events(1, 8))
            assert "read-only" in str(caught.value)
            assert store.head() == head and rows(store) == before
        vfs.read_only = False
        later = store.append_unchecked("runner-a", events(1, 8))
    assert reopened_rows(path) == before + [r.row() for r in later]


def test_opening_a_store_on_a_read_only_file_system(tmp_path: Path) -> None:
    path = tmp_path / "runners.db"
    with EventStore.open(path) as store:
        store.append_unchecked("runner-a", events(2, 8))
    before = digests(path)
    with fault_vfs() as vfs:
        vfs.read_only = True
        with raises_exactly(StoreIOError) as caught:
            EventStore.open(path, vfs=vfs.name)
        assert str(path) in str(caught.value)
        assert vfs.open_files == 0
    assert digests(path) == before


def read_only_mount_available() -> str | None:
    """None when this machine lets us make a read-only bind mount in a private namespace; else why not."""
    if sys.platform != "linux" or shutil.which("unshare") is None or shutil.which("mount") is None:
        return "needs Linux with unshare(1) and mount(8)"
    probe = subprocess.run(["unshare", "-m", "mount", "--bind", "/", "/"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        return f"cannot make a private mount namespace: {probe.stderr.strip() or probe.returncode}"
    return None


CHILD = textwrap.dedent("""
    import json, sys
    from lifecycle_es import EventStore, StoreError
    from lifecycle_es.events import UnitStopped
    outcome = {}
    try:
        with EventStore.open(sys.argv[1]) as store:
            store.append_unchecked("runner-a", [UnitStopped(lease_id="lease-x", reason="ro")])
        outcome["open"] = "ok"
    except StoreError as exc:
        outcome["open"] = type(exc).__name__
        outcome["message"] = str(exc)
    # An auditor must still read a store on read-only media (a snapshot, an evidence copy).
    with EventStore.open(sys.argv[1], read_only=True) as reader:
        outcome["read_only_events"] = reader.verify().events
    print(json.dumps(outcome))
""")


def test_read_only_bind_mount_is_an_io_error(tmp_path: Path) -> None:
    unavailable = read_only_mount_available()
    if unavailable is not None:
        pytest.skip(f"no read-only bind mount on this machine ({unavailable}); the read-only VFS tests "
                    "above still run")
    data, view = tmp_path / "data", tmp_path / "view"
    data.mkdir()
    view.mkdir()
    with EventStore.open(data / "runners.db") as store:
        store.append_unchecked("runner-a", events(2, 8))
    before = digests(data / "runners.db")
    # The mount lives only in the child's private namespace; nothing is left mounted on the host.
    script = (f"mount --bind {data} {view} && mount -o remount,bind,ro {view} && "
              f"exec {sys.executable} -c \"$0\" {view / 'runners.db'}")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script, CHILD], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["open"] == "StoreIOError", outcome
    assert str(view / "runners.db") in outcome["message"]
    assert "read-only" in outcome["message"]
    assert outcome["read_only_events"] == 2
    assert digests(data / "runners.db") == before


# --- the file goes away after a fault ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "restored-from-a-copy"])
def test_store_file_gone_after_a_fault_is_fenced(template: Path, tmp_path: Path, how: str) -> None:
    # A disk fills up; an operator frees space by deleting the store, or restores it from a copy (the
    # same bytes under a new inode). The process that hit the fault must not write into what is there.
    with fault_vfs() as vfs, faulty(template, tmp_path / "gone", vfs, "full", True) as (path, store):
        vfs.inject("write", apsw.SQLITE_FULL, at=1)
        with raises_exactly(StoreFullError):
            store.append_unchecked("runner-a", events(1, 8))
        if how == "deleted":
            os.unlink(path)
        else:
            shutil.copyfile(path, tmp_path / "copy.db")
            os.replace(tmp_path / "copy.db", path)
        there = path.read_bytes() if path.exists() else None
        for _ in range(2):  # nothing is retried on a fenced store
            with raises_exactly(StoreFencedError):
                store.append_unchecked("runner-a", events(1, 8))
        assert store.fenced is not None
        assert (path.read_bytes() if path.exists() else None) == there
