"""The read side: read models, snapshots, rebuild, state as of any seq and the fleet view equal a replay.

One mixed log drives most tests: five runners sharing one store, their commands interleaved,
leaving one runner in each state (two accepting) and leases of every status. The caches (SQL read
models and snapshots) are then compared with a fresh replay of the log, queried with plain SQL from a
connection of the test's own, dropped, corrupted, and rebuilt. On both backends: the store is a file, and
again a schema on a PostgreSQL server (edited there as its superuser would).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from fleets import truncated_replay
from holding import Held
from pg import Server
from targets import raw_sql

from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle, RunnerState
from lifecycle_es.backends import is_url
from lifecycle_es.caches import SnapshotCheck, check_read_models
from lifecycle_es.errors import InvalidInputError, StaleFenceError, StoreKeyError
from lifecycle_es.events import LeaseAcquired
from lifecycle_es.receipts import project
from lifecycle_es.replay import TAG_BYTES, load, snapshot_blob, snapshot_of
from lifecycle_es.state import encode_state
from lifecycle_es.store import WriteTransaction
from lifecycle_es.testing import FakeClock
from lifecycle_es.values import MAX_SAFE_INTEGER
from projections import (
    attach,
    fleet,
    read_lease_rows,
    rebuild,
    replay,
    replay_all,
    runner_at,
    state_at,
    states_at,
)

T0 = 1_700_000_000_000
HOOK = "sha256:" + "a" * 64
RESULT = "sha256:" + "b" * 64
RESOURCES = Resources(cpu_seconds=600, memory_bytes=1 << 30)
RUNNERS = {"runner-a": "local", "runner-b": "container", "runner-c": "ssh", "runner-d": "wsl", "runner-e": "local"}


def iso(epoch_ms: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=epoch_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def epoch_ms(at: str) -> int:
    delta = datetime.fromisoformat(at.replace("Z", "+00:00")) - datetime(1970, 1, 1, tzinfo=UTC)
    return delta // timedelta(milliseconds=1)


@dataclass
class Fleet:
    """A store shared by the five runners, the clock, and a handle per runner."""

    path: str
    store: EventStore
    clock: FakeClock
    base_dir: Path
    snapshot_every: int

    def handle(self, runner_id: str, store: EventStore | None = None) -> RunnerLifecycle:
        return RunnerLifecycle(store or self.store, runner_id=runner_id, target=RUNNERS[runner_id],
                               base_dir=str(self.base_dir), resources=RESOURCES, post_session_hook_digest=HOOK,
                               now=self.clock, snapshot_every=self.snapshot_every)

    def proxy(self, revision: int = 1) -> ProxyAuthority:
        return ProxyAuthority(id="proxy-1", revision=revision, issued_at=iso(self.clock.ms),
                              expires_at=iso(self.clock.ms + 600_000))


def open_fleet(tmp_path: Path, path: str, *, snapshot_every: int = 64) -> Fleet:
    clock = FakeClock(T0)
    base_dir = tmp_path / "base"
    base_dir.mkdir(exist_ok=True)
    return Fleet(path, EventStore.open(path, now=clock), clock, base_dir, snapshot_every)


def sql(path: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement on the store at `path`, through a connection of its own (see `targets.raw_sql`)."""
    with raw_sql(path) as run:
        return run(statement, params)


def run_mixed_commands(fleet_: Fleet) -> None:
    """Interleave commands on five runners; end with a, b accepting, e draining, c parked, d reclaiming."""
    h = {runner_id: fleet_.handle(runner_id) for runner_id in RUNNERS}
    for handle in h.values():
        handle.initialize()

    def lease(runner_id: str, session: str) -> str:
        handle = h[runner_id]
        snapshot = handle.snapshot()
        receipt = handle.acquire_lease(session_id=session, expected_generation=snapshot.generation,
                                       proxy_authority=fleet_.proxy(max(1, snapshot.proxy_authority.revision)))
        return receipt.lease.id

    a1, b1, a2, _c1, b2, a3, d1, _e1 = (lease(runner, f"session-{n}") for n, runner in enumerate(
        ["runner-a", "runner-b", "runner-a", "runner-c", "runner-b", "runner-a", "runner-d", "runner-e"]))
    fleet_.clock.advance(1_000)
    h["runner-a"].settle_lease(lease_id=a1, lease_generation=1, result_digest=RESULT)
    h["runner-b"].request_drain(expected_generation=1, timeout_ms=60_000)
    h["runner-a"].park_lease(lease_id=a2, lease_generation=1, result_digest=RESULT, reason="lost-poll")
    h["runner-c"].request_drain(expected_generation=1, timeout_ms=500)
    h["runner-b"].settle_lease(lease_id=b1, lease_generation=1, result_digest=RESULT)
    h["runner-d"].park_lease(lease_id=d1, lease_generation=1, result_digest=RESULT, reason="checkout-failure")
    h["runner-b"].settle_lease(lease_id=b2, lease_generation=1, result_digest=RESULT)  # last one: b parks
    h["runner-a"].rotate_proxy_authority(expected_generation=1, proxy_authority=fleet_.proxy(2))
    fleet_.clock.advance(500)
    h["runner-c"].park_expired_drain(expected_generation=2)
    h["runner-b"].authorize_post_session_hook(expected_runner_generation=3, lease_id=b1, lease_generation=1,
                                              result_digest=RESULT, hook_digest=HOOK)
    h["runner-d"].begin_reclaim(expected_generation=2, proxy_authority=fleet_.proxy(2))
    h["runner-b"].begin_reclaim(expected_generation=3, proxy_authority=fleet_.proxy(2))
    lease("runner-a", "session-8")
    h["runner-e"].request_drain(expected_generation=1, timeout_ms=60_000)
    h["runner-b"].complete_reclaim(expected_generation=4)
    h["runner-a"].assert_poll(lease_id=a3, lease_generation=1, proxy_authority_id="proxy-1",
                              proxy_authority_revision=2)


def replayed(store: EventStore) -> dict[str, tuple[RunnerState, int, int]]:
    """Every runner's (state, version, seq) after a full replay."""
    last: dict[str, tuple[RunnerState, int, int]] = {}
    for recorded, state in replay_all(store):
        last[recorded.stream] = (state, recorded.version, recorded.seq)
    return last


@pytest.fixture
def mixed(tmp_path: Path, store_target: str) -> Iterator[Fleet]:
    fleet_ = open_fleet(tmp_path, store_target, snapshot_every=3)
    attach(fleet_.store)
    run_mixed_commands(fleet_)
    yield fleet_
    fleet_.store.close()


# --- read models ----------------------------------------------------------------------------------------


def test_read_models_equal_a_replay_after_mixed_commands(mixed: Fleet) -> None:
    store = mixed.store
    assert store.backend.read_model_position() == store.head().seq
    states = replayed(store)
    assert sorted(states) == sorted(RUNNERS)
    assert check_read_models(store, states) == []
    # The check is able to fail: a row edited behind the projection's back is reported.
    parked = next(lease.id for lease in states["runner-a"][0].leases if lease.status == "parked")
    sql(mixed.path, "UPDATE runners SET generation = generation + 1 WHERE runner_id = 'runner-c'")
    sql(mixed.path, "DELETE FROM leases WHERE runner_id = 'runner-a' AND status = 'parked'")
    assert check_read_models(store, states) == [
        ("runner-a", f"no leases row for lease {parked!r}"),
        ("runner-c", "runners row differs from the replay: generation 4 (replay: 3)")]


def test_every_read_model_row_is_compared_with_the_replay(mixed: Fleet) -> None:
    store = mixed.store
    states = replayed(store)
    active = next(lease for lease in states["runner-e"][0].leases if lease.status == "active")
    forged = [
        ("UPDATE leases SET status = 'settled' WHERE lease_id = ?", (active.id,)),
        ("INSERT INTO leases VALUES ('runner-z', 'lease-z', 's', 1, '2026-01-01T00:00:00.000Z',"
         " '2026-01-01T00:10:00.000Z', 'active', NULL, NULL)", ()),
        ("INSERT INTO leases SELECT runner_id, 'lease-extra', session_id, generation, issued_at, expires_at, status,"
         " result_digest, hook_receipt_digest FROM leases WHERE lease_id = ?", (active.id,)),
        ("DELETE FROM runners WHERE runner_id = 'runner-d'", ()),
        ("INSERT INTO runners SELECT 'runner-y', target, state, accepting, generation, policy_revision, base_dir,"
         " cpu_seconds, memory_bytes, proxy_id, proxy_revision, post_session_hook_digest, drain_signal,"
         " drain_requested_at, drain_deadline_at, active_lease_count, parked_lease_count, settled_lease_count,"
         " updated_at, version, seq FROM runners WHERE runner_id = 'runner-a'", ()),
    ]
    with raw_sql(mixed.path) as run:  # as anyone with write access: no foreign keys enforced
        if is_url(mixed.path):
            run("SET session_replication_role = replica")  # a superuser's way past the foreign keys
        for statement, params in forged:
            run(statement, params)
    assert sorted(check_read_models(store, states)) == sorted([
        ("runner-d", "no runners row"),
        ("runner-e", "leases row 'lease-extra' for a lease the replay does not retain"),
        ("runner-e", f"leases row {active.id!r} differs from the replay: status 'settled' (replay: 'active')"),
        ("runner-y", "runners row for a runner the replay does not have"),
        ("runner-z", "leases row 'lease-z' for a runner the replay does not have"),
    ])


def test_read_model_rows_answer_plain_sql(mixed: Fleet) -> None:
    with raw_sql(mixed.path) as run:
        joined = "string_agg(runner_id, ',')" if is_url(mixed.path) else "group_concat(runner_id)"
        by_state = dict(run(
            f"SELECT state, {joined} FROM (SELECT state, runner_id FROM runners ORDER BY runner_id) AS r"
            " GROUP BY state"))
        assert by_state == {"accepting": "runner-a,runner-b", "draining": "runner-e", "parked": "runner-c",
                            "reclaiming": "runner-d"}
        active = dict(run("SELECT runner_id, count(*) FROM leases WHERE status = 'active' GROUP BY runner_id"))
        assert active == {"runner-a": 2, "runner-e": 1}
        generations = dict(run("SELECT runner_id, generation FROM runners"))
        assert generations == {runner_id: runner_at(mixed.store, runner_id).generation  # type: ignore[union-attr]
                               for runner_id in RUNNERS}
        hooked = run("SELECT runner_id, hook_receipt_digest IS NOT NULL FROM leases WHERE result_digest = ?"
                     " AND runner_id = 'runner-b' ORDER BY issued_at, lease_id", (RESULT,))
        assert sorted(flag for _, flag in hooked) == [0, 1]  # SQLite's 0 and 1, PostgreSQL's False and True
        (drain_row,) = run("SELECT drain_signal, drain_deadline_at FROM runners WHERE runner_id = 'runner-e'")
        assert drain_row == ("SIGTERM", iso(T0 + 1_500 + 60_000))


@pytest.mark.parametrize("runner_id", ["", "not an id", "../runner-a", None, 7, b"runner-a"])
def test_read_lease_rows_refuses_what_is_no_runner_id(store: EventStore, runner_id: Any) -> None:
    attach(store)
    with pytest.raises(InvalidInputError) as info:
        read_lease_rows(store, runner_id)
    assert info.value.field == "runner_id"
    assert read_lease_rows(store, "runner-a") == []


def test_read_models_catch_up_on_attach(tmp_path: Path, store_target: str) -> None:
    fleet_ = open_fleet(tmp_path, store_target)
    with fleet_.store:
        run_mixed_commands(fleet_)  # no read models attached while the log grew
        assert fleet_.store.backend.read_model_position() is None
        attach(fleet_.store)
        assert fleet_.store.backend.read_model_position() == fleet_.store.head().seq
        assert check_read_models(fleet_.store, replayed(fleet_.store)) == []


def test_read_models_catch_up_on_the_next_append_after_another_writer(tmp_path: Path, store_target: str) -> None:
    fleet_ = open_fleet(tmp_path, store_target)
    with fleet_.store, EventStore.open(fleet_.path, now=fleet_.clock) as other:
        attach(fleet_.store)
        mine = fleet_.handle("runner-a")
        mine.initialize()
        # Another connection, without read models, writes another runner's events.
        theirs = fleet_.handle("runner-b", store=other)
        theirs.initialize()
        theirs.acquire_lease(session_id="session-1", expected_generation=1, proxy_authority=fleet_.proxy())
        assert fleet_.store.backend.read_model_position() == 1 < fleet_.store.head().seq
        # The next append through the attached store folds in the events it missed, in its transaction.
        mine.request_drain(expected_generation=1)
        assert fleet_.store.backend.read_model_position() == fleet_.store.head().seq == 5
        assert check_read_models(fleet_.store, replayed(fleet_.store)) == []


GHOST_ROW = ("runner-ghost", "local", "accepting", 1, 1, 1, "/ghost", 1, 1, "proxy-1", 1, HOOK, None, None, None,
             0, 0, 0, "2023-11-14T22:13:20.000Z", 1, 1)


def _drain(handle: RunnerLifecycle) -> None:
    handle.request_drain(expected_generation=handle.snapshot().generation)


@pytest.mark.parametrize("position", [-1, 2**60, "ahead", "none", "text"],
                         ids=["negative", "beyond-any-seq", "beyond-the-head", "row-deleted", "not-a-number"])
def test_a_read_model_position_the_log_cannot_have_starts_the_tables_afresh(mixed: Fleet, position: int | str) -> None:
    """Tables whose position is past the head describe events the log does not hold (rows edited, or a log cut
    back under them): they are emptied and caught up from the start, never kept, nor resumed from that position
    (which would skip the events written next, up to it, for good)."""
    head = mixed.store.head().seq
    mixed.store.close()
    if position == "none":
        sql(mixed.path, "DELETE FROM read_model_position")
    elif position == "text":  # the table made again by hand, its seq a column of text
        sql(mixed.path, "DROP TABLE read_model_position")
        sql(mixed.path, "CREATE TABLE read_model_position (name TEXT PRIMARY KEY, seq TEXT NOT NULL)")
        sql(mixed.path, "INSERT INTO read_model_position (name, seq) VALUES ('read_models', 'abc')")
    else:
        sql(mixed.path, "UPDATE read_model_position SET seq = ?", (head + 6 if position == "ahead" else position,))
    sql(mixed.path, f"INSERT INTO runners VALUES ({', '.join(['?'] * len(GHOST_ROW))})", GHOST_ROW)
    with EventStore.open(mixed.path, now=mixed.clock) as other:  # a writer without the read models
        _drain(mixed.handle("runner-a", store=other))
    with EventStore.open(mixed.path, now=mixed.clock) as store:
        attach(store)
        assert store.backend.read_model_position() == head + 1
        assert check_read_models(store, replayed(store)) == []
        assert "runner-ghost" not in store.backend.read_model_rows("runners")[0]


def test_read_models_ahead_of_an_append_start_afresh_in_its_transaction(mixed: Fleet) -> None:
    """The same, found by an append of a store with the read models attached: its position is past the seq
    before the append's first event."""
    head = mixed.store.head().seq
    with EventStore.open(mixed.path, now=mixed.clock) as other:
        _drain(mixed.handle("runner-a", store=other))
    sql(mixed.path, "UPDATE read_model_position SET seq = ?", (head + 3,))
    sql(mixed.path, f"INSERT INTO runners VALUES ({', '.join(['?'] * len(GHOST_ROW))})", GHOST_ROW)
    mixed.handle("runner-b").rotate_proxy_authority(expected_generation=mixed.handle("runner-b").snapshot().generation,
                                                    proxy_authority=mixed.proxy(3))
    store = mixed.store
    assert store.backend.read_model_position() == store.head().seq == head + 2
    assert check_read_models(store, replayed(store)) == []


def test_read_models_never_fold_from_a_write_that_rolled_back(tmp_path: Path, store_target: str) -> None:
    fleet_ = open_fleet(tmp_path, store_target)
    with fleet_.store, EventStore.open(fleet_.path, now=fleet_.clock) as other:
        attach(fleet_.store)
        attach(other)  # another process with the read models attached, writing the same runner
        mine, theirs = fleet_.handle("runner-a"), fleet_.handle("runner-a", store=other)
        mine.initialize()
        at = iso(fleet_.clock.ms)
        phantom = LeaseAcquired(lease_id="lease-never", session_id="session-0", lease_generation=1, issued_at=at,
                                expires_at=iso(fleet_.clock.ms + 60_000), proxy_authority=fleet_.proxy())
        with pytest.raises(RuntimeError), fleet_.store.transaction("changed its mind") as tx:
            tx.append("runner-a", [phantom])
            raise RuntimeError("rolled back: the lease was never acquired")
        # The other writer appends at the version the rolled-back write had, and the read models follow it.
        lease = theirs.acquire_lease(session_id="session-1", expected_generation=1, proxy_authority=fleet_.proxy())
        # This writer's next append folds the read models from the log, not from what it rolled back.
        mine.settle_lease(lease_id=lease.lease.id, lease_generation=1, result_digest=RESULT)
        assert fleet_.store.backend.read_model_position() == fleet_.store.head().seq == 3
        assert check_read_models(fleet_.store, replayed(fleet_.store)) == []



def test_read_models_never_fold_from_a_batched_write_its_savepoint_undid(tmp_path: Path, store_target: str) -> None:
    fleet_ = open_fleet(tmp_path, store_target)
    with fleet_.store, EventStore.open(fleet_.path, now=fleet_.clock) as other:
        attach(fleet_.store)
        attach(other)
        mine, theirs = fleet_.handle("runner-a"), fleet_.handle("runner-a", store=other)
        mine.initialize()
        rollbacks = fleet_.store.rollbacks
        at = iso(fleet_.clock.ms)
        phantom = LeaseAcquired(lease_id="lease-never", session_id="session-0", lease_generation=1, issued_at=at,
                                expires_at=iso(fleet_.clock.ms + 60_000), proxy_authority=fleet_.proxy())

        def appends_then_fails(tx: WriteTransaction) -> None:
            tx.append("runner-a", [phantom])  # the read models fold it, then its savepoint undoes it
            raise RuntimeError("changed its mind")

        held = Held(fleet_.store)  # the failing work runs in a batch, under a savepoint, not alone
        held.queue("fails", lambda: fleet_.store.commit("fails", appends_then_fails))
        held.queue("reads", lambda: fleet_.store.commit("reads", lambda tx: tx.stream_version("runner-a")))
        outcomes = held.release()
        assert isinstance(outcomes["fails"], RuntimeError) and outcomes["reads"] == 1
        assert fleet_.store.rollbacks == rollbacks + 1
        lease = theirs.acquire_lease(session_id="session-1", expected_generation=1, proxy_authority=fleet_.proxy())
        mine.settle_lease(lease_id=lease.lease.id, lease_generation=1, result_digest=RESULT)
        assert fleet_.store.backend.read_model_position() == fleet_.store.head().seq == 3
        assert check_read_models(fleet_.store, replayed(fleet_.store)) == []


# --- snapshots and rebuild ------------------------------------------------------------------------------


def _stored_snapshots(store: EventStore) -> dict[str, tuple[int, int, bytes, bytes]]:
    found = {runner_id: store.backend.snapshot(runner_id) for runner_id in store.streams()}
    return {runner_id: snapshot for runner_id, snapshot in found.items() if snapshot is not None}


def test_rebuild_after_dropped_read_models_and_corrupted_snapshots(mixed: Fleet) -> None:
    store = mixed.store
    expected = {runner_id: state for runner_id, (state, _, _) in replayed(store).items()}
    assert len(_stored_snapshots(store)) >= 4  # snapshot_every=3 left one on most runners
    for table in ("leases", "runners", "read_model_position"):
        sql(mixed.path, f"DROP TABLE {table}")
    # Snapshots are a cache, not append-only: overwrite their state bytes with garbage.
    sql(mixed.path, "UPDATE snapshots SET state = ?", (b'{"not":"a state"}',))
    for runner_id in RUNNERS:
        assert snapshot_of(store, runner_id) is None  # bytes that do not decode are no snapshot
        assert mixed.handle(runner_id).state() == expected[runner_id]  # a fresh handle replays from the start
    report = rebuild(store)
    assert (report.events, report.runners) == (store.head().seq, len(RUNNERS))
    assert report.snapshots == len(RUNNERS)
    assert store.backend.read_model_position() == store.head().seq
    assert check_read_models(store, replayed(store)) == []
    check = SnapshotCheck(store)
    for recorded, state in replay_all(store):
        check.observe(recorded, state)
    assert (check.finish(), check.checked) == ([], len(RUNNERS))
    for runner_id in RUNNERS:
        snapshot = snapshot_of(store, runner_id)
        assert snapshot is not None and snapshot.state == expected[runner_id]
        assert mixed.handle(runner_id).state() == expected[runner_id]


def test_a_snapshot_naming_the_wrong_event_is_refused(mixed: Fleet) -> None:
    store = mixed.store
    runner_id = "runner-a"
    expected = replayed(store)[runner_id][0]
    version, seq, _, event_hash = store.backend.snapshot(runner_id)  # type: ignore[misc]
    assert snapshot_of(store, runner_id) is not None
    # A stale but well-formed state: trusted, it would hide every event since its first lease.
    early = load(store, runner_id, use_snapshot=False, until_seq=next(
        r.seq for r in store.read(stream=runner_id) if r.type == "LeaseAcquired")).state
    assert early is not None and early != expected
    other = next(r for r in store.read() if r.stream != runner_id)
    tampered = [
        ("zeroed hash", (version, seq, bytes(32))),
        ("another stream's event", (other.version, other.seq, other.hash)),
        ("version off by one", (version + 1, seq, event_hash)),
        ("a seq past the head", (version, store.head().seq + 10, event_hash)),
        # Beyond any seq a store holds: the read that checks it must not refuse it as a caller's bad argument.
        ("a seq no log holds", (version, MAX_SAFE_INTEGER + 2, event_hash)),
        ("the largest seq the column holds", (version, 2**63 - 1, event_hash)),
    ]
    for reason, (bad_version, bad_seq, bad_hash) in tampered:
        # Tagged as the store tags (what an unkeyed file's editor can do): the log is what refuses it.
        blob = snapshot_blob(store, runner_id, bad_version, bad_seq, bad_hash, encode_state(early))
        sql(mixed.path, "UPDATE snapshots SET version = ?, seq = ?, state = ?, event_hash = ? WHERE stream = ?",
            (bad_version, bad_seq, blob, bad_hash, runner_id))
        assert snapshot_of(store, runner_id) is None, reason
        assert mixed.handle(runner_id).state() == expected, reason
        assert state_at(store, runner_id) == expected, reason


def test_a_wrong_state_under_a_right_hash_is_caught_by_the_audit_check_and_rebuilt(mixed: Fleet) -> None:
    store = mixed.store
    runner_id = "runner-b"
    version, seq, _, event_hash = store.backend.snapshot(runner_id)  # type: ignore[misc]
    replayed_then = load(store, runner_id, use_snapshot=False, until_seq=seq).state
    assert replayed_then is not None
    wrong = msgspec.structs.replace(replayed_then, generation=replayed_then.generation + 7)
    # Tagged as the store tags (an unkeyed file's editor can): the tag verifies, the replay disagrees.
    blob = snapshot_blob(store, runner_id, version, seq, event_hash, encode_state(wrong))
    sql(mixed.path, "UPDATE snapshots SET state = ? WHERE stream = ?", (blob, runner_id))
    check = SnapshotCheck(store)
    for recorded, state in replay_all(store):
        check.observe(recorded, state)
    assert check.finish() == [(seq, runner_id, f"snapshot of {runner_id!r} differs from the replayed state")]
    rebuild(store)
    assert mixed.handle(runner_id).state() == replayed(store)[runner_id][0]


@pytest.mark.parametrize("impossible", [{"state": "bogus"}, {"lease_status": "weird"}], ids=["state", "lease status"])
def test_a_tagged_snapshot_of_a_state_no_replay_can_leave_is_ignored(mixed: Fleet, impossible: dict[str, str]) -> None:
    store = mixed.store
    version, seq, _, event_hash = store.backend.snapshot("runner-a")  # type: ignore[misc]
    then = load(store, "runner-a", use_snapshot=False, until_seq=seq).state
    assert then is not None and then.leases
    if "state" in impossible:
        wrong = msgspec.structs.replace(then, state=impossible["state"])
    else:
        lease = msgspec.structs.replace(then.leases[0], status=impossible["lease_status"])
        wrong = msgspec.structs.replace(then, leases=(lease, *then.leases[1:]))
    # Tagged as the store tags (an unkeyed file's editor can), with a value the rules never leave.
    blob = snapshot_blob(store, "runner-a", version, seq, event_hash, encode_state(wrong))
    sql(mixed.path, "UPDATE snapshots SET state = ? WHERE stream = ?", (blob, "runner-a"))
    assert snapshot_of(store, "runner-a") is None
    for at in (seq, store.head().seq):  # at the snapshot's seq no event of runner-a is folded after it
        truth = truncated_replay(store, at)
        assert states_at(store, at) == truth
        assert fleet(store, at_seq=at).runners == {runner: project(state) for runner, state in sorted(truth.items())}
        assert state_at(store, "runner-a", at) == truth["runner-a"]
    assert mixed.handle("runner-a").state() == replay(store)["runner-a"]


# --- snapshots a command may trust: only those it can prove ---------------------------------------------

KEY = bytes(range(32))
ATTACKER_HOOK = "sha256:" + "e" * 64


def _raw_snapshot(path: str, runner_id: str) -> bytes:
    ((blob,),) = sql(path, "SELECT state FROM snapshots WHERE stream = ?", (runner_id,))
    return bytes(blob)


def _write_raw_snapshot(path: str, runner_id: str, blob: bytes) -> None:
    sql(path, "UPDATE snapshots SET state = ? WHERE stream = ?", (blob, runner_id))


def _forge_snapshot(path: str, runner_id: str, **changes: Any) -> None:
    """Edit a snapshot's state as someone without the key would: its tag, seq and event hash kept."""
    blob = _raw_snapshot(path, runner_id)
    state = json.loads(blob[TAG_BYTES:])
    state.update(changes)
    _write_raw_snapshot(path, runner_id, blob[:TAG_BYTES] + json.dumps(state).encode())


@pytest.fixture
def keyed(tmp_path: Path, store_target: str) -> Iterator[Fleet]:
    """A keyed store, snapshots after every command: runner-a parked, runner-b accepting with a settled lease."""
    clock = FakeClock(T0)
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    path = store_target
    with EventStore.open(path, key=KEY, now=clock) as store:
        fleet_ = Fleet(path, store, clock, base_dir, snapshot_every=1)
        parked, busy = fleet_.handle("runner-a"), fleet_.handle("runner-b")
        for handle in (parked, busy):
            handle.initialize()
            first = handle.acquire_lease(session_id="session-1", expected_generation=1, proxy_authority=fleet_.proxy())
            handle.settle_lease(lease_id=first.lease.id, lease_generation=1, result_digest=RESULT)
        held = parked.acquire_lease(session_id="session-2", expected_generation=1, proxy_authority=fleet_.proxy())
        parked.park_lease(lease_id=held.lease.id, lease_generation=1, result_digest=RESULT, reason="lost-poll")
        assert parked.snapshot().state == "parked" and busy.snapshot().state == "accepting"
    # The key holder's next commands run on a fresh handle, as another process's would.
    with EventStore.open(path, key=KEY, now=clock) as store:
        yield Fleet(path, store, clock, base_dir, snapshot_every=1)


def test_a_forged_snapshot_in_a_keyed_store_does_not_grant_a_lease_on_a_parked_runner(keyed: Fleet) -> None:
    store = keyed.store
    assert snapshot_of(store, "runner-a") is not None  # the command would start from it: it is proven
    with pytest.raises(StaleFenceError) as honest:
        keyed.handle("runner-a").acquire_lease(session_id="session-3", expected_generation=2,
                                               proxy_authority=keyed.proxy())
    _forge_snapshot(keyed.path, "runner-a", state="accepting")
    assert snapshot_of(store, "runner-a") is None
    with pytest.raises(StaleFenceError) as forged:
        keyed.handle("runner-a").acquire_lease(session_id="session-3", expected_generation=2,
                                               proxy_authority=keyed.proxy())
    assert str(forged.value) == str(honest.value)  # refused as for a parked runner
    assert replay(store)["runner-a"].state == "parked"


def test_forged_resources_in_a_keyed_snapshot_are_not_used(keyed: Fleet) -> None:
    store = keyed.store
    assert snapshot_of(store, "runner-b") is not None
    _forge_snapshot(keyed.path, "runner-b", resources={"cpu_seconds": 86_400, "memory_bytes": 64 << 30})
    assert snapshot_of(store, "runner-b") is None
    assert keyed.handle("runner-b").state().resources == RESOURCES


def test_a_forged_hook_digest_in_a_keyed_snapshot_authorizes_no_hook(keyed: Fleet) -> None:
    store = keyed.store
    assert snapshot_of(store, "runner-a") is not None
    _forge_snapshot(keyed.path, "runner-a", post_session_hook_digest=ATTACKER_HOOK)
    assert snapshot_of(store, "runner-a") is None
    handle = keyed.handle("runner-a")
    settled = next(lease for lease in handle.state().leases if lease.status == "settled")
    with pytest.raises(StaleFenceError, match="post-session hook fence"):
        handle.authorize_post_session_hook(expected_runner_generation=2, lease_id=settled.id, lease_generation=1,
                                           result_digest=RESULT, hook_digest=ATTACKER_HOOK)
    # The log's digest is the one the command authorizes (and the snapshot it writes is proven again).
    handle.authorize_post_session_hook(expected_runner_generation=2, lease_id=settled.id, lease_generation=1,
                                       result_digest=RESULT, hook_digest=HOOK)
    rewritten = snapshot_of(store, "runner-a")
    assert rewritten is not None and rewritten.state == replay(store)["runner-a"]


def test_a_keyed_store_opened_without_its_key_proves_no_snapshot(keyed: Fleet) -> None:
    with EventStore.open(keyed.path, read_only=True) as unkeyed:
        assert snapshot_of(unkeyed, "runner-a") is None  # the tag is a MAC: nothing to check it with
        assert state_at(unkeyed, "runner-a") == replay(unkeyed)["runner-a"]
        with pytest.raises(StoreKeyError):
            SnapshotCheck(unkeyed)  # the audit's check must not pass for want of a key
    before = _raw_snapshot(keyed.path, "runner-a")
    with EventStore.open(keyed.path) as unkeyed, pytest.raises(StoreKeyError):
        rebuild(unkeyed)  # it could tag no snapshot: it changes nothing
    assert _raw_snapshot(keyed.path, "runner-a") == before


@pytest.fixture
def other_target(store_target: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A second store's target on the backend of `store_target`."""
    if not is_url(store_target):
        (tmp_path / "other").mkdir()
        yield str(tmp_path / "other" / "runners.db")
        return
    server: Server = request.getfixturevalue("pg_server")
    schema = server.new_schema()
    yield server.url(schema)
    server.drop(schema)


def test_a_snapshot_copied_from_another_store_or_stream_is_refused(mixed: Fleet, tmp_path: Path,
                                                                   other_target: str) -> None:
    store = mixed.store
    expected = {runner_id: state for runner_id, (state, _, _) in replayed(store).items()}
    (tmp_path / "other").mkdir(exist_ok=True)
    other = open_fleet(tmp_path / "other", other_target, snapshot_every=3)
    with other.store:
        run_mixed_commands(other)
    assert snapshot_of(store, "runner-a") is not None and snapshot_of(store, "runner-b") is not None
    # Another store's snapshot of the same runner, under this store's version, seq and event hash.
    _write_raw_snapshot(mixed.path, "runner-a", _raw_snapshot(other.path, "runner-a"))
    # Another runner's snapshot (runner-c is parked, runner-b accepting), under runner-b's.
    _write_raw_snapshot(mixed.path, "runner-b", _raw_snapshot(mixed.path, "runner-c"))
    for runner_id in ("runner-a", "runner-b"):
        assert snapshot_of(store, runner_id) is None
        assert mixed.handle(runner_id).state() == expected[runner_id]
    check = SnapshotCheck(store)
    assert [(stream, "tag that does not verify" in reason) for _, stream, reason in check.problems] == [
        ("runner-a", True), ("runner-b", True)]


def test_a_snapshot_written_before_snapshots_were_tagged_is_ignored_then_rewritten(mixed: Fleet) -> None:
    store = mixed.store
    version, seq, blob, _ = store.backend.snapshot("runner-a")  # type: ignore[misc]
    _write_raw_snapshot(mixed.path, "runner-a", blob[TAG_BYTES:])  # the state's bytes alone: the old format
    assert snapshot_of(store, "runner-a") is None
    handle = mixed.handle("runner-a")
    assert handle.state() == replayed(store)["runner-a"][0]
    check = SnapshotCheck(store)
    for recorded, state in replay_all(store):
        check.observe(recorded, state)
    assert check.finish() == [] and len(check.warnings) == 1 and "no tag" in check.warnings[0]
    while store.backend.snapshot("runner-a")[1] == seq:  # type: ignore[index]
        handle.rotate_proxy_authority(expected_generation=handle.snapshot().generation,
                                      proxy_authority=mixed.proxy(handle.snapshot().proxy_authority.revision + 1))
    rewritten = snapshot_of(store, "runner-a")
    assert rewritten is not None and rewritten.version > version
    assert rewritten.state == replayed(store)["runner-a"][0]


# --- state as of any seq, and the fleet view ------------------------------------------------------------


def _counts(states: dict[str, RunnerState]) -> tuple[dict[str, list[str]], dict[str, int]]:
    by_state: dict[str, list[str]] = {name: [] for name in ("accepting", "draining", "parked", "reclaiming")}
    by_status = {"active": 0, "settled": 0, "parked": 0}
    for runner_id in sorted(states):
        by_state[states[runner_id].state].append(runner_id)
        for lease in states[runner_id].leases:
            by_status[lease.status] += 1
    return by_state, by_status


def test_state_at_every_seq_equals_a_truncated_replay(mixed: Fleet) -> None:
    store = mixed.store
    head = store.head().seq
    assert head > 30 and _stored_snapshots(store)  # long enough, and snapshots exist to start from
    for seq in range(head + 1):
        truth = truncated_replay(store, seq)
        for runner_id in RUNNERS:
            expected: Any = truth.get(runner_id)
            assert state_at(store, runner_id, seq) == expected, (runner_id, seq)
            assert runner_at(store, runner_id, seq) == (project(expected) if expected is not None else None)
        assert replay(store, until_seq=seq) == truth
        view = fleet(store, at_seq=seq)
        assert (view.head_seq, (view.runners_by_state, view.leases_by_status)) == (seq, _counts(truth))
        assert view.runners == {runner_id: project(state) for runner_id, state in sorted(truth.items())}


def test_fleet_view_counts(mixed: Fleet) -> None:
    view = fleet(mixed.store)
    assert view.head_seq == mixed.store.head().seq
    assert view.runners_by_state == {"accepting": ["runner-a", "runner-b"], "draining": ["runner-e"],
                                     "parked": ["runner-c"], "reclaiming": ["runner-d"]}
    assert view.leases_by_status == {"active": 3, "settled": 3, "parked": 3}
    assert {runner_id: snapshot.generation for runner_id, snapshot in view.runners.items()} == {
        "runner-a": 2, "runner-b": 5, "runner-c": 3, "runner-d": 3, "runner-e": 2}
    # A view as of an earlier seq: just after every runner was initialized, all five accept, no lease.
    early = fleet(mixed.store, at_seq=5)
    assert early.runners_by_state["accepting"] == sorted(RUNNERS)
    assert early.leases_by_status == {"active": 0, "settled": 0, "parked": 0}


def _counting_reads(store: EventStore, monkeypatch: pytest.MonkeyPatch) -> dict[str | None, int]:
    """Count the event rows read through the backend, by stream (None: reads of the whole log)."""
    backend = store.backend
    counts: dict[str | None, int] = {}
    pages, stream_pages = backend.pages, backend.stream_pages

    def counted(found: Iterator[list[Any]], key: str | None) -> Iterator[list[Any]]:
        for rows in found:
            counts[key] = counts.get(key, 0) + len(rows)
            yield rows

    monkeypatch.setattr(backend, "pages", lambda **kw: counted(pages(**kw), kw.get("stream")))
    monkeypatch.setattr(backend, "stream_pages", lambda stream, **kw: counted(stream_pages(stream, **kw), stream))
    return counts


def test_fleet_starts_each_runner_from_its_proven_snapshot_and_folds_only_the_tail(
        mixed: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    store = mixed.store
    truth = replay(store)
    snapshots = _stored_snapshots(store)
    tails = {runner_id: store.stream_version(runner_id) - snapshots.get(runner_id, (0,))[0] for runner_id in RUNNERS}
    assert sum(tails.values()) < store.head().seq // 2  # snapshot_every=3: the snapshots cover most of the log
    counts = _counting_reads(store, monkeypatch)
    view = fleet(store)
    assert view.runners == {runner_id: project(state) for runner_id, state in sorted(truth.items())}
    assert counts == {runner_id: tail for runner_id, tail in tails.items() if tail}  # the tails, nothing else
    assert states_at(store) == truth


def test_fleet_never_trusts_a_snapshot_its_tag_does_not_prove(keyed: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    store = keyed.store
    truth = replay(store)
    assert truth["runner-a"].state == "parked" and snapshot_of(store, "runner-a") is not None
    _forge_snapshot(keyed.path, "runner-a", state="accepting", leases=[])
    counts = _counting_reads(store, monkeypatch)
    view = fleet(store)
    assert view.runners["runner-a"] == project(truth["runner-a"]) and view.runners_by_state["parked"] == ["runner-a"]
    # runner-a is replayed from its first event; runner-b, whose snapshot is proven, reads none.
    assert counts == {"runner-a": store.stream_version("runner-a")}
    assert states_at(store) == truth


def test_states_at_without_any_snapshot_folds_the_log_in_one_pass(mixed: Fleet,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = mixed.store
    truth = replay(store)
    sql(mixed.path, "DELETE FROM snapshots")
    counts = _counting_reads(store, monkeypatch)
    seen: list[tuple[int, int]] = []
    assert states_at(store, progress=lambda done, total: seen.append((done, total))) == truth
    assert counts == {None: store.head().seq}
    assert seen[-1] == (store.head().seq, store.head().seq)


def test_states_at_from_snapshots_tells_its_progress_in_events_of_the_tails(mixed: Fleet) -> None:
    store = mixed.store
    truth = replay(store)
    sql(mixed.path, "DELETE FROM snapshots WHERE stream = 'runner-e'")  # folded from its first event
    snapshots = _stored_snapshots(store)
    assert sorted(snapshots) == sorted(RUNNERS)[:-1]
    tails = store.head().seq - sum(version for version, *_ in snapshots.values())
    seen: list[tuple[int, int]] = []
    assert states_at(store, progress=lambda done, total: seen.append((done, total))) == truth
    assert {total for _, total in seen} == {tails} and seen[-1] == (tails, tails)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_read_models_follow_the_projection_retention_while_the_log_keeps_every_lease(tmp_path: Path,
                                                                                   store_target: str) -> None:
    clock = FakeClock(T0)
    with EventStore.open(store_target, now=clock, durability="normal") as store:
        attach(store)
        # The preflight is not under test here; skipping its probe file keeps 260 leases quick.
        lifecycle = RunnerLifecycle(store, runner_id="runner-a", target="local", base_dir=str(tmp_path),
                                    resources=RESOURCES, post_session_hook_digest=HOOK, now=clock,
                                    preflight_base_dir=lambda path: None)
        lifecycle.initialize()
        proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso(T0), expires_at=iso(T0 + 600_000))
        lease_ids = [lifecycle.acquire_lease(session_id=f"session-{n}", expected_generation=1,
                                             proxy_authority=proxy).lease.id for n in range(260)]
        for lease_id in lease_ids[:-1]:
            lifecycle.settle_lease(lease_id=lease_id, lease_generation=1, result_digest=RESULT)
        lifecycle.park_lease(lease_id=lease_ids[-1], lease_generation=1, result_digest=RESULT, reason="lost-poll")
        lifecycle.begin_reclaim(expected_generation=2, proxy_authority=msgspec.structs.replace(proxy, revision=2))
        lifecycle.complete_reclaim(expected_generation=3)
        rows = sql(store_target, "SELECT lease_id FROM leases WHERE runner_id = 'runner-a' ORDER BY issued_at")
        assert sorted(row[0] for row in rows) == sorted(lease_ids[-256:])  # the 4 oldest rows were deleted
        assert check_read_models(store, replayed(store)) == []
        logged = [r.event.lease_id for r in store.read(stream="runner-a") if r.type == "LeaseAcquired"]  # type: ignore[attr-defined]
        assert logged == lease_ids
