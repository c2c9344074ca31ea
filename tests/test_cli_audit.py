"""``lifecycle-es audit`` as an operator runs it: whole logs pass, and each way a log can be wrong is named.

Every case runs the real console script and checks its exit code, and the first bad seq, stream and
reason it reports (``--json``), against what was done to the file.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import apsw
import pytest
from test_cli_logs import (
    CLI,
    DIGEST,
    KEY,
    LONG_EVENTS,
    attack,
    audit_json,
    copy_store,
    fleet_in,
    long_in,
    one_error_line,
    row,
    run,
)

from lifecycle_es import EventStore, ProxyAuthority
from lifecycle_es.cli.render import PROGRESS_MIN_TOTAL, Progress
from lifecycle_es.events import DrainRequested, LeaseAcquired, LeaseSettled

FleetLog = tuple[Path, dict[str, int]]


@pytest.fixture(scope="module")
def fleet_log(tmp_path_factory: pytest.TempPathFactory) -> FleetLog:
    """The fleet log, sealed; tests that change it work on a copy."""
    return fleet_in(tmp_path_factory)


@pytest.fixture(scope="module")
def keyed_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet log in a keyed store."""
    return fleet_in(tmp_path_factory, key=KEY)[0]


@pytest.fixture(scope="module")
def long_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log long enough for two chain workers."""
    return long_in(tmp_path_factory)


def test_a_whole_log_passes_and_the_summary_says_what_it_holds(fleet_log: FleetLog) -> None:
    path, marks = fleet_log
    code, report = audit_json(path)
    with EventStore.open(path, read_only=True) as store:
        head = store.head()
    assert code == 0 and report["ok"] and report["exit_code"] == 0
    assert report["events"] == report["head_seq"] == marks["head"] == head.seq
    assert report["head_hash"] == head.hash.hex()
    assert report["runners"] == 3
    assert report["states"] == {"accepting": 2, "draining": 0, "parked": 1, "reclaiming": 0}
    assert report["leases"]["active"] == 0 and report["leases"]["parked"] == 1
    assert report["first_bad_seq"] is None and report["stream"] is None and report["reason"] is None
    assert report["snapshots_checked"] >= 3  # snapshot_every=3: each runner has one
    assert report["read_models_checked"] == 3
    assert report["seal"]["ok"] and report["seal"]["seq"] == head.seq  # FILE.seal, found beside the file

    text = run("audit", path)
    assert text.returncode == 0 and text.stderr == ""
    assert "OK: the log is whole" in text.stdout and f"seq {head.seq:,}" in text.stdout


def test_a_flipped_byte_in_a_body_is_reported_at_its_seq(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "tampered.db")
    seq = 9
    _, stream, _, _, _, body, _, _ = row(path, seq)
    flipped = bytearray(body)
    flipped[len(flipped) // 2] ^= 0x01
    attack(path, ("UPDATE events SET body = ? WHERE seq = ?", (bytes(flipped), seq)))

    code, report = audit_json(path)
    assert code == 65 and not report["ok"] and report["exit_code"] == 65
    assert (report["first_bad_seq"], report["stream"]) == (seq, stream)
    assert "hash does not match" in report["reason"]

    text = run("audit", path)
    assert text.returncode == 65
    assert f"FAILED at seq {seq} (stream '{stream}')" in text.stdout


def test_a_validly_chained_illegal_transition_is_reported_at_its_seq(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "illegal.db", seal=False)
    with EventStore.open(path) as store:  # append() chains it but checks no rule
        recorded = store.append("runner-1", [LeaseSettled(lease_id="lease-unknown", lease_generation=1,
                                                          result_digest=DIGEST)])
    code, report = audit_json(path)
    assert code == 65
    assert (report["first_bad_seq"], report["stream"]) == (recorded[0].seq, "runner-1")
    assert "LeaseSettled breaks the rules" in report["reason"] and "lease-unknown" in report["reason"]


def test_a_stream_left_with_a_park_pending_is_an_integrity_failure(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "pending.db", seal=False)
    with EventStore.open(path) as store:
        # runner-1 holds no active lease; acquiring one and settling it during a drain leaves a park due,
        # and the RunnerParked the rules require in the same transaction never comes.
        at = "2026-01-01T01:00:00.000Z"
        proxy = ProxyAuthority(id="proxy-a", revision=2, issued_at=at, expires_at="2026-01-01T02:00:00.000Z")
        state_generation = 2  # runner-1 rotated its proxy once
        store.append("runner-1", [
            LeaseAcquired(lease_id="lease-late", session_id="s-late", lease_generation=state_generation,
                          issued_at=at, expires_at="2026-01-01T01:10:00.000Z", proxy_authority=proxy),
            DrainRequested(signal="SIGTERM", requested_at=at, deadline_at="2026-01-01T01:00:30.000Z",
                           generation=state_generation + 1),
        ], at=at)
        last = store.append("runner-1", [LeaseSettled(lease_id="lease-late", lease_generation=state_generation,
                                                      result_digest=DIGEST)], at=at)
    code, report = audit_json(path)
    assert code == 65
    assert (report["first_bad_seq"], report["stream"]) == (last[0].seq, "runner-1")
    assert "park pending" in report["reason"]


def test_a_log_that_fell_behind_its_seal_fails(fleet_log: FleetLog, tmp_path: Path) -> None:
    path, marks = fleet_log
    old = copy_store(path, tmp_path / "old.db", seal=False)
    newer = copy_store(path, tmp_path / "newer.db", seal=False)
    with EventStore.open(newer) as store:
        store.append("runner-1", [LeaseSettled(lease_id="x", lease_generation=1, result_digest=DIGEST)])
        store.seal()
    code, report = audit_json(old, "--seal", f"{newer}.seal")
    assert code == 65 and report["seal"]["ok"] is False and report["seal"]["seq"] == marks["head"] + 1
    assert report["first_bad_seq"] == marks["head"] + 1
    assert "behind its seal" in report["reason"] and "shorter" in report["reason"]
    assert report["events"] == marks["head"]  # the log itself is whole: only the seal says it is not all there


def test_snapshots_and_read_models_are_checked_against_the_replay(fleet_log: FleetLog, tmp_path: Path) -> None:
    snapshot = copy_store(fleet_log[0], tmp_path / "snapshot.db")
    conn = apsw.Connection(str(snapshot), flags=apsw.SQLITE_OPEN_READONLY)
    ((seq, state),) = conn.execute("SELECT seq, state FROM snapshots WHERE stream = 'runner-2'").fetchall()
    conn.close()
    changed = json.loads(state)
    changed["generation"] += 7
    attack(snapshot, ("UPDATE snapshots SET state = ? WHERE stream = 'runner-2'", (json.dumps(changed).encode(),)))
    code, report = audit_json(snapshot)
    assert code == 65 and report["first_bad_seq"] == seq
    assert "snapshot of 'runner-2' differs from the replayed state" in report["reason"]

    model = copy_store(fleet_log[0], tmp_path / "model.db")
    attack(model, ("UPDATE runners SET generation = generation + 1 WHERE runner_id = 'runner-1'", ()))
    code, report = audit_json(model)
    assert code == 65 and report["stream"] == "runner-1"
    assert "read model: runners row differs from the replay" in report["reason"]


def test_a_keyed_store_needs_its_key_and_never_shows_it(keyed_log: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw.key"
    raw.write_bytes(KEY)
    hexed = tmp_path / "hex.key"
    hexed.write_text(KEY.hex() + "\n")
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(bytes(32))
    malformed = tmp_path / "short.key"
    malformed.write_text("abc")

    for key_file in (raw, hexed):
        code, report = audit_json(keyed_log, "--key-file", str(key_file))
        assert code == 0 and report["ok"] and report["keyed"] and report["seal"]["ok"]

    code, report = audit_json(keyed_log)
    assert code == 77 and report["exit_code"] == 77 and "--key-file" in report["reason"]
    code, report = audit_json(keyed_log, "--key-file", str(wrong))
    assert code == 77 and "wrong key" in report["reason"]

    done = run("audit", keyed_log, "--key-file", malformed)
    assert done.returncode == 64 and "32 raw bytes or 64 hex" in one_error_line(done)
    done = run("audit", keyed_log, "--key-file", tmp_path / "absent.key")
    assert done.returncode == 66
    for output in (done.stdout + done.stderr, run("audit", keyed_log, "--key-file", raw).stdout):
        assert KEY.hex() not in output


def test_worker_processes_verify_the_chain_and_meet_at_the_range_boundary(long_log: Path, tmp_path: Path) -> None:
    code, report = audit_json(long_log, "--jobs", "2")
    assert code == 0 and report["jobs"] == 2 and report["events"] == LONG_EVENTS
    # Each worker replays a share of the runners; together they saw every snapshot and read-model row.
    conn = apsw.Connection(str(long_log), flags=apsw.SQLITE_OPEN_READONLY)
    ((snapshots,),) = conn.execute("SELECT count(*) FROM snapshots").fetchall()
    conn.close()
    assert report["snapshots_checked"] == snapshots >= 3  # taken at 40% of the log
    assert report["read_models_checked"] == report["runners"] == 10
    assert report["leases"]["settled"] > 0 and report["states"]["accepting"] == 10

    # The last row of the first range gets a new hash: its worker finds the hash wrong, the next
    # worker finds the next row's prev no longer links; the first bad seq is the boundary row.
    boundary = LONG_EVENTS // 2
    tampered = copy_store(long_log, tmp_path / "boundary.db")
    attack(tampered, ("UPDATE events SET hash = zeroblob(32) WHERE seq = ?", (boundary,)))
    code, report = audit_json(tampered, "--jobs", "2")
    assert code == 65 and report["jobs"] == 2
    assert report["first_bad_seq"] == boundary and "hash does not match" in report["reason"]
    assert {problem["seq"] for problem in report["problems"]} >= {boundary, boundary + 1}

    # A body changed deep in the second range, so that it is still a legal event (another result digest,
    # another session): the replay cannot tell, only the chain can.
    seq = boundary + 1234
    type_, body = row(long_log, seq)[3], row(long_log, seq)[5]
    old, new = (b"sha256:cd", b"sha256:ce") if type_ == "LeaseSettled" else (b'"s-', b'"t-')
    changed = body.replace(old, new, 1)
    assert changed != body
    flipped = copy_store(long_log, tmp_path / "flipped.db")
    attack(flipped, ("UPDATE events SET body = ? WHERE seq = ?", (changed, seq)))
    code, report = audit_json(flipped, "--jobs", "2")
    assert code == 65 and report["first_bad_seq"] == seq and "hash does not match" in report["reason"]
    code, report = audit_json(flipped, "--jobs", "1")
    assert code == 65 and report["jobs"] == 1 and report["first_bad_seq"] == seq


def test_worker_processes_replay_the_rules_too(long_log: Path, tmp_path: Path) -> None:
    path = copy_store(long_log, tmp_path / "illegal.db")
    with EventStore.open(path) as store:
        bad = store.append("runner-3", [LeaseSettled(lease_id="lease-3-0", lease_generation=1,
                                                     result_digest=DIGEST)])  # settled long ago
        store.seal()
    code, report = audit_json(path, "--jobs", "3")
    assert code == 65 and report["jobs"] == 2  # three asked, two ranges of at least 10,000 events
    assert (report["first_bad_seq"], report["stream"]) == (bad[0].seq, "runner-3")
    assert "LeaseSettled breaks the rules" in report["reason"]


def test_usage_errors_exit_64_and_missing_files_66(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = fleet_log[0]
    for args in ((), ("audit",), ("audit", path, "--jobs", "0"), ("audit", path, "--jobs", "two"),
                 ("audit", path, "--bogus"), ("nonsense", path)):
        done = run(*args)
        assert done.returncode == 64, (args, done.stderr)
        assert "Traceback" not in done.stderr and "error:" in done.stderr
    done = run("audit", tmp_path / "absent.db")
    assert done.returncode == 66 and "does not exist" in one_error_line(done)
    code, report = audit_json(path, "--seal", str(tmp_path / "absent.seal"))
    assert code == 66 and report["exit_code"] == 66 and not report["ok"]
    assert run("--help").returncode == 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no device that fails every write")
def test_an_unwritable_output_is_an_io_error_74(fleet_log: FleetLog) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run([str(CLI), "events", str(fleet_log[0])], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60, check=False)
    assert done.returncode == 74 and "No space left" in done.stderr and "Traceback" not in done.stderr


def test_the_progress_bar_draws_on_a_terminal_only() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    drawn, piped = Terminal(), io.StringIO()
    for stream in (drawn, piped):
        bar = Progress("audit", PROGRESS_MIN_TOTAL, stream=stream)
        bar.update(PROGRESS_MIN_TOTAL // 2)
        bar.update(PROGRESS_MIN_TOTAL)
        bar.close()
    assert "\raudit [" in drawn.getvalue() and f"{PROGRESS_MIN_TOTAL:,}/{PROGRESS_MIN_TOTAL:,}" in drawn.getvalue()
    assert piped.getvalue() == ""
    short = Terminal()
    Progress("audit", PROGRESS_MIN_TOTAL - 1, stream=short).update(10)
    assert short.getvalue() == ""  # a short log is over before a bar would help
