"""The SQLite backend's schema: the migration ladder, the store's own tables and objects, and the checks
that a file holds them (part of the SQLite backend, with ``sqlite.py``: the only modules that speak SQL).

Two checks, of different weight. `check_tables` (every open): the store's tables exist, STRICT, with
exactly its columns, or the file is not a store (StoreFormatError): every value read back then has the
type the code expects. `schema_problems`: everything else that differs from what MIGRATIONS made (a
trigger added anywhere, dropped or redefined; an index or view added; a constraint gone; a meta key the
store never writes). A writer refuses a file with any; a read-only open reports them, for the audit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, cast

import apsw

from .errors import StoreFormatError
from .values import shown

APPLICATION_ID = 0x4C434553  # "LCES"
SCHEMA_VERSION = 3

# The migration ladder: MIGRATIONS[n] takes a store at user_version n-1 to n, in one transaction.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL) STRICT",
        "CREATE TABLE events ("
        " seq INTEGER PRIMARY KEY,"
        " stream TEXT NOT NULL,"
        " version INTEGER NOT NULL,"
        " type TEXT NOT NULL,"
        " at TEXT NOT NULL,"
        " body BLOB NOT NULL,"
        " prev BLOB NOT NULL,"
        " hash BLOB NOT NULL,"
        " UNIQUE (stream, version)) STRICT",
        "CREATE TRIGGER events_no_update BEFORE UPDATE ON events"
        " BEGIN SELECT RAISE(ABORT, 'events are append-only'); END",
        "CREATE TRIGGER events_no_delete BEFORE DELETE ON events"
        " BEGIN SELECT RAISE(ABORT, 'events are append-only'); END",
    ),
    2: (
        "CREATE TABLE snapshots ("
        " stream TEXT PRIMARY KEY,"
        " version INTEGER NOT NULL,"
        " seq INTEGER NOT NULL,"
        " state BLOB NOT NULL,"
        " event_hash BLOB NOT NULL) STRICT",
    ),
    3: (
        "CREATE TABLE host_leases ("
        " stream TEXT PRIMARY KEY,"
        " holder TEXT NOT NULL,"
        " token INTEGER NOT NULL,"
        " expires_ms INTEGER NOT NULL) STRICT",
    ),
}

# (name, declared type, not null, primary key) of every column of the store's own tables, as MIGRATIONS
# creates them (a STRICT table's TEXT primary key is NOT NULL; an INTEGER PRIMARY KEY is the rowid).
STORE_TABLES: dict[str, tuple[tuple[str, str, bool, bool], ...]] = {
    "meta": (("key", "TEXT", True, True), ("value", "BLOB", True, False)),
    "events": (("seq", "INTEGER", False, True), ("stream", "TEXT", True, False), ("version", "INTEGER", True, False),
               ("type", "TEXT", True, False), ("at", "TEXT", True, False), ("body", "BLOB", True, False),
               ("prev", "BLOB", True, False), ("hash", "BLOB", True, False)),
    "snapshots": (("stream", "TEXT", True, True), ("version", "INTEGER", True, False),
                  ("seq", "INTEGER", True, False), ("state", "BLOB", True, False),
                  ("event_hash", "BLOB", True, False)),
    "host_leases": (("stream", "TEXT", True, True), ("holder", "TEXT", True, False), ("token", "INTEGER", True, False),
                    ("expires_ms", "INTEGER", True, False)),
}


def _store_objects() -> dict[tuple[str, str], tuple[str, str | None]]:
    """Every schema object of the store: (type, name) -> (its table, its SQL as ``sqlite_schema`` keeps it).

    SQLite keeps a CREATE statement's text as it was given, so what MIGRATIONS ran is what the file must
    hold, byte for byte (a constraint dropped, a column's collation changed, a trigger made ``WHEN 0``:
    each differs). The indexes SQLite makes for a PRIMARY KEY that is not the rowid, or a UNIQUE, have no
    SQL; the events table's is the UNIQUE (stream, version) that keeps a stream from forking.
    """
    objects: dict[tuple[str, str], tuple[str, str | None]] = {}
    for version in sorted(MIGRATIONS):
        for statement in MIGRATIONS[version]:
            _, kind, name = statement.split(maxsplit=3)[:3]
            table = name if kind == "TABLE" else statement.split(" ON ", 1)[1].split(maxsplit=1)[0]
            objects[(kind.lower(), name)] = (table, statement)
    for table in ("meta", "events", "snapshots", "host_leases"):
        objects[("index", f"sqlite_autoindex_{table}_1")] = (table, None)
    return objects


STORE_OBJECTS = _store_objects()
# The meta keys the store writes: its random id, and the id of its key when it is keyed.
META_KEYS = ("store_id", "key_id")
_KEY_ID = re.compile(r"[0-9a-f]{32}")


def schema_deviations(listed: Iterable[tuple[Any, ...]], meta: Iterable[tuple[Any, ...]]) -> list[str]:
    """How a schema differs from the store's: `listed` holds ``sqlite_schema``'s (type, name, tbl_name,
    sql) and `meta` the meta table's (key, value), text as bytes (a hostile file's need not be UTF-8).

    The store's own objects must be exactly as MIGRATIONS made them; no trigger and no view may exist
    besides (on any table: a trigger anywhere can write to the store's tables), and no index on the
    store's tables besides its own. Other tables are the read models' (``projections`` makes them as it
    likes) and are not the store's to judge. The meta table holds the keys the store writes, no others.
    """
    problems: list[str] = []
    seen = set()
    for kind, raw_name, raw_table, raw_sql in listed:
        kind, name, table, sql = (_text(value) for value in (kind, raw_name, raw_table, raw_sql))
        ours = STORE_OBJECTS.get((kind, name))
        if ours is not None:
            seen.add((kind, name))
            if (table, sql) != ours:
                problems.append(f"its {kind} {name!r} is not the store's: {shown(sql)}")
        elif kind == "trigger":
            problems.append(f"a trigger the store never made, {name!r} on {table!r}: {shown(sql)}")
        elif kind == "view":
            problems.append(f"a view the store never made, {name!r}: {shown(sql)}")
        elif table in STORE_TABLES:
            problems.append(f"an {kind} the store never made on its {table!r} table, {name!r}: {shown(sql)}")
    for kind, name in STORE_OBJECTS.keys() - seen:
        what = "the UNIQUE (stream, version) index" if name == "sqlite_autoindex_events_1" else f"its {kind} {name!r}"
        problems.append(f"{what} is missing")
    keys = []
    for raw_key, value in meta:
        key = _text(raw_key)
        keys.append(key)
        if key not in META_KEYS:
            problems.append(f"a meta key the store never writes, {shown(key)}")
        elif key == "key_id" and not (isinstance(value, bytes) and _KEY_ID.fullmatch(_text(value) or "")):
            problems.append(f"its key_id {shown(value)} is not a key id (32 hex digits)")
        elif key == "store_id" and not (isinstance(value, bytes) and value):
            problems.append(f"its store_id {shown(value)} is not a store id")
    if "store_id" not in keys:
        problems.append("its store_id is missing")
    return problems


def _text(value: object) -> Any:
    """Text read as bytes back as text (invalid UTF-8 shown as U+FFFD); anything else as it is."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _user_version(conn: apsw.Connection) -> int:
    return cast(int, conn.execute("PRAGMA user_version").fetchall()[0][0])


def check_format(conn: apsw.Connection, path: str) -> None:
    """StoreFormatError unless the file wears the store's application_id and a schema version it knows."""
    app_id = conn.execute("PRAGMA application_id").fetchall()[0][0]
    if app_id != APPLICATION_ID:
        raise StoreFormatError(
            f"{path!r} is not a lifecycle-es store (application_id {app_id:#x}, expected {APPLICATION_ID:#x})")
    version = _user_version(conn)
    if version > SCHEMA_VERSION:
        raise StoreFormatError(f"{path!r} has schema version {version}, newer than this library's {SCHEMA_VERSION}; "
                               "upgrade")
    if version < 1:
        raise StoreFormatError(f"{path!r} has no lifecycle-es schema (user_version {version})")


def check_tables(conn: apsw.Connection, path: str) -> None:
    """A file with our application_id and version but without our tables is not a store either.

    Each table must be STRICT with exactly the columns `STORE_TABLES` lists: STRICT is what makes the
    values read back the types the code expects, so a file whose tables were rewritten without it (to
    hold a text body or an integer stream) fails here, not as a TypeError deep in a verify or replay.
    (A value smuggled in under a schema rewritten and put back, or read from a damaged page, has no
    such check here; `chain.link` and the event decoder name its row.)
    """
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    missing = sorted(set(STORE_TABLES) - names)
    if missing:
        raise StoreFormatError(f"{path!r} is not a lifecycle-es store: its tables {missing} are missing")
    for table, wanted in STORE_TABLES.items():
        (strict,), = conn.execute(
            "SELECT strict FROM pragma_table_list WHERE schema = 'main' AND name = ?", (table,)).fetchall()
        info = conn.execute('SELECT name, type, "notnull", pk FROM pragma_table_info(?)', (table,))
        columns = tuple((name, str(declared).upper(), bool(notnull), bool(pk)) for name, declared, notnull, pk in info)
        if strict != 1 or columns != wanted:
            raise StoreFormatError(f"{path!r} has a {table!r} table that is not the store's (not STRICT, "
                                   "or its columns or types differ): not a lifecycle-es store")


def schema_problems(conn: apsw.Connection) -> list[str]:
    """How the file's schema differs from the store's (see `schema_deviations`); empty when exact."""
    listed = conn.execute("SELECT CAST(type AS BLOB), CAST(name AS BLOB), CAST(tbl_name AS BLOB),"
                          " CAST(sql AS BLOB) FROM sqlite_schema").fetchall()
    meta = conn.execute("SELECT CAST(key AS BLOB), value FROM meta").fetchall()
    return schema_deviations(listed, meta)


def migrate(conn: apsw.Connection) -> None:
    """Step user_version up the ladder inside one IMMEDIATE transaction."""
    if _user_version(conn) == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for version in range(_user_version(conn) + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={version}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
