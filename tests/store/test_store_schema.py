"""The store's schema, exactly: a write the file did not keep is never acknowledged, and an altered file is
refused by writers and failed by the audit.

Whoever can write the file can change its schema: plant a trigger that ignores inserts (every command
would then report success while nothing reaches the log), drop or neuter the append-only triggers, drop
a constraint. A writer's open refuses such a file (StoreFormatError naming what differs); a read-only
open still opens it and lists the differences (`EventStore.schema_problems`), and ``lifecycle-es
audit`` reports each as a problem (exit 65). A trigger planted while a handle is open is caught by the
read-back of the insert: the append raises, nothing is acknowledged, and the handle keeps no head the
file does not hold.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import apsw
import pytest
from fleets import DIGEST, HOOK, audit_json, authority, copy_store, fleet_in

from lifecycle_es import EventStore, Resources, RunnerLifecycle, StoreFormatError
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.replay import load
from lifecycle_es.sqlite_schema import MIGRATIONS
from lifecycle_es.testing import FakeClock

KEY = bytes(range(32))
IGNORE_INSERTS = "CREATE TRIGGER t BEFORE INSERT ON events BEGIN SELECT RAISE(IGNORE); END"
TRIGGERS = [statement for statement in MIGRATIONS[1] if statement.startswith("CREATE TRIGGER")]
EVENTS_SQL = MIGRATIONS[1][1]


def edit(path: Path, *statements: str) -> None:
    """Change the file with a plain connection, as anyone who can write it can."""
    conn = apsw.Connection(str(path))
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def durable_digests(path: Path) -> tuple[str | None, ...]:
    """sha256 of the db and its -wal (the -shm is an index SQLite rebuilds, left out)."""
    return tuple(hashlib.sha256(part.read_bytes()).hexdigest() if part.exists() else None
                 for part in (path, Path(f"{path}-wal")))


def recreate_events(table_sql: str) -> list[str]:
    """Statements that rebuild the events table from `table_sql`, rows and append-only triggers kept."""
    return ["ALTER TABLE events RENAME TO old_events", table_sql, "INSERT INTO events SELECT * FROM old_events",
            "DROP TABLE old_events", *TRIGGERS]


# (id, statements, what the refusal and the audit name)
ALTERED: list[tuple[str, list[str], str]] = [
    ("insert-ignored", [IGNORE_INSERTS], "a trigger the store never made, 't'"),
    ("triggers-dropped", ["DROP TRIGGER events_no_update", "DROP TRIGGER events_no_delete"],
     "its trigger 'events_no_update' is missing"),
    ("triggers-made-no-ops", ["DROP TRIGGER events_no_update", "DROP TRIGGER events_no_delete",
                              *(statement.replace(" ON events", " ON events WHEN 0") for statement in TRIGGERS)],
     "its trigger 'events_no_update' is not the store's"),
    ("no-unique-stream-version", recreate_events(EVENTS_SQL.replace(", UNIQUE (stream, version)", "")),
     "the UNIQUE (stream, version) index is missing"),
    ("check-constraint-added", recreate_events(EVENTS_SQL.replace(" UNIQUE (stream, version)",
                                                                  " UNIQUE (stream, version), CHECK (seq > 0)")),
     "its table 'events' is not the store's"),
    ("unknown-meta-key", ["INSERT INTO meta (key, value) VALUES ('note', x'00')"],
     "a meta key the store never writes, 'note'"),
    ("index-on-events", ["CREATE INDEX by_hash ON events (hash)"], "an index the store never made on its 'events'"),
    ("index-on-meta", ["CREATE UNIQUE INDEX by_value ON meta (value)"], "an index the store never made on its 'meta'"),
    ("view", ["CREATE VIEW latest AS SELECT * FROM events ORDER BY seq DESC"], "a view the store never made"),
    ("trigger-on-a-read-model", ["CREATE TRIGGER quiet BEFORE INSERT ON leases BEGIN SELECT RAISE(IGNORE); END"],
     "a trigger the store never made, 'quiet' on 'leases'"),
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet log with read models attached and a seal; every case alters a copy."""
    return fleet_in(tmp_path_factory)[0]


def test_an_exact_schema_has_no_problems_read_models_and_all(fleet: Path, tmp_path: Path) -> None:
    copy = copy_store(fleet, tmp_path / "copy.db")
    with EventStore.open(copy) as store:  # the read models' tables and index are theirs to have
        assert store.schema_problems() == []
        assert {row[0] for row in store.backend.execute("SELECT name FROM sqlite_schema")} >= {"runners", "leases"}
    code, report = audit_json(copy)
    assert code == 0 and report["ok"], report


@pytest.mark.parametrize(("statements", "named"), [(s, n) for _, s, n in ALTERED], ids=[i for i, _, _ in ALTERED])
def test_an_altered_schema_is_refused_by_writers_and_failed_by_the_audit(
        fleet: Path, tmp_path: Path, statements: list[str], named: str) -> None:
    copy = copy_store(fleet, tmp_path / "altered.db", seal=False)
    edit(copy, *statements)
    before = durable_digests(copy)
    with pytest.raises(StoreFormatError, match="altered outside lifecycle-es") as info:
        EventStore.open(copy)
    assert named in str(info.value)
    assert durable_digests(copy) == before
    with EventStore.open(copy, read_only=True) as store:
        assert any(named in problem for problem in store.schema_problems()), store.schema_problems()
        assert store.verify().events > 0  # the rows themselves were not touched: only the schema tells
    code, report = audit_json(copy)
    assert code == 65 and not report["ok"], report
    reasons = [problem["reason"] for problem in report["problems"]]
    assert any(named in reason and "schema was altered" in reason for reason in reasons), reasons


def test_a_key_id_that_no_key_has_is_refused_by_writers(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])
    edit(path, "INSERT INTO meta (key, value) VALUES ('key_id', x'ff00')")  # not even text
    with pytest.raises(StoreFormatError, match="is not a key id"):
        EventStore.open(path, key=KEY)
    with EventStore.open(path, read_only=True) as store:  # read, not crashed on
        assert store.keyed and any("is not a key id" in problem for problem in store.schema_problems())


def test_the_audit_names_every_difference(fleet: Path, tmp_path: Path) -> None:
    copy = copy_store(fleet, tmp_path / "altered.db", seal=False)
    edit(copy, IGNORE_INSERTS, "DROP TRIGGER events_no_delete", "INSERT INTO meta (key, value) VALUES ('x', x'00')")
    code, report = audit_json(copy)
    assert code == 65
    schema = [problem for problem in report["problems"] if "schema was altered" in problem["reason"]]
    assert len(schema) == 3 and all(problem["seq"] is None for problem in schema), schema


def test_many_schema_differences_leave_room_for_the_logs_own_problems(fleet: Path, tmp_path: Path) -> None:
    copy = copy_store(fleet, tmp_path / "altered.db", seal=False)
    edit(copy, *(f"CREATE INDEX extra_{n} ON meta (value)" for n in range(150)), "DROP TRIGGER events_no_update",
         "UPDATE events SET body = x'00' WHERE seq = 5")
    code, report = audit_json(copy)
    assert code == 65 and report["first_bad_seq"] == 5, report
    schema = [problem["reason"] for problem in report["problems"] if "schema was altered" in problem["reason"]]
    assert len(schema) == 11 and "in 141 more ways" in schema[-1], schema


# --- a write the file did not keep -------------------------------------------------------------------------


def runner_with_a_lease(store: EventStore, clock: FakeClock, base: Path) -> tuple[RunnerLifecycle, str]:
    base.mkdir(exist_ok=True)
    runner = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=base,
                             resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                             post_session_hook_digest=HOOK, now=clock, random_id=lambda: os.urandom(4).hex())
    runner.initialize()
    clock.advance(1000)
    receipt = runner.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=authority(clock, 1))
    clock.advance(1000)
    return runner, receipt.lease.id


@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "keyed"])
def test_a_trigger_planted_before_open_is_refused_by_the_writer(tmp_path: Path, clock: FakeClock,
                                                                key: bytes | None) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path, key=key, now=clock) as store:
        runner_with_a_lease(store, clock, tmp_path / "base")
    edit(path, IGNORE_INSERTS)
    with pytest.raises(StoreFormatError, match="a trigger the store never made, 't' on 'events'"):
        EventStore.open(path, key=key)
    key_file = tmp_path / "store.key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    code, report = audit_json(path, *(["--key-file", str(key_file)] if key else []))
    # The log itself is whole: the trigger is the one problem, and it fails the audit.
    assert code == 65 and len(report["problems"]) == 1 and "RAISE(IGNORE)" in report["reason"], report


@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "keyed"])
def test_a_command_whose_write_a_planted_trigger_drops_is_not_acknowledged(
        tmp_path: Path, clock: FakeClock, key: bytes | None) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path, key=key, now=clock) as store:
        runner, lease_id = runner_with_a_lease(store, clock, tmp_path / "base")
        head = store.head()
        edit(path, IGNORE_INSERTS)  # while the handle is open
        before = durable_digests(path)
        with pytest.raises(StoreFormatError, match="did not keep the write"):
            runner.settle_lease(lease_id=lease_id, lease_generation=1, result_digest=DIGEST)
        with pytest.raises(StoreFormatError, match="did not keep the write"):
            store.append_unchecked("runner-2", [ReclaimCompleted(generation=1)])
        assert store.head() == head
        assert durable_digests(path) == before
    with EventStore.open(path, key=key, read_only=True) as fresh:
        assert fresh.head() == head
        state = load(fresh, "runner-1").state
        assert state is not None and [lease.status for lease in state.leases] == ["active"]


def test_the_handle_keeps_no_head_the_file_does_not_hold(tmp_path: Path) -> None:
    """After a dropped write the same handle's next append chains onto the file's real head."""
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])
        edit(path, IGNORE_INSERTS)
        with pytest.raises(StoreFormatError):
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=2)], expected_version=1)
        edit(path, "DROP TRIGGER t")  # the file is whole again
        # A batch too: the read-back checks every row of it.
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=2), ReclaimCompleted(generation=3)],
                     expected_version=1)
        assert store.verify().events == 3
    with EventStore.open(path) as store:
        assert store.verify().events == 3


def test_a_trigger_that_drops_part_of_a_batch_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])
        edit(path, "CREATE TRIGGER t BEFORE INSERT ON events WHEN NEW.seq = 3 BEGIN SELECT RAISE(IGNORE); END")
        with pytest.raises(StoreFormatError, match=r"3 event\(s\) inserted at seq 2\.\.4, 2 found"):
            store.append_unchecked("runner-1", [ReclaimCompleted(generation=n) for n in (2, 3, 4)])
        assert store.head().seq == 1

