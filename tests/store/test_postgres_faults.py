"""A store on a PostgreSQL server when the server fails under it: connections the server ends, a reconnect
that finds another cluster or an older copy of the store, a store restored under an open handle, locks held
by other sessions past the busy timeout, and a COMMIT whose connection is lost. Each on a real server."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from pg import Server

from lifecycle_es import EventStore
from lifecycle_es.backend import Row
from lifecycle_es.backends import server_target
from lifecycle_es.errors import (
    StoreIOError,
)
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.postgres_schema import create_server_store


def event(generation: int = 1) -> ReclaimCompleted:
    return ReclaimCompleted(generation=generation)


@pytest.fixture
def schema(pg_server: Server) -> Iterator[str]:
    name = pg_server.new_schema()
    yield name
    pg_server.drop(name)


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


# --- a store restored under an open connection -----------------------------------------------------------------


# --- connections the server ended --------------------------------------------------------------------------


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


