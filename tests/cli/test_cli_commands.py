"""``show``, ``events`` (``--follow`` too), ``rebuild``, ``seal``, ``export``, ``import``, as an operator runs them."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import select
import signal
import subprocess
import unicodedata
from pathlib import Path

import msgspec
import pytest
from fleets import (
    CLI,
    DIGEST,
    KEY,
    attack,
    audit_json,
    copy_store,
    edit_caches,
    one_error_line,
    row,
    rows_and_meta,
    run,
    smuggle,
)

from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerState
from lifecycle_es.auditing import AuditReport
from lifecycle_es.cli.audit import summary
from lifecycle_es.cli.exits import json_printable, one_line, printable
from lifecycle_es.cli.show import fleet_text, runner_text
from lifecycle_es.events import RUNNER_SCHEMA, LeaseAcquired, LeaseSettled, RunnerInitialized
from lifecycle_es.receipts import project
from lifecycle_es.replay import load, snapshot_blob
from lifecycle_es.state import Lease, ProxyRef, encode_state
from projections import fleet_of

FleetLog = tuple[Path, dict[str, int]]


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    """The keyed store's key, as 64 hex characters."""
    path = tmp_path / "store.key"
    path.write_text(KEY.hex())
    path.chmod(0o600)
    return path


# --- show --------------------------------------------------------------------------------------------


def test_show_the_fleet(fleet_log: FleetLog) -> None:
    path, marks = fleet_log
    done = run("show", path, "--json")
    assert done.returncode == 0
    view = json.loads(done.stdout)
    assert view["head_seq"] == marks["head"]
    assert view["runners_by_state"] == {"accepting": ["runner-0", "runner-1"], "draining": [], "parked": ["runner-2"],
                                        "reclaiming": []}
    assert view["runners"]["runner-1"]["policy_revision"] == 2  # its proxy was rotated

    text = run("show", path)
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    header = next(line for line in lines if line.startswith("runner "))
    assert all(column in header for column in ("state", "gen", "policy", "proxy", "drain deadline", "active"))
    assert any(line.startswith("runner-2") and " parked " in line for line in lines)



def test_a_snapshot_retagged_by_an_unkeyed_files_writer_is_believed_by_show_and_caught_by_the_audit(
        fleet_log: FleetLog, tmp_path: Path) -> None:
    # What the README says of an unkeyed store: its tags are hashes whoever writes the file can compute.
    path = copy_store(fleet_log[0], tmp_path / "forged.db", seal=False)
    with EventStore.open(path, read_only=True) as store:
        version, seq, _, event_hash = store.backend.snapshot("runner-2")  # type: ignore[misc]
        then = load(store, "runner-2", use_snapshot=False, until_seq=seq).state
        assert then is not None and then.state == "parked"
        lie = encode_state(msgspec.structs.replace(then, state="accepting"))
        blob = snapshot_blob(store, "runner-2", version, seq, event_hash, lie)
    edit_caches(path, ("UPDATE snapshots SET state = ? WHERE stream = ?", (blob, "runner-2")))
    assert json.loads(run("show", path, "runner-2", "--json").stdout)["runner"]["state"] == "accepting"
    audited = run("audit", path)
    assert audited.returncode == 65 and "snapshot of 'runner-2' differs from the replayed state" in audited.stdout

def test_show_one_runner_now_and_at_an_older_seq(fleet_log: FleetLog) -> None:
    path, marks = fleet_log
    then = json.loads(run("show", path, "runner-0", "--at", str(marks["active_seq"]), "--json").stdout)
    now = json.loads(run("show", path, "runner-0", "--json").stdout)
    assert then["head_seq"] == marks["active_seq"] and now["head_seq"] == marks["head"]
    assert (then["runner"]["state"], then["runner"]["generation"], then["runner"]["active_lease_count"]) == (
        "accepting", 1, 1)
    assert [(lease["id"], lease["status"]) for lease in then["leases"]] == [("lease-0001", "active")]
    assert (now["runner"]["state"], now["runner"]["generation"]) == ("accepting", 5)
    assert now["leases"][0]["status"] == "settled" and now["leases"][0]["hook_receipt_digest"].startswith("sha256:")

    text = run("show", path, "runner-0", "--at", str(marks["active_seq"]))
    assert text.returncode == 0 and f"as of seq {marks['active_seq']}" in text.stdout
    assert "lease-0001" in text.stdout and "active" in text.stdout

    assert run("show", path, "runner-404").returncode == 66
    assert run("show", path, "not a runner id!").returncode == 64
    assert run("show", path, "--at", "-1").returncode == 64


def test_show_proves_a_keyed_stores_snapshots_with_its_key_and_folds_only_the_tails(
        keyed_log: Path, fleet_log: FleetLog, key_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lifecycle_es import replay
    from lifecycle_es.cli import main as cli_main

    folded_from: list[tuple[str, int]] = []  # (runner, version) each per-runner fold started after
    stream_pages = replay.stream_pages
    monkeypatch.setattr(replay, "stream_pages", lambda store, stream, after: folded_from.append((stream, after))
                        or stream_pages(store, stream, after))
    with EventStore.open(keyed_log, key=KEY, read_only=True) as store:
        snapshots = {runner: store.backend.snapshot(runner) for runner in store.streams()}
    assert all(found is not None and found[0] > 0 for found in snapshots.values())
    views = []
    for argv in ([], ["-k", str(key_file)], ["--key-file", str(key_file)]):
        folded_from.clear()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert cli_main(["show", str(keyed_log), "--json", *argv]) == 0
        views.append(json.loads(out.getvalue()))
        if argv:  # each runner from its proven snapshot
            assert sorted(folded_from) == sorted((runner, found[0]) for runner, found in snapshots.items())  # type: ignore[index]
        else:  # without the key no snapshot is proven: the log folded from its start, in one pass
            assert folded_from == []
    assert views[0] == views[1] == views[2]
    runner = json.loads(run("show", keyed_log, "runner-2", "-k", key_file, "--json").stdout)
    assert runner["runner"] == views[0]["runners"]["runner-2"]

    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(bytes(32))
    wrong.chmod(0o600)
    done = run("show", keyed_log, "-k", wrong)
    assert done.returncode == 77 and "wrong key" in one_error_line(done)
    unkeyed = run("show", fleet_log[0], "-k", key_file)  # a key for a store that says it has none: a downgrade?
    assert unkeyed.returncode == 65 and "claims to be unkeyed" in one_error_line(unkeyed)


# --- events ------------------------------------------------------------------------------------------


def test_events_as_json_lines_and_readable(fleet_log: FleetLog) -> None:
    path, marks = fleet_log
    done = run("events", path, "--json")
    assert done.returncode == 0
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [event["seq"] for event in events] == list(range(1, marks["head"] + 1))
    fifth = events[4]
    assert set(fifth) == {"seq", "stream", "version", "type", "at", "event", "hash"}
    assert fifth["hash"] == row(path, 5)[7].hex() and fifth["event"]["type"] == fifth["type"]
    assert isinstance(fifth["event"], dict)

    mine = [json.loads(line) for line in run("events", path, "--runner", "runner-2", "--after", "10",
                                             "--json").stdout.splitlines()]
    assert mine and all(event["stream"] == "runner-2" and event["seq"] > 10 for event in mine)
    assert [event["version"] for event in mine] == list(range(mine[0]["version"], mine[0]["version"] + len(mine)))

    text = run("events", path, "--runner", "runner-0")
    assert text.returncode == 0 and "RunnerInitialized" in text.stdout and "lease_id=lease-0001" in text.stdout


# --- bad text: what a hostile file's values can print ---------------------------------------------------

# Controls (C0, DEL, C1) and the bidi and invisible formatting characters a terminal acts on or hides.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
EVIL_LEASE = "lease-\u202egnp.exe"  # shows as "lease-exe.png" on a terminal that honours the override
EVIL_SESSION = "s\x1b[31m\u2066red\u2069\u200f\x85\x7f"


def unescaped(printed: str) -> list[str]:
    """The characters of `printed` a terminal would act on or hide (its own line breaks aside)."""
    return UNSAFE.findall(printed.replace("\n", ""))


@pytest.fixture(scope="module")
def bad_text_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log with a valid chain whose lease and session ids hold bidi and control characters."""
    path = tmp_path_factory.mktemp("bad-text") / "bad.db"
    at = "2026-01-01T00:00:00.000Z"
    proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=at, expires_at="2026-01-01T01:00:00.000Z")
    with EventStore.open(path) as store:
        store.append_unchecked("runner-x", [
            RunnerInitialized(schema=RUNNER_SCHEMA, runner_id="runner-x", target="local", base_dir="/srv/runner-x",
                              resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                              post_session_hook_digest=DIGEST),
            LeaseAcquired(lease_id=EVIL_LEASE, session_id=EVIL_SESSION, lease_generation=1, issued_at=at,
                          expires_at="2026-01-01T00:10:00.000Z", proxy_authority=proxy),
        ], at=at)
    return path


def test_events_escape_control_and_bidi_characters_and_json_keeps_them(bad_text_log: Path) -> None:
    text = run("events", bad_text_log)
    assert text.returncode == 0 and not unescaped(text.stdout), ascii(text.stdout)
    assert "lease_id=lease-\\u202egnp.exe" in text.stdout
    assert "session_id=s\\x1b[31m\\u2066red\\u2069\\u200f\\x85\\x7f" in text.stdout
    done = run("events", bad_text_log, "--json")
    assert done.returncode == 0 and not unescaped(done.stdout), ascii(done.stdout)
    lines = [json.loads(line) for line in done.stdout.split("\n") if line]
    assert (lines[1]["event"]["lease_id"], lines[1]["event"]["session_id"]) == (EVIL_LEASE, EVIL_SESSION)


def test_show_never_prints_control_or_bidi_characters(bad_text_log: Path) -> None:
    # Whether the rules accept these ids or refuse them, nothing reaches the terminal unescaped.
    for args in ((), ("runner-x",)):
        done = run("show", bad_text_log, *args)
        printed = done.stdout + done.stderr
        assert "Traceback" not in done.stderr and not unescaped(printed), ascii(printed)
        if args:
            assert "\\u202e" in printed


def test_every_human_rendering_escapes_hostile_text() -> None:
    at = "2026-01-01T00:00:00.000Z"
    lease = Lease(id=EVIL_LEASE, session_id=EVIL_SESSION, generation=1, issued_at=at, expires_at=at, status="active")
    state = RunnerState(schema=RUNNER_SCHEMA, runner_id="runner-\u202ex", target="local\u2066", state="accepting",
                        generation=1, policy_revision=1, base_dir="/srv",
                        resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                        proxy_authority=ProxyRef(id="proxy\x1b]0;owned\x07", revision=1),
                        post_session_hook_digest=DIGEST, drain=None, leases=(lease,), updated_at=at)
    data = {"head_seq": 2, "runner": msgspec.to_builtins(project(state)), "leases": msgspec.to_builtins(state.leases)}
    fleet = msgspec.to_builtins(fleet_of({state.runner_id: state}, 2))
    report = AuditReport(path="/tmp/\u202eevil.db", keyed=False)
    report.add(2, "runner-x", "rules", f"lease {EVIL_LEASE} breaks the rules\u2028next line")
    report.warnings.append(f"session {EVIL_SESSION}")
    for rendered in (runner_text(data, 2), fleet_text(fleet, 2), summary(report)):
        assert not unescaped(rendered), ascii(rendered)
        assert "\\u202e" in rendered
    assert printable("ok é 中 \u202e\x00\ud800") == "ok é 中 \\u202e\\x00\\ud800"
    assert one_line("a\u2066b\nc") == "a\\u2066b c"


def test_every_format_character_is_escaped_for_people_and_for_json() -> None:
    # Unicode's format characters (Cf) draw as nothing: a zero-width space in a base dir, a tag character in a
    # session id would hide in plain sight. Each is escaped in text, and in JSON as an escape that decodes back.
    hidden = [chr(code) for code in range(0x110000) if unicodedata.category(chr(code)) == "Cf"]
    assert "\u200b" in hidden and "\U000e0041" in hidden
    for char in hidden:
        shown = printable(f"a{char}b")
        assert shown.isascii() and shown != f"a{char}b", ascii(char)
        text = json.dumps(f"a{char}b", ensure_ascii=False)
        escaped = json_printable(text)
        assert escaped.isascii() and json.loads(escaped) == f"a{char}b", ascii(char)

@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_follow_sees_another_process_commit_and_stops_on_a_signal(fleet_log: FleetLog, tmp_path: Path,
                                                                   stop: signal.Signals) -> None:
    path = copy_store(fleet_log[0], tmp_path / "followed.db", seal=False)
    head = fleet_log[1]["head"]
    follower = subprocess.Popen([str(CLI), "events", str(path), "--follow", "--json", "--after", str(head)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with EventStore.open(path) as store:  # this process is the other writer
            store.append_unchecked("runner-1", [LeaseSettled(lease_id="lease-from-elsewhere", lease_generation=1,
                                                   result_digest=DIGEST)])
        ready, _, _ = select.select([follower.stdout], [], [], 60)
        assert ready, "the follower printed nothing within 60 s"
        assert follower.stdout is not None
        seen = json.loads(follower.stdout.readline())
        assert (seen["seq"], seen["stream"], seen["event"]["lease_id"]) == (head + 1, "runner-1",
                                                                           "lease-from-elsewhere")
        follower.send_signal(stop)
        assert follower.wait(timeout=60) == 0
        assert follower.stderr is not None and "Traceback" not in follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


# --- rebuild and seal --------------------------------------------------------------------------------


def test_rebuild_repairs_the_caches(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "rebuilt.db")
    attack(path, ("UPDATE runners SET state = 'draining'", ()), ("DELETE FROM snapshots", ()))
    assert audit_json(path)[0] == 65
    done = run("rebuild", path)
    assert done.returncode == 0 and f"from {fleet_log[1]['head']} events: 3 runners" in done.stdout
    code, report = audit_json(path)
    assert code == 0 and report["read_models_checked"] == 3 and report["snapshots_checked"] == 3


def test_seal_verifies_then_seals_the_head(fleet_log: FleetLog, keyed_log: Path, key_file: Path,
                                           tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "to-seal.db", seal=False)
    done = run("seal", path)
    assert done.returncode == 0 and f"at seq {fleet_log[1]['head']}" in done.stdout
    assert os.stat(f"{path}.seal").st_mode & 0o777 == 0o600
    assert audit_json(path)[1]["seal"]["ok"]

    keyed = copy_store(keyed_log, tmp_path / "keyed.db", seal=False)
    assert run("seal", keyed).returncode == 77
    assert run("seal", keyed, "--key-file", key_file).returncode == 0
    assert audit_json(keyed, "--key-file", str(key_file))[1]["seal"]["ok"]

    broken = copy_store(fleet_log[0], tmp_path / "broken.db", seal=False)
    attack(broken, ("UPDATE events SET at = '2026-01-01T00:00:00.001Z' WHERE seq = 3", ()))
    done = run("seal", broken)
    assert done.returncode == 65 and "seq 3" in one_error_line(done)
    assert not os.path.exists(f"{broken}.seal")


# --- export and import -------------------------------------------------------------------------------


def test_export_then_import_restores_the_rows_byte_for_byte(fleet_log: FleetLog, tmp_path: Path) -> None:
    path, marks = fleet_log
    out = tmp_path / "fleet.jsonl"
    done = run("export", path, out)
    assert done.returncode == 0 and os.stat(out).st_mode & 0o777 == 0o600
    lines = out.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "lifecycle-es-export" and header["events"] == marks["head"] == len(lines) - 1
    assert set(json.loads(lines[1])) == {"seq", "stream", "version", "type", "at", "body", "prev", "hash"}

    restored = tmp_path / "restored.db"
    done = run("import", out, restored)
    assert done.returncode == 0, done.stderr
    rows, meta = rows_and_meta(path)
    assert rows_and_meta(restored) == (rows, meta)  # the same store id, so the same chain
    code, report = audit_json(restored)
    assert code == 0 and report["events"] == marks["head"]

    assert run("export", path, out).returncode == 73  # never overwritten
    assert run("import", out, restored).returncode == 73
    assert run("export", path, tmp_path / "no-such-dir" / "x.jsonl").returncode == 73



def test_export_import_and_rebuild_print_a_file_name_escaped(fleet_log: FleetLog, tmp_path: Path) -> None:
    # A name found by a glob in a directory others write to can hold what drives a terminal.
    evil = "x\x1b]0;owned\x07\u202e"
    path = copy_store(fleet_log[0], tmp_path / f"{evil}.db", seal=False)
    exported, imported = tmp_path / f"{evil}.jsonl", tmp_path / f"{evil}-copy.db"
    for argv in (("export", path, exported), ("import", exported, imported), ("rebuild", path)):
        done = run(*argv)
        assert done.returncode == 0, done.stderr
        assert printable(evil) in done.stdout, done.stdout
        assert not set(done.stdout) & {"\x1b", "\x07", "\u202e"}, done.stdout

def test_import_verifies_the_export_before_writing_anything(fleet_log: FleetLog, tmp_path: Path) -> None:
    out = tmp_path / "fleet.jsonl"
    assert run("export", fleet_log[0], out).returncode == 0
    lines = out.read_text().splitlines()

    tampered = tmp_path / "tampered.jsonl"
    changed = json.loads(lines[7])
    changed["body"] = changed["body"][:-2] + ("00" if changed["body"][-2:] != "00" else "01")
    tampered.write_text("\n".join([*lines[:7], json.dumps(changed), *lines[8:]]) + "\n")
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text("\n".join(lines[:-1]) + "\n")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text(lines[0] + "\n{not json\n")
    for source, said in ((tampered, "seq 7: hash does not match"), (truncated, "truncated"), (garbage, "line 2")):
        target = tmp_path / f"from-{source.stem}.db"
        done = run("import", source, target)
        assert done.returncode == 65 and said in one_error_line(done)
        assert not os.path.exists(target)
    assert run("import", tmp_path / "absent.jsonl", tmp_path / "x.db").returncode == 66


def test_a_keyed_export_imports_only_with_its_key(keyed_log: Path, key_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "keyed.jsonl"
    assert run("export", keyed_log, out).returncode == 0  # rows are copied as they are: no key needed
    assert run("import", out, tmp_path / "without.db").returncode == 77
    assert not os.path.exists(tmp_path / "without.db")
    restored = tmp_path / "with.db"
    assert run("import", out, restored, "--key-file", key_file).returncode == 0
    assert rows_and_meta(restored) == rows_and_meta(keyed_log)
    assert audit_json(restored, "--key-file", str(key_file))[0] == 0


def test_an_export_line_longer_than_an_event_can_be_is_refused_as_it_streams(fleet_log: FleetLog,
                                                                              tmp_path: Path) -> None:
    out = tmp_path / "fleet.jsonl"
    assert run("export", fleet_log[0], out).returncode == 0
    header = out.read_bytes().split(b"\n", 1)[0]
    # One line of 2 MiB: twice what an event's largest body spells in hex.
    long_line = tmp_path / "long-line.jsonl"
    long_line.write_bytes(header + b"\n" + b'{"seq":1,"body":"' + b"ab" * (1 << 20) + b'"}\n')
    # A 4 GiB file of one line (sparse: it costs no disk) under a 1 GiB address space: read whole, it kills.
    sparse = tmp_path / "sparse.jsonl"
    with open(sparse, "wb") as handle:
        handle.write(header + b"\n")
        handle.truncate(4 << 30)
    for source in (long_line, sparse):
        target = tmp_path / f"from-{source.stem}.db"
        done = subprocess.run([str(CLI), "import", str(source), str(target)], capture_output=True, text=True,
                              timeout=120, check=False, preexec_fn=limit_memory)
        assert done.returncode == 65 and "line 2 is longer than" in one_error_line(done), done.stderr
        assert not os.path.exists(target)



def test_a_snapshot_row_larger_than_any_state_is_ignored_unread(fleet_log: FleetLog, tmp_path: Path) -> None:
    # A file's writer can make a snapshot's state any size SQLite holds; read whole (twice, tag and state split),
    # 300 MB does not fit in 512 MiB of address space, and a state is never more than a few MB.
    path = copy_store(fleet_log[0], tmp_path / "huge.db", seal=False)
    edit_caches(path, ("UPDATE snapshots SET state = zeroblob(300000000) WHERE stream = ?", ("runner-2",)))
    done = subprocess.run([str(CLI), "show", str(path), "runner-2", "--json"], capture_output=True, text=True,
                          timeout=120, check=False, preexec_fn=lambda: limit_memory(512 << 20))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runner"]["state"] == "parked"

def limit_memory(size: int = 1 << 30) -> None:
    """preexec_fn: an address space of `size` (1 GiB), so a file read whole is a visible failure, not a slow
    success."""
    resource.setrlimit(resource.RLIMIT_AS, (size, size))


# --- key files -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o640, 0o604], ids=oct)
def test_a_key_file_others_may_use_is_refused_naming_its_mode(keyed_log: Path, tmp_path: Path, mode: int) -> None:
    key = tmp_path / "store.key"
    key.write_text(KEY.hex())
    key.chmod(mode)
    keyed = copy_store(keyed_log, tmp_path / "keyed.db", seal=False)
    out = tmp_path / "keyed.jsonl"
    assert run("export", keyed, out).returncode == 0
    for args in (("audit", keyed), ("seal", keyed), ("import", out, tmp_path / "new.db")):
        done = run(*args, "--key-file", key)
        line = one_error_line(done)
        assert done.returncode == 64 and f"mode {mode:04o}" in line and f"chmod 600 {key}" in line, line
    assert not os.path.exists(f"{keyed}.seal") and not os.path.exists(tmp_path / "new.db")
    key.chmod(0o600)
    assert run("audit", keyed, "--key-file", key).returncode == 0


def test_a_key_for_a_store_that_claims_to_be_unkeyed_is_refused_by_every_command(fleet_log: FleetLog,
                                                                                 key_file: Path,
                                                                                 tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "plain.db", seal=False)
    out = tmp_path / "plain.jsonl"
    assert run("export", path, out).returncode == 0
    for args in (("audit", path), ("seal", path), ("import", out, tmp_path / "new.db")):
        done = run(*args, "--key-file", key_file)
        assert done.returncode == 65 and "downgrade" in one_error_line(done), (args, done.stderr)
    assert not os.path.exists(f"{path}.seal") and not os.path.exists(tmp_path / "new.db")


@pytest.mark.parametrize("column", ["stream", "at", "hash"])
def test_a_column_larger_than_any_value_is_named_unread(fleet_log: FleetLog, tmp_path: Path, column: str) -> None:
    # A file's writer can make any column any size SQLite holds: 300 MB read whole does not fit in 512 MiB of
    # address space. Beyond MAX_FIELD_BYTES a column reads as NULL, unloaded, and the chain names its row.
    path = copy_store(fleet_log[0], tmp_path / "huge.db", seal=False)
    with EventStore.open(path) as store:
        seq = store.head().seq // 2
    huge = "zeroblob(300000000)" if column == "hash" else "CAST(zeroblob(300000000) AS TEXT)"
    smuggle(path, (f"UPDATE events SET {column} = {huge} WHERE seq = ?", (seq,)))
    for command in (["audit", str(path)], ["events", str(path), "-n", "5"], ["show", str(path)]):
        done = subprocess.run([str(CLI), *command], capture_output=True, text=True, timeout=120, check=False,
                              preexec_fn=lambda: limit_memory(512 << 20))
        assert done.returncode in (0, 65), (command, done.returncode, done.stderr)
        assert "MemoryError" not in done.stderr and "Traceback" not in done.stderr
    code, report = audit_json(path)
    assert code == 65 and report["first_bad_seq"] == seq, report
