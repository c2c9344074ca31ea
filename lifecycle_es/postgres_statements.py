"""The PostgreSQL backend's statements, with the store's schema in place."""

from __future__ import annotations

from collections.abc import Sequence

from .backend import MAX_EVENT_BYTES, MAX_FIELD_BYTES, MAX_SNAPSHOT_BYTES
from .postgres_schema import ROW_COLUMNS

CHANNEL_PREFIX = "lifecycle_es_"


def _bounded(column: str) -> str:
    """`column` as a read selects it: NULL, never read whole, beyond MAX_FIELD_BYTES."""
    return f"CASE WHEN octet_length({column}) > {MAX_FIELD_BYTES} THEN NULL ELSE {column} END"


class Statements:
    """The backend's statements, with the store's schema in place (a checked identifier)."""

    def begin(self, streams: Sequence[str]) -> str:
        """BEGIN, the lock, then the store's id, the head and the versions of `streams` (ids: their text
        needs no quoting) by ``tail_of``, as one simple query."""
        return self.begin_lock.format(",".join(f"'{stream}'" for stream in streams))

    def __init__(self, schema: str) -> None:
        s = schema
        # Any column beyond its bound comes back NULL, never detoasted (octet_length reads a TOASTed value's size).
        page = (f"SELECT seq, {_bounded('stream')}, version, {_bounded('type')}, {_bounded('at')},"
                f" CASE WHEN octet_length(body) > {MAX_EVENT_BYTES} THEN NULL ELSE body END, {_bounded('prev')},"
                f" {_bounded('hash')}, octet_length(body) FROM {s}.events")
        self.identity = (f"SELECT (SELECT system_identifier FROM pg_control_system()),"
                         f" (SELECT {_bounded('value')} FROM {s}.meta WHERE key = 'store_id')")
        self.meta = f"SELECT {_bounded('value')}, octet_length(value) FROM {s}.meta WHERE key = %s"
        self.set_meta = f"INSERT INTO {s}.meta (key, value) VALUES (%s, %s)"
        self.lock_timeout = "SET lock_timeout = '{timeout}'"
        # A writer's first round trip, one simple query. EXCLUSIVE blocks every other writer and no reader; a
        # table lock lives in the lock manager's memory, where a row lock (FOR UPDATE) also writes the row and
        # a WAL record, measured here at twice the server's time. Each statement after the lock takes its own
        # snapshot, so it sees every commit made before the lock was had.
        self.begin_lock = (f"BEGIN ISOLATION LEVEL READ COMMITTED; LOCK TABLE {s}.head IN EXCLUSIVE MODE;"
                           f" SELECT * FROM {s}.tail_of(ARRAY[{{}}]::text[])")
        self.head = f"SELECT seq FROM {s}.head"
        self.hash_at = f"SELECT hash FROM {s}.events WHERE seq = %s"
        self.last = f"SELECT seq, hash, at FROM {s}.events ORDER BY seq DESC LIMIT 1"
        self.stream_version = f"SELECT version FROM {s}.events WHERE stream = %s ORDER BY version DESC LIMIT 1"
        # The head row (its table locked by this transaction), read with the stream's version in one statement. Each
        # write is checked against the last event by advance_head, so a head row edited by hand fails there.
        self.tail = (f"SELECT (SELECT version FROM {s}.events WHERE stream = %s ORDER BY version DESC LIMIT 1),"
                     f" h.seq, h.hash, h.at FROM {s}.head h")
        self.insert = f"INSERT INTO {s}.events ({ROW_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
        self.advance = f"SELECT {s}.advance_head(%s, %s, %s, %s, %s)"
        self.append_rows = (f"SELECT {s}.append_rows(%s::bigint[], %s::text[], %s::bigint[], %s::text[], %s::text[],"
                            " %s::bytea[], %s::bytea[], %s::bytea[], %s::text)")
        self.append_one = f"SELECT {s}.append_one(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        # The appends that end a transaction, with COMMIT in the same simple query (constants in place of {}).
        self.append_one_literal = f"SELECT {s}.append_one({', '.join(['{}'] * 9)}); COMMIT"
        self.append_rows_literal = (f"SELECT {s}.append_rows({{}}::bigint[], {{}}::text[], {{}}::bigint[],"
                                    " {}::text[], {}::text[], {}::bytea[], {}::bytea[], {}::bytea[], {}::text);"
                                    " COMMIT")
        self.notify = f"SELECT pg_notify('{CHANNEL_PREFIX}{s}', %s)"
        self.page_all = f"{page} WHERE seq > %s ORDER BY seq LIMIT %s"
        self.page_stream_seq = f"{page} WHERE stream = %s AND seq > %s ORDER BY version LIMIT %s"
        self.page_stream = f"{page} WHERE stream = %s AND version > %s ORDER BY version LIMIT %s"
        self.row_at = f"{page} WHERE seq = %s LIMIT %s"
        # By the seq index, each row tested as it comes: the stream index would need its rows sorted by seq.
        self.page_within = (f"{page} WHERE seq > %s AND seq <= %s AND (seq BETWEEN %s AND %s"
                            " OR stream = ANY(%s::text[])) ORDER BY seq LIMIT %s")
        # Each stream after the one before, by the (stream, version) index (stream is COLLATE "C", byte
        # order as SQLite sorts): one seek per stream, not a scan of every event's index entry.
        self.streams = (f"WITH RECURSIVE s(stream) AS (SELECT min(stream) FROM {s}.events UNION ALL"
                        f" SELECT (SELECT min(e.stream) FROM {s}.events e WHERE e.stream > s.stream) FROM s"
                        " WHERE s.stream IS NOT NULL) SELECT stream FROM s WHERE stream IS NOT NULL")
        self.bounds = f"SELECT count(*), min(seq) FROM {s}.events"
        # A state beyond the bound is read as empty bytes (octet_length reads a TOASTed value's size, not the value).
        self.snapshot = (f"SELECT version, seq, CASE WHEN octet_length(state) > {MAX_SNAPSHOT_BYTES} THEN ''::bytea"
                         f" ELSE state END, event_hash FROM {s}.snapshots WHERE stream = %s")
        self.put_snapshot = (f"INSERT INTO {s}.snapshots (stream, version, seq, state, event_hash)"
                             " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (stream) DO UPDATE SET"
                             " version = excluded.version, seq = excluded.seq, state = excluded.state,"
                             " event_hash = excluded.event_hash")
        self.snapshot_positions = f"SELECT stream, seq FROM {s}.snapshots ORDER BY seq"
        self.clock = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
        self.host_lease = f"SELECT holder, token, expires_ms FROM {s}.host_leases WHERE stream = %s"
        self.put_host_lease = (f"INSERT INTO {s}.host_leases (stream, holder, token, expires_ms)"
                               " VALUES (%s, %s, %s, %s)"
                               " ON CONFLICT (stream) DO UPDATE SET holder = excluded.holder, token = excluded.token,"
                               " expires_ms = excluded.expires_ms")
        self.clear_snapshots = f"DELETE FROM {s}.snapshots"
