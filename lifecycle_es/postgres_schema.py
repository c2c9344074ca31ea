"""The PostgreSQL backend's schema: the store's tables in their own schema, how a store is born there, the
server settings a writer needs, and the exact check that the schema is still what the store made.

The store lives in one schema (default ``lifecycle_es``): ``meta``, ``events`` (the same columns as the
SQLite file's, ``seq bigint`` primary key, ``UNIQUE (stream, version)``), ``head`` (one row: the last
event's seq, hash and at, whose table every writer locks before it reads anything, so commit order is
seq order), ``snapshots``, and the read models' tables. Row triggers refuse UPDATE and DELETE
on ``events``, a statement trigger refuses TRUNCATE (row triggers never see one), and ``advance_head``
proves inside the transaction that the rows an append wrote are the log's last (a rule or trigger that
dropped them makes it raise, so the commit never happens).

`schema_problems` is the PostgreSQL form of the SQLite file's exact check: columns, constraints,
indexes, triggers (and whether they are enabled), functions, rules, row-level security and policies,
inheritance, views, meta keys, and the head row against the last event.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import psycopg

from .backend import Row
from .backends import ServerTarget, url_secrets
from .errors import StoreFormatError, StoreIOError, StorePragmaError
from .postgres_errors import NOT_KEPT, translated
from .values import shown

SCHEMA_VERSION = 1
MIN_SERVER_VERSION = 140000
ROW_COLUMNS = "seq, stream, version, type, at, body, prev, hash"

# (column, type, nullable) of every store table, in order, as information_schema shows them.
STORE_COLUMNS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "meta": (("key", "text", "NO"), ("value", "bytea", "NO")),
    "events": (("seq", "bigint", "NO"), ("stream", "text", "NO"), ("version", "bigint", "NO"),
               ("type", "text", "NO"), ("at", "text", "NO"), ("body", "bytea", "NO"), ("prev", "bytea", "NO"),
               ("hash", "bytea", "NO")),
    "head": (("one", "boolean", "NO"), ("seq", "bigint", "NO"), ("hash", "bytea", "YES"), ("at", "text", "YES")),
    "snapshots": (("stream", "text", "NO"), ("version", "bigint", "NO"), ("seq", "bigint", "NO"),
                  ("state", "bytea", "NO"), ("event_hash", "bytea", "NO")),
    "host_leases": (("stream", "text", "NO"), ("holder", "text", "NO"), ("token", "bigint", "NO"),
                    ("expires_ms", "bigint", "NO")),
}
READ_MODEL_TABLES = ("runners", "leases", "read_model_position")
META_KEYS = ("store_id", "key_id", "schema_version")

_REFUSE = "BEGIN RAISE EXCEPTION 'events are append-only'; END"
_ADVANCE = (
    "DECLARE top_seq bigint; top_hash bytea; found bigint; "
    "BEGIN "
    "SELECT e.seq, e.hash INTO top_seq, top_hash FROM {s}.events e ORDER BY e.seq DESC LIMIT 1; "
    "SELECT count(*) INTO found FROM {s}.events e WHERE e.seq >= first_seq; "
    "IF top_seq IS DISTINCT FROM last_seq OR top_hash IS DISTINCT FROM last_hash "
    "OR found <> last_seq - first_seq + 1 OR (first_seq > 1 AND NOT EXISTS "
    "(SELECT 1 FROM {s}.events e WHERE e.seq = first_seq - 1 AND e.hash = first_prev)) THEN "
    "RAISE EXCEPTION USING ERRCODE = '" + NOT_KEPT + "', MESSAGE = format("
    "'%s event(s) inserted at seq %s..%s, %s found there, after seq %s %s', last_seq - first_seq + 1, first_seq, "
    "last_seq, found, first_seq - 1, CASE WHEN first_seq = 1 OR EXISTS (SELECT 1 FROM {s}.events e WHERE "
    "e.seq = first_seq - 1 AND e.hash = first_prev) THEN 'as chained' ELSE 'not the event they chain onto' END); "
    "END IF; "
    "UPDATE {s}.head SET seq = last_seq, hash = last_hash, at = last_at; "
    "END"
)


_APPEND = (
    "BEGIN "
    "INSERT INTO {s}.events (seq, stream, version, type, at, body, prev, hash) "
    "SELECT * FROM unnest(seqs, streams, versions, types, ats, bodies, prevs, hashes); "
    "PERFORM {s}.advance_head(seqs[1], prevs[1], seqs[cardinality(seqs)], hashes[cardinality(seqs)], "
    "ats[cardinality(seqs)]); "
    "IF channel IS NOT NULL THEN PERFORM pg_notify(channel, seqs[cardinality(seqs)]::text); END IF; "
    "END"
)
_APPEND_ARGS = ("seqs bigint[], streams text[], versions bigint[], types text[], ats text[], bodies bytea[], "
                "prevs bytea[], hashes bytea[], channel text")
# The one-event append (most commands): scalars, which a client sends for a fraction of what arrays cost it.
_APPEND_ONE = (
    "DECLARE here bigint; before bigint; top bigint; "
    "BEGIN "
    "INSERT INTO {s}.events (seq, stream, version, type, at, body, prev, hash) "
    "VALUES (a_seq, a_stream, a_version, a_type, a_at, a_body, a_prev, a_hash); "
    # advance_head's proof for one row in two index probes: the row is there with its hash, the one
    # before it with the hash it links to, and none after it (the log's last seq, read backwards from the
    # end of the index). Both plans stay index plans as the function's generic ones, at any size of the
    # log. advance_head is called only to say what failed.
    "SELECT (SELECT max(t.seq) FROM {s}.events t), count(*) FILTER (WHERE e.seq = a_seq AND e.hash = a_hash), "
    "count(*) FILTER (WHERE e.seq = a_seq - 1 AND e.hash = a_prev) INTO top, here, before "
    "FROM {s}.events e WHERE e.seq BETWEEN a_seq - 1 AND a_seq; "
    "IF here <> 1 OR top <> a_seq OR (a_seq > 1 AND before <> 1) THEN "
    "PERFORM {s}.advance_head(a_seq, a_prev, a_seq, a_hash, a_at); END IF; "
    "UPDATE {s}.head SET seq = a_seq, hash = a_hash, at = a_at; "
    "IF channel IS NOT NULL THEN PERFORM pg_notify(channel, a_seq::text); END IF; "
    "END"
)
# A writer's read once the head table is locked: the store's id, the head, and the last version of each
# stream named (0 for none), in order. A function so that its queries' plans are the session's, not made
# anew for each transaction; volatile, so each query takes a snapshot of its own after the lock.
_TAIL_OF = (
    "DECLARE a_name text; a_version bigint; "
    "BEGIN "
    "SELECT m.value INTO o_store_id FROM {s}.meta m WHERE m.key = 'store_id'; "
    "SELECT h.seq, h.hash, h.at INTO o_seq, o_hash, o_at FROM {s}.head h; "
    "o_versions := '{{}}'; "
    "FOREACH a_name IN ARRAY names LOOP "
    "SELECT e.version INTO a_version FROM {s}.events e WHERE e.stream = a_name ORDER BY e.version DESC LIMIT 1; "
    "o_versions := o_versions || coalesce(a_version, 0); "
    "END LOOP; "
    "END"
)
_TAIL_OF_ARGS = ("names text[], OUT o_store_id bytea, OUT o_seq bigint, OUT o_hash bytea, OUT o_at text, "
                 "OUT o_versions bigint[]")
_APPEND_ONE_ARGS = ("a_seq bigint, a_stream text, a_version bigint, a_type text, a_at text, a_body bytea, "
                    "a_prev bytea, a_hash bytea, channel text")


def statements(schema: str) -> list[str]:
    """The statements that make the store's schema, in order (one transaction)."""
    s = schema
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"CREATE TABLE {s}.meta (key text PRIMARY KEY, value bytea NOT NULL)",
        f"CREATE TABLE {s}.events (seq bigint PRIMARY KEY, stream text COLLATE \"C\" NOT NULL,"
        " version bigint NOT NULL, type text NOT NULL, at text NOT NULL, body bytea NOT NULL,"
        " prev bytea NOT NULL, hash bytea NOT NULL,"
        " UNIQUE (stream, version))",
        f"CREATE TABLE {s}.head (one boolean PRIMARY KEY DEFAULT true CHECK (one), seq bigint NOT NULL,"
        " hash bytea, at text)",
        f"CREATE TABLE {s}.snapshots (stream text PRIMARY KEY, version bigint NOT NULL, seq bigint NOT NULL,"
        " state bytea NOT NULL, event_hash bytea NOT NULL)",
        f"CREATE TABLE {s}.host_leases (stream text PRIMARY KEY, holder text NOT NULL, token bigint NOT NULL,"
        " expires_ms bigint NOT NULL)",
        f"CREATE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $body${_REFUSE}$body$",
        f"CREATE TRIGGER events_no_change BEFORE UPDATE OR DELETE ON {s}.events"
        f" FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
        f"CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON {s}.events"
        f" FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()",
        f"CREATE FUNCTION {s}.advance_head(first_seq bigint, first_prev bytea, last_seq bigint, last_hash bytea,"
        " last_at text)"
        f" RETURNS void LANGUAGE plpgsql AS $body${_ADVANCE.format(s=s)}$body$",
        # One statement for a small append: the rows, the proof that they landed, the NOTIFY.
        f"CREATE FUNCTION {s}.append_rows({_APPEND_ARGS}) RETURNS void LANGUAGE plpgsql"
        f" AS $body${_APPEND.format(s=s)}$body$",
        f"CREATE FUNCTION {s}.append_one({_APPEND_ONE_ARGS}) RETURNS void LANGUAGE plpgsql"
        f" AS $body${_APPEND_ONE.format(s=s)}$body$",
        f"CREATE FUNCTION {s}.tail_of({_TAIL_OF_ARGS}) LANGUAGE plpgsql AS $body${_TAIL_OF.format(s=s)}$body$",
    ]


# What the catalogs hold for the store's objects once `statements` ran (with the schema as ``{s}``).
_CONSTRAINTS = {
    ("events", "events_pkey", "PRIMARY KEY (seq)"),
    ("events", "events_stream_version_key", "UNIQUE (stream, version)"),
    ("head", "head_one_check", "CHECK (one)"),
    ("head", "head_pkey", "PRIMARY KEY (one)"),
    ("meta", "meta_pkey", "PRIMARY KEY (key)"),
    ("snapshots", "snapshots_pkey", "PRIMARY KEY (stream)"),
    ("host_leases", "host_leases_pkey", "PRIMARY KEY (stream)"),
}
_INDEXES = {
    ("events", "events_pkey", "CREATE UNIQUE INDEX events_pkey ON {s}.events USING btree (seq)"),
    ("events", "events_stream_version_key",
     "CREATE UNIQUE INDEX events_stream_version_key ON {s}.events USING btree (stream, version)"),
    ("head", "head_pkey", "CREATE UNIQUE INDEX head_pkey ON {s}.head USING btree (one)"),
    ("meta", "meta_pkey", "CREATE UNIQUE INDEX meta_pkey ON {s}.meta USING btree (key)"),
    ("snapshots", "snapshots_pkey", "CREATE UNIQUE INDEX snapshots_pkey ON {s}.snapshots USING btree (stream)"),
    ("host_leases", "host_leases_pkey",
     "CREATE UNIQUE INDEX host_leases_pkey ON {s}.host_leases USING btree (stream)"),
}
_TRIGGERS = {
    ("events", "events_no_change", "O",
     "CREATE TRIGGER events_no_change BEFORE DELETE OR UPDATE ON {s}.events FOR EACH ROW EXECUTE FUNCTION "
     "{s}.refuse_change()"),
    ("events", "events_no_truncate", "O",
     "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON {s}.events FOR EACH STATEMENT EXECUTE FUNCTION "
     "{s}.refuse_change()"),
}


def _functions(schema: str) -> set[tuple[str, str, str, bool]]:
    return {("refuse_change", "", _REFUSE, False),
            ("advance_head", "first_seq bigint, first_prev bytea, last_seq bigint, last_hash bytea, last_at text",
             _ADVANCE.format(s=schema), False),
            ("append_rows", _APPEND_ARGS, _APPEND.format(s=schema), False),
            ("append_one", _APPEND_ONE_ARGS, _APPEND_ONE.format(s=schema), False),
            ("tail_of", _TAIL_OF_ARGS, _TAIL_OF.format(s=schema), False)}


def writer_grants(schema: str, role: str) -> list[str]:
    """The statements that let `role` run hosts and commands on the store in `schema`, and no more: it reads
    and appends events (no UPDATE, DELETE or TRUNCATE on them), moves the head row, and keeps snapshots and
    the read models. Run them as the store's owner once it exists (the README's PostgreSQL section)."""
    s = schema
    return [
        f"GRANT USAGE ON SCHEMA {s} TO {role}",
        f"GRANT SELECT ON {s}.meta TO {role}",
        f"GRANT SELECT, INSERT ON {s}.events TO {role}",
        f"GRANT SELECT, UPDATE ON {s}.head TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.snapshots TO {role}",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.host_leases TO {role}",
        f"GRANT CREATE ON SCHEMA {s} TO {role}",
        f"GRANT EXECUTE ON FUNCTION {s}.advance_head(bigint, bytea, bigint, bytea, text) TO {role}",
        f"GRANT EXECUTE ON FUNCTION {s}.append_rows(bigint[], text[], bigint[], text[], text[], bytea[], bytea[],"
        f" bytea[], text) TO {role}",
        f"GRANT EXECUTE ON FUNCTION {s}.append_one(bigint, text, bigint, text, text, bytea, bytea, bytea, text)"
        f" TO {role}",
        f"GRANT EXECUTE ON FUNCTION {s}.tail_of(text[]) TO {role}",
    ]


def store_exists(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Whether `schema` holds a ``meta`` table (a store, or something claiming to be one).

    Read from ``pg_class`` with the statement's own snapshot, not by name lookup (``to_regclass``): the
    backend's cache of names may still say "no such table" after another creator committed one, which a
    creator that waited on the creators' lock would then make a second time."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON "
                       "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = 'meta')", (schema,)).fetchone()
    return bool(row and row[0])


def create(conn: psycopg.Connection[Any], schema: str, *, store_id: bytes | None = None,
           key_id: str | None = None, rows: Iterable[Row] = (), exclusive: bool = False, where: str) -> None:
    """Make the store's schema (in one transaction; two creators at once end with one store).

    `store_id`, `key_id`, `rows` and `exclusive` serve `create_server_store`.
    """
    with translated(f"create the store in {where}", where), conn.transaction():
        # Serializes creators of this schema; the loser finds the store made.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"lifecycle-es create {schema}",))
        if store_exists(conn, schema):
            if exclusive:
                raise StoreIOError(f"cannot create a store in {where}: schema {schema!r} already holds one")
            return
        for statement in statements(schema):
            conn.execute(statement)
        conn.execute(f"INSERT INTO {schema}.meta (key, value) VALUES ('store_id', %s), "
                     "('schema_version', %s)", (store_id if store_id is not None else os.urandom(16),
                                                str(SCHEMA_VERSION).encode()))
        if key_id is not None:
            conn.execute(f"INSERT INTO {schema}.meta (key, value) VALUES ('key_id', %s)",
                         (key_id.encode(),))
        last: Row | None = None
        with conn.cursor() as cursor:
            batch: list[Row] = []
            for row in rows:
                batch.append(row)
                last = row
                if len(batch) >= 1000:
                    cursor.executemany(f"INSERT INTO {schema}.events ({ROW_COLUMNS}) "
                                       "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", batch)
                    batch = []
            if batch:
                cursor.executemany(f"INSERT INTO {schema}.events ({ROW_COLUMNS}) "
                                   "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", batch)
        conn.execute(f"INSERT INTO {schema}.head (one, seq, hash, at) VALUES (true, %s, %s, %s)",
                     (last[0], last[7], last[4]) if last else (0, None, None))


def create_server_store(target: ServerTarget, *, store_id: bytes, key_id: str | None, rows: Iterable[Row]) -> None:
    """`backends.create_store` on a server: the schema made and filled in one transaction, or nothing."""
    with connect(target) as conn:
        create(conn, target.schema, store_id=store_id, key_id=key_id, rows=rows, exclusive=True, where=target.shown)


def drop_server_store(target: ServerTarget) -> None:
    """Drop the schema `create_server_store` made (an import whose check failed)."""
    with connect(target) as conn, translated(f"remove the store in {target.shown}", target.shown):
        conn.execute(f"DROP SCHEMA IF EXISTS {target.schema} CASCADE")


def connect(target: ServerTarget, *, read_only: bool = False) -> psycopg.Connection[Any]:
    """An autocommit connection to the store's server (StoreIOError naming the masked URL when refused)."""
    try:
        # UTF8 whatever the URL or the server says: the constants a commit spells (`postgres_write`) are in it.
        conn = psycopg.connect(target.conninfo, autocommit=True, application_name="lifecycle-es",
                               client_encoding="UTF8")
    except psycopg.Error as exc:
        reason = _reason(exc)
        for secret in url_secrets(target.conninfo):  # libpq quotes a piece it could not decode, password and all
            reason = reason.replace(secret, "***")
        if isinstance(exc, psycopg.ProgrammingError):  # libpq could not read the URL: no server was tried
            raise StoreIOError(f"cannot connect to {target.shown}: {reason} (fix the URL: a character such as %, @, "
                               "/ or : in a password or a parameter must be percent-encoded)") from None
        raise StoreIOError(f"cannot connect to {target.shown}: {reason} (check that the server is up and "
                           "reachable and that the URL names its host, user and database, then retry)") from None
    if read_only:
        with translated("open read-only", target.shown):
            conn.execute("SET default_transaction_read_only = on")
    return conn


def _reason(exc: psycopg.Error) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    # libpq repeats "connection to server at ... failed:" per address; the last line says why.
    return lines[-1] if lines else type(exc).__name__


def check_settings(conn: psycopg.Connection[Any], *, durability: str, where: str) -> None:
    """StorePragmaError unless the server keeps what it acknowledges: fsync and full_page_writes on,
    synchronous_commit not off (unless `durability` is ``"normal"``), and version 14 or newer."""
    with translated("read the server's settings", where):
        row = conn.execute("SELECT current_setting('server_version_num')::int, current_setting('fsync'),"
                           " current_setting('full_page_writes'), current_setting('synchronous_commit')").fetchone()
    assert row is not None
    version, fsync, full_pages, synchronous = row
    if version < MIN_SERVER_VERSION:
        raise StorePragmaError("server_version_num", f">= {MIN_SERVER_VERSION}", version, message=(
            f"{where}: server_version_num is {version}; lifecycle-es needs PostgreSQL 14 or newer"))
    if fsync != "on":
        raise StorePragmaError("fsync", "on", fsync, message=(
            f"{where}: the server runs with fsync = {fsync}, so a crash can lose or corrupt what it acknowledged; "
            "set fsync = on"))
    if full_pages != "on":
        raise StorePragmaError("full_page_writes", "on", full_pages, message=(
            f"{where}: the server runs with full_page_writes = {full_pages}, so a crash can tear pages; "
            "set full_page_writes = on"))
    if durability == "full" and synchronous == "off":
        raise StorePragmaError("synchronous_commit", "on", synchronous, message=(
            f"{where}: synchronous_commit is off, so a crash can lose commits it acknowledged; set "
            "synchronous_commit = on for this role or database, or open with durability='normal' to accept that"))


def check_format(conn: psycopg.Connection[Any], schema: str, where: str) -> None:
    """StoreFormatError unless `schema` holds the store's tables with exactly their columns, at a schema
    version this library knows."""
    with translated(f"open {where}", where):
        if not store_exists(conn, schema):
            raise StoreFormatError(f"{where} holds no lifecycle-es store in schema {schema!r}")
        found: dict[str, list[tuple[str, str, str]]] = {}
        for table, column, kind, nullable in conn.execute(
                "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name = ANY(%s) ORDER BY table_name, ordinal_position",
                (schema, list(STORE_COLUMNS))):
            found.setdefault(table, []).append((column, kind, nullable))
        missing = sorted(set(STORE_COLUMNS) - set(found))
        if missing:
            raise StoreFormatError(f"{where} is not a lifecycle-es store: its tables {missing} are missing "
                                   f"from schema {schema!r}")
        for table, wanted in STORE_COLUMNS.items():
            if tuple(found[table]) != wanted:
                raise StoreFormatError(f"{where} has a {table!r} table that is not the store's (its columns or "
                                       "types differ): not a lifecycle-es store")
        row = conn.execute(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'").fetchone()
    version = row[0].decode("ascii", "replace") if row else None
    if version != str(SCHEMA_VERSION):
        if version is not None and version.isdigit() and int(version) > SCHEMA_VERSION:
            raise StoreFormatError(f"{where} has schema version {version}, newer than this library's "
                                   f"{SCHEMA_VERSION}; upgrade lifecycle-es")
        raise StoreFormatError(f"{where} has schema version {shown(version)}, not one this library knows")


def schema_problems(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """How the store's schema differs from what `statements` made (empty when exact)."""
    problems: list[str] = []
    ours = list(STORE_COLUMNS)
    expanded = {(table, name, text.format(s=schema)) for table, name, text in _INDEXES}
    checks: list[tuple[str, str, Any, set[Any]]] = [
        ("constraint",
         "SELECT c.relname, con.conname, pg_get_constraintdef(con.oid) FROM pg_constraint con"
         " JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
         " WHERE n.nspname = %s AND c.relname = ANY(%s)", (schema, ours), _CONSTRAINTS),
        ("index",
         "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = ANY(%s)",
         (schema, ours), expanded),
        ("trigger",
         "SELECT c.relname, t.tgname, t.tgenabled::text, pg_get_triggerdef(t.oid) FROM pg_trigger t"
         " JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
         " WHERE n.nspname = %s AND NOT t.tgisinternal", (schema,),
         {(table, name, enabled, text.format(s=schema)) for table, name, enabled, text in _TRIGGERS}),
        ("function",
         "SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prosrc, p.prosecdef"
         " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s",
         (schema,), _functions(schema)),
    ]
    for kind, query, params, wanted in checks:
        found = {tuple(row) for row in conn.execute(query, params)}
        for row in sorted(found - wanted, key=str):
            problems.append(f"a {kind} the store never made (or changed), {row[1]!r} on {row[0]!r}: "
                            f"{shown(row[-1])}" + (" (disabled)" if kind == "trigger" and row[2] != "O" else ""))
        for row in sorted(wanted - found, key=str):
            if not any(other[:2] == row[:2] for other in found):
                problems.append(f"its {kind} {row[1]!r} on {row[0]!r} is missing")
    for table, name, definition in conn.execute(
            "SELECT tablename, rulename, definition FROM pg_rules WHERE schemaname = %s", (schema,)):
        problems.append(f"a rule the store never made, {name!r} on {table!r}: {shown(definition)}")
    for table, name in conn.execute("SELECT tablename, policyname FROM pg_policies WHERE schemaname = %s", (schema,)):
        problems.append(f"a row-level security policy the store never made, {name!r} on {table!r}")
    for table, kind, secured, forced in conn.execute(
            "SELECT c.relname, c.relkind::text, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s"
            " AND c.relkind IN ('r', 'v', 'm', 'p', 'f')",
            (schema,)):
        if kind in ("v", "m"):
            problems.append(f"a view the store never made, {table!r}")
        elif kind in ("p", "f") and table in STORE_COLUMNS:
            problems.append(f"its {table!r} table is not a plain table (kind {kind})")
        if table in STORE_COLUMNS and (secured or forced):
            problems.append(f"row-level security is enabled on its {table!r} table")
    for parent, child in conn.execute(
            "SELECT p.relname, c.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent"
            " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = p.relnamespace"
            " WHERE n.nspname = %s", (schema,)):
        problems.append(f"a table {child!r} inherits from its {parent!r} table (its rows would read as the store's)")
    collation = conn.execute("SELECT collation_name FROM information_schema.columns WHERE table_schema = %s"
                       " AND table_name = 'events' AND column_name = 'stream'", (schema,)).fetchone()
    if collation is not None and collation[0] != "C":
        problems.append(f"its events.stream column sorts by collation {shown(collation[0])}, not C (byte order)")
    problems += _meta_problems(conn, schema)
    problems += _head_problems(conn, schema)
    return problems


def _meta_problems(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    problems = []
    keys = []
    for key, value in conn.execute(f"SELECT key, value FROM {schema}.meta ORDER BY key"):
        keys.append(key)
        if key not in META_KEYS:
            problems.append(f"a meta key the store never writes, {shown(key)}")
        elif key == "key_id" and not (len(value) == 32 and all(c in b"0123456789abcdef" for c in value)):
            problems.append(f"its key_id {shown(value)} is not a key id (32 hex digits)")
        elif key == "store_id" and not value:
            problems.append(f"its store_id {shown(value)} is not a store id")
    if "store_id" not in keys:
        problems.append("its store_id is missing")
    return problems


def _head_problems(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    # One statement, so one snapshot: read in two, a writer's commit between them looks like a head row
    # behind the log (and a store being written to would be refused to every writer that opens it).
    row = conn.execute(
        f"SELECT (SELECT count(*) FROM {schema}.head), h.seq, h.hash, h.at, e.seq, e.hash, e.at FROM (SELECT) AS one"
        f" LEFT JOIN (SELECT seq, hash, at FROM {schema}.head LIMIT 1) AS h ON true"
        f" LEFT JOIN (SELECT seq, hash, at FROM {schema}.events ORDER BY seq DESC LIMIT 1) AS e ON true").fetchone()
    assert row is not None
    count, head, last = row[0], tuple(row[1:4]), tuple(row[4:7])
    if count != 1:
        return [f"its head table holds {count} rows, not one"]
    wanted = last if last[0] is not None else (0, None, None)
    if head != wanted:
        return [f"its head row says seq {head[0]}, but the log's last event is seq {wanted[0]} "
                "(or their hash or at differ)"]
    return []
