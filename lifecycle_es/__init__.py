"""lifecycle-es: the durable, auditable authority for execution-location runners.

The write side: events, the hash-chained store, the runner lifecycle, receipts and errors.
"""

from .errors import (
    EXIT_DATAERR,
    EXIT_FENCED,
    EXIT_HELD,
    EXIT_SOFTWARE,
    AuthorityError,
    ConcurrencyError,
    IntegrityError,
    InvalidInputError,
    LifecycleError,
    PreflightError,
    StaleFenceError,
    StoreBehindSealError,
    StoreBusyError,
    StoreError,
    StoreFencedError,
    StoreFormatError,
    StoreFullError,
    StoreIOError,
    StoreKeyError,
    StorePragmaError,
)
from .events import Event
from .seal import Seal
from .store import EventStore, Head, RecordedEvent, VerifyReport
from .values import ProxyAuthority, Resources

__all__ = sorted([
    "EXIT_DATAERR",
    "EXIT_FENCED",
    "EXIT_HELD",
    "EXIT_SOFTWARE",
    "AuthorityError",
    "ConcurrencyError",
    "Event",
    "EventStore",
    "Head",
    "IntegrityError",
    "InvalidInputError",
    "LifecycleError",
    "PreflightError",
    "ProxyAuthority",
    "RecordedEvent",
    "Resources",
    "Seal",
    "StaleFenceError",
    "StoreBehindSealError",
    "StoreBusyError",
    "StoreError",
    "StoreFencedError",
    "StoreFormatError",
    "StoreFullError",
    "StoreIOError",
    "StoreKeyError",
    "StorePragmaError",
    "VerifyReport",
])
