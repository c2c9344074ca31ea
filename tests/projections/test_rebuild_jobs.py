"""`projections.rebuild(store, jobs=N)`: the replay shared between this process and worker processes gives
the same snapshots, read models and report as one process, on a store file and on a PostgreSQL server; a
log the rules refuse fails at the same seq and changes nothing; bad `jobs` is refused before anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fleets import attack, build_long, copy_store, rechain, run, smuggled

from lifecycle_es import EventStore, audit, fold_parts
from lifecycle_es.errors import IntegrityError, InvalidInputError, LifecycleError
from lifecycle_es.walk import counted, owners, split
from lifecycle_es.workers import Workers
from projections import rebuild


@pytest.fixture
def long_log(interleaved_log: Path) -> Path:
    return interleaved_log


def copied(source: Path, target: Path) -> Path:
    return copy_store(source, target, seal=False)


def caches(store: EventStore) -> dict[str, Any]:
    """What a rebuild writes: the read models' rows and position, and every runner's snapshot."""
    backend = store.backend
    return {"runners": backend.read_model_rows("runners"), "leases": backend.read_model_rows("leases"),
            "position": backend.read_model_position(),
            "snapshots": {stream: backend.snapshot(stream) for stream in store.streams()}}


def rebuilt(target: str, jobs: int) -> tuple[tuple[int, int, int], dict[str, Any]]:
    with EventStore.open(target) as store:
        report = rebuild(store, jobs=jobs)
        return (report.events, report.runners, report.snapshots), caches(store)


def test_two_processes_rebuild_what_one_does(long_log: Path, tmp_path: Path) -> None:
    one = rebuilt(str(copied(long_log, tmp_path / "one.db")), 1)
    two = rebuilt(str(copied(long_log, tmp_path / "two.db")), 2)
    with EventStore.open(long_log, read_only=True) as store:
        assert len(split(store.head().seq, 2)) == 2 and len(set(owners(counted(store), 2).values())) == 2
        assert one[0] == (store.head().seq, len(store.streams()), len(store.streams()))
    assert two == one
    report = audit(tmp_path / "two.db", jobs=1)
    assert report.ok and report.snapshots_checked == 10 and report.read_models_checked == 10, report.problems


def test_two_processes_rebuild_what_one_does_on_a_server(pg_server: Any) -> None:
    # One store rebuilt twice: the workers read it over their own connections while the rebuild's
    # transaction holds the head table's lock and has dropped the read models it is rebuilding.
    schema = pg_server.new_schema()
    url = pg_server.url(schema)
    try:
        build_long(url, chunk=250, interleaved=True)
        assert rebuilt(url, 2) == rebuilt(url, 1)
        assert audit(url).ok
    finally:
        pg_server.drop(schema)


@pytest.mark.parametrize("owner", [0, 1])
def test_a_log_the_rules_refuse_fails_at_the_same_seq_and_changes_nothing(long_log: Path, tmp_path: Path,
                                                                          owner: int) -> None:
    # A settle of a lease never acquired, chained again as an attacker would: only the rules can tell; in a
    # runner this process replays, and in one a worker does.
    path = copied(long_log, tmp_path / "forged.db")
    with EventStore.open(path, read_only=True) as store:
        owned = owners(counted(store), 2)
        row = next(row for row in store.read() if row.type == "LeaseSettled" and row.seq > store.head().seq // 2
                   and owned[row.stream] == owner)
    attack(path, ("UPDATE events SET body = ? WHERE seq = ?",
                  (row.body.replace(b'"lease_id":"lease-', b'"lease_id":"never-', 1), row.seq)))
    rechain(path)
    found = []
    for jobs in (1, 2):
        with EventStore.open(path) as store:
            before = caches(store)
            with pytest.raises(IntegrityError) as refused:
                rebuild(store, jobs=jobs)
            assert caches(store) == before
            found.append((refused.value.seq, refused.value.stream))
    assert found == [(row.seq, row.stream)] * 2


@pytest.mark.parametrize("jobs", [0, -1, True, 2.0, "2", None, 10**9])
def test_bad_jobs_are_refused_before_anything_is_written(long_log: Path, tmp_path: Path, jobs: object) -> None:
    path = copied(long_log, tmp_path / "bad.db")
    before = path.read_bytes()
    with EventStore.open(path) as store, pytest.raises(InvalidInputError, match="jobs"):
        rebuild(store, jobs=jobs)  # type: ignore[arg-type]
    assert path.read_bytes() == before


def test_the_command_shares_its_replay_and_refuses_a_bad_count(long_log: Path, tmp_path: Path) -> None:
    path = copied(long_log, tmp_path / "cli.db")
    before = path.read_bytes()
    refused = run("rebuild", path, "--jobs", "0")
    assert refused.returncode == 64 and "argument --jobs: 0 is not at least 1" in refused.stderr
    refused = run("rebuild", path, "--jobs", str(10**9))
    assert refused.returncode == 64 and f"argument --jobs: {10**9} is more than 256" in refused.stderr
    assert path.read_bytes() == before
    done = run("rebuild", path, "--jobs", "2")
    assert done.returncode == 0 and "from 20,500 events: 10 runners" in done.stdout, done.stderr
    one = rebuilt(str(copied(long_log, tmp_path / "one.db")), 1)
    with EventStore.open(path, read_only=True) as store:
        assert caches(store) == one[1]


def test_a_file_put_in_place_of_the_one_opened_is_not_folded_into_its_caches(long_log: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # The workers open the store by its path: another store renamed over it once the rebuild's transaction began
    # (before that, the store fences itself) must not give the opened store's caches its runners.
    path = copied(long_log, tmp_path / "opened.db")
    other = tmp_path / "other.db"
    build_long(other, chunk=250)

    def replaced_first(*args: Any, **kwargs: Any) -> Workers:
        os.replace(other, path)
        return Workers(*args, **kwargs)

    monkeypatch.setattr(fold_parts, "Workers", replaced_first)
    with EventStore.open(path) as store:
        before = caches(store)
        with pytest.raises(LifecycleError, match="another store"):
            rebuild(store, jobs=2)
        assert caches(store) == before


def refused_or_written(path: Path, jobs: int) -> tuple[Any, ...]:
    """What `rebuild(jobs=jobs)` does to the store at `path`: the caches it wrote, or the error it raised and
    whether the file was left byte for byte as it was."""
    before = path.read_bytes()
    with EventStore.open(path) as store:
        try:
            report = rebuild(store, jobs=jobs)
        except LifecycleError as exc:
            refused = (type(exc).__name__, getattr(exc, "seq", None), getattr(exc, "stream", None), str(exc))
        else:
            return ("rebuilt", report.events, report.runners, report.snapshots, caches(store))
    return (*refused, path.read_bytes() == before)


@pytest.mark.parametrize("edit", ["gap", "version", "version-text", "seq-0", "stream-renamed", "stream-null",
                                  "at-null"])
def test_a_log_one_process_rebuilds_or_refuses_is_rebuilt_or_refused_alike(long_log: Path, tmp_path: Path,
                                                                           edit: str) -> None:
    # A rebuild replays the rules alone (one process folds as `fold_log` does: no seq or version checked; the
    # audit proves those): its workers must neither refuse more, nor refuse otherwise, nor place a runner
    # name that is not text anywhere but where one process does.
    with EventStore.open(long_log, read_only=True) as store:
        seq = store.head().seq * 3 // 4
    found = []
    for jobs in (1, 2):
        path = copied(long_log, tmp_path / f"edited-{jobs}.db")
        if edit == "gap":
            attack(path, ("DELETE FROM events WHERE seq = ?", (seq,)))
        elif edit == "version":
            attack(path, ("UPDATE events SET version = version + 100000 WHERE seq = ?", (seq,)))
        elif edit == "version-text":
            smuggled(path, "version", "x", seq)
        elif edit == "at-null":
            smuggled(path, "at", None, seq)
        elif edit == "seq-0":
            attack(path, ("UPDATE events SET seq = 0 WHERE seq = ?", (seq,)))
        elif edit == "stream-renamed":
            attack(path, ("UPDATE events SET stream = 'runner-x' WHERE seq = ?", (seq,)))
        else:
            smuggled(path, "stream", None, seq)
        found.append(refused_or_written(path, jobs))
    assert found[1] == found[0]
    assert found[0][0] == "rebuilt" or found[0][-1], found[0]  # refused: the file as it was
