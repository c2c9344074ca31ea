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
import shutil
from dataclasses import dataclass
from pathlib import Path

import apsw
import pytest
from fleets import (
    DIGEST,
    KEY,
    attack,
    audit_json,
    copy_store,
    long_in,
    one_error_line,
    rechain,
    run,
    store_bytes,
)

from lifecycle_es import chain
from lifecycle_es.sqlite_schema import SCHEMA_VERSION
from lifecycle_es.walk import split

FleetLog = tuple[Path, dict[str, int]]


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
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
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


# --- files named on the command line that are not files to read -----------------------------------------

HANG_S = 30  # a command that waits on a FIFO is killed at this bound and the test fails (TimeoutExpired)


@pytest.fixture(scope="module")
def export_of_fleet(fleet_log: FleetLog, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of the fleet log: a valid import source."""
    out = tmp_path_factory.mktemp("export") / "fleet.jsonl"
    assert run("export", fleet_log[0], out).returncode == 0
    return out


def key_file(path: Path, mode: int = 0o600) -> Path:
    """The keyed log's key as hex, at `mode`."""
    path.write_text(KEY.hex())
    path.chmod(mode)
    return path


@dataclass
class Named:
    """The files one case names: a fleet copy, a keyed copy, a valid export and key, and where new files go."""

    store: Path
    keyed: Path
    export: Path
    key: Path
    new: Path
    out: Path

    def fill(self, args: tuple[str, ...], special: Path) -> list[str]:
        """`args` with each ``{name}`` replaced by that file, and ``{special}`` by `special`."""
        places = {"special": special, **vars(self)}
        return [arg.format(**places) for arg in args]

    def unchanged(self) -> tuple[object, ...]:
        return store_bytes(self.store), store_bytes(self.keyed), self.new.exists(), self.out.exists()


@pytest.fixture
def named(fleet_log: FleetLog, keyed_log: Path, export_of_fleet: Path, tmp_path: Path) -> Named:
    return Named(store=copy_store(fleet_log[0], tmp_path / "fleet.db"), keyed=copy_store(keyed_log, tmp_path / "k.db"),
                 export=export_of_fleet, key=key_file(tmp_path / "store.key"), new=tmp_path / "new.db",
                 out=tmp_path / "out.jsonl")


# (command line, where the special file goes: "beside" = FILE.seal of the fleet copy, else {special})
NAMED_FILES = {
    "audit FILE.seal": (("audit", "{store}"), "beside"),
    "audit --seal": (("audit", "{store}", "--seal", "{special}"), None),
    "audit --key-file": (("audit", "{keyed}", "--key-file", "{special}"), None),
    "seal --key-file": (("seal", "{keyed}", "--key-file", "{special}"), None),
    "import IN.jsonl": (("import", "{special}", "{new}"), None),
    "import --key-file": (("import", "{export}", "{new}", "--key-file", "{special}"), None),
    "show FILE.seal": (("show", "{store}"), "beside"),
    "events FILE.seal": (("events", "{store}"), "beside"),
    "export FILE.seal": (("export", "{store}", "{out}"), "beside"),
    "rebuild FILE.seal": (("rebuild", "{store}"), "beside"),
    "seal FILE.seal": (("seal", "{store}"), "beside"),
    "audit FILE": (("audit", "{special}"), None),
}


def _special_at(named: Named, place: str | None) -> Path:
    if place == "beside":
        os.unlink(f"{named.store}.seal")
        return Path(f"{named.store}.seal")
    return named.store.parent / "special"


@pytest.mark.parametrize("case", sorted(NAMED_FILES))
def test_a_fifo_named_anywhere_is_refused_without_hanging(named: Named, case: str) -> None:
    args, place = NAMED_FILES[case]
    fifo = _special_at(named, place)
    os.mkfifo(fifo)
    before = named.unchanged()
    done = run(*named.fill(args, fifo), timeout=HANG_S)
    assert done.returncode == 65, (done.returncode, done.stdout, done.stderr)
    assert "not a regular file" in one_error_line(done)
    assert named.unchanged() == before


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-valid-file", "dangling"])
@pytest.mark.parametrize("case", sorted(NAMED_FILES))
def test_a_link_named_anywhere_is_refused_never_followed(named: Named, case: str, dangling: bool) -> None:
    args, place = NAMED_FILES[case]
    valid_seal = named.store.parent / "valid.seal"
    shutil.copyfile(f"{named.store}.seal", valid_seal)
    # Linked to the very file that would do: only the link itself is refused.
    target = {"import IN.jsonl": named.export, "audit FILE": named.store}.get(
        case, named.key if "key-file" in case else valid_seal)
    link = _special_at(named, place)
    link.symlink_to(named.store.parent / "nowhere" if dangling else target)
    before = named.unchanged()
    done = run(*named.fill(args, link), timeout=HANG_S)
    assert done.returncode == 65, (done.returncode, done.stdout, done.stderr)
    assert "symbolic link" in one_error_line(done)
    assert named.unchanged() == before
    assert not (named.store.parent / "nowhere").exists()


@pytest.mark.parametrize(("args", "said"), [
    (("audit", "{keyed}", "--key-file", "/dev/zero"), "a device"),
    (("import", "/dev/zero", "{new}"), "a device"),
    (("audit", "{store}", "--seal", "{store}.d"), "a directory"),
    (("import", "{store}.d", "{new}"), "a directory"),
], ids=["key-file-device", "import-device", "seal-directory", "import-directory"])
def test_devices_and_directories_named_are_refused(named: Named, args: tuple[str, ...], said: str) -> None:
    os.mkdir(f"{named.store}.d")
    before = named.unchanged()
    done = run(*named.fill(args, named.store), timeout=HANG_S)
    assert done.returncode == 65 and said in one_error_line(done), (done.returncode, done.stderr)
    assert named.unchanged() == before


# --- paths that are not UTF-8 --------------------------------------------------------------------------

NOT_UTF8 = b"x\xff.db"  # what a shell passes for a Latin-1 name; Python sees a lone surrogate


@pytest.mark.parametrize(("args", "arg"), [
    (("audit", "{bad}"), "FILE"),
    (("show", "{bad}"), "FILE"),
    (("events", "{bad}"), "FILE"),
    (("rebuild", "{bad}"), "FILE"),
    (("seal", "{bad}"), "FILE"),
    (("export", "{bad}", "{out}"), "FILE"),
    (("host", "{bad}", "--runner", "runner-0"), "FILE"),
    (("audit", "{store}", "--seal", "{bad}"), "--seal"),
    (("audit", "{keyed}", "--key-file", "{bad}"), "--key-file"),
    (("seal", "{keyed}", "--key-file", "{bad}"), "--key-file"),
    (("export", "{store}", "{bad}"), "OUT.jsonl"),
    (("import", "{bad}", "{new}"), "IN.jsonl"),
    (("import", "{export}", "{bad}"), "FILE"),
    (("import", "{export}", "{new}", "--key-file", "{bad}"), "--key-file"),
], ids=lambda value: " ".join(value) if isinstance(value, tuple) else value)
def test_a_path_that_is_not_utf8_is_a_usage_error(named: Named, args: tuple[str, ...], arg: str) -> None:
    directory = os.fsencode(named.store.parent)
    bad = directory + b"/" + NOT_UTF8
    # Where a file is read, one is there under that name (a store, a seal, a key): only the name is wrong.
    if arg == "FILE" and args[0] != "import":
        shutil.copyfile(named.store, bad)
    elif arg == "--seal":
        shutil.copyfile(f"{named.store}.seal", bad)
    elif arg == "--key-file":
        shutil.copyfile(named.key, bad)
        os.chmod(bad, 0o600)
    elif arg == "IN.jsonl":
        shutil.copyfile(named.export, bad)
    listed = set(os.listdir(directory))
    before = named.unchanged()
    argv = [bad if part == "{bad}" else named.fill((part,), named.store)[0] for part in args]
    done = run(*argv, timeout=HANG_S)
    assert done.returncode == 64, (done.returncode, done.stdout, done.stderr)
    line = one_error_line(done)
    assert f"{arg} is invalid" in line and "not UTF-8" in line
    assert named.unchanged() == before
    assert set(os.listdir(directory)) == listed  # nothing created under either name


# --- a keyed store downgraded to unkeyed ---------------------------------------------------------------


def downgrade(path: Path) -> None:
    """What someone who can write a keyed store but lacks its key can do: remove the key id, re-chain
    every event without a key (the append-only triggers put back as they were), rebuild the caches and
    re-make the seal, all with the tools at hand."""
    conn = apsw.Connection(str(path))
    try:
        triggers = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'trigger'").fetchall()
        conn.execute("BEGIN")
        for name, _ in triggers:
            conn.execute(f'DROP TRIGGER "{name}"')
        conn.execute("DELETE FROM meta WHERE key = 'key_id'")
        ((store_id,),) = conn.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchall()
        prev = chain.genesis(store_id)
        for seq, stream, version, type_, at, body in conn.execute(
                "SELECT seq, stream, version, type, at, body FROM events ORDER BY seq").fetchall():
            digest = chain.link(prev, seq, stream, version, type_, at, body)
            conn.execute("UPDATE events SET prev = ?, hash = ? WHERE seq = ?", (prev, digest, seq))
            prev = digest
        for _, sql in triggers:
            conn.execute(sql)
        conn.execute("COMMIT")
    finally:
        conn.close()
    os.unlink(f"{path}.seal")  # its MAC needs the key: replaced by an unkeyed one
    assert run("rebuild", path).returncode == 0
    assert run("seal", path).returncode == 0


def test_a_keyed_store_downgraded_to_unkeyed_is_tampered_for_whoever_holds_the_key(keyed_log: Path,
                                                                                   tmp_path: Path) -> None:
    path = copy_store(keyed_log, tmp_path / "downgraded.db")
    downgrade(path)
    code, report = audit_json(path)
    assert code == 0 and not report["keyed"], report  # without the key, nothing shows: that is the attack
    key = key_file(tmp_path / "store.key")
    before = store_bytes(path)
    code, report = audit_json(path, "--key-file", str(key))
    assert code == 65 and report["exit_code"] == 65 and not report["ok"], report
    assert "downgrade" in report["reason"] and "claims to be unkeyed" in report["reason"]
    done = run("audit", path, "--key-file", key)
    assert done.returncode == 65 and "tampered" in one_error_line(done)
    done = run("seal", path, "--key-file", key)  # every command given the key says the same
    assert done.returncode == 65 and "downgrade" in one_error_line(done)
    assert store_bytes(path) == before
