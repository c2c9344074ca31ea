"""The read models' rows: what the ``runners`` and ``leases`` tables hold for a replayed state.

Pure: a state in, a row out. The backend owns the tables and their statements (``Backend.upsert_runner_rows``
and the rest), `projections.read_models` keeps them in step with the log, and the audit compares every
stored row with the rows of a fresh replay (`compare_read_models`). Keeping the shape here, in the core,
is what lets the audit prove the read models without importing the read side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .state import Lease, RunnerState, lease_counts
from .values import shown

RUNNER_COLUMNS = ("runner_id", "target", "state", "accepting", "generation", "policy_revision", "base_dir",
                  "cpu_seconds", "memory_bytes", "proxy_id", "proxy_revision", "post_session_hook_digest",
                  "drain_signal", "drain_requested_at", "drain_deadline_at", "active_lease_count",
                  "parked_lease_count", "settled_lease_count", "updated_at", "version", "seq")
"""The ``runners`` table's columns, in the order rows hold them."""
LEASE_COLUMNS = ("runner_id", "lease_id", "session_id", "generation", "issued_at", "expires_at", "status",
                 "result_digest", "hook_receipt_digest")
"""The ``leases`` table's columns, in the order rows hold them."""

Row = tuple[Any, ...]
# Per runner id: (state, version, seq of its last event), as a replay leaves it.
Replayed = Mapping[str, tuple[RunnerState, int, int]]


def position_of(value: object) -> int:
    """A read-model position as stored: the integer, or -1 for any other value (text, a real, a boolean, NULL),
    which no log's seq is, so that the read models are started afresh (`projections.read_models`)."""
    return value if type(value) is int else -1


def runner_row(state: RunnerState, version: int, seq: int) -> Row:
    """The ``runners`` row of a state, folded up to `version` of its stream (`seq` in the log)."""
    active, parked, settled = lease_counts(state)
    drain = state.drain
    return (state.runner_id, state.target, state.state, int(state.state == "accepting"), state.generation,
            state.policy_revision, state.base_dir, state.resources.cpu_seconds, state.resources.memory_bytes,
            state.proxy_authority.id, state.proxy_authority.revision, state.post_session_hook_digest,
            drain.signal if drain else None, drain.requested_at if drain else None,
            drain.deadline_at if drain else None, active, parked, settled,
            state.updated_at, version, seq)


def lease_row(runner_id: str, lease: Lease) -> Row:
    """The ``leases`` row of a lease the runner retains."""
    return (runner_id, lease.id, lease.session_id, lease.generation, lease.issued_at, lease.expires_at,
            lease.status, lease.result_digest, lease.hook_receipt_digest)


def compare_read_models(runner_rows: Iterable[Row], lease_rows: Iterable[Row],
                        replayed: Replayed) -> list[tuple[str, str]]:
    """Every stored row against the rows of `replayed` (``{runner id: (state, version, seq)}``).

    Reports a row that differs (naming the columns), one the replay has and the table lacks, one the
    table has and the replay lacks (a lease row of a runner without a ``runners`` row included), and a
    row stored twice. Returns ``(runner id, what differs)`` pairs; empty when the tables equal the replay.
    """
    problems: list[tuple[str, str]] = []
    runners: dict[Any, Row] = {}
    for row in runner_rows:
        if row[0] in runners:
            problems.append((row[0], "runners row stored twice"))
        runners[row[0]] = row
    leases: dict[Any, dict[Any, Row]] = {}
    for row in lease_rows:
        by_id = leases.setdefault(row[0], {})
        if row[1] in by_id:
            problems.append((row[0], f"leases row {shown(row[1])} stored twice"))
        by_id[row[1]] = row
    for runner_id, (state, version, seq) in sorted(replayed.items()):
        stored_row = runners.pop(runner_id, None)
        if stored_row is None:
            problems.append((runner_id, "no runners row"))
        else:
            wanted = runner_row(state, version, seq)
            if stored_row != wanted:
                problems.append((runner_id, f"runners row differs from the replay: "
                                            f"{_differences(RUNNER_COLUMNS, stored_row, wanted)}"))
        retained = {lease.id: lease_row(runner_id, lease) for lease in state.leases}
        stored = leases.pop(runner_id, {})
        for lease_id in sorted(retained.keys() | stored.keys(), key=str):
            found, due = stored.get(lease_id), retained.get(lease_id)
            if found is None:
                problems.append((runner_id, f"no leases row for lease {shown(lease_id)}"))
            elif due is None:
                problems.append((runner_id, f"leases row {shown(lease_id)} for a lease the replay does not retain"))
            elif found != due:
                problems.append((runner_id, f"leases row {shown(lease_id)} differs from the replay: "
                                            f"{_differences(LEASE_COLUMNS, found, due)}"))
    problems.extend((runner_id, "runners row for a runner the replay does not have")
                    for runner_id in sorted(runners, key=str))
    problems.extend((runner_id, f"leases row {shown(lease_id)} for a runner the replay does not have")
                    for runner_id, stored in sorted(leases.items(), key=lambda item: str(item[0]))
                    for lease_id in sorted(stored, key=str))
    return problems


def _differences(columns: tuple[str, ...], found: Row, wanted: Row) -> str:
    """The columns where a stored row differs from the replay's: ``name stored (replay: value)``."""
    if len(found) != len(wanted):
        return f"{len(found)} columns where {len(wanted)} were due"
    return ", ".join(f"{name} {shown(have)} (replay: {shown(want)})"
                     for name, have, want in zip(columns, found, wanted, strict=True) if have != want)
