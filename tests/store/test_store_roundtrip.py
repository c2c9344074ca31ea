"""What goes in comes out: the store against a small in-memory model, paging, and follow.

The model is a list of rows ``(seq, stream, version, type, at, body)``; after every step the log must
read back exactly as the model says (the bytes stored are the canonical bytes of the event appended),
every query must agree with it, and the chain must verify, keyed or not. On both backends: the model and
the paging cases run against a file and against a schema on a PostgreSQL server.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from pg import Server
from targets import Places, raw_sql

from lifecycle_es import ConcurrencyError, EventStore, IntegrityError, InvalidInputError, StoreFencedError
from lifecycle_es import store as store_module
from lifecycle_es.backend import MAX_EVENT_BYTES, PAGE_BYTES
from lifecycle_es.backends import is_url
from lifecycle_es.canonical import MAX_EPOCH_MS, iso_ms
from lifecycle_es.events import (
    DrainExpired,
    Event,
    LeaseSettled,
    ReclaimCompleted,
    RunnerParked,
    UnitSignalled,
    decode,
    encode,
    type_of,
)
from lifecycle_es.sqlite_schema import MIGRATIONS
from lifecycle_es.testing import FakeClock
from lifecycle_es.values import ID_RE

ModelRow = tuple[int, str, int, str, str, bytes]

GENERATIONS = st.integers(0, 2**53 - 1)
IDS = st.from_regex(ID_RE, fullmatch=True)
# A few fixed streams make streams interleave and grow; a generated one now and then tests the id rules.
STREAMS = st.one_of(st.sampled_from(["runner-1", "runner-2", "runner.3@host:9"]), IDS)
EVENTS = st.one_of(
    st.builds(ReclaimCompleted, generation=GENERATIONS),
    st.builds(RunnerParked, cause=st.sampled_from(["drain-settled", "lease-parked", "drain-expired", "drain-idle"]),
              generation=GENERATIONS),
    st.builds(LeaseSettled, lease_id=IDS, lease_generation=GENERATIONS,
              result_digest=st.from_regex(r"sha256:[a-f0-9]{64}", fullmatch=True)),
    # Free text (any Unicode but surrogates) in a body: canonical bytes must survive the round trip as-is.
    st.builds(UnitSignalled, lease_id=IDS, signal=st.sampled_from(["SIGTERM", "SIGKILL"]), reason=st.text(max_size=40)),
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def as_model(recorded: Any) -> ModelRow:
    return (recorded.seq, recorded.stream, recorded.version, recorded.type, recorded.at, recorded.body)


class StoreModel(RuleBasedStateMachine):
    """The real store, fresh for each run (a file, or a schema on a server), beside a list of the rows it
    must hold."""

    def __init__(self, places: Places) -> None:
        super().__init__()
        self.places = places
        self.path = places.new()
        self.clock = FakeClock()
        self.rows: list[ModelRow] = []
        self.events: list[Event] = []
        self.key: bytes | None = None
        self.store: EventStore | None = None

    @initialize(key=st.one_of(st.none(), st.binary(min_size=32, max_size=32)))
    def open_store(self, key: bytes | None) -> None:
        self.key = key
        self.store = EventStore.open(self.path, key=key, now=self.clock.now)

    def version(self, stream: str) -> int:
        return max((row[2] for row in self.rows if row[1] == stream), default=0)

    def head_at(self) -> str:
        return self.rows[-1][4] if self.rows else ""

    def record(self, stream: str, events: list[Event], at: str, recorded: list[Any]) -> None:
        version = self.version(stream)
        for offset, event in enumerate(events):
            self.rows.append((len(self.rows) + 1, stream, version + offset + 1, type_of(event), at, encode(event)))
            self.events.append(event)
        assert [as_model(r) for r in recorded] == self.rows[-len(events):]
        assert [r.event for r in recorded] == events

    @rule(stream=STREAMS, events=st.lists(EVENTS, min_size=1, max_size=5), step_ms=st.integers(0, 86_400_000))
    def append(self, stream: str, events: list[Event], step_ms: int) -> None:
        assert self.store is not None
        self.clock.advance(step_ms)
        recorded = self.store.append_unchecked(stream, events, expected_version=self.version(stream))
        # Stamped by the clock, never before the head (an explicit at may have put it past the clock).
        self.record(stream, events, max(iso_ms(self.clock.now()), self.head_at()), recorded)

    @rule(stream=STREAMS, events=st.lists(EVENTS, min_size=1, max_size=3), ms=st.integers(0, MAX_EPOCH_MS),
          spelling=st.sampled_from(["canonical", "offset", "datetime"]))
    def append_at(self, stream: str, events: list[Event], ms: int, spelling: str) -> None:
        assert self.store is not None
        # Every spelling of one instant is stored as the one canonical string (it is hashed as stored).
        at: Any = {"canonical": iso_ms(ms), "offset": iso_ms(ms)[:-1] + "+00:00",
                   "datetime": EPOCH + timedelta(milliseconds=ms)}[spelling]
        if iso_ms(ms) < self.head_at():
            # Time never runs backwards: an at before the head's is refused, and nothing is appended.
            with pytest.raises(InvalidInputError, match=self.head_at()) as info:
                self.store.append_unchecked(stream, events, at=at)
            assert info.value.field == "at"
            return
        # No expected_version: appends whatever the version.
        recorded = self.store.append_unchecked(stream, events, at=at)
        self.record(stream, events, iso_ms(ms), recorded)

    @rule(stream=STREAMS, events=st.lists(EVENTS, min_size=1, max_size=3), expected=st.integers(0, 20))
    def append_with_a_stale_version(self, stream: str, events: list[Event], expected: int) -> None:
        assert self.store is not None
        actual = self.version(stream)
        assume(expected != actual)
        with pytest.raises(ConcurrencyError) as info:
            self.store.append_unchecked(stream, events, expected_version=expected)
        assert (info.value.stream, info.value.expected, info.value.actual) == (stream, expected, actual)

    @rule()
    def reopen(self) -> None:
        assert self.store is not None
        self.store.close()
        self.store = EventStore.open(self.path, key=self.key, now=self.clock.now)

    @rule(after=st.integers(0, 60), stream=st.one_of(st.none(), STREAMS),
          limit=st.one_of(st.none(), st.integers(0, 60)))
    def read_some(self, after: int, stream: str | None, limit: int | None) -> None:
        assert self.store is not None
        wanted = [row for row in self.rows if row[0] > after and (stream is None or row[1] == stream)]
        got = [as_model(r) for r in self.store.read(after=after, stream=stream, limit=limit)]
        assert got == (wanted if limit is None else wanted[:limit])

    @invariant()
    def log_matches_model(self) -> None:
        if self.store is None:
            return
        store = self.store
        recorded = list(store.read())
        assert [as_model(r) for r in recorded] == self.rows
        assert [r.event for r in recorded] == self.events
        assert all(decode(row[5]) == event for row, event in zip(self.rows, self.events, strict=True))
        streams = sorted({row[1] for row in self.rows})
        assert store.streams() == streams
        for stream in streams:
            mine = [row for row in self.rows if row[1] == stream]
            assert [as_model(r) for r in store.read_stream(stream)] == mine
            assert [r.version for r in store.read_stream(stream)] == list(range(1, len(mine) + 1))
            assert store.stream_version(stream) == len(mine)
        assert store.stream_version("never-written") == 0
        head = store.head()
        report = store.verify()
        assert report.events == head.seq == len(self.rows)
        assert report.streams == len(streams)
        assert report.head == head
        if self.rows:
            assert head.hash == recorded[-1].hash and head.at == self.rows[-1][4]
            for position in {0, len(recorded) // 2, len(recorded) - 1}:
                assert store.event_at(recorded[position].seq) == recorded[position]
            assert all(later.prev == earlier.hash for earlier, later in itertools.pairwise(recorded))
        assert store.event_at(len(self.rows) + 1) is None
        assert store.event_at(0) is None

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        self.places.clean()


def test_store_against_the_model(places: Places) -> None:
    run_state_machine_as_test(lambda: StoreModel(places),
                              settings=settings(max_examples=20, stateful_step_count=15, deadline=None))


# --- paging across PAGE ------------------------------------------------------------------------------------

TOTAL = 4_500


def stream_of(seq: int) -> str:
    return "a" if seq % 3 else ("b" if seq % 2 else "c")


def module_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A target for a module's store on the backend `request.param` names; removed after the module."""
    if request.param == "postgres":
        server: Server = request.getfixturevalue("pg_server")
        schema = server.new_schema()
        yield server.url(schema)
        server.drop(schema)
    else:
        yield str(tmp_path_factory.mktemp("log") / "events.db")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def long_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from module_target(request, tmp_path_factory)


@pytest.fixture(scope="module")
def long_log(long_target: str) -> Any:
    assert store_module.PAGE == 2000, "the cases below are placed around a 2000-row page"
    path = long_target
    with EventStore.open(path, now=FakeClock().now) as store:
        with store.transaction() as tx:  # one commit: 4500 fsyncs would cost seconds for nothing
            for seq in range(1, TOTAL + 1):
                tx.append_unchecked(stream_of(seq), [ReclaimCompleted(generation=seq)])
        rows = [as_model(r) for r in store.read()]
    store = EventStore.open(path)
    yield store, rows
    store.close()


def expected_read(rows: list[ModelRow], after: int, stream: str | None, limit: int | None) -> list[ModelRow]:
    wanted = [row for row in rows if row[0] > after and (stream is None or row[1] == stream)]
    return wanted if limit is None else wanted[:limit]


def test_long_log_is_whole(long_log: Any) -> None:
    store, rows = long_log
    assert [row[0] for row in rows] == list(range(1, TOTAL + 1))
    assert store.verify().events == TOTAL
    assert store.streams() == ["a", "b", "c"]
    assert store.stream_version("a") == 3000


@pytest.mark.parametrize(("after", "stream", "limit"), [
    (0, None, None), (0, None, 2000), (0, None, 2001), (0, None, 1999), (1999, None, 2), (1999, None, None),
    (2000, None, 1), (3999, None, 2002), (4499, None, None), (4500, None, None), (9999, None, None),
    (0, None, 0), (0, "a", None), (0, "a", 2000), (0, "a", 2001), (10, "a", 2500), (2999, "a", None),
    (0, "b", None), (4000, "c", 5), (0, "nobody", None),
])
def test_read_pages(long_log: Any, after: int, stream: str | None, limit: int | None) -> None:
    store, rows = long_log
    got = [as_model(r) for r in store.read(after=after, stream=stream, limit=limit)]
    assert got == expected_read(rows, after, stream, limit)


near_a_page = st.one_of(st.integers(0, TOTAL + 10), st.sampled_from([1999, 2000, 2001, 3999, 4000, 4001]))


@settings(max_examples=40, deadline=None)
@given(after=near_a_page, stream=st.sampled_from([None, "a", "b", "c"]), limit=st.one_of(st.none(), near_a_page))
def test_read_pages_property(long_log: Any, after: int, stream: str | None, limit: int | None) -> None:
    store, rows = long_log
    got = [as_model(r) for r in store.read(after=after, stream=stream, limit=limit)]
    assert got == expected_read(rows, after, stream, limit)


@pytest.mark.parametrize("after_version", [0, 1, 1999, 2000, 2001, 2999, 3000, 5000])
def test_read_stream_pages(long_log: Any, after_version: int) -> None:
    store, rows = long_log
    mine = [row for row in rows if row[1] == "a"]
    got = [as_model(r) for r in store.read_stream("a", after_version=after_version)]
    assert got == mine[after_version:]


# --- paging by bytes ---------------------------------------------------------------------------------------


def large_drain(n: int) -> DrainExpired:
    """A DrainExpired naming 1000 leases of 250-character ids: about 256 KB, half the bound."""
    return DrainExpired(lease_ids=tuple(f"{n:04d}-{i:04d}-" + "x" * 240 for i in range(1000)),
                        deadline_at="2026-01-01T00:00:00.000Z")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def large_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from module_target(request, tmp_path_factory)


@pytest.fixture(scope="module")
def large_log(large_target: str) -> Any:
    """60 events of about 260 KB (15 MB) in two streams, then a small one."""
    path = large_target
    with EventStore.open(path, now=FakeClock().now) as store:
        with store.transaction() as tx:
            for n in range(60):
                tx.append_unchecked("a" if n % 3 else "b", [large_drain(n)])
            tx.append_unchecked("a", [ReclaimCompleted(generation=1)])
        rows = [as_model(r) for r in store.read()]
    store = EventStore.open(path, read_only=True)
    yield store, rows
    store.close()


def test_pages_end_by_bytes_as_well_as_rows(large_log: Any) -> None:
    store, rows = large_log
    assert sum(len(row[5]) for row in rows) > PAGE_BYTES  # more than one page's worth of bodies
    for stream in (None, "a"):
        pages = list(store.backend.pages(after=0, stream=stream))
        assert len(pages) > 1
        # A page ends once its bodies reach PAGE_BYTES: the row that reached it is the page's last.
        assert all(sum(len(row[5]) for row in page[:-1]) < PAGE_BYTES for page in pages)
        assert [row[:6] for page in pages for row in page] == [row for row in rows if stream in (None, row[1])]
    assert [as_model(r) for r in store.read()] == rows
    assert [as_model(r) for r in store.read(after=3, limit=40)] == rows[3:43]
    assert [as_model(r) for r in store.read_stream("a", after_version=2)] == [row for row in rows if row[1] == "a"][2:]
    assert len(list(store.backend.stream_pages("a", after_version=0))) > 1
    assert store.verify().events == len(rows)


def test_a_body_beyond_the_bound_is_never_loaded_and_named_by_seq(store_target: str) -> None:
    """A body an attacker made larger than MAX_EVENT_BYTES (the append-only trigger dropped or disabled,
    and put back): reads yield the rows before it, then raise IntegrityError at its seq."""
    path = store_target
    with EventStore.open(path) as store:
        store.append_unchecked("a", [ReclaimCompleted(generation=n) for n in range(1, 6)])
    with raw_sql(path) as run:
        if is_url(path):
            run("ALTER TABLE events DISABLE TRIGGER events_no_change")
            run("UPDATE events SET body = decode(repeat('00', ?), 'hex') WHERE seq = 3", (MAX_EVENT_BYTES + 1,))
            run("ALTER TABLE events ENABLE TRIGGER events_no_change")
        else:
            run("DROP TRIGGER events_no_update")
            run("UPDATE events SET body = zeroblob(?) WHERE seq = 3", (MAX_EVENT_BYTES + 1,))
            run(MIGRATIONS[1][2])  # events_no_update, as it was
    with EventStore.open(path, read_only=True) as store:
        seen = []
        with pytest.raises(IntegrityError, match=f"{MAX_EVENT_BYTES + 1:,} bytes, beyond the bound") as info:
            seen.extend(recorded.seq for recorded in store.read())
        assert info.value.seq == 3 and seen == [1, 2]
        for read in (store.verify, lambda: store.event_at(3), lambda: list(store.read_stream("a"))):
            with pytest.raises(IntegrityError) as info:
                read()
            assert info.value.seq == 3


def test_read_arguments_are_checked_at_the_call(store: EventStore) -> None:
    for kwargs in ({"after": -1}, {"after": True}, {"stream": "a/b"}, {"limit": -1}, {"limit": 1.5}):
        with pytest.raises(InvalidInputError):
            store.read(**kwargs)  # no next(): a bad argument must not wait for the first page
    with pytest.raises(InvalidInputError):
        store.read_stream("")
    with pytest.raises(InvalidInputError):
        store.read_stream("a", after_version=-1)
    for kwargs in ({"poll_interval": 0}, {"poll_interval": True}, {"after": -1}, {"stream": "a b"}):
        with pytest.raises(InvalidInputError):
            store.follow(**kwargs)
    for bad in (-1, "1", None):
        with pytest.raises(InvalidInputError):
            store.event_at(bad)  # type: ignore[arg-type]


def test_empty_log(store: EventStore) -> None:
    head = store.head()
    assert head.seq == 0 and head.at is None and len(head.hash) == 32
    assert list(store.read()) == [] and store.streams() == [] and store.stream_version("x") == 0
    assert store.verify().events == 0


# --- follow -----------------------------------------------------------------------------------------------

GUARD_S = 30  # a failing follow must end the test, not hang it; nothing is asserted about time


def guarded(stop: threading.Event) -> threading.Timer:
    timer = threading.Timer(GUARD_S, stop.set)
    timer.daemon = True
    timer.start()
    return timer


def test_follow_yields_what_another_connection_commits(store: EventStore) -> None:
    store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])
    stop, go = threading.Event(), threading.Event()
    written: list[Event] = [ReclaimCompleted(generation=2), RunnerParked(cause="drain-idle", generation=3),
                            ReclaimCompleted(generation=4)]
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            go.wait(GUARD_S)
            with EventStore.open(store.path) as other:  # its own connection: what another process does
                other.append_unchecked("runner-1", written[:2])
                other.append_unchecked("runner-2", written[2:])
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    timer = guarded(stop)
    seen: list[Any] = []
    try:
        for recorded in store.follow(poll_interval=0.01, stop=stop):
            seen.append(recorded)
            if recorded.seq == 1:
                go.set()  # written only once follow is past what was there when it started
            if len(seen) == 4:
                break
    finally:
        timer.cancel()
        go.set()
        thread.join(GUARD_S)
    assert failures == []
    assert [r.seq for r in seen] == [1, 2, 3, 4]
    assert [r.event for r in seen[1:]] == written


def test_follow_yields_this_connections_own_commits(store: EventStore) -> None:
    # data_version does not move for a connection's own commits; follow must see them anyway.
    store.append_unchecked("runner-1", [ReclaimCompleted(generation=1)])
    stop = threading.Event()
    timer = guarded(stop)
    seen: list[int] = []
    try:
        for recorded in store.follow(poll_interval=0.01, stop=stop):
            seen.append(recorded.seq)
            if recorded.seq < 3:
                store.append_unchecked("runner-1", [ReclaimCompleted(generation=recorded.seq + 1)])
            else:
                break
    finally:
        timer.cancel()
    assert seen == [1, 2, 3]



def six_events(store: EventStore) -> None:
    """Seqs 1..6, odd ones on stream x, even ones on stream y."""
    for n in range(1, 7):
        store.append_unchecked("x" if n % 2 else "y", [ReclaimCompleted(generation=n)])

def test_follow_one_stream_after_a_seq(store: EventStore) -> None:
    six_events(store)
    stop = threading.Event()
    timer = guarded(stop)
    seen: list[int] = []
    try:
        for recorded in store.follow(after=1, stream="x", poll_interval=0.01, stop=stop):
            seen.append(recorded.seq)
            if len(seen) == 2:
                stop.set()  # and the generator ends by itself
    finally:
        timer.cancel()
    assert seen == [3, 5]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.binary(min_size=32, max_size=32), events=st.lists(EVENTS, min_size=1, max_size=8))
def test_keyed_round_trip_survives_reopen(places: Places, key: bytes, events: list[Event]) -> None:
    path = places.new()
    with EventStore.open(path, key=key) as store:
        written = store.append_unchecked("runner-1", events, expected_version=0)
    with EventStore.open(path, key=key) as store:
        assert list(store.read()) == written
        assert [r.event for r in store.read()] == events
        assert store.verify().events == len(events)


E = TypeVar("E", bound=BaseException)


def follow_until_raised(store: EventStore, error: type[E], at_seq: int, meddle: Callable[[], None], *,
                        stream: str | None = None) -> tuple[list[int], E]:
    """Follow `store` (six events in it) until it raises `error`, running `meddle` once it yielded `at_seq`:
    the seqs it yielded, and the error."""
    six_events(store)
    stop = threading.Event()
    timer = guarded(stop)
    seen: list[int] = []
    try:
        with pytest.raises(error) as raised:
            for recorded in store.follow(stream=stream, poll_interval=0.01, stop=stop):
                seen.append(recorded.seq)
                if recorded.seq == at_seq:
                    meddle()
    finally:
        timer.cancel()
    return seen, raised.value


@pytest.mark.parametrize("stream", [None, "x"])
def test_follow_raises_when_the_log_is_cut_back_under_it(tmp_path: Any, stream: str | None) -> None:
    path = str(tmp_path / "cut.db")

    def cut_back() -> None:
        # The rows after seq 2 deleted behind the follower, as an older copy put back would leave it.
        with raw_sql(path) as run:
            run("DROP TRIGGER events_no_delete")
            run("DELETE FROM events WHERE seq > 2")

    with EventStore.open(path) as store:
        seen, cut = follow_until_raised(store, IntegrityError, 5, cut_back, stream=stream)
        assert re.search(r"head went back from seq [56] to 2", str(cut)), cut
        assert cut.seq == 3
        # A page read before the cut is yielded whole (up to seq 6): the cut is met at the next poll.
        assert seen == ([1, 2, 3, 4, 5, 6] if stream is None else [1, 3, 5])


def cut_back_and_regrow(path: str) -> None:
    """The rows after seq 4 deleted (the append-only trigger put back after), then 4 other events appended."""
    with raw_sql(path) as run:
        (trigger,), = run("SELECT sql FROM sqlite_schema WHERE name = 'events_no_delete'")
        run("DROP TRIGGER events_no_delete")
        run("DELETE FROM events WHERE seq > 4")
        run(trigger)
    with EventStore.open(path) as other:
        other.append_unchecked("z", [ReclaimCompleted(generation=generation) for generation in range(5, 9)])


def test_follow_raises_when_the_log_is_cut_back_and_written_again_between_two_polls(tmp_path: Any) -> None:
    # The head is past what the follower yielded again, so only the event at its place tells: it was rewritten.
    path = str(tmp_path / "regrown.db")
    with EventStore.open(path) as store:
        seen, rewritten = follow_until_raised(store, IntegrityError, 6, lambda: cut_back_and_regrow(path))
        assert seen == [1, 2, 3, 4, 5, 6] and rewritten.seq == 6
        assert "changed while it was followed" in str(rewritten)


@pytest.mark.parametrize("after", [6, 5], ids=["at-the-head", "below-the-head"])
def test_a_follower_that_has_yielded_nothing_sees_its_start_rewritten_and_grown_past(tmp_path: Any,
                                                                                    after: int) -> None:
    """Started after seq `after`, the follower holds the event there: a log cut back below it and written again
    past it before the first look (an older copy restored, then appended to) is seen at that seq, not followed on
    from as if the new events came after the ones its caller already has."""
    path = str(tmp_path / "restored.db")
    with EventStore.open(path) as store:
        six_events(store)
        stop = threading.Event()
        timer = guarded(stop)
        follower = store.follow(after=after, poll_interval=0.01, stop=stop)
        cut_back_and_regrow(path)
        try:
            with pytest.raises(IntegrityError) as rewritten:
                next(follower)
        finally:
            timer.cancel()
        assert rewritten.value.seq == after and "changed while it was followed" in str(rewritten.value)


def test_a_follower_from_the_start_holds_nothing_and_reads_on_after_the_log_is_cut_back(tmp_path: Any) -> None:
    """after=0 holds no seq: a log cut back before its first event takes nothing it has, and it yields what the
    log holds then, here the other stream's events written after the cut."""
    path = str(tmp_path / "from-the-start.db")
    with EventStore.open(path) as store:
        six_events(store)
        stop = threading.Event()
        timer = guarded(stop)
        follower = store.follow(after=0, stream="z", poll_interval=0.01, stop=stop)
        cut_back_and_regrow(path)
        try:
            assert [(recorded.seq, recorded.stream) for recorded in itertools.islice(follower, 4)] == \
                [(5, "z"), (6, "z"), (7, "z"), (8, "z")]
        finally:
            timer.cancel()


def test_check_followed_refuses_a_hash_that_is_no_hash(store: EventStore) -> None:
    six_events(store)
    for bad in (b"short", "a" * 32, bytearray(32)):
        with pytest.raises(InvalidInputError) as info:
            store.check_followed(6, event_hash=bad)  # type: ignore[arg-type]
        assert info.value.field == "event_hash"
    last = store.event_at(6)
    assert last is not None
    store.check_followed(6, event_hash=last.hash)
    with pytest.raises(IntegrityError):
        store.check_followed(6, event_hash=bytes(32))


def test_follow_raises_fenced_when_the_file_it_follows_is_replaced(tmp_path: Any) -> None:
    # Its connection would go on reading the file it opened, which no one writes any more: a follower
    # that waited on it would wait for ever, never seeing what is appended to the file now at the path.
    path, other = str(tmp_path / "followed.db"), str(tmp_path / "other.db")
    with EventStore.open(other) as elsewhere:
        elsewhere.append_unchecked("z", [ReclaimCompleted(generation=1)])
    with EventStore.open(path) as store:
        seen, fenced = follow_until_raised(store, StoreFencedError, 6, lambda: os.replace(other, path))
        assert seen == [1, 2, 3, 4, 5, 6]
        assert "replaced" in fenced.cause and "reopen the store" in fenced.cause
        assert store.fenced == fenced.cause
