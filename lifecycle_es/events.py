"""The facts of the log: one frozen, explicitly tagged msgspec Struct per kind of event.

The tag is the event's ``type`` column and is written into its body, so a class rename never changes
stored bytes or hashes. Schema evolution follows msgspec's rules: a new field gets a default and goes
at the end; an existing field never changes type.

Lifecycle events carry the runner generation they leave behind (``generation``) so a replay can check
every fence, and the proxy authority they were decided on so a replay can check its freshness at the
event's ``at``. Unit events are the host driver's side effects on the runner's stream: an intent
(``UnitStarting``) before the side effect, an outcome after.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Union

import msgspec
from msgspec import UNSET, UnsetType

from .canonical import PLAIN_TYPES, struct_bytes, structs_bytes
from .errors import IntegrityError, InvalidInputError
from .values import ProxyAuthority, Resources, not_plain, shown

RUNNER_SCHEMA = "cc-execution-location-runner-lifecycle/v1"

# What a host driver writes into unit facts, defined once: the rules hold every recorded fact to these
# (``lifecycle_es.units``), and the host drivers take their values from here.
UNIT_MODES = frozenset({"child", "systemd"})
"""``UnitStarting.mode`` / ``UnitRecord.mode``: a detached child process, or a transient systemd service."""
UNIT_OUTCOMES = frozenset({"settled", "lost-poll", "resource-limit", "checkout-failure"})
"""``UnitExited.outcome``: what the host made of a unit's end (exit 0, any other end, its limits, no start)."""
UNIT_STOP_REASONS = frozenset({"stopped", "lease-ended", "lease-expired", "parked-waiting", "unsafe-file",
                               "unproven-handle"})
"""``UnitStopped.reason``: asked to stop, its lease ended or expired, its work only waits, it left a file the
host may not read (a link, a FIFO, too large), or the host cannot prove it started the unit its facts name."""
UNIT_SIGNAL_REASONS = frozenset({"drain", "drain-deadline"})
"""``UnitSignalled.reason``: the drain's SIGTERM, the drain deadline's SIGKILL."""
UNIT_SIGNALS_SENT = frozenset({"SIGTERM", "SIGKILL"})
"""``UnitSignalled.signal`` and each of ``UnitStopped.signals`` (at most these two, each once): the signals a
host sends a unit."""
SIGNAL_NAME_RE = re.compile(r"SIG[A-Z0-9+]{1,16}")
"""``UnitExited.signal``: a signal's name as a host records a death by it (``SIGXCPU``, ``SIG35``, ``SIGRTMIN+1``)."""
UNIT_NAME_RE = re.compile(r"[A-Za-z0-9:_.-]{1,200}")
"""A systemd unit name a host chooses (``UnitStarting.unit``, ``UnitRecord.unit``)."""
HOST_LABEL_RE = re.compile(r"[!-~]{1,255}")
"""``UnitRecord.host`` and ``boot_id``: 1..255 printable ASCII characters, no space or control character."""
MAX_EXIT_CODE = 255
MAX_PID = 4_194_304
"""Linux's PID_MAX_LIMIT: no process id is larger."""
MAX_COMMAND_ARGS = 256
"""``UnitStarting.command``: at most this many arguments ..."""
MAX_ARG_CHARS = 8_192
"""... of at most this many characters each."""
MIN_HOST_LEASE_TTL_MS = 1_000
MAX_HOST_LEASE_TTL_MS = 3_600_000


def safe_holder(holder: object) -> str:
    """A host lease holder's name (1-255 printable ASCII characters, no space) as a plain str, or InvalidInputError."""
    if type(holder) is not str or HOST_LABEL_RE.fullmatch(holder) is None:
        raise not_plain(holder, "holder") or InvalidInputError(
            "holder", f"holder is invalid: {shown(holder)} is not 1-255 printable ASCII characters without space "
                      "(host name/boot id/instance id)")
    return holder
"""``HostLeaseAcquired.ttl_ms``: a host lease lives 1 s .. 1 h between renewals."""


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every event; subclasses name their tag explicitly."""


# --- runner lifecycle -------------------------------------------------------------------------------


class RunnerInitialized(Event, frozen=True, tag="RunnerInitialized"):
    """A runner came into being: accepting, generation 1, policy revision 1, proxy unbound."""

    schema: str
    runner_id: str
    target: str
    base_dir: str
    resources: Resources
    post_session_hook_digest: str


class LeaseAcquired(Event, frozen=True, tag="LeaseAcquired"):
    """A session took a lease at the runner's current generation, under a fresh proxy authority."""

    lease_id: str
    session_id: str
    lease_generation: int
    issued_at: str
    expires_at: str
    proxy_authority: ProxyAuthority


class ProxyRotated(Event, frozen=True, tag="ProxyRotated"):
    """The proxy authority moved to a newer revision; generation and policy revision +1."""

    proxy_authority: ProxyAuthority
    generation: int
    policy_revision: int


class DrainRequested(Event, frozen=True, tag="DrainRequested"):
    """The runner stops accepting and asks its units to finish by a deadline; generation +1."""

    signal: str
    requested_at: str
    deadline_at: str
    generation: int


class LeaseSettled(Event, frozen=True, tag="LeaseSettled"):
    """A lease ended with a result."""

    lease_id: str
    lease_generation: int
    result_digest: str
    host_token: int | UnsetType = UNSET


class LeaseParked(Event, frozen=True, tag="LeaseParked"):
    """A lease ended without finishing its work, for one of the original's three reasons."""

    lease_id: str
    lease_generation: int
    result_digest: str
    reason: str
    host_token: int | UnsetType = UNSET


class DrainExpired(Event, frozen=True, tag="DrainExpired"):
    """The drain deadline passed: every lease still active is parked (no result digest)."""

    lease_ids: tuple[str, ...]
    deadline_at: str
    host_token: int | UnsetType = UNSET


class RunnerParked(Event, frozen=True, tag="RunnerParked"):
    """The runner holds no active lease and is parked; generation +1.

    ``cause`` says which fact made it so: ``drain-settled``, ``lease-parked``, ``drain-expired`` or
    ``drain-idle`` (a drain requested with no active lease).
    """

    cause: str
    generation: int
    host_token: int | UnsetType = UNSET


class ReclaimBegun(Event, frozen=True, tag="ReclaimBegun"):
    """A parked runner is being reclaimed under a newer proxy revision; generation +1."""

    proxy_authority: ProxyAuthority
    generation: int


class ReclaimCompleted(Event, frozen=True, tag="ReclaimCompleted"):
    """The runner accepts again; generation +1."""

    generation: int


class HookAuthorized(Event, frozen=True, tag="HookAuthorized"):
    """The post-session hook of an ended lease was authorized; the receipt digest is recorded."""

    lease_id: str
    lease_generation: int
    runner_generation: int
    result_digest: str
    hook_digest: str
    receipt_digest: str


# --- host driver side effects -----------------------------------------------------------------------


class UnitRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Where a unit runs and how to find it again: mode, host, boot, and the pid or the unit name."""

    mode: str
    host: str
    boot_id: str
    run_dir: str
    pid: int | None = None
    start_ticks: int | None = None
    unit: str | None = None


class UnitStarting(Event, frozen=True, tag="UnitStarting"):
    """Intent: the host is about to start a unit for this lease (recorded before the side effect).

    ``unit`` is the systemd unit name chosen before the start (child mode: None; the unit writes its
    pid to its run directory), and ``command`` the argv it runs (never a secret: tokens go on stdin),
    so a host that crashed between intent and outcome can find the unit, or start it again.
    """

    lease_id: str
    lease_generation: int
    mode: str
    run_dir: str
    unit: str | None = None
    command: tuple[str, ...] = ()
    host_token: int | UnsetType = UNSET


class UnitStarted(Event, frozen=True, tag="UnitStarted"):
    """A unit for this lease is running; the record finds it again after a host restart."""

    lease_id: str
    lease_generation: int
    handle: UnitRecord
    host_token: int | UnsetType = UNSET


class UnitSignalled(Event, frozen=True, tag="UnitSignalled"):
    """The host sent a signal to the unit (drain's SIGTERM, the deadline's SIGKILL)."""

    lease_id: str
    signal: str
    reason: str
    host_token: int | UnsetType = UNSET


class UnitExited(Event, frozen=True, tag="UnitExited"):
    """The unit ended on its own: exit code or signal, and what the host made of it."""

    lease_id: str
    code: int | None
    signal: str | None
    outcome: str
    host_token: int | UnsetType = UNSET


class UnitStopped(Event, frozen=True, tag="UnitStopped"):
    """The host stopped the unit (its lease ended, the runner parked, or its work only waits).

    ``signals`` are the signals the stop sent, in order: ``("SIGTERM", "SIGKILL")`` when it had to
    escalate, ``()`` when nothing was alive to signal or the mode's manager (systemd) sent them.
    """

    lease_id: str
    reason: str
    signals: tuple[str, ...] = ()
    host_token: int | UnsetType = UNSET


class UnitWakeRecorded(Event, frozen=True, tag="UnitWakeRecorded"):
    """The unit's work only waits until ``wake_at`` (epoch ms); it is stopped and restarted then."""

    lease_id: str
    wake_at: int
    host_token: int | UnsetType = UNSET


class HostLeaseAcquired(Event, frozen=True, tag="HostLeaseAcquired"):
    """A host driver took the runner's host lease (first, or over a holder that let it lapse).

    ``holder`` names the driver (host name, boot id and a random instance id); ``token`` is the fencing
    number every later event of that driver carries, greater than every token before it; ``ttl_ms`` how
    long the lease lives without a renewal (renewals are no events).
    """

    holder: str
    token: int
    ttl_ms: int


LIFECYCLE_EVENTS: tuple[type[Event], ...] = (
    RunnerInitialized, LeaseAcquired, ProxyRotated, DrainRequested, LeaseSettled, LeaseParked,
    DrainExpired, RunnerParked, ReclaimBegun, ReclaimCompleted, HookAuthorized,
)
UNIT_EVENTS: tuple[type[Event], ...] = (
    UnitStarting, UnitStarted, UnitSignalled, UnitExited, UnitStopped, UnitWakeRecorded,
)
HOST_LEASE_EVENTS: tuple[type[Event], ...] = (HostLeaseAcquired,)
FENCED_EVENTS: frozenset[type[Event]] = frozenset(
    cls for cls in LIFECYCLE_EVENTS + UNIT_EVENTS if "host_token" in cls.__struct_fields__)
"""The events a host driver may append, each carrying its host lease token (``host_token``)."""
EVENT_TYPES: dict[str, type[Event]] = {
    str(cls.__struct_config__.tag): cls for cls in LIFECYCLE_EVENTS + UNIT_EVENTS + HOST_LEASE_EVENTS
}

TAG_OF: dict[type[Event], str] = {cls: tag for tag, cls in EVENT_TYPES.items()}
"""Each event class's tag (what the ``type`` column holds for it)."""
_DECODER = msgspec.json.Decoder(Union[tuple(EVENT_TYPES.values())])  # noqa: UP007
decode_body: Callable[[bytes], Event] = _DECODER.decode
"""The event a body's bytes hold, unchecked against its row (msgspec's DecodeError or ValidationError, or
TypeError for no bytes): the replay's hot path, which asks `decode_recorded` for the error naming the row."""


def type_of(event: Event) -> str:
    """The tag of an event: what its ``type`` column holds."""
    return event.__struct_config__.tag  # type: ignore[return-value]


# Field value types an event may hold without a look for floats: plain values, and the value types that
# validate every field when they are built (and decoded, and replaced), refusing floats.
_FLOAT_FREE = PLAIN_TYPES | {ProxyAuthority, Resources, UnsetType}


def encode(event: Event) -> bytes:
    """The canonical bytes of an event (stored and hashed as they are).

    The same bytes as ``canonical_bytes(msgspec.to_builtins(event))``, a float anywhere refused alike;
    encoded from the Struct directly, which is several times cheaper.
    """
    if not isinstance(event, Event):
        _refuse_non_event(event)
    return struct_bytes(event, _FLOAT_FREE)


def encode_all(events: Sequence[Event]) -> list[tuple[str, bytes]]:
    """``(type_of(event), encode(event))`` of each event, in one pass; the first refused event raises."""
    bodies = structs_bytes(events, _FLOAT_FREE, Event, _refuse_non_event)
    return list(zip([type_of(event) for event in events], bodies, strict=True))


def _refuse_non_event(value: object) -> None:
    raise InvalidInputError("events", f"events must be lifecycle_es events, got {type(value).__name__}")


def decode(body: bytes) -> Event:
    """The event whose canonical bytes are `body`; raises msgspec.ValidationError / DecodeError."""
    event: Event = _DECODER.decode(body)
    return event


def decode_recorded(seq: int, stream: str, type_: str, body: bytes) -> Event:
    """The event a log row holds, or the IntegrityError that names its seq: the one place a row's body
    is decoded and held to its ``type`` column (every reader, replay and audit goes through it)."""
    try:
        event: Event = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as exc:
        # TypeError: a body that is not bytes at all (NULL from a damaged page, text smuggled past STRICT).
        raise IntegrityError(seq, f"body is not a valid event: {exc}", stream=stream) from None
    if TAG_OF[type(event)] != type_:  # the decoded class's tag: a look-up, cheaper than its config's
        tag = event.__struct_config__.tag
        raise IntegrityError(seq, f"type column {type_!r} differs from body tag {tag!r}", stream=stream)
    return event


def as_dict(event: Event) -> dict[str, Any]:
    """An event as plain builtins (what ``events --json`` prints)."""
    return msgspec.to_builtins(event)  # type: ignore[no-any-return]
