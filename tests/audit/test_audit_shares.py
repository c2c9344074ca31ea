"""The audit's walkers of a split pass, each reading only its seq range (and the row before it) and its own
runners' rows: together they still find every problem one walk over every row finds, at the same seq and
of the same kind.

The log is long enough for two ranges, its runners' events interleaved from its start to its end, so that
each walker's runners have events in the other walker's range.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import apsw
import pytest
from fleets import attack, copy_store, rechain, smuggled

from lifecycle_es import AuditReport, EventStore, audit
from lifecycle_es.walk import counted, open_for_audit, owners, split


@pytest.fixture
def interleaved(interleaved_log: Path) -> Path:
    return interleaved_log


def copied(source: Path, target: Path) -> Path:
    return copy_store(source, target, seal=False)


def shares(path: Path) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """The two ranges of the pass over `path`, and which walker replays each runner."""
    with contextlib.closing(open_for_audit(str(path), None)) as store:
        ranges = split(store.head().seq, 2)
        return ranges, owners(counted(store), len(ranges))


def row_of(path: Path, owner: int, seqs: tuple[int, int], type_: str = "LeaseSettled") -> tuple[int, str, bytes]:
    """(seq, stream, body) of a `type_` event inside `seqs` of a runner the walker `owner` replays."""
    _, owned = shares(path)
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    with contextlib.closing(conn):
        for seq, stream, body in conn.execute("SELECT seq, stream, body FROM events WHERE seq BETWEEN ? AND ?"
                                              " AND type = ? ORDER BY seq", (*seqs, type_)):
            if owned[stream] == owner and seq not in seqs:  # not at a range's end
                return seq, stream, body
    raise AssertionError(f"no {type_} of a runner of walker {owner} in {seqs}")


def both(path: Path) -> tuple[AuditReport, AuditReport]:
    """The report of one walk over every row, and of the pass split in two (which must split)."""
    one, two = audit(path), audit(path, jobs=2)
    assert (one.jobs, two.jobs) == (1, 2)
    return one, two


def whole(report: AuditReport) -> dict[str, object]:
    """Everything the report says but how many processes said it."""
    found = report.as_dict()
    del found["jobs"]
    return found


def same_first_problem(path: Path, seq: int, kind: str) -> tuple[AuditReport, AuditReport]:
    """Both reports, whose first problem must be at `seq` and of `kind`, and which must say the same in every
    other respect too (the problems, the checks, the runners' states and leases as of the seq before)."""
    one, two = both(path)
    assert one.first_problem is not None and two.first_problem is not None, (one.problems, two.problems)
    assert (one.first_problem.seq, one.first_problem.kind) == (seq, kind), one.problems
    assert (two.first_problem.seq, two.first_problem.kind) == (seq, kind), two.problems
    assert two.events == one.events == seq - 1
    assert whole(two) == whole(one)
    return one, two


def test_the_walkers_runners_have_events_in_each_others_ranges(interleaved: Path) -> None:
    ranges, owned = shares(interleaved)
    assert len(ranges) == 2 and sorted(set(owned.values())) == [0, 1]
    for owner in (0, 1):
        for seqs in ranges:
            row_of(interleaved, owner, seqs)
    one, two = both(interleaved)
    assert one.ok and two.ok, two.problems
    assert (two.events, two.runners, two.head, two.states) == (one.events, one.runners, one.head, one.states)
    assert two.snapshots_checked == one.snapshots_checked > 0
    assert two.read_models_checked == one.read_models_checked == 10


@pytest.mark.parametrize("part", [0, 1])
def test_a_deleted_row_inside_a_range_is_named_at_its_seq(interleaved: Path, tmp_path: Path, part: int) -> None:
    ranges, _ = shares(interleaved)
    first, last = ranges[part]
    gap = (first + last) // 2
    path = copied(interleaved, tmp_path / "gap.db")
    attack(path, ("DELETE FROM events WHERE seq = ?", (gap,)))
    same_first_problem(path, gap, "chain")


def test_rows_deleted_at_the_end_of_the_first_range_are_named_where_they_begin(interleaved: Path,
                                                                              tmp_path: Path) -> None:
    # The first walker proves its range runs to its end; the second starts at the row before its range,
    # which is gone too: the first seq missing is the first walker's to name.
    ranges, _ = shares(interleaved)
    last = ranges[0][1]
    path = copied(interleaved, tmp_path / "cut.db")
    attack(path, ("DELETE FROM events WHERE seq BETWEEN ? AND ?", (last - 40, last)))
    same_first_problem(path, last - 40, "chain")


def test_a_truncated_tail_is_the_same_to_both(interleaved: Path, tmp_path: Path) -> None:
    # Rows cut off the log's end leave a shorter log whose chain and rules hold: its read models (beyond the
    # new head, and ahead of the replay) and its seal (at the old head) name it, to both alike.
    ranges, _ = shares(interleaved)
    head = ranges[-1][1]
    path = copied(interleaved, tmp_path / "tail.db")
    with EventStore.open(path) as store:
        store.seal()
    attack(path, ("DELETE FROM events WHERE seq > ?", (head - 300,)))
    one, two = both(path)
    assert one.checks["chain"] and one.checks["rules"] and one.checks["read_models"] is False, one.problems
    assert sorted(two.problems) == sorted(one.problems) and two.first_problem == one.first_problem
    assert two.events == one.events == head - 300 and two.checks == one.checks


@pytest.mark.parametrize(("owner", "inside"), [(0, 1), (1, 0)])
@pytest.mark.parametrize("rechained", [False, True], ids=["edited", "rechained"])
def test_an_event_of_one_walkers_runner_in_the_others_range_is_named_at_its_seq(
        interleaved: Path, tmp_path: Path, owner: int, inside: int, rechained: bool) -> None:
    # A LeaseSettled that settles a lease never acquired. Edited alone, its hash no longer matches (the
    # range's walker) and its replay breaks the rules (the runner's walker): the chain names it, as one walk
    # over every row does. Chained again as an attacker would, only the replay of its runner can tell.
    ranges, _ = shares(interleaved)
    seq, stream, body = row_of(interleaved, owner, ranges[inside])
    changed = body.replace(b'"lease_id":"lease-', b'"lease_id":"never-', 1)
    assert changed != body
    path = copied(interleaved, tmp_path / "settled.db")
    attack(path, ("UPDATE events SET body = ? WHERE seq = ?", (changed, seq)))
    if rechained:
        rechain(path)
    one, two = same_first_problem(path, seq, "rules" if rechained else "chain")
    assert two.first_problem == one.first_problem and one.first_problem.stream == stream


@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("column", ["hash", "at"])
def test_an_edit_at_a_ranges_end_is_one_problem_as_one_walk_finds(interleaved: Path, tmp_path: Path, where: str,
                                                                  column: str) -> None:
    # One walk stops at its first bad row. Split, the hash of the first range's last row is also the prev the
    # second walker links its range to, and an at set back breaks the chain (its range's walker) and the rules
    # (its runner's walker) alike: neither may add a second problem, nor mark the rules broken.
    ranges, _ = shares(interleaved)
    seq = ranges[0][1] if where == "last" else ranges[1][0]
    path = copied(interleaved, tmp_path / "end.db")
    value: object = bytes(32) if column == "hash" else "2025-01-01T00:00:00.000Z"
    attack(path, (f"UPDATE events SET {column} = ? WHERE seq = ?", (value, seq)))
    one, _ = same_first_problem(path, seq, "chain")
    assert len(one.problems) == 1 and one.checks["rules"] is None, one.problems


@pytest.mark.parametrize(("column", "value"), [("version", "x"), ("version", b"x"), ("stream", None),
                                               ("stream", b"runner-1"), ("stream", 7)])
@pytest.mark.parametrize("part", [0, 1])
def test_a_value_smuggled_past_strict_is_named_as_one_walk_names_it(interleaved: Path, tmp_path: Path, column: str,
                                                                   value: object, part: int) -> None:
    # A version that is not an integer is a stream's last version (text sorts after numbers): the runners
    # cannot be counted. A runner name that is not text cannot be shared out: every walker meets its row, and
    # the one whose range holds it names it as one walk does (the chain cannot hash it), not as a row it
    # could not place.
    ranges, _ = shares(interleaved)
    first, last = ranges[part]
    seq = (first + last) // 2
    path = copied(interleaved, tmp_path / "smuggled.db")
    smuggled(path, column, value, seq)
    same_first_problem(path, seq, "chain")


def test_a_worker_never_walks_a_file_put_in_place_of_the_one_opened(interleaved: Path, tmp_path: Path) -> None:
    # The workers open the store by its path: a clean copy renamed over an edited file once the audit's caller
    # opened it must not stand in for the edited rows of the workers' ranges.
    ranges, _ = shares(interleaved)
    seq = (ranges[1][0] + ranges[1][1]) // 2
    path = copied(interleaved, tmp_path / "edited.db")
    attack(path, ("UPDATE events SET hash = ? WHERE seq = ?", (bytes(32), seq)))
    clean = copied(interleaved, tmp_path / "clean.db")
    with EventStore.open(path, read_only=True) as store:
        os.replace(clean, path)
        one, two = audit(store), audit(store, jobs=2)
    assert one.first_problem is not None and one.first_problem.seq == seq, one.problems
    assert not two.ok and two.first_problem is not None, two.problems
    assert "another store" in two.first_problem.reason and "replaced" in two.first_problem.reason
