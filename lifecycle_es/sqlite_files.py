"""The SQLite backend's files: what may be opened as a store, how a new store file is born, and whether the
files an open connection uses are still the ones at the store's path.

A store file must be a regular file (never a link, a directory or a device). A new one is built under
a temporary name, already in WAL mode with its whole schema, fsynced, and linked into place, so no one
ever sees a half-made store; an orphaned ``-wal`` (of a store removed while in use) refuses creation.

A connection keeps the store file, its WAL (``-wal``) and the WAL's index (``-shm``) open by descriptor.
Another process that removes or replaces one of them at the path (a restore, a cleanup, a copy) leaves the
connection on files no one else opens: its commits would land in a WAL no other connection reads (lost
when the process dies) or be indexed where no other writer looks. `OpenedFiles` notices, and so does a
store file cut short below the size it had at the last commit: one ``os.stat`` of the store file, one
of its directory, and one per side file only when the directory changed. A ``stat`` of the ``-wal``
before its next ``fdatasync`` makes that sync cost a journal commit more on current Linux (about 90 µs
a commit here), while no side file is removed, created or renamed without changing the directory's
ctime.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable, Sequence

import apsw

from .backend import Row
from .errors import StoreBusyError, StoreError, StoreFormatError, StoreIOError
from .sqlite_errors import translated
from .sqlite_profile import _pragma, set_journal_mode_wal
from .sqlite_schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION

ROW_COLUMNS = "seq, stream, version, type, at, body, prev, hash"
"""The events table's columns in a row's order."""


def check_path(path: str) -> bool:
    """Whether `path` exists as a regular file; refuse links, directories and devices."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            raise StoreIOError(f"cannot create store {path!r}: directory {parent!r} does not exist") from None
        return False
    except OSError as exc:
        raise StoreIOError(f"cannot open store {path!r}: {exc.strerror}") from exc
    if stat.S_ISLNK(info.st_mode):
        raise StoreFormatError(f"store path {path!r} is a symbolic link; open the file it names instead")
    if stat.S_ISDIR(info.st_mode):
        raise StoreFormatError(f"store path {path!r} is a directory, not a store file")
    if not stat.S_ISREG(info.st_mode):
        raise StoreFormatError(f"store path {path!r} is not a regular file")
    if info.st_size == 0:
        raise StoreFormatError(f"store file {path!r} is empty: not a lifecycle-es store")
    return True


SETTLED_NS = 2_000_000_000
"""How long a directory must have been still before its unchanged ctime vouches for its side files (far
beyond a file system's timestamp granularity)."""

FileId = tuple[int, int]
"""A file's (device, inode): which file a path names, whatever it holds."""


def side_files(path: str) -> tuple[str, str]:
    """The side files of the store file at `path`: its WAL and the WAL's index."""
    return (f"{path}-wal", f"{path}-shm")


def file_id(path: str) -> FileId | None:
    """The (device, inode) of the file at `path` now, or None when there is none."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def changed_file(recorded: Sequence[tuple[str, FileId | None]]) -> tuple[str, str] | None:
    """The first of the (path, identity) pairs in `recorded` whose file is no longer that one, with how
    (``"removed"`` or ``"replaced"``); None when each still is. A path recorded with no file is not watched."""
    for path, identity in recorded:
        if identity is None:
            continue
        try:
            now = file_id(path)
        except OSError:
            now = None  # unreadable now: it is not the file the connection has open, as far as anyone can tell
        if now != identity:
            return path, "removed" if now is None else "replaced"
    return None


class OpenedFiles:
    """The store file and its side files as a connection (`conn`) opened them, and the store file's size at the
    last commit: `changed` says when the files at the path are no longer those (one ``os.stat`` per file, and
    one read transaction when the store file shrank)."""

    __slots__ = ("conn", "directory", "identity", "immutable", "path", "settled", "sides", "size")

    def __init__(self, path: str, conn: apsw.Connection, *, immutable: bool = False) -> None:
        self.path = path
        self.conn = conn
        self.immutable = immutable
        info = os.stat(path)
        self.identity: FileId = (info.st_dev, info.st_ino)
        self.size = info.st_size
        # Recorded once the connection has read: SQLite opens (and creates) both then. An immutable open uses
        # neither (a stray -shm left there is no file of its own); its -wal must stay absent instead.
        self.sides = [] if immutable else [(side, file_id(side)) for side in side_files(path)]
        self.directory = os.path.dirname(path) or "."
        self.settled: tuple[int, int, int, int] | None = None  # the directory when the side files last checked out

    def changed(self) -> str | None:
        """Why the files at the store's path are not the ones the connection opened, naming the file and
        what to do, or None: the store file gone, replaced or shorter than at the last commit, a side file
        removed or replaced, or (`immutable`) a -wal made by a writer since."""
        return self._check()[0]

    def committed(self) -> str | None:
        """After a commit: `changed`, and when nothing did, the store file's size now is the least it may have."""
        cause, size = self._check()
        if cause is None and size > self.size:
            self.size = size
        return cause

    def _check(self) -> tuple[str | None, int]:
        path = self.path
        try:
            info = os.stat(path)
        except OSError as exc:
            return (f"store file {path!r} is gone ({exc.strerror}): reopen the store (a new file there starts "
                    "empty)"), 0
        if (info.st_dev, info.st_ino) != self.identity:
            return (f"store file {path!r} was replaced underneath this connection, which still has the old one "
                    "open: reopen the store to use the file now at that path"), 0
        if info.st_size < self.size:
            missing = self._pages_missing()
            if missing:
                return (f"store file {path!r} was cut short underneath this connection ({info.st_size:,} bytes, "
                        f"{self.size:,} at its last commit), so events it held may be gone: audit it "
                        "(lifecycle-es audit) and restore it from a good copy before you reopen the store"), 0
            if missing is not None:
                self.size = info.st_size  # shrunk by another connection, every page held: the least from now on
        if self.immutable and os.path.lexists(side_files(path)[0]):
            return (f"{side_files(path)[0]!r} appeared underneath this connection, which opened the store immutable "
                    "(read-only, no -wal then) and never reads a -wal: another connection opened the store since, "
                    "and a writer's commits go there; reopen the store to read them"), 0
        if self.sides:
            seen = self._directory()
            if seen is None or seen != self.settled:
                side = changed_file(self.sides)
                if side is not None:
                    return (f"{side[0]!r} was {side[1]} underneath this connection, which would commit where no "
                            "other connection looks: close this handle and reopen the store"), 0
                self.settled = seen
        return None, info.st_size

    def _directory(self) -> tuple[int, int, int, int] | None:
        """The directory's (device, inode, mtime, ctime) when it has been still for `SETTLED_NS`, else None.

        A side file removed, created or renamed changes the directory's ctime, which no one can set back.
        Read before the side files are, and trusted only once settled: a change in the same clock tick as
        a recent ctime could leave it unchanged, but a change after a ctime older than `SETTLED_NS` stamps
        a later one.
        """
        try:
            info = os.stat(self.directory)
        except OSError:
            return None
        if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) <= SETTLED_NS:
            return None
        return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)

    def _pages_missing(self) -> bool | None:
        """Whether the store file and its WAL together are too short for the pages the log now counts: pages gone
        underneath. Asked only of a file that shrank, which another connection's VACUUM and checkpoint do
        legitimately (then every page is in one of the two). One read transaction: while it lasts no
        checkpoint takes from the file a page its snapshot needs. None when it cannot judge now: inside a
        transaction of this connection (its pages not yet in either file), or the store busy; a later check
        judges (the check after a commit, or the next write's)."""
        conn = self.conn
        if not conn.getautocommit():
            return None
        try:
            with translated("check the store file's size"):
                conn.execute("BEGIN")
                try:
                    pages = int(_pragma(conn, "page_count"))
                    page_size = int(_pragma(conn, "page_size"))
                    held = os.stat(self.path).st_size
                    with contextlib.suppress(FileNotFoundError):
                        held += os.stat(side_files(self.path)[0]).st_size
                finally:
                    conn.execute("COMMIT")
        except StoreBusyError:
            return None  # busy, not short (and never an error of its own after a commit that landed)
        except (StoreError, OSError):
            return True  # unreadable as it is now: as far as anyone can tell, pages are gone
        return held < pages * page_size


def create_file(path: str, vfs: str | None, *, store_id: bytes | None = None, key_id: str | None = None,
            rows: Iterable[Row] = (), exclusive: bool = False) -> None:
    """Create a new store atomically: built under a temporary name, then linked into place.

    No one ever sees a half-made file at `path`, and two processes creating the same store at
    once end with one of them opening the other's. A non-empty ``<path>-wal`` with no file at `path`
    is the WAL of a store removed underneath a process that then died: SQLite would replay its pages
    into the new file, so creating is refused (StoreFormatError) until it is removed.
    `store_id`, `key_id`, `rows` and `exclusive` serve `create_store` (see there).
    """
    _refuse_orphan_wal(path)
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, f".{os.path.basename(path)}.creating-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    except OSError as exc:
        raise StoreIOError(f"cannot create store {path!r}: {exc.strerror}") from exc
    try:
        with translated(f"create {path!r}"):
            conn = apsw.Connection(temp, flags=apsw.SQLITE_OPEN_READWRITE, vfs=vfs)
            try:
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.execute("PRAGMA journal_mode=delete")
                conn.execute("BEGIN IMMEDIATE")
                for version in range(1, SCHEMA_VERSION + 1):
                    for statement in MIGRATIONS[version]:
                        conn.execute(statement)
                conn.execute("INSERT INTO meta (key, value) VALUES ('store_id', ?)",
                             (store_id if store_id is not None else os.urandom(16),))
                if key_id is not None:
                    conn.execute("INSERT INTO meta (key, value) VALUES ('key_id', ?)", (key_id.encode(),))
                conn.executemany(f"INSERT INTO events ({ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("COMMIT")
                # Born in WAL mode (the header keeps it; closing folds the -wal back in): openers never
                # convert it, and a journal-mode change is the one lock SQLite may refuse at once,
                # without waiting, when several processes open a new store together.
                set_journal_mode_wal(conn)
            finally:
                conn.close()
        fd = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, path)
        except FileExistsError:
            if exclusive:
                raise StoreIOError(f"cannot create store {path!r}: a file exists there") from None
        _fsync_dir(directory)
    except OSError as exc:
        raise StoreIOError(f"cannot create store {path!r}: {exc.strerror}") from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def create_store(path: str, *, store_id: bytes, key_id: str | None, rows: Iterable[Row]) -> None:
    """Create a new store file at `path` that holds `rows` exactly, under the given store id and key id.

    For restoring an export (``lifecycle-es import``): the rows were chained under `store_id` (their
    first ``prev`` derives from it), so they go in as they are, never re-chained, and the caller
    verifies the chain before and after. The file is built under a temporary name and linked into place
    once every row is in: `path` ends up holding all of them or nothing is there. A file already at
    `path` raises StoreIOError and is left alone; an exception raised by `rows` propagates.
    """
    if os.path.lexists(path):
        raise StoreIOError(f"cannot create store {path!r}: a file exists there")
    create_file(path, None, store_id=store_id, key_id=key_id, rows=rows, exclusive=True)


def _refuse_orphan_wal(path: str) -> None:
    wal = path + "-wal"
    try:
        orphan = os.stat(wal).st_size > 0
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreIOError(f"cannot create store {path!r}: cannot check {wal!r} ({exc.strerror})") from exc
    # Checked after the WAL: a creator racing us links `path` before its WAL exists, so it is seen here.
    if orphan and not os.path.lexists(path):
        raise StoreFormatError(f"{wal!r} exists without its store {path!r} (a store removed while in use?); "
                               "restore the store or remove the WAL before creating a new one")


def read_only_fs(path: str) -> bool:
    """Whether the file system holding `path` is mounted read-only."""
    try:
        return bool(os.statvfs(os.path.dirname(path) or ".").f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
