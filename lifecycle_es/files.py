"""Reading files that someone else may control: seals, key files, imports, and files units write.

Every such file is opened the one safe way: ``O_NOFOLLOW`` (a link is refused, not followed),
``O_NONBLOCK`` (a FIFO or a device cannot hang the open), then ``fstat`` on the open descriptor (so
the checks are about the file actually opened, not a name someone swapped meanwhile): it must be a
regular file no larger than the caller's bound. Reads are bounded too: a file that grows while it is
read is cut off at the bound plus one byte and refused.

    data = read_regular(path, limit=4096, what="seal")
    digest = sha256_regular(path, limit=1 << 30, what="result")

Refusals raise `UnsafeFileError` (an `OSError`, so callers that already map OSErrors keep working),
whose message names the file and what was wrong; callers translate it into their own error kind.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator

CHUNK = 1 << 20


class UnsafeFileError(OSError):
    """A file that may not be read: a link, not a regular file, too large, or not openable."""


def _describe(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


@contextlib.contextmanager
def open_regular(path: str | os.PathLike[str], *, limit: int, what: str) -> Iterator[tuple[int, os.stat_result]]:
    """An open, read-only descriptor of the regular file at `path` and its ``fstat``, closed on exit.

    Raises UnsafeFileError when `path` is a symbolic link (dangling or not), a FIFO, a device, a
    socket or a directory, is larger than `limit` bytes, or cannot be opened (FileNotFoundError,
    also an OSError, when it does not exist). `what` names the file in messages ("seal", "key file").
    """
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(errno.ELOOP, f"{what} {name!r} is a symbolic link; name the file itself") from None
        raise UnsafeFileError(exc.errno, f"cannot open {what} {name!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(errno.EINVAL, f"{what} {name!r} is {_describe(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise UnsafeFileError(errno.EFBIG, f"{what} {name!r} is {info.st_size} bytes, larger than the "
                                               f"{limit} bytes a {what} may be")
        yield fd, info
    finally:
        os.close(fd)


def _chunks(fd: int, limit: int, name: str, what: str) -> Iterator[bytes]:
    total = 0
    while True:
        chunk = os.read(fd, min(CHUNK, limit + 1 - total))
        if not chunk:
            return
        total += len(chunk)
        if total > limit:
            raise UnsafeFileError(errno.EFBIG, f"{what} {name!r} grew past the {limit} bytes a {what} may be "
                                               "while it was read")
        yield chunk


def read_regular(path: str | os.PathLike[str], *, limit: int, what: str) -> bytes:
    """The whole content of the regular file at `path`, at most `limit` bytes (see `open_regular`)."""
    name = os.fspath(path)
    with open_regular(name, limit=limit, what=what) as (fd, _):
        return b"".join(_chunks(fd, limit, name, what))


def sha256_regular(path: str | os.PathLike[str], *, limit: int, what: str) -> str:
    """``sha256:<hex>`` of the regular file at `path`, hashed in chunks, at most `limit` bytes."""
    name = os.fspath(path)
    digest = hashlib.sha256()
    with open_regular(name, limit=limit, what=what) as (fd, _):
        for chunk in _chunks(fd, limit, name, what):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def check_private(info: os.stat_result, *, name: str, what: str) -> None:
    """UnsafeFileError when a secret file is readable or writable by its group or by others.

    The rule ssh applies to private keys: a key that others could read may already be theirs, and one
    they could write may be theirs to choose.
    """
    if info.st_mode & 0o077:
        raise UnsafeFileError(errno.EACCES, f"{what} {name!r} has mode {stat.S_IMODE(info.st_mode):04o}: group or "
                                            f"others may read or write it; run chmod 600 {name!r}")
