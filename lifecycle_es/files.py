"""Reading files that someone else may control: seals, key files, imports, and files units write.

Every such file is opened the one safe way: ``lstat`` first (a FIFO, a device or a socket is refused
before it is ever opened: opening some devices acts, a FIFO would block), then ``O_NOFOLLOW`` (a link
is refused, not followed) and ``O_NONBLOCK`` (should the name be swapped for a FIFO meanwhile, the open
still returns), then ``fstat`` on the open descriptor (so the checks are about the file actually
opened): it must be a regular file no larger than the caller's bound. Reads are bounded too: a file
that grows while it is read is cut off at the bound plus one byte and refused.

    data = read_regular(path, limit=4096, what="seal")
    key = read_regular(path, limit=256, what="key file", private=True)
    digest = sha256_regular(path, limit=1 << 30, what="result")

Refusals raise `UnsafeFileError` (an `OSError`, so callers that already map OSErrors keep working),
whose message names the file and what was wrong and whose ``kind`` says which rule it broke; callers
translate it into their own error kind. `text_path` is the check every path a user names passes
first: text that names the same bytes to the operating system and to SQLite.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shlex
import stat
from collections.abc import Iterator

from .errors import InvalidInputError
from .values import MAX_PATH_CHARS, not_plain, shown

CHUNK = 1 << 20

LINK = "link"
NOT_REGULAR = "not-regular"
TOO_LARGE = "too-large"
NOT_PRIVATE = "not-private"
UNOPENABLE = "unopenable"


class UnsafeFileError(OSError):
    """A file that may not be read: a link, not a regular file, too large, not private, or not openable.

    ``kind`` says which: `LINK`, `NOT_REGULAR`, `TOO_LARGE`, `NOT_PRIVATE` (a secret others may read or
    write), or `UNOPENABLE` (the operating system refused the open; ``errno`` says why).
    """

    def __init__(self, code: int, message: str, *, kind: str) -> None:
        super().__init__(code, message)
        self.kind = kind


def text_path(value: object, field: str) -> str:
    """`value` as a non-empty text path of at most 4096 characters without NUL, or InvalidInputError naming `field`.

    A path is also refused when it is not UTF-8 text: a lone surrogate (what Python makes of a byte
    of a command-line argument that is not UTF-8) cannot be handed to SQLite, which names files in
    UTF-8, and a path the operating system would spell in other bytes than SQLite would name two
    different files.
    """
    text = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if type(text) is not str or not text or "\0" in text:
        raise not_plain(text, field) or InvalidInputError(field, f"{field} is invalid: {shown(value)} is not a text "
                                                                 "path")
    if len(text) > MAX_PATH_CHARS:  # beyond what the operating system names (PATH_MAX), or a URL as long
        raise InvalidInputError(field, f"{field} is invalid: {shown(text)} is {len(text):,} characters long, more "
                                       f"than the {MAX_PATH_CHARS} a path may have")
    try:
        same = os.fsencode(text) == text.encode("utf-8")
    except UnicodeEncodeError:
        same = False
    if not same:
        raise InvalidInputError(field, f"{field} is invalid: {shown(text)} is not UTF-8 text; rename the file "
                                       "or name it by a UTF-8 path")
    return text


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


def _refuse_kind(mode: int, name: str, what: str) -> None:
    if stat.S_ISLNK(mode):
        raise UnsafeFileError(errno.ELOOP, f"{what} {name!r} is a symbolic link; name the file itself", kind=LINK)
    if not stat.S_ISREG(mode):
        raise UnsafeFileError(errno.EINVAL, f"{what} {name!r} is {_describe(mode)}, not a regular file",
                              kind=NOT_REGULAR)


@contextlib.contextmanager
def open_regular(path: str | os.PathLike[str], *, limit: int | None, what: str,
                 private: bool = False) -> Iterator[tuple[int, os.stat_result]]:
    """An open, read-only descriptor of the regular file at `path` and its ``fstat``, closed on exit.

    Raises UnsafeFileError when `path` is a symbolic link (dangling or not), a FIFO, a device, a
    socket or a directory, is larger than `limit` bytes (None: no bound, for a file read as a stream
    with its own bounds), is `private` but readable or writable by group or others (see
    `check_private`), or cannot be opened; FileNotFoundError (also an OSError) when nothing is there.
    `what` names the file in messages ("seal", "key file").
    """
    name = os.fspath(path)
    try:
        _refuse_kind(os.lstat(name).st_mode, name, what)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (FileNotFoundError, UnsafeFileError):
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the name became a link after the lstat
            raise UnsafeFileError(errno.ELOOP, f"{what} {name!r} is a symbolic link; name the file itself",
                                  kind=LINK) from None
        raise UnsafeFileError(exc.errno or errno.EIO, f"cannot open {what} {name!r}: {exc.strerror}",
                              kind=UNOPENABLE) from None
    try:
        info = os.fstat(fd)
        _refuse_kind(info.st_mode, name, what)
        if limit is not None and info.st_size > limit:
            raise UnsafeFileError(errno.EFBIG, f"{what} {name!r} is {info.st_size} bytes, larger than the "
                                               f"{limit} bytes a {what} may be", kind=TOO_LARGE)
        if private:
            check_private(info, name=name, what=what)
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
                                               "while it was read", kind=TOO_LARGE)
        yield chunk


def read_regular(path: str | os.PathLike[str], *, limit: int, what: str, private: bool = False) -> bytes:
    """The whole content of the regular file at `path`, at most `limit` bytes (see `open_regular`)."""
    name = os.fspath(path)
    with open_regular(name, limit=limit, what=what, private=private) as (fd, _):
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
    """UnsafeFileError when group or others have any access to a secret file.

    The rule ssh applies to private keys: a key that others could read may already be theirs, and one
    they could write may be theirs to choose.
    """
    if info.st_mode & 0o077:
        raise UnsafeFileError(errno.EACCES, f"{what} {name!r} has mode {stat.S_IMODE(info.st_mode):04o}: group or "
                                            f"others may read or write it; run chmod 600 {shlex.quote(name)}",
                              kind=NOT_PRIVATE)
