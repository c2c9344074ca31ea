"""What the suites need to say about a store wherever it lives (a file, or a schema on a PostgreSQL server):
what it durably holds, a raw row put in past the store's append, and fresh places for a state machine's
examples (which cannot take pytest fixtures).

    before = durable_state(store.path)
    ...  # a refused append
    assert durable_state(store.path) == before
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pg import Server

from lifecycle_es import EventStore
from lifecycle_es.backends import is_url, server_target

COLUMNS = "seq, stream, version, type, at, body, prev, hash"


def durable_state(target: str) -> tuple[str | None, ...]:
    """A digest of everything the store holds durably.

    A file: the db file and its -wal, hashed with the store left open (closing would checkpoint and move
    bytes between them; the -shm file is SQLite's rebuildable index, where readers write their marks).
    A server's store: every row of every table in its schema, read through a connection of its own.
    """
    if is_url(target):
        return _schema_state(target)
    out = []
    for suffix in ("", "-wal"):
        part = Path(target + suffix)
        out.append(hashlib.sha256(part.read_bytes()).hexdigest() if part.exists() else None)
    return tuple(out)


def _schema_state(url: str) -> tuple[str | None, ...]:
    import psycopg

    target = server_target(url)
    with psycopg.connect(target.conninfo, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY table_name",
            (target.schema,))]
        digests = []
        for table in tables:
            (digest,) = conn.execute(  # type: ignore[misc]
                f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) "  # type: ignore[arg-type]
                f"FROM {target.schema}.{table} t").fetchone() or (None,)
            digests.append(f"{table}:{digest}")
    return tuple(digests)


def raw_insert(store: EventStore, row: Sequence[Any]) -> None:
    """Insert one event row through the store's own connection, past its append (and past what its append
    remembers of the head). On a server the head row moves with it: the schema keeps the head row equal to
    the last event, and a raw writer there must advance it as the store's append does."""
    backend: Any = store.backend
    if is_url(store.path):
        schema = backend.schema
        backend.execute(f"INSERT INTO {schema}.events ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", row)
        backend.execute(f"SELECT {schema}.advance_head(%s, %s, %s, %s, %s)", (row[0], row[6], row[0], row[7], row[4]))
    else:
        backend.execute(f"INSERT INTO events ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)


Run = Callable[..., list[tuple[Any, ...]]]


@contextlib.contextmanager
def raw_sql(target: str) -> Iterator[Run]:
    """A connection of its own to the store at `target`, as anyone with write access to it (a file's owner,
    a server's superuser) could open: ``run(sql, params=())`` runs one statement in autocommit and returns
    its rows. On a server, `sql` names the store's tables unqualified (the schema is the search path) and
    ``?`` stands for a parameter, as in SQLite."""
    if is_url(target):
        import psycopg

        server = server_target(target)
        with psycopg.connect(server.conninfo, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {server.schema}")  # type: ignore[arg-type]

            def run_on_server(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
                cursor = conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
                return cursor.fetchall() if cursor.description else []

            yield run_on_server
        return
    import apsw

    file = apsw.Connection(target)
    try:
        yield lambda sql, params=(): file.execute(sql, params).fetchall()
    finally:
        file.close()


class Places:
    """Fresh store targets for the examples of a state machine, on one backend: a file in a temporary
    directory, or a new schema on the cluster; `clean` removes what `new` made."""

    def __init__(self, backend: str, server: Server | None) -> None:
        self.backend = backend
        self.server = server
        self._undo: list[Callable[[], None]] = []

    def new(self) -> str:
        """A target no store is at yet."""
        if self.backend == "postgres":
            assert self.server is not None
            server, schema = self.server, self.server.new_schema()
            self._undo.append(lambda: server.drop(schema))
            return server.url(schema)
        directory = tempfile.mkdtemp(prefix="lces-place-")
        self._undo.append(lambda: shutil.rmtree(directory, ignore_errors=True))
        return f"{directory}/events.db"

    def clean(self) -> None:
        """Remove every store `new` made a place for."""
        while self._undo:
            self._undo.pop()()
