"""Exit codes of the ``lifecycle-es`` command, and the one place errors become them.

The codes follow sysexits, as `lifecycle_es.errors` does for processes that stop on its errors:

    0   EXIT_OK          the command did what was asked (audit: the log is whole)
    64  EXIT_USAGE       bad usage: unknown option, bad value, a path that is not UTF-8, a malformed
                         key file or one group or others may use (chmod 600 it)
    65  EXIT_DATAERR     the data is wrong: integrity failure, illegal transition, behind its seal,
                         not a lifecycle-es file, snapshot or read model differs from a replay; a
                         file named (store, seal, key, export) that is a link, a FIFO, a device or a
                         directory, or too large to be what it must be; a key given for a store or
                         export that claims to be unkeyed (a downgrade is tampering)
    66  EXIT_NOINPUT     a file (store, seal, key, export) or a runner named does not exist, or the
                         operating system will not open it (a runner: always through `no_runner`)
    70  EXIT_SOFTWARE    a bug: something raised that nothing here expected
    73  EXIT_CANTCREAT   an output file exists already (export, import never overwrite)
    74  EXIT_IOERR       the operating system failed a read or a write (or the disk is full)
    75  EXIT_FENCED      the store was fenced; `host`: a runner's host lease was lost (another holder
                         took it, or it was not renewed by the driver's local deadline)
    76  EXIT_HELD        the store's lock is held elsewhere (busy timeout passed); `host --no-wait`: a
                         runner's host lease is held by another live driver
    77  EXIT_NOPERM      a keyed store without its key (or with the wrong one)
    130                  interrupted (SIGINT) where a command does not treat it as its end

`classify` maps any exception to ``(code, one-line message)``; the command line prints that line and
never a traceback, whatever the file holds.
"""

from __future__ import annotations

import re

import msgspec

from lifecycle_es.errors import (
    EXIT_DATAERR,
    EXIT_FENCED,
    EXIT_HELD,
    EXIT_SOFTWARE,
    HostFencedError,
    HostLeaseHeldError,
    IntegrityError,
    InvalidInputError,
    LifecycleError,
    StoreBusyError,
    StoreFencedError,
    StoreFullError,
    StoreIOError,
    StoreKeyError,
)
from lifecycle_es.workers import WorkerError

EXIT_OK = 0
EXIT_USAGE = 64
EXIT_NOINPUT = 66
EXIT_CANTCREAT = 73
EXIT_IOERR = 74
EXIT_NOPERM = 77
EXIT_INTERRUPTED = 130

__all__ = [
    "EXIT_CANTCREAT",
    "EXIT_DATAERR",
    "EXIT_FENCED",
    "EXIT_HELD",
    "EXIT_INTERRUPTED",
    "EXIT_IOERR",
    "EXIT_NOINPUT",
    "EXIT_NOPERM",
    "EXIT_OK",
    "EXIT_SOFTWARE",
    "EXIT_USAGE",
    "CommandError",
    "classify",
    "json_printable",
    "no_runner",
    "one_line",
    "printable",
]


class CommandError(Exception):
    """A failure the command line reports as it is: an exit code and a one-line message."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(message)


def no_runner(runner: str, path: str, *, at: int | None = None) -> CommandError:
    """The one refusal of a runner the log does not have, for every command that takes one: exit 66
    (EX_NOINPUT: the thing named is not there), ``no runner 'x' in FILE`` (``as of seq N`` when the
    command looked at an earlier seq), and where to see the runners that are there.
    """
    as_of = f" as of seq {at:,}" if at is not None else ""
    return CommandError(EXIT_NOINPUT, f"no runner {runner!r} in {path}{as_of} "
                                      f"('lifecycle-es show {path}' lists the runners it has)")


# What a terminal would act on or draw as nothing: C0, DEL and C1 controls; line and paragraph separators; lone
# surrogates, which no terminal encoding can write; and every format character (Unicode's Cf): bidi marks,
# embeddings, overrides and isolates (a U+202E turns the rest of a line around), zero-width spaces and joiners,
# the soft hyphen, tags.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
                     "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
                     "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
                     "\U000e0001\U000e0020-\U000e007f]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON spells a character beyond the BMP as its UTF-16 surrogate pair
    return f"\\u{0xd800 + (code >> 10):04x}\\u{0xdc00 + (code & 0x3ff):04x}"


def printable(text: str) -> str:
    """`text` with control, bidi and invisible formatting characters escaped (``\\x1b``, ``\\u202e``).

    The one escaping of every line the command line prints for people, so a value from a hostile file
    cannot drive the terminal or reorder what it shows. JSON output is left to JSON's own escaping.
    """
    return _UNSAFE.sub(_escape, text)


def json_printable(text: str) -> str:
    """JSON text with the same characters as `printable` written as JSON escapes (``\\u202e``).

    They can only stand inside a JSON string, where the escape decodes to the very same character:
    the JSON is the same, and a terminal it is printed on shows it as it is.
    """
    return _UNSAFE.sub(_json_escape, text)


def one_line(text: str, limit: int = 1000) -> str:
    """`text` on one line, control characters escaped (a hostile file's values can hold both), cut short."""
    flat = printable(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def classify(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one-line message for an exception that reached the command line."""
    code = _code(exc)
    if isinstance(exc, UnicodeError):
        message = "text in the file is not valid UTF-8: not a lifecycle-es file, or damaged"
    elif isinstance(exc, msgspec.MsgspecError):
        message = f"malformed data: {exc}"
    elif isinstance(exc, OSError) and exc.strerror:
        message = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    elif code == EXIT_SOFTWARE:
        message = f"internal error ({type(exc).__name__}): {exc}"
    else:
        message = str(exc) or type(exc).__name__
    return code, one_line(message)


def _code(exc: BaseException) -> int:
    # Most specific first: the store's error kinds subclass each other and builtins.
    if isinstance(exc, CommandError):
        return exc.code
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, IntegrityError):
        return EXIT_DATAERR
    if isinstance(exc, StoreKeyError):
        return EXIT_NOPERM
    if isinstance(exc, StoreBusyError | HostLeaseHeldError):
        return EXIT_HELD
    if isinstance(exc, StoreFencedError | HostFencedError):
        return EXIT_FENCED
    if isinstance(exc, StoreFullError | StoreIOError):
        return EXIT_IOERR
    if isinstance(exc, InvalidInputError):
        return EXIT_USAGE
    if isinstance(exc, WorkerError):
        return EXIT_SOFTWARE  # a worker that died or broke proves nothing about the log: not 65
    if isinstance(exc, LifecycleError | msgspec.MsgspecError | UnicodeError):
        # StoreFormatError, StoreBehindSealError, StorePragmaError and any other store error: the file
        # is not what a lifecycle-es store must be.
        return EXIT_DATAERR
    if isinstance(exc, FileNotFoundError):
        return EXIT_NOINPUT
    if isinstance(exc, OSError):
        return EXIT_IOERR
    return EXIT_SOFTWARE
