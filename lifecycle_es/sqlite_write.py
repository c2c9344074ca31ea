"""The SQLite backend's write transaction, and what its connection knows of the log's end between statements.

    with backend.write("acquire_lease"):     # BEGIN IMMEDIATE ... COMMIT (ROLLBACK when the block raised)
        backend.tail("runner-1")             # a query, or what `LogEnd` knows without one

An append decides against the log's end: the head's seq, hash and at, and its stream's version (a
`Tail`). Reading them is a statement; a connection that holds the write lock can often know them
instead, because nothing but itself can move them while it holds the lock, and it saw every row it
wrote land (`SqliteBackend.insert` reads the head back). `LogEnd` keeps that knowledge, and only as
long as it provably holds:

- inside a write transaction, while the connection's ``total_changes`` is what it was when the
  knowledge was last made exact: any write of this connection that `LogEnd` did not see (a read
  model's row, a snapshot, a row put in by hand) moves it, and the next `tail` reads the file again;
- across transactions, when the connection's data version and ``total_changes`` are still what they
  were just after the commit that left it: no connection, this one or another in any process, has
  changed the file since (SQLite trusts its page cache on the same evidence);
- after a write of its own to another table (a snapshot, a host lease row) that changed its one row
  and nothing else: no trigger wrote to the log with it (a trigger's rows count in ``total_changes``);
- never after a rollback, of the transaction or of a savepoint in it (``total_changes`` does not go
  back with the rows): then everything is forgotten.

So a batch of commands of a group commit, each on its own stream, reads no tail at all once the
streams are known, and a lone command none either. Were the knowledge ever wrong, the insert of a seq
already taken would fail its primary key and a version already taken its UNIQUE (stream, version): a
stale tail cannot fork the chain or a stream. Streams known are bounded (`MAX_KNOWN_STREAMS`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import apsw

from .backend import Row, Tail
from .errors import StoreBehindSealError, StoreError, StoreFencedError, StoreIOError
from .sqlite_errors import SYNC_FAILURES, translation

if TYPE_CHECKING:
    from .sqlite import SqliteBackend

_HASH_AT = "SELECT hash FROM events WHERE seq = ?"
_HEAD_SEQ = "SELECT seq FROM events ORDER BY seq DESC LIMIT 1"

MAX_KNOWN_STREAMS = 65_536
"""The most streams whose versions a connection keeps; past it, it starts again from none."""


class LogEnd:
    """What one connection knows of the log's end: the head, and the versions of the streams it read or wrote.

    `head` is (seq, hash, at) and `versions` maps a stream to its last version; both hold while
    `changes` equals the connection's ``total_changes`` inside a write transaction (see the module).
    `acked` is the last event (seq, hash) a commit of this connection left as the head, which the log must
    keep: a write transaction that begins after another connection wrote checks it is still there.
    """

    __slots__ = ("acked", "changes", "committed", "conn", "head", "versions", "writing")

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn
        self.writing = False
        self.head: tuple[int, bytes | None, str | None] = (0, None, None)
        self.versions: dict[str, int] = {}
        self.changes = -1  # no value of total_changes: nothing is known
        # (data version, total_changes) just after the commit that left the knowledge exact, or None.
        self.committed: tuple[int, int] | None = None
        # The last event (seq, hash) a commit of this connection left as the head: the log must keep it.
        self.acked: tuple[int, bytes | None] = (0, None)

    def check_open(self, action: str, *, always: bool = False) -> None:
        """StoreIOError when a write transaction was begun and the database has ended it (on an error its caller
        caught and went on from): a write now would commit by itself, outside the transaction the caller
        believes it is in. `always`: whenever no transaction is open (a write that is never made outside one)."""
        if (self.writing or always) and self.conn.getautocommit():
            self.forget()
            raise StoreIOError(f"{action}: the write transaction is no longer open (the database ended it on an "
                               "earlier error), so nothing more is written in it: nothing of it was committed")

    def forget(self) -> None:
        """Drop everything known (a rollback, a failed write, a commit whose result is not known)."""
        self.changes = -1
        self.committed = None
        self.versions = {}

    def begin(self) -> None:
        """A write transaction began: keep what the last commit left only if nothing changed the file since."""
        conn = self.conn
        changes = conn.total_changes()
        if self.committed is not None and self.committed == (conn.data_version(), changes):
            self.changes = changes
        else:
            self.forget()
        self.committed = None
        self.writing = True

    def known(self, stream: str) -> Tail | None:
        """The stream's tail when it is known now, else None (then the caller reads it)."""
        if not self.writing or self.changes != self.conn.total_changes():
            return None
        version = self.versions.get(stream)
        if version is None:
            return None
        seq, digest, at = self.head
        return (version, seq, digest, at)

    def head_at(self) -> tuple[bool, str | None]:
        """(True, the head's at) when the head is known now, else (False, None)."""
        if self.writing and self.changes == self.conn.total_changes():
            return True, self.head[2]
        return False, None

    def read(self, stream: str, found: Tail) -> None:
        """`found` was just read from the file under the write lock: it is the head, and the stream's version."""
        if not self.writing:
            return
        changes = self.conn.total_changes()
        if changes != self.changes or len(self.versions) >= MAX_KNOWN_STREAMS:
            self.versions = {}
        self.head = found[1:]
        self.versions[stream] = found[0]
        self.changes = changes

    def wrote_one(self, before: int) -> None:
        """A statement of ours wrote one row to a table other than the log; `before` was ``total_changes``
        before it. The knowledge still holds when it held before and the statement changed that row alone:
        one row changed by the statement itself, and no other by anything it set off (a trigger's rows count
        in ``total_changes`` but not in ``changes``, and one that skips the statement's row leaves none)."""
        conn = self.conn
        if self.changes == before and conn.changes() == 1 and conn.total_changes() == before + 1:
            self.changes = before + 1

    def inserted(self, rows: Sequence[Row], before: int) -> None:
        """`rows` were inserted and seen to land, the last one now the head; `before` was ``total_changes``
        before the insert (what was known then still holds for every stream but theirs)."""
        if not self.writing:
            self.forget()
            return
        if before != self.changes:
            self.versions = {}
        versions = self.versions
        for row in rows:
            known = versions.get(row[1])
            # A stream read before the insert: its version is the highest of the two. One never read
            # stays unknown (a row put in by hand may have left it higher than this one).
            if known is not None and row[2] > known:
                versions[row[1]] = row[2]
        last = rows[-1]
        self.head = (last[0], last[7], last[4])
        self.changes = self.conn.total_changes()

    def ended(self, committed: bool) -> None:
        """The transaction ended: committed (keep what is exact at the commit) or rolled back (forget)."""
        self.writing = False
        conn = self.conn
        if committed and self.changes == conn.total_changes():
            self.committed = (conn.data_version(), self.changes)
            if self.head[0] > self.acked[0]:
                self.acked = (self.head[0], self.head[1])
        else:
            self.forget()


class SqliteTransaction:
    """`SqliteBackend.write`: BEGIN IMMEDIATE, then COMMIT, or ROLLBACK when the block raised.

    A class rather than a generator for the same reason as `translated`. A failed fsync at COMMIT
    leaves the commit's outcome unknown: that is a StoreIOError with ``outcome_unknown`` set; so are the
    store's files found changed right after COMMIT (`sqlite_files.OpenedFiles.committed`).
    """

    __slots__ = ("action", "conn", "end", "files", "foreign", "parent_wrote", "path")

    def __init__(self, backend: SqliteBackend, action: str) -> None:
        self.path = backend.path
        self.conn = backend.conn
        self.end = backend.log_end
        self.files = backend.files
        self.action = action
        self.parent_wrote = backend.written_by_parent
        # A transaction open on the connection before this one began is not this one's to roll back (a caller's
        # read transaction, which BEGIN refuses to nest in): True until BEGIN is about to run.
        self.foreign = True

    def __enter__(self) -> apsw.Connection:
        if self.parent_wrote:
            raise StoreFencedError(
                f"{self.action}: this process was forked while a thread of its parent was writing the store file "
                f"{self.path!r}. SQLite keeps, in each process, the locks its connections hold on a file, and this "
                "process's copy says that write is still going on, so no connection opened here can write the file "
                "(each write would wait out the busy timeout for a lock nothing here releases). Write it from a "
                "process not forked from a writer: multiprocessing's 'spawn' or 'forkserver' start method, or a "
                "fork made before the store was opened; reading it from here works")
        try:
            self.foreign = not self.conn.getautocommit()
            if self.foreign:
                # SQLite would refuse it too, but only after taking the write lock, which the open transaction
                # (a caller's read) would then hold until it ends: every other writer busy meanwhile.
                raise StoreError(f"{self.action}: cannot start a transaction within a transaction")
            self.conn.execute("BEGIN IMMEDIATE")
        except apsw.Error as exc:
            raise translation(self.action, exc) from exc
        end = self.end
        end.begin()
        if end.changes == -1 and end.acked[0]:  # another connection wrote since this one's last commit
            self._check_acked()
        return self.conn

    def _check_acked(self) -> None:
        """With the write lock: StoreBehindSealError (the transaction rolled back) unless the log still holds
        the last event this connection committed, as it committed it. Without it the file was restored
        under the connection (an older copy written in through SQLite, which every connection follows):
        appending would chain onto the older head and fork the log. One lookup by seq, taken only when
        another connection changed the file since this one's last commit."""
        conn, end = self.conn, self.end
        seq, digest = end.acked
        try:
            row = conn.execute(_HASH_AT, (seq,)).fetchone()
            if row is not None and row[0] == digest:
                return
            head = conn.execute(_HEAD_SEQ).fetchone()
        except apsw.Error as exc:
            self.__exit__(type(exc), exc, None)  # rolls back, and raises it as a StoreError
            raise
        end.ended(committed=False)
        with contextlib.suppress(apsw.Error):
            conn.execute("ROLLBACK")
        head_seq = int(head[0]) if head else 0
        raise StoreBehindSealError(
            f"the store file {self.path!r} no longer holds seq {seq} as this handle committed it (its head is seq "
            f"{head_seq}): an older copy was written into it under this handle (a restore through SQLite?), so the "
            "events after its head are gone from it. Nothing more is written through this handle: audit the "
            "store, find the copy that holds the missing events, then reopen it", sealed_seq=seq, head_seq=head_seq)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:
        conn, end = self.conn, self.end
        if exc is not None:
            end.ended(committed=False)
            try:
                if not self.foreign and not conn.getautocommit():
                    conn.execute("ROLLBACK")
            except apsw.Error as error:
                raise translation(self.action, error) from error
            if isinstance(exc, apsw.Error):
                raise translation(self.action, exc) from exc
            return False
        try:
            conn.execute("COMMIT")
        except apsw.IOError as error:
            end.ended(committed=False)
            if not conn.getautocommit():
                with contextlib.suppress(apsw.Error):
                    conn.execute("ROLLBACK")
            if getattr(error, "extendedresult", None) in SYNC_FAILURES:
                raise StoreIOError(f"{self.action}: the commit's fsync failed ({error}): whether it reached the "
                                   "disk is unknown", outcome_unknown=True) from error
            raise translation(self.action, error) from error
        except BaseException as error:
            end.ended(committed=False)
            if isinstance(error, apsw.Error):
                raise translation(self.action, error) from error
            raise
        end.ended(committed=True)
        changed = self.files.committed()
        if changed is not None:
            # Changed during the transaction: the commit went to the files this connection has open, which
            # may no longer be the store's (a WAL no one else reads, a file renamed away).
            end.forget()
            raise StoreIOError(f"{self.action}: the store's files changed while it committed, so whether the store "
                               f"holds the commit is unknown: {changed}", outcome_unknown=True)
        return False
