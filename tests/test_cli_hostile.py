"""Hostile files: whatever the file holds, the command line answers with an exit code and one line.

Random bytes, a truncated copy, flipped bits, another program's database, a lifecycle-es file whose
tables are not the store's, bodies that are not events, unknown tags, huge values, text that is not
UTF-8, a directory: never a traceback. Where the chain still links (an attacker of an unkeyed store
can re-chain after an edit), the rules catch the event and name its seq.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import apsw
import pytest
from test_cli_logs import DIGEST, attack, audit_json, copy_store, fleet_in, long_in, one_error_line, rechain, run

from lifecycle_es.cli.jobs import split

FleetLog = tuple[Path, dict[str, int]]


@pytest.fixture(scope="module")
def fleet_log(tmp_path_factory: pytest.TempPathFactory) -> FleetLog:
    """The fleet log; every case attacks a copy."""
    return fleet_in(tmp_path_factory)


def _refused(done_args: tuple[object, ...]) -> str:
    done = run(*map(str, done_args))
    assert done.returncode == 65, (done.returncode, done.stdout, done.stderr)
    return one_error_line(done)


def test_files_that_are_not_stores(fleet_log: FleetLog, tmp_path: Path) -> None:
    noise = tmp_path / "noise.db"
    noise.write_bytes(random.Random(1).randbytes(8192))
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(fleet_log[0].read_bytes()[: 4096 * 3 + 100])
    foreign = tmp_path / "foreign.db"
    conn = apsw.Connection(str(foreign))
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    conn.close()
    directory = tmp_path / "a-directory"
    directory.mkdir()
    link = tmp_path / "link.db"
    link.symlink_to(fleet_log[0])
    for path in (noise, empty, truncated, foreign, directory, link):
        for command in ("audit", "show", "events"):
            line = _refused((command, path))
            assert "error:" in line


def test_a_file_with_our_header_but_foreign_tables(tmp_path: Path) -> None:
    impostor = tmp_path / "impostor.db"
    conn = apsw.Connection(str(impostor))
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA application_id=0x4C434553")
    conn.execute("PRAGMA user_version=2")
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value)")
    conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, stream, version, type, at, body, prev, hash)")
    conn.execute("CREATE TABLE snapshots (stream TEXT PRIMARY KEY, version, seq, state, event_hash)")
    conn.execute("INSERT INTO meta VALUES ('store_id', 'text, not bytes')")
    conn.execute("INSERT INTO events VALUES (1, 7, 'one', NULL, 3.5, 'x', 'y', 'z')")
    conn.close()
    for command in ("audit", "show", "events", "export"):
        args = (command, impostor) if command != "export" else (command, impostor, tmp_path / "out.jsonl")
        assert "not a lifecycle-es store" in _refused(args)


def test_flipped_bits_anywhere_in_the_file_never_crash(fleet_log: FleetLog, tmp_path: Path) -> None:
    data = fleet_log[0].read_bytes()
    rng = random.Random(5)
    codes = set()
    for case in range(10):
        path = tmp_path / f"flipped-{case}.db"
        damaged = bytearray(data)
        for _ in range(4):
            damaged[rng.randrange(100, len(damaged))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        done = run("audit", path)
        assert done.returncode in (0, 65), (case, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr
        codes.add(done.returncode)
    assert 65 in codes


def _rechained(fleet_log: FleetLog, tmp_path: Path, name: str, seq: int, **columns: object) -> Path:
    path = copy_store(fleet_log[0], tmp_path / f"{name}.db", seal=False)
    sets = ", ".join(f"{column} = ?" for column in columns)
    attack(path, (f"UPDATE events SET {sets} WHERE seq = ?", (*columns.values(), seq)))
    rechain(path)
    return path


@pytest.mark.parametrize(("name", "columns", "reason"), [
    ("not-json", {"body": b"\xff\xfe not json"}, "body is not a valid event"),
    ("not-an-event", {"body": b'{"hello":1}'}, "body is not a valid event"),
    ("unknown-tag", {"body": b'{"type":"LeaseStolen","lease_id":"x"}', "type": "LeaseStolen"},
     "body is not a valid event"),
    ("type-column-lies", {"type": "LeaseParked"}, "differs from body tag"),
    ("huge-integer", {"body": b'{"lease_generation":' + b"9" * 400 + b',"lease_id":"lease-0001","result_digest":"'
                      + DIGEST.encode() + b'","type":"LeaseSettled"}', "type": "LeaseSettled"}, "breaks the rules"),
    ("huge-string", {"body": b'{"lease_generation":1,"lease_id":"' + b"x" * 3_000_000 + b'","result_digest":"'
                     + DIGEST.encode() + b'","type":"LeaseSettled"}', "type": "LeaseSettled"}, "beyond the bound"),
    ("at-is-not-a-time", {"at": "yesterday, around noon"}, "not a time as the store writes one"),
    ("time-runs-backwards", {"at": "2025-01-01T00:00:00.000Z"}, "time ran backwards"),
    ("float-in-body", {"body": b'{"generation":1.5,"type":"ReclaimCompleted"}', "type": "ReclaimCompleted"},
     "body is not a valid event"),
])
def test_a_rechained_hostile_event_is_named_by_seq(fleet_log: FleetLog, tmp_path: Path, name: str,
                                                  columns: dict[str, object], reason: str) -> None:
    seq = 10
    path = _rechained(fleet_log, tmp_path, name, seq, **columns)
    code, report = audit_json(path)
    assert code == 65 and report["first_bad_seq"] == seq, report
    assert reason in report["reason"]
    assert len(report["reason"]) < 2000  # a huge value is cut short, not echoed whole


def test_time_running_backwards_across_two_workers_ranges_is_named_by_seq(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """The first row of the second worker's range goes back in time: that worker reads the row before it
    (the first worker's) and compares the two."""
    path = copy_store(long_in(tmp_path_factory), tmp_path / "long.db", seal=False)
    code, report = audit_json(path, "--jobs", "2")
    assert code == 0 and report["jobs"] == 2, report
    (_, _), (boundary, _) = split(report["head_seq"], 2)
    attack(path, ("UPDATE events SET at = '2025-12-31T23:59:59.999Z' WHERE seq = ?", (boundary,)))
    rechain(path)
    code, report = audit_json(path, "--jobs", "2")
    assert code == 65 and report["first_bad_seq"] == boundary and "time ran backwards" in report["reason"], report


def test_text_that_is_not_utf8_is_named_by_seq(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "latin1.db", seal=False)
    attack(path, ("UPDATE events SET stream = CAST(X'72756e6e6572ff' AS TEXT) WHERE seq = 4", ()))
    code, report = audit_json(path)
    assert code == 65 and report["first_bad_seq"] == 4 and "UTF-8" in report["reason"]
    assert "error:" in _refused(("events", path))


def test_hostile_caches_are_problems_found_not_crashes(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "caches.db", seal=False)
    attack(path, ("DROP TABLE leases", ()),
           ("CREATE TABLE leases (runner_id, lease_id, session_id, generation, issued_at, expires_at, status,"
            " result_digest, hook_receipt_digest)", ()),
           ("INSERT INTO leases VALUES (1, 2.5, X'00', 'g', NULL, NULL, NULL, NULL, NULL)", ()),
           ("INSERT INTO snapshots VALUES ('runner-9', 1, 999999, X'00', X'00')", ()))
    code, report = audit_json(path)
    assert code == 65
    reasons = " | ".join(problem["reason"] for problem in report["problems"])
    assert "snapshot of 'runner-9'" in reasons and "read model" in reasons


def test_a_damaged_seal_cannot_be_trusted(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "sealed.db")
    seal = json.loads(Path(f"{path}.seal").read_text())
    seal["seal"]["seq"] -= 1
    Path(f"{path}.seal").write_text(json.dumps(seal))
    code, report = audit_json(path, "--seal", f"{path}.seal")
    assert code == 65 and "checksum" in report["reason"]
    os.unlink(f"{path}.seal")
    Path(f"{path}.seal").write_bytes(os.urandom(100))
    code, report = audit_json(path)  # opening a store reads its seal: damage there fails the command
    assert code == 65 and report["reason"]
