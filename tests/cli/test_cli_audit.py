"""``lifecycle-es audit`` as an operator runs it: whole logs pass, and each way a log can be wrong is named.

Every case runs the real console script and checks its exit code, and the first bad seq, stream and
reason it reports (``--json``), against what was done to the file.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest
from fleets import (
    CLI,
    DIGEST,
    KEY,
    LONG_EVENTS,
    attack,
    audit_json,
    copy_store,
    edit_caches,
    one_error_line,
    row,
    run,
)
from forging import forge

from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.cli import main as cli_main
from lifecycle_es.cli import render
from lifecycle_es.cli.render import PROGRESS_MIN_TOTAL, Progress
from lifecycle_es.events import (
    RUNNER_SCHEMA,
    DrainRequested,
    Event,
    LeaseAcquired,
    LeaseParked,
    LeaseSettled,
    RunnerInitialized,
    UnitExited,
    UnitRecord,
    UnitStarted,
    UnitStarting,
)
from lifecycle_es.replay import TAG_BYTES
from lifecycle_es.testing import START_MS, FakeClock, SequentialIds

FleetLog = tuple[Path, dict[str, int]]
# Events to forge, from the base dir and the time (epoch ms) they are stamped at.
Forged = Callable[[str, int], list[Event]]


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
        recorded = store.append_unchecked("runner-1", [LeaseSettled(lease_id="lease-unknown", lease_generation=1,
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
        store.append_unchecked("runner-1", [
            LeaseAcquired(lease_id="lease-late", session_id="s-late", lease_generation=state_generation,
                          issued_at=at, expires_at="2026-01-01T01:10:00.000Z", proxy_authority=proxy),
            DrainRequested(signal="SIGTERM", requested_at=at, deadline_at="2026-01-01T01:00:30.000Z",
                           generation=state_generation + 1),
        ], at=at)
        last = store.append_unchecked("runner-1", [
            LeaseSettled(lease_id="lease-late", lease_generation=state_generation, result_digest=DIGEST)], at=at)
    code, report = audit_json(path)
    assert code == 65
    assert (report["first_bad_seq"], report["stream"]) == (last[0].seq, "runner-1")
    assert "park pending" in report["reason"]


# --- logs the commands could not have written (issue 10, items 4 and 10) -------------------------------------

LEASE = "lease-000001"
YEAR = 365 * 24 * 3_600_000


@pytest.fixture(scope="module")
def leased_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One runner holding one active lease (``lease-000001``) whose unit's start its host announced."""
    directory = tmp_path_factory.mktemp("leased")
    base = directory / "base"
    base.mkdir()
    clock = FakeClock()
    with EventStore.open(directory / "leased.db", now=clock) as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=base,
                                    resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                                    post_session_hook_digest=DIGEST, now=clock, random_id=SequentialIds())
        lifecycle.initialize()
        clock.advance(1000)
        lease = lifecycle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority=ProxyAuthority(
            id="proxy-1", revision=1, issued_at=iso_ms(clock()), expires_at=iso_ms(clock() + 3_600_000))).lease
        assert lease.id == LEASE
        lifecycle.record_host_facts([UnitStarting(lease_id=LEASE, lease_generation=1, mode="child",
                                                  run_dir=f"{base}/{LEASE}", command=("/bin/true",))])
    return directory / "leased.db", str(base)


def _initialized(**changes: str) -> tuple[str, Forged]:
    fields = {"schema": RUNNER_SCHEMA, "runner_id": "runner-x", "target": "local", "base_dir": "/srv/runner-x",
              "resources": Resources(cpu_seconds=600, memory_bytes=1 << 30), "post_session_hook_digest": DIGEST}
    return "runner-x", lambda base, at: [RunnerInitialized(**{**fields, **changes})]


def _offset_spelling(at_ms: int) -> str:
    """The instant `at_ms` spelled with ``+00:00`` for ``Z``: the same time, a spelling no command writes."""
    return iso_ms(at_ms)[:-1] + "+00:00"


def _acquired(lease_id: str = "lease-forged", session_id: str = "s-forged", spelled: bool = False,
              ) -> tuple[str, Forged]:
    def make(base: str, at: int) -> list[Event]:
        proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(at), expires_at=iso_ms(at + 600_000))
        expires = _offset_spelling(at + 60_000) if spelled else iso_ms(at + 60_000)
        return [LeaseAcquired(lease_id=lease_id, session_id=session_id, lease_generation=1, issued_at=iso_ms(at),
                              expires_at=expires, proxy_authority=proxy)]
    return "runner-1", make


FORGED_LOGS = [
    pytest.param(*_initialized(target="mars"), 0, "target", id="initialized-target-mars"),
    pytest.param(*_initialized(base_dir="srv/runner-x"), 0, "base_dir", id="initialized-relative-base-dir"),
    pytest.param(*_initialized(base_dir="/srv/x/../../etc"), 0, "base_dir", id="initialized-base-dir-not-normalized"),
    pytest.param(*_initialized(post_session_hook_digest="garbage"), 0, "post_session_hook_digest",
                 id="initialized-hook-digest-garbage"),
    pytest.param(*_acquired(lease_id="../../../etc"), 0, "lease_id", id="acquired-lease-id-a-path"),
    pytest.param(*_acquired(session_id="s\n\0"), 0, "session_id", id="acquired-session-id-newline-nul"),
    # 1 MB: beyond the id pattern and the body size bound alike; either way a failure at its seq.
    pytest.param(*_acquired(lease_id="l" * 1_000_000), 0, None, id="acquired-lease-id-1mb"),
    pytest.param(*_acquired(spelled=True), 0, "expires_at", id="acquired-expiry-spelled-otherwise"),
    pytest.param("runner-1", lambda base, at: [DrainRequested(signal="SIGTERM", requested_at=iso_ms(at),
                                                              deadline_at=_offset_spelling(at + 1000), generation=2)],
                 0, "deadline_at", id="drain-deadline-spelled-otherwise"),
    pytest.param("runner-1", lambda base, at: [LeaseSettled(lease_id=LEASE, lease_generation=1,
                                                            result_digest="not-a-digest")], 0, "result_digest",
                 id="settled-not-a-digest"),
    pytest.param("runner-1", lambda base, at: [LeaseParked(lease_id=LEASE, lease_generation=1, result_digest="",
                                                           reason="lost-poll")], 0, "result_digest",
                 id="parked-empty-digest"),
    pytest.param("runner-1", lambda base, at: [UnitStarted(
        lease_id="lease-never", lease_generation=1, handle=UnitRecord(
            mode="child", host="h", boot_id="b", run_dir="/srv/lease-never", pid=1, start_ticks=1))], 0, "lease-never",
                 id="unit-started-for-no-lease"),
    pytest.param("runner-1", lambda base, at: [UnitExited(lease_id=LEASE, code=-5, signal=None, outcome="banana")], 0,
                 "code", id="unit-exited-banana"),
    pytest.param("runner-1", lambda base, at: [UnitStarting(lease_id=LEASE, lease_generation=1, mode="evil",
                                                            run_dir="/etc/passwd")], 0, "mode",
                 id="unit-starting-evil-outside"),
    pytest.param("runner-1", lambda base, at: [UnitStarting(lease_id=LEASE, lease_generation=1, mode="child",
                                                            run_dir=f"{base}/../../etc/{LEASE}")], 0, "run_dir",
                 id="unit-starting-run-dir-climbing-out"),
    pytest.param("runner-1", lambda base, at: [LeaseSettled(lease_id=LEASE, lease_generation=1, result_digest=DIGEST)],
                 -YEAR, "time ran backwards", id="settled-a-year-before-its-lease"),
]


@pytest.mark.parametrize(("stream", "events", "shift", "word"), FORGED_LOGS)
def test_a_log_the_commands_could_not_have_written_fails(leased_log: tuple[Path, str], tmp_path: Path, stream: str,
                                                         events: Forged, shift: int, word: str | None) -> None:
    source, base = leased_log
    path = copy_store(source, tmp_path / "forged.db", seal=False)
    at = START_MS + 1000 + shift  # the head's time (the lease's grant and its unit's start), shifted
    seqs = forge(path, stream, events(base, at), iso_ms(at))
    code, report = audit_json(path)
    assert code == 65 and not report["ok"]
    assert (report["first_bad_seq"], report["stream"]) == (seqs[0], stream)
    if word is not None:
        assert word in report["reason"], report["reason"]


def test_a_log_that_fell_behind_its_seal_fails(fleet_log: FleetLog, tmp_path: Path) -> None:
    path, marks = fleet_log
    old = copy_store(path, tmp_path / "old.db", seal=False)
    newer = copy_store(path, tmp_path / "newer.db", seal=False)
    with EventStore.open(newer) as store:
        store.append_unchecked("runner-1", [LeaseSettled(lease_id="x", lease_generation=1, result_digest=DIGEST)])
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
    changed = json.loads(state[TAG_BYTES:])
    changed["generation"] += 7
    edit_caches(snapshot, ("UPDATE snapshots SET state = ? WHERE stream = 'runner-2'",
                      (state[:TAG_BYTES] + json.dumps(changed).encode(),)))
    code, report = audit_json(snapshot)
    assert code == 65 and report["first_bad_seq"] == seq and report["stream"] == "runner-2"
    assert "snapshot of 'runner-2' has a tag that does not verify" in report["reason"]

    model = copy_store(fleet_log[0], tmp_path / "model.db")
    edit_caches(model, ("UPDATE runners SET generation = generation + 1 WHERE runner_id = 'runner-1'", ()))
    code, report = audit_json(model)
    assert code == 65 and report["stream"] == "runner-1"
    assert "read model: runners row differs from the replay" in report["reason"]




READ_MODEL_FORGERIES = {
    "a lease's status changed": (
        [("UPDATE leases SET status = 'active' WHERE runner_id = 'runner-2' AND status = 'parked'", ())],
        "runner-2", "differs from the replay: status 'active' (replay: 'parked')"),
    "the position dropped, a runner forged": (
        [("DROP TABLE read_model_position", ()),
         ("UPDATE runners SET state = 'parked', generation = 99 WHERE runner_id = 'runner-1'", ())],
        "runner-1", "runners row differs from the replay: state 'parked' (replay: 'accepting'), generation 99"),
    "the position row deleted, a runner forged": (
        [("DELETE FROM read_model_position", ()),
         ("UPDATE runners SET state = 'parked', generation = 99 WHERE runner_id = 'runner-1'", ())],
        "runner-1", "runners row for a runner the replay does not have (as of seq 0)"),
    "a lease of a runner without a runners row": (
        [("INSERT INTO leases VALUES ('runner-9', 'lease-9', 's-9', 1, '2026-01-01T00:00:00.000Z',"
          " '2026-01-01T00:10:00.000Z', 'active', NULL, NULL)", ())],
        "runner-9", "leases row 'lease-9' for a runner the replay does not have"),
    "a lease row missing": (
        [("DELETE FROM leases WHERE runner_id = 'runner-0' AND lease_id = 'lease-0001'", ())],
        "runner-0", "no leases row for lease 'lease-0001'"),
    "a runners row extra": (
        [("INSERT INTO runners SELECT 'runner-7', target, state, accepting, generation, policy_revision, base_dir,"
          " cpu_seconds, memory_bytes, proxy_id, proxy_revision, post_session_hook_digest, drain_signal,"
          " drain_requested_at, drain_deadline_at, active_lease_count, parked_lease_count, settled_lease_count,"
          " updated_at, version, seq FROM runners WHERE runner_id = 'runner-0'", ())],
        "runner-7", "runners row for a runner the replay does not have"),
}


@pytest.mark.parametrize("case", sorted(READ_MODEL_FORGERIES))
def test_every_read_model_row_is_compared_whatever_the_position_says(fleet_log: FleetLog, tmp_path: Path,
                                                                    case: str) -> None:
    statements, runner, reason = READ_MODEL_FORGERIES[case]
    path = copy_store(fleet_log[0], tmp_path / "models.db")
    edit_caches(path, *statements)
    code, report = audit_json(path)
    assert code == 65, report
    assert any(problem["stream"] == runner and reason in problem["reason"] for problem in report["problems"]), report
    # show answers from the replay, never from the read models: the forgery is not what it prints.
    shown = json.loads(run("show", path, "--json").stdout)
    assert shown["runners"]["runner-1"]["state"] == "accepting" and "runner-7" not in shown["runners"]

def private_key_file(directory: Path) -> Path:
    """The keyed store's key as 64 hex characters, in a file only its owner may read."""
    path = directory / "store.key"
    path.write_text(KEY.hex())
    path.chmod(0o600)
    return path


def test_a_forged_snapshot_in_a_keyed_store_fails_the_audit_and_rebuild_rewrites_it(keyed_log: Path,
                                                                                      tmp_path: Path) -> None:
    key_file = private_key_file(tmp_path)
    path = copy_store(keyed_log, tmp_path / "forged.db")
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    ((seq, state),) = conn.execute("SELECT seq, state FROM snapshots WHERE stream = 'runner-2'").fetchall()
    conn.close()
    # Whoever lacks the key edits the state and keeps everything else: the tag no longer covers it.
    changed = json.loads(state[TAG_BYTES:])
    changed["resources"] = {"cpu_seconds": 86_400, "memory_bytes": 64 << 30}
    edit_caches(path, ("UPDATE snapshots SET state = ? WHERE stream = 'runner-2'",
                  (state[:TAG_BYTES] + json.dumps(changed).encode(),)))
    code, report = audit_json(path, "--key-file", str(key_file))
    assert code == 65 and report["first_bad_seq"] == seq and report["stream"] == "runner-2"
    assert "has a tag that does not verify" in report["reason"] and "under its key" in report["reason"]

    done = run("rebuild", path)  # a keyed store's snapshots need its key to be tagged
    assert done.returncode == 77 and "--key-file" in one_error_line(done)
    assert audit_json(path, "--key-file", str(key_file))[0] == 65  # and nothing was rewritten
    done = run("rebuild", path, "--key-file", key_file)
    assert done.returncode == 0, done.stderr
    code, report = audit_json(path, "--key-file", str(key_file))
    assert code == 0 and report["snapshots_checked"] == 3 and report["warnings"] == []


def test_a_snapshot_from_before_snapshots_were_tagged_is_a_warning_when_it_equals_the_replay(
        fleet_log: FleetLog, tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "old-format.db")
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    ((seq, state),) = conn.execute("SELECT seq, state FROM snapshots WHERE stream = 'runner-1'").fetchall()
    conn.close()
    edit_caches(path, ("UPDATE snapshots SET state = ? WHERE stream = 'runner-1'", (state[TAG_BYTES:],)))
    code, report = audit_json(path)
    assert code == 0 and report["snapshots_checked"] == 3
    assert report["warnings"] == [f"snapshot of 'runner-1' at seq {seq} has no tag (written before snapshots were "
                                  "tagged): commands ignore it; rebuild rewrites it"]
    changed = json.loads(state[TAG_BYTES:])
    changed["state"] = "parked"
    edit_caches(path, ("UPDATE snapshots SET state = ? WHERE stream = 'runner-1'", (json.dumps(changed).encode(),)))
    code, report = audit_json(path)
    assert code == 65 and report["stream"] == "runner-1" and "differs from the replayed state" in report["reason"]

def test_a_keyed_store_needs_its_key_and_never_shows_it(keyed_log: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw.key"
    raw.write_bytes(KEY)
    hexed = tmp_path / "hex.key"
    hexed.write_text(KEY.hex() + "\n")
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(bytes(32))
    malformed = tmp_path / "short.key"
    malformed.write_text("abc")
    for key_file in (raw, hexed, wrong, malformed):
        key_file.chmod(0o600)  # a key others may read is refused before it is read

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
    # worker finds the next row's prev no longer links; the first bad seq is the boundary row, and the
    # report is what one process reports, which stops there.
    boundary = LONG_EVENTS // 2
    tampered = copy_store(long_log, tmp_path / "boundary.db")
    attack(tampered, ("UPDATE events SET hash = zeroblob(32) WHERE seq = ?", (boundary,)))
    code, report = audit_json(tampered, "--jobs", "2")
    assert code == 65 and report["jobs"] == 2
    assert report["first_bad_seq"] == boundary and "hash does not match" in report["reason"]
    assert [problem["seq"] for problem in report["problems"]] == [boundary]
    _, alone = audit_json(tampered, "--jobs", "1")
    assert {**report, "jobs": 1} == alone

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
        bad = store.append_unchecked("runner-3", [LeaseSettled(lease_id="lease-3-0", lease_generation=1,
                                                     result_digest=DIGEST)])  # settled long ago
        store.seal()
    code, report = audit_json(path, "--jobs", "3")
    assert code == 65 and report["jobs"] == 2  # three asked, two ranges of at least 10,000 events
    assert (report["first_bad_seq"], report["stream"]) == (bad[0].seq, "runner-3")
    assert "LeaseSettled breaks the rules" in report["reason"]



@pytest.mark.parametrize("command", ["audit", "rebuild"])
def test_a_worker_that_dies_exits_70_not_65(command: str, long_log: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # A worker killed (the OOM killer, an operator) proves nothing about the log: not the data error of a bad one.
    from lifecycle_es.workers import WorkerError, Workers

    def killed(self: Workers) -> list[object]:
        raise WorkerError("worker 0 was killed by signal 9: no message")

    path = copy_store(long_log, tmp_path / "whole.db")
    before = path.read_bytes()
    monkeypatch.setattr(Workers, "results", killed)
    assert cli_main([command, str(path), "--jobs", "2"]) == 70
    assert "worker 0 was killed by signal 9" in capsys.readouterr().err
    assert path.read_bytes() == before

def test_usage_errors_exit_64_and_missing_files_66(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = fleet_log[0]
    for args in ((), ("audit",), ("audit", path, "--jobs", "0"), ("audit", path, "--jobs", "two"),
                 ("audit", path, "--jobs", "-1"), ("audit", path, "--jobs", str(10**9)), ("audit", path, "--bogus"),
                 ("nonsense", path)):
        done = run(*args)
        assert done.returncode == 64, (args, done.stderr)
        assert "Traceback" not in done.stderr and "error:" in done.stderr
        assert "--jobs" not in args or "argument --jobs" in done.stderr, done.stderr
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


def test_a_bar_for_a_library_call_tells_the_rate_since_the_call_began(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    now = [100.0]
    monkeypatch.setattr(render.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = render.Bar("show")
    now[0] += 2.0  # the first page took two seconds before the first call
    bar(PROGRESS_MIN_TOTAL // 2, PROGRESS_MIN_TOTAL)
    assert f"(50%, {PROGRESS_MIN_TOTAL // 4:,}/s)" in sys.stderr.getvalue(), sys.stderr.getvalue()


@pytest.mark.parametrize(("command", "edit"), [
    ("show", "UPDATE events SET body = x'7b' WHERE seq = 5000"),  # a body that is no JSON: the fold stops there
    ("rebuild", "UPDATE events SET body = x'7b' WHERE seq = 5000"),
    ("export", "UPDATE events SET stream = CAST(x'72756eff' AS TEXT) WHERE seq = 5000"),  # export decodes no body
])
def test_a_command_that_fails_midway_erases_its_bar_before_its_error_line(command: str, edit: str, long_log: Path,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    path = copy_store(long_log, tmp_path / "edited.db")
    attack(path, (edit, ()))
    edit_caches(path, ("DELETE FROM snapshots", ()))  # show folds the log in one pass, as far as the edited row
    monkeypatch.setattr(render, "PROGRESS_MIN_TOTAL", 1)
    monkeypatch.setattr(sys, "stderr", Terminal())
    out = [str(tmp_path / "export.jsonl")] if command == "export" else []
    assert cli_main([command, str(path), *out]) == 65
    drawn = sys.stderr.getvalue()
    assert f"\r{command} [" in drawn and drawn.endswith("\n") and drawn.count("\n") == 1, drawn
    assert f"\r\x1b[2Klifecycle-es {command}: error: integrity failure at seq 5000" in drawn, drawn


def test_show_draws_progress_for_long_tails_after_old_snapshots(long_log: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    with EventStore.open(long_log, read_only=True) as store:
        snapshots = [store.backend.snapshot(runner) for runner in store.streams()]
        tails = store.head().seq - sum(found[0] for found in snapshots if found is not None)
    assert any(snapshots)
    # Ten runners, thousands of events each after its snapshot or without one: the bar counts those events.
    monkeypatch.setattr(render, "PROGRESS_MIN_TOTAL", tails)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert cli_main(["show", str(long_log)]) == 0
    drawn = sys.stderr.getvalue()
    assert "\rshow [" in drawn and f"{tails:,}/{tails:,}" in drawn and drawn.endswith("\r\x1b[2K"), drawn


def test_show_of_one_runner_draws_progress_for_its_long_tail(long_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    with EventStore.open(long_log, read_only=True) as store:
        assert store.backend.snapshot("runner-9") is None  # appended after the caches were rebuilt
        tail = store.stream_version("runner-9")
    monkeypatch.setattr(render, "PROGRESS_MIN_TOTAL", tail)  # thousands of its events to fold
    for argv in (["runner-9"], ["runner-9", "--json"]):
        monkeypatch.setattr(sys, "stderr", Terminal())
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert cli_main(["show", str(long_log), *argv]) == 0
        shown = sys.stderr.getvalue()
        assert "\rshow [" in shown and f"{tail:,}/{tail:,}" in shown and shown.endswith("\r\x1b[2K"), shown
        assert "show [" not in out.getvalue() and "runner-9" in out.getvalue()


@pytest.mark.parametrize("command", ["show", "rebuild", "export"])
def test_show_rebuild_and_export_draw_progress_on_a_terminal_only(command: str, fleet_log: FleetLog, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    path = tmp_path / "copy.db"
    shutil.copy(fleet_log[0], path)
    monkeypatch.setattr(render, "PROGRESS_MIN_TOTAL", 1)  # the fixture's log is shorter than a bar's threshold
    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        out = [str(tmp_path / f"export-{drawn}.jsonl")] if command == "export" else []
        assert cli_main([command, str(path), *out]) == 0
        assert (f"\r{command} [" in stream.getvalue()) is drawn, stream.getvalue()
        assert stream.getvalue().endswith("\r\x1b[2K") is drawn  # the bar is erased before the output
