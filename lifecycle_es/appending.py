"""An append's rows, made from its events before they are inserted: each event encoded once and held to the
bound on a body, the events' time held to the one canonical spelling (it is hashed as stored) and never
before the log's head, and the rows chained onto the head (see ``chain.py``). `EventStore._append` runs
these under the store's lock, between reading the stream's tail and inserting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import chain
from .backend import MAX_EVENT_BYTES, Row
from .canonical import MAX_EPOCH_MS, canonical_ms, iso_ms, timestamp
from .errors import IntegrityError, InvalidInputError
from .events import Event, encode_all
from .values import safe_int, shown
from .verify import well_formed_at


def encoded(events: Sequence[Event]) -> list[tuple[str, bytes]]:
    """(type, body) of each of `events`, or InvalidInputError("events"): not a non-empty sequence of events,
    an event that cannot be encoded (a float in it, say), or a body beyond MAX_EVENT_BYTES."""
    # A list is a Sequence: the ABC's check (a registry walk) is for everything else.
    if (type(events) is not list and (isinstance(events, Event) or not isinstance(events, Sequence))) or not events:
        raise InvalidInputError("events", "events must be a non-empty sequence of events")
    bodies = encode_all(events)
    for _, body in bodies:
        if len(body) > MAX_EVENT_BYTES:
            raise _too_large(bodies)
    return bodies


def stamp(at: str | None, now: Callable[[], int]) -> str:
    """The events' `at` as stored: `now()`'s time when none is given, else `at` in its canonical spelling (UTC,
    milliseconds, Z), or InvalidInputError("at")."""
    if at is None:
        return iso_ms(safe_int(now(), "now", 0, MAX_EPOCH_MS))
    if canonical_ms(at) is None:  # already spelled so (a command's own stamp): `timestamp` would return it
        return timestamp(at, "at")
    return at


def chained(bodies: Sequence[tuple[str, bytes]], prev: bytes, seq: int, stream: str, version: int, at: str,
            key: bytes | None) -> list[Row]:
    """The rows of `bodies` appended to `stream` (at `version`) after the head (`seq`, hash `prev`)."""
    rows: list[Row] = []
    for (type_, body), digest in zip(bodies, chain.links(prev, seq, stream, version, at, bodies, key), strict=True):
        seq += 1
        version += 1
        rows.append((seq, stream, version, type_, at, body, prev, digest))
        prev = digest
    return rows


def not_before(at: str, seq: int, head_at: object, *, stamped: bool) -> str:
    """`at` for an event appended after a head stamped `head_at`, later than `at`: the head's time when the
    store's clock stamped it (a clock that stepped back), InvalidInputError when the caller named it."""
    if type(head_at) is not str or not well_formed_at(head_at):
        raise IntegrityError(seq, f"the log's head has at {shown(head_at)}, not a time as the store writes one: "
                                  "audit the file (lifecycle-es audit)")
    if not stamped:
        raise InvalidInputError("at", f"at {at} is earlier than {head_at}, the at of the log's head (seq {seq}): "
                                      "an event is never stamped before the one before it; pass a later at or none")
    return head_at


def _too_large(bodies: Sequence[tuple[str, bytes]]) -> InvalidInputError:
    """The InvalidInputError naming the first event of `bodies` beyond MAX_EVENT_BYTES, and its size."""
    index, (type_, body) = next((index, pair) for index, pair in enumerate(bodies) if len(pair[1]) > MAX_EVENT_BYTES)
    return InvalidInputError("events", f"event {index} ({type_}) is {len(body):,} bytes encoded, beyond the bound of "
                                       f"{MAX_EVENT_BYTES:,} bytes an event may hold (MAX_EVENT_BYTES)")
