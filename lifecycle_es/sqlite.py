"""The SQLite backend: one apsw connection to one store file, behind `Backend` (see ``backend.py``).

This module holds the connection, reads paged by rows and bytes, inserts read back before they are
acknowledged, and the named queries the store, the projections and the audit need. Its other ideas
sit beside it, the only other modules that speak SQL: ``sqlite_write`` (the write transaction that
always begins IMMEDIATE, and what the connection knows of the log's end while it holds the lock),
``sqlite_savepoint`` (a group commit's command inside it), ``sqlite_schema`` (the schema, its
migrations and the exact check), ``sqlite_profile`` (the pragma profile), ``sqlite_files`` (which
files may be opened, how a store file is born), ``sqlite_read_models`` (the read models' tables),
``sqlite_caches`` (snapshots and host leases) and ``sqlite_errors`` (apsw errors as StoreErrors).
A PostgreSQL backend implements the same interface.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any, cast

import apsw

from . import forked
from .backend import MAX_EVENT_BYTES, MAX_FIELD_BYTES, PAGE_BYTES, PAGE_ROWS, Row, Tail, paged, stream_paged
from .backend import oversized_meta as _oversized_meta
from .errors import IntegrityError, StoreFencedError, StoreFormatError, StoreIOError
from .sqlite_caches import CacheTables
from .sqlite_errors import translated
from .sqlite_files import ROW_COLUMNS, OpenedFiles, check_path, create_file, read_only_fs
from .sqlite_profile import _expect, _pragma, apply_profile, apply_read_profile, set_busy_timeout
from .sqlite_read_models import ReadModelTables
from .sqlite_savepoint import SqliteSavepoint
from .sqlite_schema import APPLICATION_ID, SCHEMA_VERSION, check_format, check_tables, migrate, schema_problems
from .sqlite_write import LogEnd, SqliteTransaction

TEXT_COLUMNS = ("stream", "type", "at")


def _bounded(column: str) -> str:
    """`column` as a read selects it: NULL, never loaded, beyond MAX_FIELD_BYTES (a length is in its header)."""
    return f"iif(octet_length({column}) > {MAX_FIELD_BYTES}, NULL, {column})"


_INSERT = f"INSERT INTO events ({ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
# What an insert left in the file: the head's seq and hash (one seek), and how many rows lie after the head
# the insert chained onto (a count over the rows just written, no column read).
_LANDED = "SELECT seq, hash, (SELECT count(*) FROM events WHERE seq > ?) FROM events ORDER BY seq DESC LIMIT 1"
_STREAM_VERSION = "SELECT version FROM events WHERE stream = ? ORDER BY version DESC LIMIT 1"
# No row when the log is empty; otherwise the head's seq, hash and at, and the stream's version (NULL
# when the stream has no events yet).
_TAIL = ("SELECT (SELECT version FROM events WHERE stream = ?1 ORDER BY version DESC LIMIT 1), seq,"
         f" {_bounded('hash')}, {_bounded('at')} FROM events ORDER BY seq DESC LIMIT 1")
_HEAD_AT = f"SELECT {_bounded('at')} FROM events ORDER BY seq DESC LIMIT 1"
# Each stream after the one before, by the (stream, version) index: one seek per stream (see `streams`).
_STREAMS = ("WITH RECURSIVE s(stream) AS (SELECT min(stream) FROM events UNION ALL"
            " SELECT (SELECT min(stream) FROM events WHERE stream > s.stream) FROM s WHERE s.stream IS NOT NULL)"
            f" SELECT {_bounded('stream')} FROM s WHERE stream IS NOT NULL")
# A row as reads page it: a body beyond the bound comes back NULL, and so does any other column beyond
# MAX_FIELD_BYTES, so neither is ever loaded (SQLite reads a value's length from its header, not its pages).
_PAGE_COLUMNS = ", ".join(["seq", _bounded("stream"), "version", _bounded("type"), _bounded("at"),
                           f"iif(length(body) > {MAX_EVENT_BYTES}, NULL, body)", _bounded("prev"), _bounded("hash")])


class SqliteBackend(ReadModelTables, CacheTables):
    """One apsw connection to one store file, with the write transaction and the queries the store needs."""

    def __init__(self, path: str, *, durability: str, busy_timeout_ms: int, vfs: str | None = None,
                 read_only: bool = False) -> None:
        # SQLITE_OPEN_NOFOLLOW refuses a link anywhere in the path; only the file itself must not be
        # one (check_path refuses that), so the directory is resolved first (/tmp may be a link).
        directory, name = os.path.split(os.path.abspath(path))
        path = os.path.join(os.path.realpath(directory), name)
        self.path = path
        self.read_only = read_only
        self.immutable = False
        exists = check_path(path)
        if not exists:
            if read_only:
                raise StoreIOError(f"store {path!r} does not exist")
            create_file(path, vfs)
        with translated(f"open {path!r}"):
            self.conn = self._connect(path, vfs, read_only)
        # What this connection knows of the log's end between its statements (see ``sqlite_write``).
        self.log_end = LogEnd(self.conn)
        try:
            with translated(f"open {path!r}"):
                # The busy timeout goes first: reading the header must wait, like every later statement,
                # while another process holds the file (converting it to WAL, or checkpointing as it closes).
                set_busy_timeout(self.conn, busy_timeout_ms)
                check_format(self.conn, path)
                if read_only:
                    apply_read_profile(self.conn, busy_timeout_ms=busy_timeout_ms, immutable=self.immutable)
                    if _pragma(self.conn, "user_version") != SCHEMA_VERSION:
                        raise StoreFormatError(f"{path!r} needs a schema migration: open it read-write once")
                else:
                    apply_profile(self.conn, durability=durability, busy_timeout_ms=busy_timeout_ms)
                    migrate(self.conn)
                _expect(self.conn, "application_id", APPLICATION_ID)
                _expect(self.conn, "user_version", SCHEMA_VERSION)
                check_tables(self.conn, path)
                if not read_only:
                    self._refuse_altered_schema()
        except StoreIOError as exc:
            self.conn.close()
            if not read_only and read_only_fs(path):
                # SQLite says only "unable to open database file"; say why.
                raise StoreIOError(f"open {path!r}: the file system is read-only; open it with read_only=True "
                                   "to read it") from exc
            raise
        except BaseException:
            self.conn.close()
            raise
        try:
            self.files = OpenedFiles(path, self.conn, immutable=self.immutable)
        except OSError as exc:
            self.conn.close()
            raise StoreIOError(f"open {path!r}: {exc.strerror}") from exc
        self.identity = self.files.identity
        # A store file an ancestor process was writing when it forked this one: SQLite's copy of its lock here
        # would make every write wait out the busy timeout and fail (`forked.written_at_fork`).
        self.written_by_parent = self.identity in forked.written_at_fork

    def _connect(self, path: str, vfs: str | None, read_only: bool) -> apsw.Connection:
        """Open the connection: read-write, or for a `read_only` store SQLITE_OPEN_READONLY.

        A read-only connection leaves every byte of the file and of its -wal as it found them, even
        when the -wal still holds commits (an evidence copy taken while a writer had the store open): it
        cannot write either, so it neither checkpoints the -wal into the file nor truncates it on close.
        It still needs the -shm, the -wal's index (which holds no data: SQLite rebuilds it from the
        -wal): where it is missing SQLite creates it, and an empty -wal beside a file that had none, and
        leaves both behind (removing them could pull them from under a writer that opened meanwhile).
        Where neither can be created (read-only media) a -wal must already have its -shm.
        """
        if not read_only:
            flags = apsw.SQLITE_OPEN_NOFOLLOW | apsw.SQLITE_OPEN_READWRITE
            return apsw.Connection(path, flags=flags, vfs=vfs)
        if (os.access(path, os.W_OK) and not read_only_fs(path)) or os.path.exists(path + "-wal"):
            return apsw.Connection(path, flags=apsw.SQLITE_OPEN_NOFOLLOW | apsw.SQLITE_OPEN_READONLY, vfs=vfs)
        # No -wal: every commit is in the main file, and nothing can write to it here, so the file is
        # exactly what immutable=1 assumes (no locks, no -shm needed).
        self.immutable = True
        uri = "file:" + urllib.parse.quote(path) + "?immutable=1"
        flags = apsw.SQLITE_OPEN_NOFOLLOW | apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
        return apsw.Connection(uri, flags=flags, vfs=vfs)

    def schema_problems(self) -> list[str]:
        """How the file's schema differs from the store's (see `sqlite_schema.schema_deviations`); empty when exact."""
        with translated("check the store's schema"):
            return schema_problems(self.conn)

    def _refuse_altered_schema(self) -> None:
        """A writer refuses a file whose schema is not the store's: a trigger could drop its writes."""
        problems = self.schema_problems()
        if problems:
            raise StoreFormatError(f"{self.path!r} was altered outside lifecycle-es, so it is not opened for "
                                   f"writing: {'; '.join(problems[:5])}"
                                   + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
                                   + "; audit it (lifecycle-es audit) and restore the store from a good copy")

    def file_identity(self) -> tuple[int, int]:
        """(device, inode) of the store file, to notice a file replaced underneath the connection."""
        try:
            info = os.stat(self.path)
        except OSError as exc:
            raise StoreFencedError(f"store file {self.path!r} is gone ({exc.strerror})") from exc
        return (info.st_dev, info.st_ino)

    def check_files(self) -> None:
        """StoreFencedError when the files at the store's path are no longer the ones this connection opened
        (see `sqlite_files.OpenedFiles`): its cause names the file and says what to do."""
        cause = self.files.changed()
        if cause is not None:
            raise StoreFencedError(cause)

    # --- transactions -------------------------------------------------------------------------------

    def written_at_fork(self, busy: bool) -> tuple[int, int] | None:
        """In a process just forked from this one: the store file's (device, inode) when this connection had a
        write transaction open at the fork, else None. SQLite says which, unless a thread was inside a call on
        the connection then (apsw refuses the question): `busy` says whether the store was beginning, holding or
        ending a write transaction."""
        try:
            writing = self.conn.txn_state("main") == apsw.SQLITE_TXN_WRITE
        except apsw.ThreadingViolationError:
            writing = busy
        except apsw.Error:
            writing = False
        return self.identity if writing else None

    def write(self, action: str, streams: Sequence[str] = ()) -> SqliteTransaction:
        """A write transaction that begins IMMEDIATE (the lock is had before anything is read); `streams` is
        a hint a local file has no use for (a read costs no round trip)."""
        return SqliteTransaction(self, action)

    def savepoint(self, action: str) -> SqliteSavepoint:
        """A savepoint inside the open write transaction (see `Backend.savepoint`)."""
        return SqliteSavepoint(self, action)

    @contextlib.contextmanager
    def read_tx(self, action: str) -> Iterator[apsw.Connection]:
        """A read transaction: one consistent view of the log for several queries."""
        with translated(action):
            self.conn.execute("BEGIN DEFERRED")
            try:
                yield self.conn
            finally:
                if not self.conn.getautocommit():
                    self.conn.execute("COMMIT")

    # --- queries (callable inside or outside a transaction) ------------------------------------------

    def meta(self, key: str) -> bytes | None:
        """A value of the ``meta`` table."""
        with translated("read meta"):
            rows = self.conn.execute(f"SELECT {_bounded('value')}, length(value) FROM meta WHERE key = ?",
                                     (key,)).fetchall()
        if not rows:
            return None
        value, length = rows[0]
        return cast("bytes", value) if value is not None else _oversized_meta(self.path, key, cast("int", length))

    def set_meta(self, key: str, value: bytes) -> None:
        """Insert a ``meta`` value (inside a write transaction)."""
        self.conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _select(self, action: str, columns: str, tail: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of ``SELECT columns FROM events tail``; text that is not UTF-8 names its seq.

        SQLite keeps whatever bytes a TEXT column was given; a file edited by hand can hold text that
        does not decode, and that must surface as the IntegrityError of that row, not a UnicodeDecodeError.
        """
        with translated(action):
            try:
                return self.conn.execute(f"SELECT {columns} FROM events {tail}", params).fetchall()
            except UnicodeDecodeError:
                raise self._undecodable(tail, params) from None

    def _undecodable(self, tail: str, params: Sequence[Any]) -> IntegrityError:
        raw = ", ".join(f"CAST({column} AS BLOB)" for column in TEXT_COLUMNS)
        for seq, *values in self.conn.execute(f"SELECT seq, {raw} FROM events {tail}", params):
            for column, value in zip(TEXT_COLUMNS, values, strict=True):
                try:
                    value.decode()
                except UnicodeDecodeError:
                    return IntegrityError(seq, f"its {column} is not valid UTF-8 (edited outside the store)")
        return IntegrityError(0, "a text value is not valid UTF-8 (edited outside the store)")

    def head(self) -> tuple[int, bytes | None, str | None]:
        """(seq, hash, at) of the last event; (0, None, None) for an empty log. An index lookup."""
        rows = self._select("read head", f"seq, {_bounded('hash')}, {_bounded('at')}", "ORDER BY seq DESC LIMIT 1")
        return rows[0] if rows else (0, None, None)

    def head_at(self) -> str | None:
        """The head's at (None for an empty log): the earliest an event appended now may be stamped.

        Inside a write transaction, answered from what the connection knows of the log's end when it
        can (no query: see ``sqlite_write``).
        """
        known, at = self.log_end.head_at()
        if known:
            return at
        with translated("read the head's time"):
            rows = self.conn.execute(_HEAD_AT).fetchall()
        return cast("str", rows[0][0]) if rows else None

    def stream_version(self, stream: str) -> int:
        """The last version of a stream (0 when it has none). An index lookup."""
        # ORDER BY ... LIMIT 1 seeks the (stream, version) index; max(version) with a WHERE scans every
        # entry of the stream, so an append would cost more the longer its stream grew.
        with translated("read stream version"):
            rows = self.conn.execute(_STREAM_VERSION, (stream,)).fetchall()
        return cast("int", rows[0][0]) if rows else 0

    def tail(self, stream: str) -> Tail:
        """(stream version, head seq, head hash, head at), read in one statement: what an append reads under the lock.

        Inside a write transaction, without a statement when the connection knows them: it holds the
        write lock, saw its own rows land, and can tell that nothing else changed the file since
        (`sqlite_write.LogEnd` says exactly when). A command reads the tail to decide and its append
        reads it again; the commands of a group commit's batch each read theirs after the others'
        inserts; a lone command follows its own last commit. None of them reads the file for it.
        """
        end = self.log_end
        known = end.known(stream)
        if known is not None:
            return known
        with translated("read stream version and head"):
            rows = self.conn.execute(_TAIL, (stream,)).fetchall()
        # STRICT columns: the types Tail names.
        found = cast("Tail", (rows[0][0] or 0, *rows[0][1:])) if rows else (0, 0, None, None)
        if rows and (type(found[2]) is not bytes or len(found[2]) != 32):
            # A head no append leaves (its hash edited away, or beyond MAX_FIELD_BYTES): chaining onto it would
            # bury the edit under events that verify against it.
            raise IntegrityError(found[1], "the head's hash is not 32 bytes, so the file was edited: audit it "
                                           "(lifecycle-es audit) and restore it from a good copy")
        end.read(stream, found)
        return found

    def insert(self, rows: Sequence[Row]) -> None:
        """Insert event rows (inside a write transaction), then check that the file holds them.

        SQLite reports an insert done when a trigger (``RAISE(IGNORE)``) made it skip the row. So the head
        is read back and must be the last row written, seq and hash, with as many rows after the head the
        insert chained onto as it wrote (seqs are unique integers: that many in that range is every one of
        them), or StoreFormatError: the write is not acknowledged, the transaction is rolled back, and no
        head that is not in the file is kept for the next append.
        """
        if not rows:
            return
        conn = self.conn
        self.log_end.check_open("append", always=True)
        before = conn.total_changes()
        conn.executemany(_INSERT, rows)
        seq, digest = rows[-1][0], rows[-1][7]
        first = rows[0][0]
        landed = conn.execute(_LANDED, (first - 1,)).fetchall()
        if not landed or landed[0] != (seq, digest, len(rows)):
            found = landed[0][2] if landed else 0
            raise StoreFormatError(
                f"{self.path!r} did not keep the write: {len(rows)} event(s) inserted at seq {first}..{seq}, "
                f"{found} found there; the store's schema was altered (a trigger?), so nothing was appended: "
                "audit the file (lifecycle-es audit)")
        self.log_end.inserted(rows, before)

    def pages(self, *, after: int, stream: str | None, limit: int | None = None) -> Iterator[list[Row]]:
        """The rows with seq > `after`, in seq order, optionally of one stream and at most `limit`, in pages.

        A page ends at PAGE_ROWS rows or once its bodies reach PAGE_BYTES, so memory stays bounded
        however large the events; each page is one statement, finished before it is yielded. A row whose
        body is beyond MAX_EVENT_BYTES (or whose text is not UTF-8) ends the page before it, and raises
        IntegrityError at its seq when it comes first: a reader meets the rows before it first.
        """
        if stream is None:
            return paged(lambda start, want: self._page("read events", "WHERE seq > ? ORDER BY seq LIMIT ?",
                                                        (start, want)), after=after, limit=limit)
        # Versions rise with seq inside a stream, so the (stream, version) index gives seq order.
        return paged(lambda start, want: self._page("read events", "WHERE stream = ? AND seq > ? ORDER BY version"
                                                    " LIMIT ?", (stream, start, want)), after=after, limit=limit)

    def pages_within(self, *, after: int, through: int, seqs: tuple[int, int],
                     streams: Sequence[str]) -> Iterator[list[Row]]:
        """The rows with `after` < seq <= `through` whose seq is in ``[seqs[0], seqs[1]]`` or whose stream is one
        of `streams`, in seq order, in pages (see `pages`).

        The streams go as one JSON array, read by ``json_each`` into a set SQLite builds once per page; the
        rows are walked by seq (``+stream`` keeps the planner off the stream index, whose rows would need a
        sort), each tested in C, so a row not wanted never reaches Python.
        """
        wanted = json.dumps(list(streams), ensure_ascii=False)
        low, high = seqs
        return paged(lambda start, want: self._page(
            "read events", "WHERE seq > ? AND seq <= ? AND (seq BETWEEN ? AND ? OR +stream IN"
            " (SELECT value FROM json_each(?))) ORDER BY seq LIMIT ?", (start, through, low, high, wanted, want)),
            after=after, limit=None)

    def stream_pages(self, stream: str, *, after_version: int) -> Iterator[list[Row]]:
        """One stream's rows with version > `after_version`, in order, in pages (see `pages`)."""
        return stream_paged(lambda start: self._page("read stream", "WHERE stream = ? AND version > ? ORDER BY"
                                                     " version LIMIT ?", (stream, start, PAGE_ROWS)),
                            after_version=after_version)

    def row_at(self, seq: int) -> Row | None:
        """The row at `seq`, if any (IntegrityError when its body is beyond the bound)."""
        rows = self._page("read event", "WHERE seq = ? LIMIT ?", (seq, 1))[0]
        return rows[0] if rows else None

    def _page(self, action: str, tail: str, params: Sequence[Any]) -> tuple[list[Row], bool]:
        """The rows of ``SELECT ... FROM events tail`` (its last parameter the LIMIT), up to PAGE_BYTES of
        bodies, and whether the page is full (the next may hold more)."""
        rows: list[Row] = []
        size = 0
        with translated(action):
            cursor = self.conn.execute(f"SELECT {_PAGE_COLUMNS} FROM events {tail}", params)
            try:
                for row in cursor:
                    try:
                        size += len(row[5])
                    except TypeError:  # NULL: a body beyond the bound, or one smuggled past STRICT (or a number)
                        if row[5] is None and self._oversized(row, first=not rows):
                            return rows, True
                    rows.append(row)
                    if size >= PAGE_BYTES:
                        return rows, True
            except UnicodeDecodeError:
                # SQLite keeps whatever bytes a TEXT column was given; a file edited by hand can hold text
                # that does not decode: the page ends before that row, and a page it begins names its seq.
                if rows:
                    return rows, True
                raise self._undecodable(tail, params) from None
            finally:
                cursor.close()
        return rows, len(rows) == params[-1]

    def _oversized(self, row: Row, *, first: bool) -> bool:
        """Whether `row`'s NULL body stands for one beyond the bound (IntegrityError when `first` in its page)."""
        seq = row[0]
        ((length,),) = cast("list[tuple[int | None]]", self.conn.execute(
            "SELECT length(body) FROM events WHERE seq = ?", (seq,)).fetchall())
        if length is None or length <= MAX_EVENT_BYTES:
            return False  # NULL itself: the hash check names it
        if not first:
            return True
        raise IntegrityError(seq, f"its body is {length:,} bytes, beyond the bound of {MAX_EVENT_BYTES:,} "
                                  "(MAX_EVENT_BYTES): no command writes one so large",
                             stream=row[1] if isinstance(row[1], str) else None)

    def streams(self) -> list[str]:
        """Every stream id, sorted.

        A skip-scan of the (stream, version) index, one seek per stream, not a walk over every event's
        entry: a fleet's view lists its runners first, and a million events must not cost a scan.
        """
        with translated("list streams"):
            try:
                return [row[0] for row in self.conn.execute(_STREAMS)]
            except UnicodeDecodeError:
                pass
        # Text that is not UTF-8 (a file edited by hand) is named at its seq by the plain scan.
        return [row[0] for row in self._select("list streams", f"DISTINCT {_bounded('stream')}", "ORDER BY stream")]

    def data_version(self) -> int:
        """SQLite's data_version: changes when another connection commits. StoreFencedError when the files are
        not the ones opened (`check_files`): this connection's number would never move again."""
        self.check_files()
        with translated("read data_version"):
            return int(_pragma(self.conn, "data_version"))

    def wait(self, timeout: float, stop: threading.Event | None = None) -> None:
        """Sleep `timeout` seconds (or until `stop` is set): SQLite tells no one of a commit, so followers poll."""
        if stop is not None:
            stop.wait(timeout)
        else:
            time.sleep(timeout)

    def clock_ms(self) -> int | None:
        """None: a file has no clock of its own (the store's clock decides host leases' expiry)."""
        return None

    def seq_bounds(self) -> tuple[int, int | None]:
        """How many rows the events table holds, and its lowest seq (None when empty): a walk that reads
        seq 1, 2, ... sees a row moved outside that range only through these."""
        with translated("count events"):
            (count, lowest), = cast("list[tuple[int, int | None]]", self.conn.execute(
                "SELECT count(*), min(seq) FROM events").fetchall())
        return count, lowest

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        """Run one raw statement: for tests and tools that must reach under the store (to tamper with a
        file, or read a pragma). Not part of `Backend`: nothing in the packages uses it."""
        with translated("execute"):
            return self.conn.execute(sql, params).fetchall()

    def close(self) -> None:
        """Close the connection (SQLite checkpoints the WAL when the last connection closes).

        When the file at `path` is no longer the one opened (replaced or removed underneath), SQLite
        skips that checkpoint and leaves our WAL at ``<path>-wal``, where the next opener of whatever
        file is at `path` would replay our pages into it. So the WAL is first folded into the file it
        belongs to (through our open descriptor) and emptied.
        """
        with translated("close"):
            if self._moved():
                with contextlib.suppress(apsw.Error):
                    self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self.conn.close()

    def _moved(self) -> bool:
        try:
            return self.file_identity() != self.identity
        except StoreFencedError:
            return True
