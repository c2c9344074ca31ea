"""A keyed store proves what it folds before it acts on it or tags it: a body edited, or a row removed, by someone
without the key fails a command's catch-up and a rebuild with IntegrityError at that row, and no snapshot is
tagged with the edited state (which, the body put back afterwards, would vouch for a state the log never held).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fleets import DIGEST as LONG_DIGEST
from fleets import attack, build_long, copy_store, rows_and_meta

from lifecycle_es import EventStore, IntegrityError, ProxyAuthority, RunnerLifecycle, audit
from lifecycle_es.canonical import iso_ms
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS, FakeClock, SequentialIds
from lifecycle_es.walk import split
from projections import rebuild

KEY = bytes(range(32))
HOUR = 3_600_000
DIGEST = "sha256:" + "c" * 64
FORGED = "sha256:" + "f" * 64


@pytest.fixture(scope="module")
def keyed_long(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keyed") / "keyed.db"
    build_long(path, chunk=250, interleaved=True, key=KEY)
    return path


def caches(store: EventStore) -> dict[str, Any]:
    backend = store.backend
    return {"runners": backend.read_model_rows("runners"), "leases": backend.read_model_rows("leases"),
            "position": backend.read_model_position(),
            "snapshots": {stream: backend.snapshot(stream) for stream in store.streams()}}


def settled_rows(path: Path) -> list[tuple[int, bytes]]:
    rows, _ = rows_and_meta(path)
    return [(row[0], row[5]) for row in rows if row[3] == "LeaseSettled"]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_keyed_rebuild_refuses_a_body_edited_without_the_key_and_tags_nothing(keyed_long: Path, tmp_path: Path,
                                                                                 jobs: int) -> None:
    path = copy_store(keyed_long, tmp_path / "edited.db", seal=False)
    with EventStore.open(path, key=KEY, read_only=True) as store:
        head = store.head().seq
        assert len(split(head, 2)) == 2
    # A settlement in the second half of the log: the second process's range when two share the rebuild.
    seq, body = next((seq, body) for seq, body in settled_rows(path) if seq > head * 3 // 4)
    forged = body.replace(LONG_DIGEST.encode(), FORGED.encode())
    assert forged != body
    attack(path, ("UPDATE events SET body = ? WHERE seq = ?", (forged, seq)))
    with EventStore.open(path, key=KEY) as store:
        before = caches(store)
        with pytest.raises(IntegrityError) as caught:
            rebuild(store, jobs=jobs)
        assert caught.value.seq == seq
        assert caches(store) == before


def test_a_keyed_rebuild_in_two_processes_proves_the_chain_and_writes_what_one_does(keyed_long: Path,
                                                                                     tmp_path: Path) -> None:
    written = []
    for jobs in (1, 2):
        path = copy_store(keyed_long, tmp_path / f"jobs{jobs}.db", seal=False)
        told: list[tuple[int, int]] = []
        with EventStore.open(path, key=KEY) as store:
            report = rebuild(store, jobs=jobs, progress=lambda done, total, told=told: told.append((done, total)))
            written.append(((report.events, report.runners, report.snapshots), caches(store)))
            assert told[-1] == (store.head().seq, store.head().seq)
        assert audit(path, key=KEY, jobs=1).ok
    assert written[0] == written[1]


def lifecycle(store: EventStore, tmp_path: Path, ids: Any = None, **options: Any) -> RunnerLifecycle:
    return RunnerLifecycle(store, **RUNNER_DEFAULTS, base_dir=str(tmp_path), now=FakeClock(),
                           random_id=ids or SequentialIds(), **options)


def proxy() -> ProxyAuthority:
    return ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(START_MS), expires_at=iso_ms(START_MS + HOUR))


def keyed_runner(path: Path, tmp_path: Path, leases: int, snapshot_every: int) -> None:
    with EventStore.open(path, key=KEY) as store:
        runner = lifecycle(store, tmp_path, snapshot_every=snapshot_every)
        runner.initialize()
        for n in range(leases):
            receipt = runner.acquire_lease(session_id=f"s-{n}", expected_generation=1, proxy_authority=proxy())
            runner.settle_lease(lease_id=receipt.lease.id, lease_generation=1, result_digest=DIGEST)


@pytest.mark.parametrize("edit", ["body", "removed"])
@pytest.mark.parametrize("snapshot_every", [1000, 4])
def test_a_command_on_a_keyed_store_refuses_a_tail_edited_without_the_key(tmp_path: Path, edit: str,
                                                                          snapshot_every: int) -> None:
    path = tmp_path / "keyed.db"
    keyed_runner(path, tmp_path, leases=5, snapshot_every=snapshot_every)
    # A settlement after the last snapshot when there is one (every 4 events, the last at version 8): the last
    # one edited, or the one before it removed (a row after it must show the gap).
    seq, body = settled_rows(path)[-1 if edit == "body" else -2]
    if edit == "body":
        forged = body.replace(DIGEST.encode(), FORGED.encode())
        assert forged != body
        attack(path, ("UPDATE events SET body = ? WHERE seq = ?", (forged, seq)))
    else:
        attack(path, ("DELETE FROM events WHERE seq = ?", (seq,)))
    before = rows_and_meta(path)
    with EventStore.open(path, key=KEY) as store:
        snapshots = caches(store)["snapshots"]
        # A new handle (its ids not the first one's), which would tag a snapshot at once.
        runner = lifecycle(store, tmp_path, ids=lambda: "next", snapshot_every=1)
        with pytest.raises(IntegrityError) as caught:
            runner.acquire_lease(session_id="s-next", expected_generation=1, proxy_authority=proxy())
        assert caught.value.seq == seq + (edit == "removed")
        with pytest.raises(IntegrityError):
            runner.snapshot()
        assert caches(store)["snapshots"] == snapshots
    assert rows_and_meta(path) == before
