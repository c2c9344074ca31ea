"""Every error lifecycle-es raises, under one root.

    LifecycleError
    ├── InvalidInputError (also ValueError)      a value a caller passed is malformed or out of bounds
    ├── StaleFenceError                          a generation, lease or state fence no longer holds
    ├── AuthorityError                           a proxy authority that is not fresh, drifted or rolled back
    ├── PreflightError                           the base directory is not a writable real directory
    ├── IntegrityError                           the log is not what the chain and the rules say it must be
    └── StoreError                               the event store could not do what was asked
        ├── StorePragmaError                     a connection setting did not read back as set
        ├── StoreFormatError                     the file is not a lifecycle-es store, or is from a newer schema
        ├── StoreBusyError (also TimeoutError)   the write lock was not had within busy_timeout
        ├── ConcurrencyError                     expected_version did not match the stream
        ├── StoreFencedError                     the store was fenced; nothing is retried on it
        ├── HostFencedError                      a host driver's host lease is stale or expired: it must stop
        ├── HostLeaseHeldError                   a runner's host lease is held by another live driver
        ├── StoreBehindSealError                 the log's head is behind the seal taken earlier
        ├── StoreKeyError                        a keyed store opened with no key or the wrong key
        ├── StoreFullError                       the disk is full
        └── StoreIOError                         the operating system failed a read or a write

Errors carry fields (seq, stream, expected, actual), not only a message, and a message never holds a
secret. Exit codes for processes that stop on these errors follow sysexits: EXIT_DATAERR for data
that is wrong, EXIT_SOFTWARE for a state no retry can fix, EXIT_FENCED and EXIT_HELD for a fence and
a lock held elsewhere.
"""

from __future__ import annotations

EXIT_DATAERR = 65
EXIT_SOFTWARE = 70
EXIT_FENCED = 75
EXIT_HELD = 76


class LifecycleError(Exception):
    """The root of every error lifecycle-es raises."""


class InvalidInputError(LifecycleError, ValueError):
    """A value passed by a caller is malformed or out of bounds; nothing was appended.

    `field` names the argument (dotted for a nested one, e.g. ``proxy_authority.revision``).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class StaleFenceError(LifecycleError):
    """A generation, lease or state fence no longer holds: someone else moved the runner on."""


class AuthorityError(LifecycleError):
    """A proxy authority that is not fresh, whose identity drifted, or whose revision rolled back."""


class PreflightError(LifecycleError):
    """The runner's base directory is not a real, writable directory."""


class IntegrityError(LifecycleError):
    """The log is not what the chain and the transition rules say it must be.

    `seq` is the first bad event's global sequence number (0 when the fault is not tied to one event),
    `stream` its stream when known, and `reason` says what was wrong.
    """

    def __init__(self, seq: int, reason: str, *, stream: str | None = None) -> None:
        self.seq = seq
        self.reason = reason
        self.stream = stream
        where = f"seq {seq}" + (f" (stream {stream!r})" if stream is not None else "")
        super().__init__(f"integrity failure at {where}: {reason}")


class StoreError(LifecycleError):
    """The event store could not do what was asked."""


class StorePragmaError(StoreError):
    """A pragma of the connection profile did not read back as it was set, or a PostgreSQL server's setting
    (`pragma` names it) would let it lose what it acknowledged."""

    def __init__(self, pragma: str, wanted: object, got: object, *, message: str | None = None) -> None:
        self.pragma = pragma
        self.wanted = wanted
        self.got = got
        super().__init__(message or f"pragma {pragma} did not take: wanted {wanted!r}, got {got!r}")


class StoreFormatError(StoreError):
    """The file is not a lifecycle-es store (foreign, corrupt) or was written by a newer schema."""


class StoreBusyError(StoreError, TimeoutError):
    """The write lock was not had within the store's busy timeout."""


class ConcurrencyError(StoreError):
    """`expected_version` did not match the stream's version; nothing was appended."""

    def __init__(self, stream: str, expected: int, actual: int) -> None:
        self.stream = stream
        self.expected = expected
        self.actual = actual
        super().__init__(f"stream {stream!r} is at version {actual}, expected {expected}")


class StoreFencedError(StoreError):
    """The store was fenced (by `fence()` or a file replaced underneath it); nothing is retried on it."""

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__(f"the store is fenced: {cause}")


class HostFencedError(StoreError):
    """A host driver's write was refused: its host lease token is no longer the runner's, or the lease expired.

    Nothing was appended. The driver has lost the runner (another took it over, or it could not renew
    in time) and must stop acting on its units at once; `lifecycle-es host` exits EXIT_FENCED.
    `runner_id`, `holder` and `token` name the lease that was used; `reason` says what no longer holds.
    """

    def __init__(self, runner_id: str, holder: str, token: int, reason: str) -> None:
        self.runner_id = runner_id
        self.holder = holder
        self.token = token
        self.reason = reason
        super().__init__(f"host lease of runner {runner_id} (token {token}, holder {holder}) is fenced: {reason}; "
                         "this host must stop acting for the runner")


class HostLeaseHeldError(StoreError):
    """A runner's host lease is held by another driver whose lease has not expired.

    `holder` is that driver, `expires_in_ms` how long its lease lives without a renewal (by the store's
    clock). Wait as a standby and try again, or exit EXIT_HELD.
    """

    def __init__(self, runner_id: str, holder: str, expires_in_ms: int) -> None:
        self.runner_id = runner_id
        self.holder = holder
        self.expires_in_ms = expires_in_ms
        super().__init__(f"runner {runner_id}'s host lease is held by {holder} for {expires_in_ms} ms more unless "
                         "renewed; wait for it to lapse (a standby takes it then)")


class StoreBehindSealError(StoreError):
    """The log's head is behind the seal taken earlier: rolled back to an old copy or truncated."""

    def __init__(self, reason: str, *, sealed_seq: int, head_seq: int) -> None:
        self.reason = reason
        self.sealed_seq = sealed_seq
        self.head_seq = head_seq
        super().__init__(f"store is behind its seal (sealed at seq {sealed_seq}, head {head_seq}): {reason}")


class StoreKeyError(StoreError):
    """A keyed store was opened or verified without its key, or with a different one."""


class StoreFullError(StoreError):
    """The disk (or the file system's quota) is full; the write was rolled back."""


class StoreIOError(StoreError):
    """The operating system failed a read or a write of the store.

    A failed write is rolled back, with one exception: a commit whose fsync failed. Its frames were
    written and may or may not be on the disk, so its outcome is unknown (``outcome_unknown`` is
    True); the store then fences itself, and reopening it shows whether the batch landed.
    """

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        self.outcome_unknown = outcome_unknown
        super().__init__(message)
