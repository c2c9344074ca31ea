"""The rules of the host driver's unit facts: each held, like a command's input, to what a host writes.

A unit fact (``UnitStarting`` ... ``UnitWakeRecorded``) records a host driver's side effect on the
unit of one lease. Recorded through `RunnerLifecycle.record_host_facts` or replayed from the log, a
fact passes every check below, or nothing is appended (the command path) and the replay fails at its
seq (IntegrityError):

- its lease is one the runner retains (StaleFenceError otherwise); a start (``UnitStarting``,
  ``UnitStarted``) needs the lease active at the generation the fact names;
- ``UnitStarted`` follows a ``UnitStarting`` of the same lease with the same mode and run directory
  (and, for a systemd unit, the same unit name), with no end of that unit recorded in between;
- every field lies within what a host driver writes (the sets in ``events.py``): the mode ``child``
  or ``systemd``; a run directory absolute, normalized and named after the lease (the host's run root
  is the host's to check); a child's pid (2..4194304) and start ticks, or a systemd unit's name; an
  exit code 0..255 or a signal name (not both); outcomes, reasons and the signals sent from their sets
  (a stop's ``signals``: each at most once);
  a command of at most 256 arguments of at most 8192 characters, without NUL.

A malformed field is InvalidInputError naming it. The checks are set lookups, precompiled patterns and
integer comparisons: a replay runs them for every unit fact of the log.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .canonical import MAX_EPOCH_MS
from .draft import RunnerDraft
from .errors import InvalidInputError, StaleFenceError
from .events import (
    HOST_LABEL_RE,
    MAX_ARG_CHARS,
    MAX_COMMAND_ARGS,
    MAX_EXIT_CODE,
    MAX_PID,
    SIGNAL_NAME_RE,
    UNIT_MODES,
    UNIT_NAME_RE,
    UNIT_OUTCOMES,
    UNIT_SIGNAL_REASONS,
    UNIT_SIGNALS_SENT,
    UNIT_STOP_REASONS,
    Event,
    UnitExited,
    UnitRecord,
    UnitSignalled,
    UnitStarted,
    UnitStarting,
    UnitStopped,
    UnitWakeRecorded,
)
from .state import Lease, UnitIntent
from .values import MAX_SAFE_INTEGER, safe_id, safe_int, safe_path, shown


def _lease(draft: RunnerDraft, lease_id: object) -> Lease:
    # A retained lease's id passed the id check when it was granted: only an id not found needs one.
    lease = draft.lease(lease_id) if type(lease_id) is str else None
    if lease is None:
        safe_id(lease_id, "lease_id")
        raise StaleFenceError(f"unit fact names a lease the runner does not hold (lease_id {lease_id}): it never "
                              "had one, or retention dropped it")
    return lease


def _startable(draft: RunnerDraft, lease_id: object, lease_generation: object) -> Lease:
    lease = _lease(draft, lease_id)
    generation = safe_int(lease_generation, "lease_generation", 1)
    if lease.status != "active":
        raise StaleFenceError(f"a unit may only start for an active lease (lease_id {lease.id}): lease {lease.id} is "
                              f"{lease.status} (a host starts no unit for an ended lease)")
    if lease.generation != generation:
        raise StaleFenceError(f"a unit may only start for an active lease (lease_id {lease.id}): lease {lease.id} was "
                              f"granted at generation {lease.generation}, not lease_generation {generation} (pass "
                              "the lease_generation of its receipt)")
    return lease


def _member(value: object, allowed: frozenset[str], field: str) -> str:
    if type(value) is not str or value not in allowed:
        raise InvalidInputError(field, f"{field} is invalid: {shown(value)} is not one of {', '.join(sorted(allowed))}")
    return value


def _matching(value: object, pattern: Any, field: str, what: str) -> str:
    if type(value) is not str or pattern.fullmatch(value) is None:
        raise InvalidInputError(field, f"{field} is invalid: {shown(value)} is not {what}")
    return value


def _run_dir(value: object, lease_id: str, field: str) -> str:
    run_dir = safe_path(value, field)
    if os.path.basename(run_dir) != lease_id:
        raise InvalidInputError(field, f"{field} is invalid: {shown(run_dir)} is not the lease's run directory "
                                       f"(<run root>/{lease_id})")
    return run_dir


def _command(command: object) -> None:
    if not isinstance(command, tuple | list) or len(command) > MAX_COMMAND_ARGS:
        raise InvalidInputError("command", f"command must be a list of at most {MAX_COMMAND_ARGS} arguments, "
                                           f"got {shown(command)}")
    for arg in command:
        if type(arg) is not str or len(arg) > MAX_ARG_CHARS or "\0" in arg:
            raise InvalidInputError("command", f"command argument {shown(arg)} is not a string of at most "
                                               f"{MAX_ARG_CHARS} characters without NUL")
        if not arg.isascii():
            try:
                arg.encode()
            except UnicodeEncodeError:
                raise InvalidInputError("command", f"command argument {shown(arg)} is not valid text") from None
    if command and not command[0]:
        raise InvalidInputError("command", "command[0] is empty")


def _intent(draft: RunnerDraft, lease_id: str) -> UnitIntent | None:
    intents: tuple[UnitIntent, ...] = draft.units_starting
    for intent in intents:
        if intent.lease_id == lease_id:
            return intent
    return None


def forget_start(draft: RunnerDraft, lease_id: str) -> None:
    """Drop the announced start of `lease_id`'s unit, if any (its unit started or ended, or its lease did).

    Callers look at ``draft.units_starting`` first: mostly empty, it spares them the call.
    """
    starting = draft.units_starting
    if any(intent.lease_id == lease_id for intent in starting):
        draft.units_starting = tuple(intent for intent in starting if intent.lease_id != lease_id)


def _unit_starting(draft: RunnerDraft, event: UnitStarting, at_ms: int, at: str) -> None:
    lease = _startable(draft, event.lease_id, event.lease_generation)
    mode = _member(event.mode, UNIT_MODES, "mode")
    run_dir = _run_dir(event.run_dir, lease.id, "run_dir")
    if mode == "systemd":
        _matching(event.unit, UNIT_NAME_RE, "unit", "a systemd unit name (1-200 of A-Z a-z 0-9 : _ . -)")
    elif event.unit is not None:
        raise InvalidInputError("unit", f"unit is invalid: a child-mode unit has no unit name, got {shown(event.unit)}")
    _command(event.command)
    if draft.units_starting:
        forget_start(draft, lease.id)
    draft.units_starting = (*draft.units_starting,
                            UnitIntent(lease_id=lease.id, mode=mode, run_dir=run_dir, unit=event.unit))


def _unit_started(draft: RunnerDraft, event: UnitStarted, at_ms: int, at: str) -> None:
    lease = _startable(draft, event.lease_id, event.lease_generation)
    handle = event.handle
    if type(handle) is not UnitRecord:
        raise InvalidInputError("handle", f"handle must be a UnitRecord, got {type(handle).__name__}")
    intent = _intent(draft, lease.id)
    if intent is None:
        raise StaleFenceError(f"a unit is recorded started only after its UnitStarting (lease_id {lease.id}: "
                              "no start announced, or its unit already started or ended)")
    if handle.mode != intent.mode:
        raise InvalidInputError("handle.mode", f"handle.mode is invalid: {shown(handle.mode)}, the start "
                                               f"announced {intent.mode}")
    if handle.run_dir != intent.run_dir:
        raise InvalidInputError("handle.run_dir", f"handle.run_dir is invalid: {shown(handle.run_dir)}, the start "
                                                  f"announced {shown(intent.run_dir)}")
    _matching(handle.host, HOST_LABEL_RE, "handle.host", "a host name (1-255 printable ASCII characters)")
    _matching(handle.boot_id, HOST_LABEL_RE, "handle.boot_id", "a boot id (1-255 printable ASCII characters)")
    if intent.mode == "child":
        safe_int(handle.pid, "handle.pid", 2, MAX_PID)
        safe_int(handle.start_ticks, "handle.start_ticks", 0, MAX_SAFE_INTEGER)
        if handle.unit is not None:
            raise InvalidInputError("handle.unit", f"handle.unit is invalid: a child-mode unit has no unit name, "
                                                   f"got {shown(handle.unit)}")
    else:
        if handle.unit != intent.unit:
            raise InvalidInputError("handle.unit", f"handle.unit is invalid: {shown(handle.unit)}, the start "
                                                   f"announced {shown(intent.unit)}")
        for field, value in (("handle.pid", handle.pid), ("handle.start_ticks", handle.start_ticks)):
            if value is not None:
                raise InvalidInputError(field, f"{field} is invalid: a systemd unit is found by its name, "
                                               f"got {shown(value)}")
    forget_start(draft, lease.id)  # it holds this lease's start, found above


def _unit_signalled(draft: RunnerDraft, event: UnitSignalled, at_ms: int, at: str) -> None:
    _lease(draft, event.lease_id)
    _member(event.signal, UNIT_SIGNALS_SENT, "signal")
    _member(event.reason, UNIT_SIGNAL_REASONS, "reason")


def _unit_exited(draft: RunnerDraft, event: UnitExited, at_ms: int, at: str) -> None:
    lease = _lease(draft, event.lease_id)
    code, signal = event.code, event.signal
    if code is not None:
        safe_int(code, "code", 0, MAX_EXIT_CODE)
    if signal is not None:
        _matching(signal, SIGNAL_NAME_RE, "signal", "a signal name (SIG and 1-16 of A-Z 0-9 +)")
        if code is not None:
            raise InvalidInputError("code", f"code is invalid: a unit ends by an exit code or a signal, not both "
                                            f"(code {code}, signal {signal})")
    _member(event.outcome, UNIT_OUTCOMES, "outcome")
    if draft.units_starting:
        forget_start(draft, lease.id)


def _unit_stopped(draft: RunnerDraft, event: UnitStopped, at_ms: int, at: str) -> None:
    lease = _lease(draft, event.lease_id)
    _member(event.reason, UNIT_STOP_REASONS, "reason")
    signals = event.signals
    if signals or type(signals) is not tuple:  # () is the common case: one cheap check
        if type(signals) is not tuple or len(signals) > len(UNIT_SIGNALS_SENT):  # a str is not a tuple either
            raise InvalidInputError("signals", f"signals is invalid: {shown(signals)} is not a tuple of at most "
                                               f"{len(UNIT_SIGNALS_SENT)} signals")
        for sent in signals:
            _member(sent, UNIT_SIGNALS_SENT, "signals")
        if len(set(signals)) != len(signals):
            raise InvalidInputError("signals", f"signals is invalid: {shown(signals)} names a signal twice")
    if draft.units_starting:
        forget_start(draft, lease.id)


def _unit_wake_recorded(draft: RunnerDraft, event: UnitWakeRecorded, at_ms: int, at: str) -> None:
    _lease(draft, event.lease_id)
    safe_int(event.wake_at, "wake_at", 0, MAX_EPOCH_MS)


UNIT_HANDLERS: dict[type[Event], Callable[[RunnerDraft, Any, int, str], None]] = {
    UnitStarting: _unit_starting,
    UnitStarted: _unit_started,
    UnitSignalled: _unit_signalled,
    UnitExited: _unit_exited,
    UnitStopped: _unit_stopped,
    UnitWakeRecorded: _unit_wake_recorded,
}
"""The rule of each kind of unit fact (``runner.step`` dispatches to them)."""
