"""lifecycle-es: the durable, auditable authority for execution-location runners.

The write side: events, the hash-chained store, the runner lifecycle, receipts and errors. The read
side lives in `projections`, the host driver in `hosts`; this package imports neither.
"""

from ._version import __version__ as __version__
from .auditing import AuditReport, Problem, audit
from .authority import assert_lease_authority, lifecycle_profile_from_lease
from .checkpoints import Checkpoint
from .errors import (
    EXIT_DATAERR,
    EXIT_FENCED,
    EXIT_HELD,
    EXIT_SOFTWARE,
    AuthorityError,
    ConcurrencyError,
    HostFencedError,
    HostLeaseHeldError,
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
from .host_lease import HostLeaseGrant
from .lifecycle import RunnerLifecycle, UnknownRunnerError
from .log import Head, RecordedEvent, VerifyReport
from .receipts import (
    BaseDirClaim,
    DrainParkSnapshot,
    HookReceipt,
    LeaseAuthority,
    LeaseParkSnapshot,
    LeaseProfile,
    LeaseReceipt,
    LeaseRef,
    PollResult,
    PostSessionHook,
    RunnerSnapshot,
)
from .seal import Seal
from .signing import Signer, Verifier, generate_key, load_signer, load_verifier
from .state import Drain, Lease, ProxyRef, RunnerCapacityError, RunnerState
from .store import EventStore, WriteTransaction
from .values import ProxyAuthority, Resources

__all__ = [
    "EXIT_DATAERR",
    "EXIT_FENCED",
    "EXIT_HELD",
    "EXIT_SOFTWARE",
    "AuditReport",
    "AuthorityError",
    "BaseDirClaim",
    "Checkpoint",
    "ConcurrencyError",
    "Drain",
    "DrainParkSnapshot",
    "Event",
    "EventStore",
    "Head",
    "HookReceipt",
    "HostFencedError",
    "HostLeaseGrant",
    "HostLeaseHeldError",
    "IntegrityError",
    "InvalidInputError",
    "Lease",
    "LeaseAuthority",
    "LeaseParkSnapshot",
    "LeaseProfile",
    "LeaseReceipt",
    "LeaseRef",
    "LifecycleError",
    "PollResult",
    "PostSessionHook",
    "PreflightError",
    "Problem",
    "ProxyAuthority",
    "ProxyRef",
    "RecordedEvent",
    "Resources",
    "RunnerCapacityError",
    "RunnerLifecycle",
    "RunnerSnapshot",
    "RunnerState",
    "Seal",
    "Signer",
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
    "UnknownRunnerError",
    "Verifier",
    "VerifyReport",
    "WriteTransaction",
    "assert_lease_authority",
    "audit",
    "generate_key",
    "lifecycle_profile_from_lease",
    "load_signer",
    "load_verifier",
]
