"""A store on a PostgreSQL server when the server fails under it: connections the server ends, a reconnect
that finds another cluster or an older copy of the store, a store restored under an open handle, locks held
by other sessions past the busy timeout, and a COMMIT whose connection is lost. Each on a real server."""

from __future__ import annotations

import threading

import psycopg
import pytest
from pg import Server, SocketLink, cluster
from waiting import returns_within, wait_for

from lifecycle_es import EventStore
from lifecycle_es.backend import Row
from lifecycle_es.backends import server_target
from lifecycle_es.errors import (
    StoreBehindSealError,
    StoreBusyError,
    StoreError,
    StoreFencedError,
    StoreIOError,
)
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.postgres_schema import create_server_store


def event(generation: int = 1) -> ReclaimCompleted:
    return ReclaimCompleted(generation=generation)


@pytest.fixture
def schema(pg_schema: str) -> str:
    return pg_schema


def rows_of(store: EventStore) -> list[Row]:
    return [row for page in store.backend.pages(after=0, stream=None) for row in page]


def terminate(server: Server, store: EventStore) -> None:
    """End the server process serving `store`'s connection, as an administrator or a restart would."""
    with psycopg.connect(server.conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s, 10000)", (store.backend.conn.info.backend_pid,))  # type: ignore[attr-defined]


def restore(server: Server, schema: str, store_id: bytes, rows: list[Row]) -> None:
    """Put an older copy of the store (its id, these rows) in `schema` of `server`, as a restore would."""
    server.drop(schema)
    create_server_store(server_target(server.url(schema)), store_id=store_id, key_id=None, rows=rows)


def count(server: Server, schema: str) -> int:
    with psycopg.connect(server.conninfo(), autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {schema}.events").fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


# --- a reconnect that finds another cluster, or an older copy ------------------------------------------------


def test_a_reconnect_to_another_cluster_holding_an_older_copy_fences_writes_and_reads(pg_server: Server,
                                                                                    schema: str) -> None:
    link = SocketLink(pg_server)
    try:
        with EventStore.open(link.server.url(schema)) as store, cluster() as other:
            store.append_unchecked("a", [event(1)])
            restore(other, schema, store.store_id, rows_of(store))  # a copy taken now, restored elsewhere
            store.append_unchecked("a", [event(2), event(3)])
            # The address now leads to the other cluster (a failover), and the connection is lost.
            link.point(other)
            terminate(pg_server, store)
            with pytest.raises(StoreFencedError, match="another cluster"):
                store.append_unchecked("a", [event(2)])
            assert store.fenced is not None and count(other, schema) == 1
            with pytest.raises(StoreFencedError):
                list(store.read())
            with pytest.raises(StoreFencedError):
                store.head()
    finally:
        link.close()


def test_a_reconnect_to_a_copy_whose_last_event_differs_fences(pg_server: Server, schema: str) -> None:
    # Same cluster, same store id, as many events: but the one this handle committed last is not there.
    with EventStore.open(pg_server.url(schema)) as store, EventStore.open(pg_server.url(schema + "x")) as other:
        store.append_unchecked("a", [event(1)])
        other.append_unchecked("a", [event(1)])
        store.append_unchecked("a", [event(2)])
        first = rows_of(store)[0]
        forged = rows_of(other)[0]
        restore(pg_server, schema, store.store_id, [first, (2, "b", 1, *forged[3:6], first[7], forged[7])])
        terminate(pg_server, store)
        with pytest.raises(StoreBehindSealError):
            store.append_unchecked("a", [event(3)])
        assert store.fenced is not None and count(pg_server, schema) == 2
    pg_server.drop(schema + "x")


def test_a_reconnect_that_finds_the_store_gone_fences_and_makes_no_store(pg_server: Server, schema: str) -> None:
    with EventStore.open(pg_server.url(schema)) as store:
        store.append_unchecked("a", [event(1)])
        terminate(pg_server, store)
        pg_server.drop(schema)
        with pytest.raises(StoreFencedError) as fenced:
            store.append_unchecked("a", [event(2)])
        assert store.fenced is not None and "holds no lifecycle-es store" in store.fenced
        assert str(fenced.value).count("fenced") == 1  # the cause once, not wrapped in itself
    with psycopg.connect(pg_server.conninfo(), autocommit=True) as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone() == (None,)


def lose_after(server: Server, schema: str, keep: int) -> None:
    """The events after seq `keep` gone, and the head back at it, as a crash of a server that had not yet
    flushed their commits (synchronous_commit off) leaves the store."""
    with psycopg.connect(server.conninfo(), autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {schema}.events DISABLE TRIGGER events_no_change")  # type: ignore[arg-type]
        conn.execute(f"DELETE FROM {schema}.events WHERE seq > %s", (keep,))  # type: ignore[arg-type]
        conn.execute(f"ALTER TABLE {schema}.events ENABLE TRIGGER events_no_change")  # type: ignore[arg-type]
        conn.execute(f"UPDATE {schema}.head SET (seq, hash, at) = (SELECT seq, hash, at FROM "  # type: ignore[arg-type]
                     f"{schema}.events WHERE seq = %s)", (keep,))


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_commits_a_crash_lost_fence_the_handle_saying_what_its_durability_allowed(pg_server: Server, schema: str,
                                                                                durability: str) -> None:
    # Under durability='normal' a server crash may lose the last commits it acknowledged: expected, and the
    # handle's reconnect finds the head behind what it had. The fence says that this is what 'normal' allows,
    # what the handle had and the server has, and how to go on; under 'full' no acknowledged commit is lost,
    # so the same finding is a restore or a failover to investigate.
    with EventStore.open(pg_server.url(schema), durability=durability) as store:
        for generation in (1, 2, 3):
            store.append_unchecked("a", [event(generation)])
        lose_after(pg_server, schema, 1)
        terminate(pg_server, store)  # the crash ended its connection: the next write reconnects
        with pytest.raises(StoreBehindSealError) as behind:
            store.append_unchecked("a", [event(4)])
        message = str(behind.value)
        assert (behind.value.sealed_seq, behind.value.head_seq) == (3, 1)
        assert store.fenced is not None and count(pg_server, schema) == 1
        if durability == "normal":
            for said in ("durability='normal'", "can be lost by a server crash", "had the log up to seq 3",
                         "the server's head is seq 1", "reopen the store to go on from the server's head (seq 1)",
                         "durability='full'"):
                assert said in message, message
            assert "find the copy" not in message
        else:
            assert "find the copy that holds the missing events" in message and "durability" not in message
    with EventStore.open(pg_server.url(schema), durability=durability) as reopened:  # what the advice says works
        assert reopened.append_unchecked("a", [event(4)])[0].seq == 2
        assert reopened.verify().events == 2


# --- a store restored under an open connection -----------------------------------------------------------------


def test_a_store_restored_behind_what_this_handle_committed_fences_at_the_next_write(pg_server: Server,
                                                                                    schema: str) -> None:
    with EventStore.open(pg_server.url(schema)) as store:
        store.append_unchecked("a", [event(1)])
        copy = rows_of(store)
        store.append_unchecked("a", [event(2), event(3)])
        restore(pg_server, schema, store.store_id, copy)  # the connection stays open throughout
        with pytest.raises(StoreBehindSealError) as behind:
            store.append_unchecked("a", [event(2)])
        assert (behind.value.sealed_seq, behind.value.head_seq) == (3, 1)
        assert store.fenced is not None and count(pg_server, schema) == 1
        with pytest.raises(StoreFencedError):
            store.commit("append", lambda tx: tx.append_unchecked("a", [event(2)]))
        assert count(pg_server, schema) == 1


def test_a_store_rewritten_at_the_seq_this_handle_committed_fences_at_the_next_write(pg_server: Server,
                                                                                    schema: str) -> None:
    with EventStore.open(pg_server.url(schema)) as store:
        store.append_unchecked("a", [event(1)])
        store.append_unchecked("a", [event(2)])
        first, second = rows_of(store)
        forged = (*second[:5], b'{"generation":9}', second[6], bytes(32))
        restore(pg_server, schema, store.store_id, [first, forged])
        with pytest.raises(StoreBehindSealError):
            store.append_unchecked("a", [event(3)])
        assert store.fenced is not None and count(pg_server, schema) == 2


# --- connections the server ended --------------------------------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
def test_a_read_after_the_server_ended_an_idle_connection_reconnects(pg_server: Server, schema: str,
                                                                     read_only: bool) -> None:
    with EventStore.open(pg_server.url(schema)) as writer:
        writer.append_unchecked("a", [event(1), event(2)])
    with EventStore.open(pg_server.url(schema), read_only=read_only) as store:
        for read in (lambda: store.head().seq, lambda: len(list(store.read())),
                     lambda: store.stream_version("a"), lambda: store.verify().events):
            terminate(pg_server, store)
            assert read() == 2
        # Inside a read transaction a statement is not run again alone, on another snapshot: the error stands.
        with pytest.raises(StoreIOError), store.backend.read_tx("read twice"):
            assert store.head().seq == 2
            terminate(pg_server, store)
            store.stream_version("a")
        assert store.head().seq == 2 and store.fenced is None


def test_a_read_transaction_whose_connection_was_lost_reads_nothing_more_outside_its_snapshot(
        pg_server: Server, schema: str) -> None:
    # A caller that records a failed read and goes on inside the same read transaction (the audit's walk does)
    # must not be answered from a new connection: outside the transaction, that is another snapshot.
    with EventStore.open(pg_server.url(schema)) as writer, \
            EventStore.open(pg_server.url(schema), read_only=True) as store:
        writer.append_unchecked("a", [event(1)])
        with pytest.raises(StoreIOError), store.backend.read_tx("audit"):
            assert store.head().seq == 1
            terminate(pg_server, store)
            with pytest.raises(StoreIOError):
                store.stream_version("a")
            writer.append_unchecked("a", [event(2)])
            with pytest.raises(StoreIOError) as lost:
                store.head()  # seq 2 would be read on a new connection, after the snapshot the block began with
            assert "read transaction" in str(lost.value) and "again" in str(lost.value)
        assert store.head().seq == 2 and store.fenced is None  # outside it, a read reconnects as before


def test_a_connection_lost_during_commit_fences_saying_so(pg_server: Server, schema: str) -> None:
    with EventStore.open(pg_server.url(schema)) as store:
        with pytest.raises(StoreIOError) as lost, store.transaction() as tx:
            tx.append_unchecked("a", [event(1)])
            terminate(pg_server, store)
        assert lost.value.outcome_unknown
        assert store.fenced is not None
        assert "fsync" not in store.fenced and "connection" in store.fenced and "lost" in store.fenced


# --- errors while opening, and locks held by other sessions ----------------------------------------------------


def _locked(server: Server, schema: str, table: str) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(server.conninfo(), autocommit=True)
    conn.execute("BEGIN")
    conn.execute(f"LOCK TABLE {schema}.{table} IN ACCESS EXCLUSIVE MODE")  # type: ignore[arg-type]
    return conn


def test_a_lock_held_through_a_writers_open_is_a_busy_error_naming_the_server(pg_server: Server,
                                                                             schema: str) -> None:
    url = pg_server.url(schema).replace("postgres@", "postgres:hunter2@")
    EventStore.open(url).close()
    with _locked(pg_server, schema, "events"), pytest.raises(StoreBusyError) as busy:
        EventStore.open(url, busy_timeout_ms=50)
    message = str(busy.value)
    assert "postgresql://postgres:***@" in message and "hunter2" not in message and "busy_timeout_ms" in message


def test_a_connection_lost_while_opening_is_a_store_io_error_naming_the_server(pg_server: Server,
                                                                              schema: str) -> None:
    url = pg_server.url(schema).replace("postgres@", "postgres:hunter2@")
    EventStore.open(url).close()
    with _locked(pg_server, schema, "events"):
        def opening() -> BaseException | None:
            try:
                EventStore.open(url, busy_timeout_ms=600_000).close()
            except BaseException as exc:  # returned to the test
                return exc
            return None

        box: list[BaseException | None] = []
        thread = threading.Thread(target=lambda: box.append(opening()), daemon=True)
        thread.start()
        # Watched from a connection of its own: the locker's transaction would see one snapshot of the activity.
        with psycopg.connect(pg_server.conninfo(), autocommit=True) as watcher:
            waiting = ("SELECT pid FROM pg_stat_activity WHERE application_name = 'lifecycle-es'"
                       " AND wait_event_type = 'Lock'")
            assert wait_for(lambda: watcher.execute(waiting).fetchone() is not None)
            row = watcher.execute(waiting).fetchone()
            assert row is not None
            watcher.execute("SELECT pg_terminate_backend(%s, 10000)", (row[0],))
        thread.join(60)
    assert box and isinstance(box[0], StoreIOError), box
    message = str(box[0])
    assert "postgresql://postgres:***@" in message and "hunter2" not in message and "retry" in message


@pytest.mark.parametrize("table", ["events", "meta"])
def test_a_reader_behind_a_table_lock_gives_up_at_the_busy_timeout(pg_server: Server, schema: str,
                                                                   table: str) -> None:
    with EventStore.open(pg_server.url(schema)) as writer:
        writer.append_unchecked("a", [event(1)])
    with EventStore.open(pg_server.url(schema), read_only=True, busy_timeout_ms=50) as reader:
        with _locked(pg_server, schema, table):  # closed (the lock released) whatever happens
            def read() -> object:
                try:
                    return (list(reader.read()), EventStore.open(pg_server.url(schema), read_only=True,
                                                                   busy_timeout_ms=50))
                except StoreError as exc:
                    return exc

            found = returns_within(read, 20)
        assert isinstance(found, StoreBusyError), found
        assert "busy_timeout_ms" in str(found)
