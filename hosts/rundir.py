"""A lease's run directory, held by one host at a time.

Layout, under the host's run root (created 0700 when missing)::

    <run root>/<lease id>/         0700, the run directory
        owner.lock                 0600, flock()ed by the host that runs the lease
        work/                      0700, the unit's working directory
        unit.log                   0600, the unit's stdout and stderr (child mode; systemd when asked)
        unit.pid                   0600, a child-mode unit's supervisor: pid, start ticks, boot, host (hosts.child)
        unit.end                   0600, how a child-mode unit ended, written by its supervisor (hosts.supervisor)
        unit.handle                0600, the host's proof of the unit it started (hosts.unitfiles)
        unit.exit                  a systemd unit's last exit, written by its ExecStopPost (hosts.systemd_show)
        status.json                the unit's task report (hosts.park), at most 1 MiB
        result                     the unit's result, hashed to settle its lease (hosts.unitfiles), at most 1 GiB

Files a unit may write (``status.json``, ``result``) are read without following links or blocking,
must be regular files and are bounded (`lifecycle_es.files`); the run root must be valid UTF-8 text
(`safe_run_root`).

The owner lock is ``fcntl.flock`` on ``owner.lock``, taken without blocking: a second holder (another
host process, or a second open in the same process, since flock locks belong to an open file) gets
`RunDirHeldError`, whose ``exit_code`` is ``EXIT_HELD`` (76), so no two hosts run the same lease's
directory. The lock goes with the holder: closing the RunDir or the holder's death releases it, and
the lock file's descriptor is close-on-exec so a unit never inherits it.

A lease id is a lifecycle id (``^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,255}$``): it has no ``/`` and cannot be
``.`` or ``..``, so the run directory is always a direct child of the run root. Nothing here follows a
symbolic link: the root, the run directory and ``work/`` must be real directories.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path
from types import TracebackType

from lifecycle_es.errors import EXIT_HELD, InvalidInputError
from lifecycle_es.values import not_plain, safe_id, shown

from .proc import HostError

OWNER_LOCK = "owner.lock"
WORK_DIR = "work"
UNIT_LOG = "unit.log"
PID_FILE = "unit.pid"
EXIT_FILE = "unit.exit"
STATUS_FILE = "status.json"


class RunDirHeldError(HostError):
    """Another holder has the run directory's owner lock; a process stopping on it exits 76."""

    exit_code = EXIT_HELD

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(f"run directory {path} is held by another host (owner lock {OWNER_LOCK})")


def _real_dir(path: Path, mode: int = 0o700) -> None:
    """Make `path` a directory (mode `mode`) or check it is one, never through a symbolic link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise HostError(f"{path} is not a directory (a symbolic link or a file is never followed)")
    if info.st_uid != os.geteuid():
        raise HostError(f"{path} is owned by uid {info.st_uid}, not by this host (uid {os.geteuid()})")
    # mkdir's mode is cut by the umask, and an existing directory may have any mode: set it.
    if stat.S_IMODE(info.st_mode) != mode:
        os.chmod(path, mode, follow_symlinks=False)


class RunDir:
    """A held run directory: its paths, and the owner lock until `close()`.

    Use `open_run_dir` to get one; it is a context manager that releases the lock on exit.
    """

    def __init__(self, root: Path, lease_id: str, lock_fd: int) -> None:
        self.root = root
        self.lease_id = lease_id
        self.path = root / lease_id
        self.work = self.path / WORK_DIR
        self.log_path = self.path / UNIT_LOG
        self.status_path = self.path / STATUS_FILE
        self._lock_fd: int | None = lock_fd

    @property
    def held(self) -> bool:
        """Whether this RunDir still holds the owner lock."""
        return self._lock_fd is not None

    def close(self) -> None:
        """Release the owner lock (closing its descriptor); a second close does nothing."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RunDir {str(self.path)!r} {'held' if self.held else 'released'}>"


def safe_run_root(value: object) -> str:
    """An absolute run root, as text the log can hold: a str or path without NUL or lone surrogates.

    A relative path is made absolute (against the current directory). Raises InvalidInputError naming
    ``run_root`` otherwise: a lone surrogate could name no file the log could record, and a NUL no file.
    """
    if not isinstance(value, str | os.PathLike):
        raise InvalidInputError("run_root", f"run_root must be a path, got {type(value).__name__}")
    text = os.fspath(value)
    if type(text) is not str:
        raise not_plain(text, "run_root") or InvalidInputError("run_root", "run_root must be a text path, not bytes")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError("run_root", f"run_root {shown(text)} is not valid text (it holds a lone "
                                            "surrogate); name the directory in UTF-8") from None
    if not text or "\0" in text:
        raise InvalidInputError("run_root", f"run_root {shown(text)} must be a non-empty path without NUL")
    return str(Path(text).absolute())


def open_run_dir(root: str | os.PathLike[str], lease_id: str) -> RunDir:
    """Make (or reuse) ``<root>/<lease id>/`` with ``work/`` inside, and take its owner lock.

    The root is created 0700 when missing (its parent must exist). Raises `InvalidInputError` for a
    lease id outside the id pattern, `RunDirHeldError` when another holder has the lock, and
    `HostError` for a path that is not a real directory of this host's user.
    """
    safe_id(lease_id, "lease_id")
    if not Path(root).is_absolute():
        raise InvalidInputError("run_root", f"run_root must be an absolute path, got {str(root)!r}")
    base = Path(safe_run_root(root))
    _real_dir(base)
    path = base / lease_id
    _real_dir(path)
    # O_NONBLOCK: a FIFO put in the lock's place cannot hang the open (it is then refused as not regular).
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path / OWNER_LOCK, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HostError(f"{path / OWNER_LOCK} is a symbolic link; it is never followed") from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostError(f"{path / OWNER_LOCK} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise RunDirHeldError(path) from exc
        os.fchmod(fd, 0o600)
        # Only the holder touches work/: made after the lock so a refused second host changes nothing.
        _real_dir(path / WORK_DIR)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return RunDir(base, lease_id, fd)
