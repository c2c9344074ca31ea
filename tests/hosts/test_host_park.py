"""hosts.park: the busy/idle/waiting rules (examples and properties) and the status file format."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from waiting import returns_within

from hosts.park import (
    LOCAL_PARK_THRESHOLD_MS,
    STATUS_LIMIT,
    UNREADABLE,
    Busy,
    Idle,
    StatusReport,
    Task,
    Waiting,
    busy_state,
    drain_state,
    parking_decision,
    parse_status,
    read_status,
    write_status,
)
from hosts.proc import UnitFileError

NOW = 1_767_225_600_000
T = LOCAL_PARK_THRESHOLD_MS

KNOWN = ["running", "ready", "sleeping", "waiting", "completing", "blocked", "done"]
times = st.integers(min_value=NOW - 10 * T, max_value=NOW + 10 * T)
tasks_st = st.builds(
    Task,
    id=st.text(max_size=5),
    state=st.sampled_from([*KNOWN, "paused", UNREADABLE]),
    until=st.none() | times,
)
task_lists = st.lists(tasks_st, max_size=8)
thresholds = st.integers(min_value=0, max_value=5 * T)


def task(state: str, until: int | None = None, tid: str = "t") -> Task:
    return Task(id=tid, state=state, until=until)


# --- examples: the seed's rules one by one ------------------------------------------------------------


def test_no_tasks_is_idle() -> None:
    assert busy_state([], NOW, T) == Idle()
    assert drain_state([], NOW) == Idle()


def test_a_running_or_ready_task_is_busy() -> None:
    assert busy_state([task("running")], NOW, T) == Busy()
    assert busy_state([task("ready")], NOW, T) == Busy()


def test_a_task_that_only_sleeps_far_away_is_waiting_and_near_is_busy() -> None:
    far, near = NOW + T + 1, NOW + T
    assert busy_state([task("sleeping", far)], NOW, T) == Waiting(far)
    assert busy_state([task("running", far)], NOW, T) == Waiting(far)  # running, but only sleeping
    assert busy_state([task("sleeping", near)], NOW, T) == Busy()  # exactly the threshold keeps it up
    assert busy_state([task("sleeping", NOW - 1)], NOW, T) == Busy()  # overdue: about to run
    assert busy_state([task("sleeping", far), task("sleeping", far + 5)], NOW, T) == Waiting(far)
    assert busy_state([task("sleeping", far), task("sleeping", near)], NOW, T) == Busy()


def test_dependent_blocked_and_done_tasks_never_keep_it_up() -> None:
    for state in ("waiting", "completing", "blocked", "done"):
        assert busy_state([task(state)], NOW, T) == Idle()
        assert busy_state([task(state), task("sleeping", NOW + 2 * T)], NOW, T) == Waiting(NOW + 2 * T)


def test_unknown_shapes_are_busy() -> None:
    assert busy_state([task("paused")], NOW, T) == Busy()
    assert busy_state([task(UNREADABLE)], NOW, T) == Busy()
    assert busy_state([task("sleeping", None)], NOW, T) == Busy()  # a sleeper with no deadline
    assert drain_state([task("paused")], NOW) == Busy()


def test_drain_counts_any_sleeper_as_waiting() -> None:
    near = NOW + 10
    assert busy_state([task("sleeping", near)], NOW, T) == Busy()
    assert drain_state([task("sleeping", near)], NOW) == Waiting(near)
    assert drain_state([task("sleeping", NOW - 5)], NOW) == Waiting(NOW - 5)
    assert drain_state([task("running"), task("sleeping", near)], NOW) == Busy()


# --- properties -----------------------------------------------------------------------------------------


@given(task_lists, times, thresholds, st.randoms())
def test_order_does_not_matter(tasks: list[Task], now: int, threshold: int, rnd) -> None:
    shuffled = list(tasks)
    rnd.shuffle(shuffled)
    assert busy_state(tasks, now, threshold) == busy_state(shuffled, now, threshold)
    assert drain_state(tasks, now) == drain_state(shuffled, now)


@given(task_lists, times, thresholds, st.sampled_from(["waiting", "completing", "blocked", "done"]))
def test_adding_a_task_that_cannot_run_changes_nothing(tasks: list[Task], now: int, threshold: int,
                                                        state: str) -> None:
    more = [*tasks, task(state)]
    assert busy_state(more, now, threshold) == busy_state(tasks, now, threshold)
    assert drain_state(more, now) == drain_state(tasks, now)


@given(task_lists, times, thresholds, st.sampled_from(["running", "ready", "paused", UNREADABLE]))
def test_a_task_that_needs_the_unit_makes_it_busy(tasks: list[Task], now: int, threshold: int, state: str) -> None:
    assert busy_state([*tasks, task(state)], now, threshold) == Busy()
    assert drain_state([*tasks, task(state)], now) == Busy()


@given(task_lists, times, thresholds)
def test_waiting_means_every_sleeper_is_beyond_the_threshold(tasks: list[Task], now: int, threshold: int) -> None:
    result = busy_state(tasks, now, threshold)
    sleepers = [t.until for t in tasks if t.until is not None and t.state in ("running", "ready", "sleeping")]
    if isinstance(result, Waiting):
        assert sleepers and result.until == min(sleepers) and result.until - now > threshold
    if isinstance(result, Idle):
        assert not sleepers


@given(task_lists, times, thresholds)
def test_drain_is_never_more_busy_than_parking(tasks: list[Task], now: int, threshold: int) -> None:
    parking, draining = busy_state(tasks, now, threshold), drain_state(tasks, now)
    if not isinstance(parking, Busy):
        assert draining == parking
    # A lower threshold never makes a unit busier.
    if isinstance(busy_state(tasks, now, threshold + 1), Waiting):
        assert isinstance(parking, Waiting)


# --- the status file ----------------------------------------------------------------------------------


@given(st.lists(st.builds(Task, id=st.text(max_size=8), state=st.sampled_from(KNOWN), until=st.none() | times),
                max_size=6), times)
def test_write_then_read_round_trips(tmp_path_factory, tasks: list[Task], updated: int) -> None:
    run_dir = tmp_path_factory.mktemp("run")
    write_status(run_dir, tasks, updated)
    assert read_status(run_dir) == StatusReport(tasks=tuple(tasks), updated_at=updated)


def test_the_file_is_the_documented_json_written_0600_without_leftovers(tmp_path: Path) -> None:
    write_status(tmp_path, [task("sleeping", NOW + 2 * T, "t1")], NOW)
    path = tmp_path / "status.json"
    assert json.loads(path.read_bytes()) == {"tasks": [{"id": "t1", "state": "sleeping", "until": NOW + 2 * T}],
                                             "updated_at": NOW}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == ["status.json"]
    report = read_status(tmp_path)
    assert report is not None and busy_state(report.tasks, NOW, T) == Waiting(NOW + 2 * T)


def test_a_missing_file_is_none(tmp_path: Path) -> None:
    assert read_status(tmp_path) is None


def test_what_cannot_be_read_counts_as_busy() -> None:
    for raw in (b"", b"{", b"[]", b'{"tasks": 3}', b"\xff\xfe"):
        report = parse_status(raw)
        assert busy_state(report.tasks, NOW, T) == Busy(), raw
    report = parse_status(b'{"tasks": [7, {"id": 1, "state": "done"}, {"id": "a", "state": "done", "until": 1.5},'
                          b' {"id": "b", "state": "sleeping", "until": true}], "updated_at": "x"}')
    assert [t.state for t in report.tasks] == [UNREADABLE] * 4 and report.updated_at is None
    assert busy_state(report.tasks, NOW, T) == Busy()
    fine = parse_status(b'{"tasks": [{"id": "a", "state": "done"}], "updated_at": 5, "extra": 1}')
    assert fine == StatusReport(tasks=(Task(id="a", state="done"),), updated_at=5)


def test_nesting_too_deep_for_the_decoder_counts_as_busy() -> None:
    for raw in (b"[" * 100_000, b'{"tasks": [' + b"[" * 100_000):
        report = parse_status(raw)
        assert [t.state for t in report.tasks] == [UNREADABLE]


@pytest.mark.parametrize("kind", ["link-to-a-report", "link-to-dev-zero", "fifo", "directory", "larger-than-limit"])
def test_a_status_file_that_breaks_the_rules_is_a_unit_failure(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "status.json"
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"tasks": []}')
    if kind == "link-to-a-report":
        path.symlink_to(elsewhere)
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as f:
            f.truncate(STATUS_LIMIT + 1)
    with pytest.raises(UnitFileError, match=r"status\.json"):
        returns_within(lambda: read_status(tmp_path), 10, fifo=path if kind == "fifo" else None)
    with pytest.raises(UnitFileError):
        parking_decision(tmp_path, NOW, T)


def test_a_status_file_at_the_limit_is_read(tmp_path: Path) -> None:
    body = b'{"tasks": [], "updated_at": 5}'
    (tmp_path / "status.json").write_bytes(body + b" " * (STATUS_LIMIT - len(body)))
    assert read_status(tmp_path) == StatusReport(tasks=(), updated_at=5)


# --- the seed's park verbs around the pure decisions ------------------------------------------------


def test_parking_decision_reads_the_units_report(tmp_path) -> None:
    from hosts.park import Task, Waiting, parking_decision, write_status

    assert parking_decision(tmp_path, 1_000, 60_000) is None  # no report: the unit stays up
    write_status(tmp_path, [Task(id="t", state="sleeping", until=200_000)], 1_000)
    assert parking_decision(tmp_path, 1_000, 60_000) == Waiting(200_000)
    assert parking_decision(tmp_path, 150_000, 60_000) is None  # the wait is now within the threshold


def test_watch_parking_calls_on_park_once_the_work_only_waits(tmp_path) -> None:
    import threading

    from hosts.park import Task, watch_parking, write_status

    parked: list[int] = []
    write_status(tmp_path, [Task(id="t", state="running")], 0)
    stop = threading.Event()
    ticks = iter(range(10))

    def poll_then_report(interval: float) -> bool:
        # Stands in for stop.wait: the unit's next report arrives after the first look.
        if next(ticks) == 0:
            write_status(tmp_path, [Task(id="t", state="sleeping", until=500_000)], 0)
        return False

    stop.wait = poll_then_report  # type: ignore[method-assign]
    assert watch_parking(tmp_path, threshold_ms=60_000, now=lambda: 0, on_park=parked.append, stop=stop) == 500_000
    assert parked == [500_000]
    stopped = threading.Event()
    stopped.set()
    assert watch_parking(tmp_path, threshold_ms=60_000, now=lambda: 0, on_park=parked.append, stop=stopped) is None


def test_drain_returns_when_no_work_needs_the_unit_or_at_the_deadline(tmp_path) -> None:
    from hosts.park import Busy, Idle, Task, drain, write_status

    clock = [0]

    def sleep(seconds: float) -> None:
        clock[0] += int(seconds * 1000)

    write_status(tmp_path, [Task(id="t", state="running")], 0)
    assert drain(tmp_path, deadline=1_000, now=lambda: clock[0], sleep=sleep) == Busy()
    assert clock[0] >= 1_000
    write_status(tmp_path, [Task(id="t", state="done")], 0)
    assert drain(tmp_path, deadline=10_000, now=lambda: clock[0], sleep=sleep) == Idle()


def test_record_wake_appends_the_wake_under_the_rules(tmp_path) -> None:
    from hosts.park import record_wake
    from lifecycle_es import EventStore, InvalidInputError, Resources, RunnerLifecycle

    with EventStore.open(tmp_path / "e.db", now=lambda: 1_767_225_600_000) as store:
        lifecycle = RunnerLifecycle(store, runner_id="r", target="local", base_dir=str(tmp_path),
                                    resources=Resources(cpu_seconds=1, memory_bytes=64 << 20),
                                    post_session_hook_digest="sha256:" + "a" * 64, now=lambda: 1_767_225_600_000)
        lifecycle.initialize()
        # A wake is a unit fact: recorded only for a lease the runner holds.
        proxy = {"id": "proxy-1", "revision": 1, "issued_at": "2026-01-01T00:00:00.000Z",
                 "expires_at": "2026-01-01T01:00:00.000Z"}
        lease_id = lifecycle.acquire_lease(session_id="s", expected_generation=1, proxy_authority=proxy).lease.id
        record_wake(lifecycle, lease_id, 1_767_225_700_000)
        last = list(store.read())[-1]
        assert (last.type, last.event.wake_at) == ("UnitWakeRecorded", 1_767_225_700_000)
        head = store.head()
        with pytest.raises(InvalidInputError):
            record_wake(lifecycle, lease_id, -5)
        assert store.head() == head
