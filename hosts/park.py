"""Parking and drain decisions from a unit's own report of its tasks (the original host driver's park, adapted).

A unit reports its tasks through ``status.json`` in its run directory. The format (UTF-8 JSON)::

    {"tasks": [{"id": "t1", "state": "running", "until": null},
               {"id": "t2", "state": "sleeping", "until": 1767225600000}],
     "updated_at": 1767225540000}

- ``tasks``: every live or recently ended task of the unit. ``id`` is a string; ``until`` is an epoch-ms
  integer or null; ``state`` is one of:

  - ``running``, ``ready``: the task runs or is ready to run. With ``until`` it only sleeps until then
    (a retry backoff, a deferred poll): the same as ``sleeping``.
  - ``sleeping``: the task only sleeps until ``until`` (required; a sleeper with no deadline is an
    unknown shape).
  - ``waiting``, ``completing``: the task depends on other tasks, which decide.
  - ``blocked``: nothing can run the task; it never keeps the unit up.
  - ``done``: ended.

- ``updated_at``: epoch ms of the write (what the unit's clock said).

The unit writes the file atomically (a temporary file in the same directory, fsynced, renamed over
``status.json``: `write_status` does that), so a reader never sees half a report. Anything this module
does not know (another state, a task that is not an object, a wrong type, a file that is not JSON)
counts as a task that needs the unit: a unit whose report cannot be read is kept up rather than parked
mid-work. No file at all is `read_status` returning None; the driver then knows nothing and keeps the
unit up too.

The unit is not trusted with the host's resources, though: ``status.json`` is opened without following
a link and without blocking, must be a regular file, and may hold at most `STATUS_LIMIT` bytes (1 MiB,
far more than any report needs; `lifecycle_es.files` reads it). A link, a FIFO, a device or a larger
file is `UnitFileError`: the unit broke the host's rules, and the host ends it as a failed unit
(`hosts.local`).

The decisions are pure (no clock, no I/O): `busy_state` for parking, `drain_state` for drain. Around
them, as the original's park module has them: `parking_decision` and `watch_parking` (when a unit may be
parked), `drain` (wait until no work needs the unit, or the deadline) and `record_wake` (the wake
time written to the log before the unit is stopped).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import msgspec

from lifecycle_es.errors import InvalidInputError
from lifecycle_es.events import UnitWakeRecorded
from lifecycle_es.files import read_regular
from lifecycle_es.lifecycle import RunnerLifecycle
from lifecycle_es.values import safe_id

from .proc import unit_file_error
from .rundir import STATUS_FILE

# A wait no longer than this keeps the unit up: far above twice the time a unit takes to start.
LOCAL_PARK_THRESHOLD_MS = 60_000
# The most ``status.json`` may hold: a report of thousands of tasks fits many times over.
STATUS_LIMIT = 1 << 20
RUNNABLE = frozenset({"running", "ready"})
DEPENDENT = frozenset({"waiting", "completing"})
# Not a state a unit writes: what a task this module could not read becomes (it counts as busy).
UNREADABLE = "unreadable"


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """One task of a unit's report: its id, state, and the epoch ms it sleeps until (or None)."""

    id: str
    state: str
    until: int | None = None


class StatusReport(msgspec.Struct, frozen=True, kw_only=True):
    """A unit's ``status.json``: its tasks and when it wrote them (None when the file did not say)."""

    tasks: tuple[Task, ...]
    updated_at: int | None = None


class Busy(msgspec.Struct, frozen=True):
    """Work needs the unit now."""


class Idle(msgspec.Struct, frozen=True):
    """No task could run: the unit can stop and is started again on demand."""


class Waiting(msgspec.Struct, frozen=True):
    """Every task that could run only sleeps until at least `until` (epoch ms)."""

    until: int


BusyState = Busy | Idle | Waiting


def _sleep_deadline(task: Task) -> int | None:
    """The deadline of a task that only sleeps, or None when it does not (or its shape is unknown)."""
    if task.state == "sleeping" or (task.state in RUNNABLE and task.until is not None):
        return task.until if type(task.until) is int else None
    return None


def _classify(tasks: Iterable[Task]) -> tuple[bool, list[int]]:
    """(whether some task needs the unit now, the deadlines of the tasks that only sleep)."""
    busy, deadlines = False, []
    for task in tasks:
        deadline = _sleep_deadline(task)
        if deadline is not None:
            deadlines.append(deadline)
        elif task.state in DEPENDENT or task.state in ("blocked", "done"):
            continue  # decided by other tasks, never runnable, or ended: none keeps the unit up itself
        else:
            busy = True  # running or ready with no deadline, a sleeper without one, or an unknown shape
    return busy, deadlines


def busy_state(tasks: Sequence[Task], now: int, threshold_ms: int = LOCAL_PARK_THRESHOLD_MS) -> BusyState:
    """Whether the unit's work needs it: a running or ready task does, unless it only sleeps until a
    deadline more than `threshold_ms` after `now`. Waiting and completing tasks leave it to the tasks
    they depend on; blocked and done tasks never keep it up; an unknown shape does. No task that could
    run: Idle. Only far sleepers: Waiting until the earliest deadline."""
    busy, deadlines = _classify(tasks)
    if busy:
        return Busy()
    if not deadlines:
        return Idle()
    earliest = min(deadlines)
    return Waiting(earliest) if earliest - now > threshold_ms else Busy()


def drain_state(tasks: Sequence[Task], now: int) -> BusyState:
    """The drain's view: as `busy_state`, but any sleeping task counts as waiting however short (or
    past) its wait, since stopping the unit ends the sleep and the next start resumes it."""
    busy, deadlines = _classify(tasks)
    if busy:
        return Busy()
    return Waiting(min(deadlines)) if deadlines else Idle()


def _task(raw: object) -> Task:
    """A task entry as read; one that is not the documented shape becomes an unreadable (busy) task."""
    if not isinstance(raw, dict):
        return Task(id="", state=UNREADABLE)
    tid, state, until = raw.get("id"), raw.get("state"), raw.get("until")
    if not isinstance(tid, str) or not isinstance(state, str) or not (until is None or type(until) is int):
        return Task(id=tid if isinstance(tid, str) else "", state=UNREADABLE)
    return Task(id=tid, state=state, until=until)


def parse_status(data: bytes) -> StatusReport:
    """A report from the bytes of ``status.json``; what cannot be read counts as one busy task."""
    try:
        raw = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):  # nesting too deep for the decoder is unreadable too
        return StatusReport(tasks=(Task(id="", state=UNREADABLE),))
    if not isinstance(raw, dict) or not isinstance(raw.get("tasks"), list):
        return StatusReport(tasks=(Task(id="", state=UNREADABLE),))
    updated = raw.get("updated_at")
    return StatusReport(tasks=tuple(_task(t) for t in raw["tasks"]),
                        updated_at=updated if type(updated) is int else None)


def read_status(run_dir: str | os.PathLike[str]) -> StatusReport | None:
    """The unit's report from ``<run_dir>/status.json``, or None when it wrote none.

    Raises `UnitFileError` when the file is a link, not a regular file, larger than `STATUS_LIMIT`,
    or unreadable (see the module docstring).
    """
    path = Path(run_dir) / STATUS_FILE
    try:
        data = read_regular(path, limit=STATUS_LIMIT, what=STATUS_FILE)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise unit_file_error(exc, path, STATUS_FILE) from exc
    return parse_status(data)


def write_status(run_dir: str | os.PathLike[str], tasks: Sequence[Task], updated_at: int) -> None:
    """Write a report atomically, as a unit must (temporary file, fsync, rename over status.json)."""
    path = Path(run_dir) / STATUS_FILE
    tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
    body = msgspec.json.encode({"tasks": [msgspec.structs.asdict(t) for t in tasks], "updated_at": updated_at})
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def parking_decision(run_dir: str | os.PathLike[str], now: int, threshold_ms: int) -> Waiting | None:
    """Waiting(until) when the unit's report says its work only waits beyond `threshold_ms`; else None.

    No report, or one that cannot be parsed, is None: a unit the host knows nothing about stays up. A
    report file that breaks the rules raises `UnitFileError` (see `read_status`).
    """
    report = read_status(run_dir)
    if report is None:
        return None
    decision = busy_state(report.tasks, now, threshold_ms)
    return decision if isinstance(decision, Waiting) else None


def watch_parking(run_dir: str | os.PathLike[str], *, threshold_ms: int, now: Callable[[], int],
                  on_park: Callable[[int], None], stop: threading.Event, poll_interval: float = 0.5) -> int | None:
    """Watch a unit's report until its work only waits beyond the threshold, then call `on_park(until)`.

    Returns the wake time it parked for, or None when `stop` was set first. The host records the wake
    (`record_wake`) and stops the unit inside `on_park`, so the wake is written before the unit goes.
    """
    while not stop.is_set():
        decision = parking_decision(run_dir, now(), threshold_ms)
        if decision is not None:
            on_park(decision.until)
            return decision.until
        stop.wait(poll_interval)
    return None


def drain(run_dir: str | os.PathLike[str], *, deadline: int, now: Callable[[], int],
          sleep: Callable[[float], None] = time.sleep, poll_interval: float = 0.1) -> BusyState:
    """Wait until no task needs the unit (its report reads Idle or Waiting) or `deadline` (epoch ms).

    Returns the last classification: Busy means the deadline passed with work running, which the
    stop interrupts. A unit with no report is Busy: only its exit, or the deadline, ends its drain. A
    report file that breaks the rules raises `UnitFileError` (see `read_status`).
    """
    while True:
        report = read_status(run_dir)
        state = drain_state(report.tasks, now()) if report is not None else Busy()
        if not isinstance(state, Busy) or now() >= deadline:
            return state
        sleep(poll_interval)


def record_wake(lifecycle: RunnerLifecycle, lease_id: str, wake_at: int) -> None:
    """Record in the log that the unit of `lease_id` only waits until `wake_at` (epoch ms).

    Written before the unit is stopped: a host that dies in between finds the wake in the log and
    finishes the park; reconcile starts the unit again at that time.
    """
    if type(wake_at) is not int or wake_at < 0:
        raise InvalidInputError("wake_at", f"wake_at must be epoch milliseconds, got {wake_at!r}")
    lifecycle.record_host_facts([UnitWakeRecorded(lease_id=safe_id(lease_id, "lease_id"), wake_at=wake_at)])
