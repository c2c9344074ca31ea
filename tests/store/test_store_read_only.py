"""A read-only open: possible on a closed WAL store, and it never writes.

Not even to an evidence copy whose -wal still holds commits: the db and the -wal keep every byte, through
the API and through every command that reads (audit, show, events, export). SQLite does need the -wal's
index, the -shm, and creates it where it is missing (it holds no data: it is rebuilt from the -wal).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from fleets import DIGEST, HOOK, authority, run

from lifecycle_es import EventStore, Resources, RunnerLifecycle, StoreIOError
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.testing import FakeClock
from projections import attach


def file_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))


def test_read_only_open_of_a_closed_store_reads_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=2)])
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



# --- evidence copies: reading one leaves every byte of it as it was ------------------------------------------


def durable_digests(path: Path) -> dict[str, str | None]:
    """sha256 of the db and its -wal (the -shm is the -wal's index, rebuilt from it: not evidence)."""
    return {suffix: hashlib.sha256(part.read_bytes()).hexdigest() if part.exists() else None
            for suffix, part in (("db", path), ("-wal", Path(f"{path}-wal")))}


@pytest.fixture
def evidence(tmp_path: Path) -> tuple[Path, int]:
    """A copy of a live store's db and -wal, taken while its writer still had it open: the -wal holds every
    commit (a store is born with its schema in the db, and a small log is never checkpointed until close)."""
    clock = FakeClock()
    live = tmp_path / "live" / "runners.db"
    (tmp_path / "base").mkdir()
    live.parent.mkdir()
    with EventStore.open(live, now=clock) as store:
        attach(store)
        runner = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=tmp_path / "base",
                                 resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                                 post_session_hook_digest=HOOK, now=clock, random_id=lambda: "0001")
        runner.initialize()
        clock.advance(1000)
        receipt = runner.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=authority(clock, 1))
        clock.advance(1000)
        runner.settle_lease(lease_id=receipt.lease.id, lease_generation=1, result_digest=DIGEST)
        head = store.head().seq
        copy = tmp_path / "evidence" / "runners.db"
        copy.parent.mkdir()
        for suffix in ("", "-wal"):
            shutil.copyfile(f"{live}{suffix}", f"{copy}{suffix}")
    assert Path(f"{copy}-wal").stat().st_size > 0
    return copy, head


def test_a_read_only_open_of_an_evidence_copy_changes_no_byte_of_it(evidence: tuple[Path, int]) -> None:
    copy, head = evidence
    before = durable_digests(copy)
    with EventStore.open(copy, read_only=True) as store:
        assert store.head().seq == head  # the commits in the -wal are read
        assert store.verify().events == head
        assert len(list(store.read())) == head
    assert durable_digests(copy) == before
    with EventStore.open(copy, read_only=True) as store:  # and again, now that a -shm exists
        assert store.verify().events == head
    assert durable_digests(copy) == before


@pytest.mark.parametrize("command", ["audit", "show", "events", "export"])
def test_reading_an_evidence_copy_from_the_command_line_changes_no_byte_of_it(
        evidence: tuple[Path, int], tmp_path: Path, command: str) -> None:
    copy, head = evidence
    before = durable_digests(copy)
    args = {"audit": ["audit", copy, "--jobs", "1", "--json"], "show": ["show", copy, "--json"],
            "events": ["events", copy, "--json"], "export": ["export", copy, tmp_path / "out.jsonl"]}[command]
    done = run(*args)
    assert done.returncode == 0, done.stderr
    if command == "audit":
        assert json.loads(done.stdout)["head_seq"] == head
    if command == "events":
        assert len(done.stdout.splitlines()) == head
    assert durable_digests(copy) == before
