"""A fault-injecting SQLite VFS for tests: power cuts, full disks, I/O errors, read-only file systems.

`FaultVFS` is an ``apsw.VFS`` that inherits every method from the default (unix) VFS and wraps the
files SQLite opens through it. Writes go through to the real files at once, so locking, the WAL index
(``-shm``, memory-mapped through xShmMap, passed through untouched) and reads behave exactly as they
do without it; syncs reach the disk only with ``FaultVFS(fsync=True)``, since the model below, not
the disk, decides what a power cut keeps. Beside the real files it keeps that model:

- for each main database, WAL and rollback-journal file: its **durable** content (as of its last
  xSync) and the writes and truncations it received since (**pending**);
- whether the file's directory entry is durable: a file that was there before the VFS first opened
  it is; a WAL or journal SQLite creates becomes durable on its first xSync, because the unix VFS
  fsyncs the directory then (UNIXFILE_DIRSYNC); an unlink that SQLite did not ask to be synced
  (the WAL deleted on close) may be undone by a power loss, bringing back the file's durable content
  (a **ghost**).

A power cut (`power_off`, or `cut_after` to let it happen in the middle of an operation) stops every
later write, truncate, sync and delete with SQLITE_IOERR, as if the machine stopped there. Once every
connection is closed, `power_cut` rewrites the files to what the disk could hold after the reboot: the
durable content plus the pending writes a `CutChooser` picks, in the order it picks them (so writes
may be dropped whole, reordered, or torn: only the part before a 512-byte sector boundary lands), and
deletes every ``-shm`` (it is rebuilt from the WAL by the next opener, whatever it held).

Modelled faithfully: POSIX fsync semantics per file (a sync of any handle makes the file's writes
durable), the unix VFS's directory sync for new journals, non-durable unlinks, torn and reordered
writes within what SQLITE_IOCAP_POWERSAFE_OVERWRITE promises (the unix VFS claims it: bytes outside a
write's range are never damaged, so a tear never touches neighbouring data).

Not modelled: files created or synced outside this VFS (the store's own creation under a temporary
name, the seal file: both are fsynced with their directory by the library itself, so the model takes
any file it has not seen as durable, which makes tests start from a cleanly closed store); a file
extended by its size metadata whose data did not land (zeros); a tear that keeps later sectors of a
write but not earlier ones; damage to data that was already durable (bit rot, lying drives).

Other faults: `inject` makes the N-th write (or sync, or truncate) from now raise SQLITE_FULL, an
SQLITE_IOERR code or any other code, once or until `clear_faults`; `read_only` makes the file system
read-only as a remount would (opens for writing fall back to read-only, creating a file fails with
SQLITE_CANTOPEN, writing to an open file fails with SQLITE_IOERR_WRITE).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import apsw

SECTOR = 512

# The files whose content a power cut decides; temp files and sub-journals are scratch and not read
# after a restart.
_TRACKED = (apsw.SQLITE_OPEN_MAIN_DB | apsw.SQLITE_OPEN_WAL | apsw.SQLITE_OPEN_MAIN_JOURNAL
            | apsw.SQLITE_OPEN_SUPER_JOURNAL)
# The unix VFS fsyncs the directory on the first sync of a journal or WAL it created (isNewJrnl).
_DIRSYNCED = apsw.SQLITE_OPEN_WAL | apsw.SQLITE_OPEN_MAIN_JOURNAL | apsw.SQLITE_OPEN_SUPER_JOURNAL

OPS = ("write", "truncate", "sync", "delete")


class Write(NamedTuple):
    """A write a file received since its last sync."""

    offset: int
    data: bytes

    def tears(self) -> list[int]:
        """How many leading bytes may land when the write is torn: up to each sector boundary inside it."""
        first = (self.offset // SECTOR + 1) * SECTOR
        return [boundary - self.offset for boundary in range(first, self.offset + len(self.data), SECTOR)]


class Truncate(NamedTuple):
    """A truncation (or extension) a file received since its last sync."""

    size: int


Pending = Write | Truncate


class Fate(NamedTuple):
    """What a power cut does with one pending write: it lands whole, or only its first `keep` bytes."""

    index: int
    keep: int | None = None


class CutChooser(Protocol):
    """Decides, at a power cut, what each file looks like after the reboot."""

    def entry(self, path: str, options: Sequence[str]) -> str:
        """Which of ``absent``, ``ghost`` (an unlinked earlier file) and ``file`` a non-durable name shows."""
        ...

    def fates(self, path: str, pending: Sequence[Pending]) -> Sequence[Fate]:
        """Which pending writes land, in the order they land (absent ones are lost)."""
        ...


class LoseEverything:
    """The harshest cut: no pending write lands and no non-durable name survives."""

    def entry(self, path: str, options: Sequence[str]) -> str:
        """Prefer the file gone; failing that, an unlinked one back."""
        return "absent" if "absent" in options else options[0]

    def fates(self, path: str, pending: Sequence[Pending]) -> Sequence[Fate]:
        """Nothing lands."""
        return []


class KeepEverything:
    """The mildest cut: the disk had written everything (what a process crash leaves)."""

    def entry(self, path: str, options: Sequence[str]) -> str:
        """The file as the process last saw it."""
        return "file" if "file" in options else "absent"

    def fates(self, path: str, pending: Sequence[Pending]) -> Sequence[Fate]:
        """Everything lands, in order."""
        return [Fate(index) for index in range(len(pending))]


@dataclass
class FileState:
    """The model of one path: what is durable, what is pending, whether its name survives a power cut."""

    path: str
    kind: int
    durable: bytearray
    entry_durable: bool
    exists: bool = True
    ghost: bytes | None = None
    pending: list[Pending] = field(default_factory=list)

    def sync(self) -> None:
        """Everything written so far is durable (and a new journal's name, by the directory fsync)."""
        self.durable = apply(self.durable, self.pending, [Fate(i) for i in range(len(self.pending))])
        self.pending.clear()
        if self.kind & _DIRSYNCED:
            self.entry_durable = True
            self.ghost = None


def apply(content: bytes | bytearray, pending: Sequence[Pending], fates: Sequence[Fate]) -> bytearray:
    """`content` with the pending writes `fates` names applied in that order (a hole reads as zeros)."""
    result = bytearray(content)
    for fate in fates:
        op = pending[fate.index]
        if isinstance(op, Truncate):
            if op.size < len(result):
                del result[op.size:]
            else:
                result.extend(bytes(op.size - len(result)))
            continue
        data = op.data if fate.keep is None else op.data[:fate.keep]
        end = op.offset + len(data)
        if end > len(result):
            result.extend(bytes(end - len(result)))
        result[op.offset:end] = data
    return result


@dataclass
class _Fault:
    op: str
    code: int
    at: int
    count: int | None
    seen: int = 0

    def fires(self) -> bool:
        self.seen += 1
        return self.seen >= self.at and (self.count is None or self.seen < self.at + self.count)


def _error(code: int, message: str) -> apsw.Error:
    """The apsw exception SQLite maps back to `code`, with a message saying what the test did."""
    exc = apsw.exception_for(code)
    exc.args = (message,)
    return exc


def _filename(name: str | apsw.URIFilename | None) -> str | None:
    return name.filename() if isinstance(name, apsw.URIFilename) else name


class FaultFile(apsw.VFSFile):
    """A file of the default VFS whose writes, truncations and syncs the `FaultVFS` sees first."""

    def __init__(self, vfs: FaultVFS, name: str | apsw.URIFilename | None, flags: list[int]) -> None:
        self._vfs = vfs
        self._path = _filename(name)
        self._closed = False
        kind = flags[0]
        existed = self._path is not None and os.path.exists(self._path)
        wanted = flags
        if vfs.read_only and kind & apsw.SQLITE_OPEN_READWRITE:
            if not existed:
                # EROFS on O_CREAT: the unix VFS reports it as "unable to open".
                raise _error(apsw.SQLITE_CANTOPEN, f"cannot create {self._path}: read-only file system")
            # EROFS on O_RDWR: the unix VFS quietly retries read-only, and so do we.
            wanted = [(kind & ~(apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)) | apsw.SQLITE_OPEN_READONLY,
                      flags[1]]
        super().__init__("", name, wanted)
        flags[1] = wanted[1]
        self._state = vfs._opened(self._path, kind, existed) if self._path and kind & _TRACKED else None
        vfs._handles.add(self)

    def xWrite(self, data: bytes, offset: int) -> None:
        """Write through, unless a fault or the power says no; remember the write until a sync."""
        self._vfs._io("write", apsw.SQLITE_IOERR_WRITE)
        super().xWrite(data, offset)
        if self._state is not None:
            self._state.pending.append(Write(offset, bytes(data)))

    def xTruncate(self, newsize: int) -> None:
        """Truncate through, unless a fault or the power says no; remember it until a sync."""
        self._vfs._io("truncate", apsw.SQLITE_IOERR_TRUNCATE)
        super().xTruncate(newsize)
        if self._state is not None:
            self._state.pending.append(Truncate(newsize))

    def xSync(self, flags: int) -> None:
        """Sync (through, when the VFS was made with ``fsync=True``); everything pending is now durable."""
        self._vfs._io("sync", apsw.SQLITE_IOERR_FSYNC)
        if self._vfs.fsync:
            super().xSync(flags)
        if self._state is not None:
            self._state.sync()

    def xClose(self) -> None:
        """Close the real file (safe to call twice)."""
        if not self._closed:
            self._closed = True
            self._vfs._handles.discard(self)
        super().xClose()


class FaultVFS(apsw.VFS):
    """The default VFS plus a power-loss model and injectable faults. Register, use by name, unregister.

        vfs = FaultVFS("fault-1")
        store = EventStore.open(path, vfs=vfs.name)
        vfs.cut_after(3)            # the 4th write/sync/truncate/delete from now never happens
        ...                         # the operation fails; close the store
        vfs.power_cut(chooser)      # the files become what the disk could hold after a reboot
    """

    def __init__(self, name: str = "fault", *, fsync: bool = False) -> None:
        super().__init__(name, "")
        self.name = name
        # The model, not the disk, decides what a power cut keeps, so a real fsync only costs time
        # (milliseconds each); `fsync=True` passes every sync through to the disk all the same.
        self.fsync = fsync
        self.read_only = False
        self.files: dict[str, FileState] = {}
        self.counts: Counter[str] = Counter()
        self._handles: set[FaultFile] = set()
        self._faults: list[_Fault] = []
        self._powered = True
        self._cut_in: int | None = None

    # --- what SQLite calls ----------------------------------------------------------------------------

    def xOpen(self, name: str | apsw.URIFilename | None, flags: list[int]) -> FaultFile:
        """Open a file of the default VFS, wrapped."""
        return FaultFile(self, name, flags)

    def xDelete(self, filename: str, syncdir: bool) -> None:
        """Delete through; without `syncdir` the unlink is not durable and a power cut may undo it."""
        self._io("delete", apsw.SQLITE_IOERR_DELETE)
        if self.read_only:
            raise _error(apsw.SQLITE_IOERR_DELETE, f"cannot delete {filename}: read-only file system")
        super().xDelete(filename, syncdir)
        state = self.files.get(filename)
        if state is not None and state.exists:
            if syncdir:
                state.ghost = None
            elif state.entry_durable:
                state.ghost = bytes(state.durable)
            state.exists = False
            state.entry_durable = False
            state.pending.clear()

    # --- faults -----------------------------------------------------------------------------------------

    def inject(self, op: str, code: int, *, at: int = 1, count: int | None = 1) -> None:
        """Make the `at`-th `op` (``write``, ``truncate``, ``sync``, ``delete``) from now fail with `code`.

        `count` operations fail from there (None: every one until `clear_faults`), as a disk that
        stays full would. The failing operation does not reach the file.
        """
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {op!r}")
        self._faults.append(_Fault(op, code, at, count))

    def clear_faults(self) -> None:
        """Every later operation succeeds again (the disk has room, the error cleared)."""
        self._faults.clear()

    def cut_after(self, ops: int) -> None:
        """Let `ops` more writes, truncations, syncs and deletes happen; the power goes before the next."""
        self._cut_in = ops

    def power_off(self) -> None:
        """The power goes now: every later write, truncation, sync and delete fails and changes nothing."""
        self._powered = False
        self._cut_in = None

    @property
    def powered(self) -> bool:
        """False once the power went (until `power_cut` reboots the disk)."""
        return self._powered

    @property
    def open_files(self) -> int:
        """How many files are open through this VFS (a power cut needs every one closed)."""
        return len(self._handles)

    def power_cut(self, chooser: CutChooser) -> dict[str, str]:
        """Rewrite every tracked file to what the disk could hold after the power loss; reboot the model.

        Every connection through this VFS must be closed first. Returns what happened to each file,
        for a failing test's report.
        """
        if self._handles:
            raise RuntimeError(f"{len(self._handles)} files are still open through {self.name!r}")
        self.power_off()
        report: dict[str, str] = {}
        for path, state in sorted(self.files.items()):
            report[path] = self._settle(path, state, chooser)
            if state.kind & apsw.SQLITE_OPEN_MAIN_DB:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path + "-shm")
        self.files.clear()
        self.counts.clear()
        self._faults.clear()
        self._powered = True
        return report

    # --- the model --------------------------------------------------------------------------------------

    def _io(self, op: str, ioerr: int) -> None:
        """Count one mutating operation; raise when the power is gone or a fault fires."""
        if self._cut_in is not None:
            if self._cut_in == 0:
                self.power_off()
            else:
                self._cut_in -= 1
        if not self._powered:
            raise _error(ioerr, f"{op} refused: the power is off")
        self.counts[op] += 1
        for fault in self._faults:
            if fault.op == op and fault.fires():
                raise _error(fault.code, f"injected fault at {op} {self.counts[op]}")
        if self.read_only and op in ("write", "truncate"):
            # EROFS from write(2) or ftruncate(2) on a file opened before the remount.
            raise _error(ioerr, f"{op} refused: read-only file system")

    def _opened(self, path: str, kind: int, existed: bool) -> FileState:
        state = self.files.get(path)
        if state is not None and state.exists:
            return state
        if existed:
            # A file the model has not seen is taken as durable (see the module docstring).
            with open(path, "rb") as handle:
                content = bytearray(handle.read())
            state = FileState(path, kind, content, entry_durable=True)
        else:
            ghost = state.ghost if state is not None else None
            state = FileState(path, kind, bytearray(), entry_durable=False, ghost=ghost)
        self.files[path] = state
        return state

    def _settle(self, path: str, state: FileState, chooser: CutChooser) -> str:
        options: list[str] = []
        if not state.exists or not state.entry_durable:
            options.append("absent")
            if state.ghost is not None:
                options.append("ghost")
        if state.exists:
            options.append("file")
        choice = options[0] if len(options) == 1 else chooser.entry(path, tuple(options))
        if choice not in options:
            raise ValueError(f"{choice!r} is not one of {options}")
        if choice == "absent":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return "absent"
        if choice == "ghost":
            content: bytes | bytearray = state.ghost or b""
            summary = f"ghost of {len(content)} bytes"
        else:
            fates = list(chooser.fates(path, state.pending)) if state.pending else []
            content = apply(state.durable, state.pending, fates)
            summary = (f"{len(state.durable)} durable bytes + {len(fates)}/{len(state.pending)} pending: "
                       + ", ".join(f"#{f.index}" + (f"[:{f.keep}]" if f.keep is not None else "") for f in fates))
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
            handle.write(content)
        return summary
