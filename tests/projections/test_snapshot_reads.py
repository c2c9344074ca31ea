"""Reads from snapshots equal a fold of the log from its start, at every seq, whatever snapshots were taken.

`states_at`, `fleet` and `state_at` (with a progress callback too) start each runner from its proven
snapshot and fold only the tail: a second path to every state, so hypothesis holds it to the first one (a
fold of the log's first N events through the rules, no snapshot, no projection helper) on logs of several
runners the rules allow (parks, drains, reclaims, rotations, unit facts), with snapshots taken after
random appends, then with those snapshots edited as anyone with write access to the store could (a byte
flipped, another stream's row, a version or seq moved, the event hash changed, the tag cut): an edited
snapshot is never folded from. On both backends.
"""

from __future__ import annotations

from itertools import groupby

from fleets import truncated_replay
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from targets import Places, raw_sql

from lifecycle_es import EventStore
from lifecycle_es.canonical import iso_ms
from lifecycle_es.replay import load, write_snapshot
from lifecycle_es.testing import event_logs
from projections import fleet, fleet_of, state_at, states_at

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
EDITS = ("flip", "other stream", "version", "seq", "event hash", "cut", "none")


def assert_reads_equal_the_fold(store: EventStore, seqs: list[int]) -> None:
    for seq in seqs:
        truth = truncated_replay(store, seq)
        assert states_at(store, seq) == truth, seq
        assert fleet(store, at_seq=seq) == fleet_of(truth, seq), seq
        for runner_id in store.streams():
            assert state_at(store, runner_id, seq) == truth.get(runner_id), (runner_id, seq)
            told: list[tuple[int, int]] = []  # a page at a time, through the same fold
            assert state_at(store, runner_id, seq, progress=lambda *done, to=told: to.append(done)) == truth.get(
                runner_id)
            assert all(0 <= done <= total for done, total in told), told
            assert told and told[-1][0] == told[-1][1], told  # it ends at its end, (0, 0) when nothing was folded


@SETTINGS
@given(data=st.data())
def test_reads_from_any_snapshots_equal_a_fold_from_the_start(places: Places, data: st.DataObject) -> None:
    runners = data.draw(st.integers(1, 3), label="runners")
    logs = [data.draw(event_logs(max_commands=15, runner_id=f"runner-{n}"), label=f"runner-{n}")
            for n in range(runners)]
    # One log of the runners' events by time; a runner's events at one time are one append (a park with its cause).
    merged = sorted(((at_ms, n, event) for n, log in enumerate(logs) for at_ms, event in log), key=lambda e: e[0])
    path = places.new()
    with EventStore.open(path) as store:
        for (at_ms, n), group in groupby(merged, key=lambda item: (item[0], item[1])):
            stream = f"runner-{n}"
            store.append(stream, [event for _, _, event in group], at=iso_ms(at_ms))
            if data.draw(st.booleans(), label=f"snapshot of {stream}"):
                folded = load(store, stream, use_snapshot=False)
                recorded = store.event_at(folded.seq)
                assert recorded is not None
                with store.transaction("snapshot"):
                    write_snapshot(store, stream, folded, recorded.hash)
        head = store.head().seq
        seqs = sorted({0, head, *data.draw(st.lists(st.integers(0, head), max_size=4), label="seqs")})
        assert_reads_equal_the_fold(store, seqs)
        with raw_sql(path) as run:
            rows = run("SELECT stream, version, seq, state, event_hash FROM snapshots ORDER BY stream")
            for stream, version, seq, blob, event_hash in rows:
                blob, event_hash = bytes(blob), bytes(event_hash)
                edit = data.draw(st.sampled_from(EDITS), label=f"edit of {stream}")
                if edit == "flip":
                    at = data.draw(st.integers(0, len(blob) - 1), label="byte")
                    blob = blob[:at] + bytes([blob[at] ^ 1]) + blob[at + 1:]
                elif edit == "other stream" and len(rows) > 1:
                    _, version, seq, blob, event_hash = data.draw(st.sampled_from([r for r in rows if r[0] != stream]))
                elif edit in ("version", "seq"):
                    step = data.draw(st.sampled_from([-1, 1]), label="step")
                    version, seq = (version + step, seq) if edit == "version" else (version, seq + step)
                elif edit == "event hash":
                    event_hash = bytes(len(event_hash))
                elif edit == "cut":
                    blob = blob[:data.draw(st.integers(0, len(blob) - 1), label="cut at")]
                run("UPDATE snapshots SET version = ?, seq = ?, state = ?, event_hash = ? WHERE stream = ?",
                    (version, seq, bytes(blob), bytes(event_hash), stream))
        assert_reads_equal_the_fold(store, seqs)
