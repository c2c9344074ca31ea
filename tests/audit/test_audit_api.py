"""lifecycle_es.audit as a user calls it: a path or an open store, a report with checks and typed problems,
worker processes from a plain script and from a thread, progress as a callback, only LifecycleErrors."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from fleets import KEY, attack, copy_store

import lifecycle_es
from lifecycle_es import AuditReport, EventStore, InvalidInputError, LifecycleError, Problem, StoreKeyError, audit
from lifecycle_es.walk import MIN_RANGE_EVENTS


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_whole_log_reports_every_check_proved(fleet_log: tuple[Path, dict[str, int]]) -> None:
    path, facts = fleet_log
    report = audit(path)
    assert isinstance(report, AuditReport)
    assert report.ok and report.first_problem is None and report.problems == []
    with EventStore.open(path, read_only=True) as store:
        streams = len(store.streams())
    assert report.events == facts["head"] == report.head[0]
    assert report.streams == streams > 1
    assert report.checks["schema"] is True and report.checks["chain"] is True and report.checks["rules"] is True
    assert report.checks["read_models"] is True
    assert report.checks["seal"] is True and report.seal is not None  # the seal beside the file, by default


def test_an_open_store_can_be_audited_and_is_left_open(fleet_log: tuple[Path, dict[str, int]]) -> None:
    path, facts = fleet_log
    with EventStore.open(path, read_only=True) as store:
        report = audit(store)
        assert report.ok and report.events == facts["head"]
        assert report.checks["seal"] is True  # an open store's seal beside it is checked too
        assert store.head().seq == facts["head"]  # still usable


def test_an_edited_event_is_a_chain_problem_naming_its_seq(fleet_log: tuple[Path, dict[str, int]],
                                                          tmp_path: Path) -> None:
    copy = copy_store(fleet_log[0], tmp_path / "edited.db", seal=False)
    attack(copy, ("UPDATE events SET at = '2026-01-01T00:00:00.001Z' WHERE seq = 3", ()))
    before = digest(copy)
    report = audit(copy)
    assert not report.ok
    first = report.first_problem
    assert isinstance(first, Problem)
    assert (first.seq, first.kind) == (3, "chain")
    assert report.checks["chain"] is False
    assert digest(copy) == before  # reading changed nothing


def test_a_dropped_trigger_is_a_schema_problem(fleet_log: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    import apsw

    copy = copy_store(fleet_log[0], tmp_path / "schema.db", seal=False)
    conn = apsw.Connection(str(copy))
    conn.execute("DROP TRIGGER events_no_delete")
    conn.close()
    report = audit(copy)
    assert not report.ok
    assert [problem.kind for problem in report.problems] == ["schema"]
    assert report.checks["schema"] is False and report.checks["chain"] is True


def test_a_keyed_store_needs_its_key_and_a_key_for_an_unkeyed_one_is_a_problem(
        keyed_log: Path, fleet_log: tuple[Path, dict[str, int]]) -> None:
    with pytest.raises(StoreKeyError):
        audit(keyed_log)
    assert audit(keyed_log, key=KEY).ok
    report = audit(fleet_log[0], key=KEY)
    assert not report.ok
    assert [problem.kind for problem in report.problems] == ["key"]
    assert "downgrade" in report.problems[0].reason


@pytest.mark.parametrize(("option", "value"), [("jobs", 0), ("jobs", True), ("jobs", "2"), ("key", b"short"),
                                               ("progress", "bar"), ("seal", "\udcff.seal")])
def test_bad_arguments_are_invalid_input_naming_the_field(fleet_log: tuple[Path, dict[str, int]], option: str,
                                                          value: object) -> None:
    with pytest.raises(InvalidInputError) as raised:
        audit(fleet_log[0], **{option: value})  # type: ignore[arg-type]
    assert raised.value.field == option


def test_what_cannot_be_audited_raises_only_lifecycle_errors(tmp_path: Path) -> None:
    for target in (tmp_path / "missing.db", tmp_path, b"not a path"):
        with pytest.raises(LifecycleError):
            audit(target)  # type: ignore[arg-type]
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(LifecycleError):
        audit(junk)


def test_progress_is_a_callback_and_the_library_draws_nothing(long_log: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[int, int]] = []
    report = audit(long_log, progress=lambda done, total: seen.append((done, total)))
    assert report.ok
    assert seen and seen[-1] == (report.events, report.events)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_jobs_share_the_work_and_agree_with_one_process(long_log: Path) -> None:
    one = audit(long_log)
    two = audit(long_log, jobs=2)
    assert one.events >= 2 * MIN_RANGE_EVENTS
    assert two.jobs == 2 and one.jobs == 1
    assert (two.ok, two.events, two.streams, two.head) == (one.ok, one.events, one.streams, one.head)


def test_jobs_from_a_thread(long_log: Path) -> None:
    found: list[AuditReport] = []
    thread = threading.Thread(target=lambda: found.append(audit(long_log, jobs=2)))
    thread.start()
    thread.join(300)
    assert found and found[0].ok and found[0].jobs == 2


def test_jobs_from_a_plain_script_without_a_main_guard(long_log: Path, tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        import lifecycle_es
        report = lifecycle_es.audit({str(long_log)!r}, jobs=2)
        print(report.ok, report.jobs, report.events)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    ok, jobs, events = done.stdout.split()
    assert (ok, jobs) == ("True", "2") and int(events) >= 2 * MIN_RANGE_EVENTS


def test_the_report_is_plain_json_values(fleet_log: tuple[Path, dict[str, int]]) -> None:
    import json

    data = json.loads(json.dumps(audit(fleet_log[0]).as_dict()))
    assert data["ok"] is True and data["checks"]["chain"] is True and data["problems"] == []
    assert lifecycle_es.audit is audit
