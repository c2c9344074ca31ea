"""The hash chain: framing, genesis, links and key ids.

``hash = blake3(DOMAIN || prev || frame(seq, stream, version, type, at, body))``. Every field of the
frame is length-prefixed (integers as 8 bytes, byte strings behind an 8-byte length), so no two field
lists frame alike. The ``prev`` of seq 1 is derived from the store's random id, so an event cannot be
spliced from one store into another. In keyed mode every hash is blake3's keyed hash under a 32-byte
key: whoever edits the file without the key cannot forge a chain that verifies. A snapshot carries a
tag made the same way (`snapshot_tag`), so a state nobody can prove is never folded from.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any

import blake3

from .errors import IntegrityError

EVENT_DOMAIN = b"lifecycle-es/event/v1\x00"
GENESIS_DOMAIN = b"lifecycle-es/genesis/v1\x00"
SEAL_DOMAIN = b"lifecycle-es/seal/v1\x00"
SNAPSHOT_DOMAIN = b"lifecycle-es/snapshot/v1\x00"
KEY_ID_CONTEXT = "lifecycle-es 2026-12 key id v1"
KEY_BYTES = 32
HASH_BYTES = 32

_U64 = struct.Struct(">Q")
# The frame up to the body's length, as one Struct per (stream, type, at) length triple: a log has a
# handful of those, and one pack call is several times cheaper than ten. Bounded, for hostile logs.
_HEADS: dict[tuple[int, int, int], struct.Struct] = {}
_MAX_HEADS = 1024


def _hasher(key: bytes | None) -> blake3.blake3:
    return blake3.blake3(key=key) if key is not None else blake3.blake3()


def frame_head(lengths: tuple[int, int, int]) -> struct.Struct:
    """The Struct that packs an event's frame up to its body's length (seq, stream, version, type, at, the
    body's length), given the encoded lengths of its stream, type and at; kept for the next such event."""
    head = _HEADS.get(lengths)
    if head is None:
        head = struct.Struct(">QQ%dsQQ%dsQ%dsQ" % lengths)  # noqa: UP031 (a format of formats)
        if len(_HEADS) < _MAX_HEADS:
            _HEADS[lengths] = head
    return head


def link(prev: bytes, seq: int, stream: str, version: int, type_: str, at: str, body: bytes,
         key: bytes | None = None) -> bytes:
    """The hash of one event, given the hash of the event before it.

    The same bytes as ``EVENT_DOMAIN || prev || frame(...)``, fed to blake3 in two updates (the frame's
    head, then the body) so that verifying a long log costs little more than hashing it. Fields that no
    frame can hold (a negative version, a NULL or an integer where text belongs: a row edited outside
    the store or read from a damaged page) raise IntegrityError at `seq`: no hash can be that row's.
    """
    try:
        stream_b = stream.encode()
        type_b = type_.encode()
        at_b = at.encode()
        lengths = (len(stream_b), len(type_b), len(at_b))
        head = _HEADS.get(lengths) or frame_head(lengths)
        start = EVENT_DOMAIN + prev + head.pack(seq, lengths[0], stream_b, version, lengths[1], type_b, lengths[2],
                                                at_b, len(body))
        hasher = blake3.blake3(start, key=key) if key is not None else blake3.blake3(start)
        hasher.update(body)
    except (struct.error, TypeError, AttributeError, UnicodeError):
        # Inside the try, not a check before it: the hot path of every verify and audit pays nothing.
        raise IntegrityError(seq, f"it cannot be hashed: {_unframeable(prev, seq, stream, version, type_, at, body)}",
                             stream=stream if isinstance(stream, str) else None) from None
    return hasher.digest()


def links(prev: bytes, seq: int, stream: str, version: int, at: str, events: Sequence[tuple[str, bytes]],
          key: bytes | None = None) -> list[bytes]:
    """The hashes of a batch: `events` ``(type, body)`` appended to `stream` at `at` after `prev`, `seq`, `version`.

    Each is ``link`` of the event at seq + 1, version + 1, ... chained to the one before, byte for byte;
    the stream's and the time's bytes are framed once for the batch, each type's once, not per event.
    Whatever a frame cannot hold is refused as ``link`` refuses it (it is asked again, event by event).
    """
    digests: list[bytes] = []
    try:
        stream_b, at_b = stream.encode(), at.encode()
        stream_n, at_n = len(stream_b), len(at_b)
        heads: dict[str, tuple[Any, bytes, int]] = {}
        new = blake3.blake3 if key is None else functools.partial(blake3.blake3, key=key)
        last, position, number = prev, seq, version
        for type_, body in events:
            position += 1
            number += 1
            head = heads.get(type_)
            if head is None:
                type_b = type_.encode()
                lengths = (stream_n, len(type_b), at_n)
                head = heads[type_] = ((_HEADS.get(lengths) or frame_head(lengths)).pack, type_b, lengths[1])
            pack, type_b, type_n = head
            hasher = new(EVENT_DOMAIN + last + pack(position, stream_n, stream_b, number, type_n, type_b, at_n, at_b,
                                                    len(body)))
            hasher.update(body)
            last = hasher.digest()
            digests.append(last)
    except (struct.error, TypeError, AttributeError, UnicodeError):
        digests = []
        for type_, body in events:
            seq += 1
            version += 1
            prev = link(prev, seq, stream, version, type_, at, body, key)  # raises at the row it cannot frame
            digests.append(prev)
    return digests


def _unframeable(prev: object, seq: object, stream: object, version: object, type_: object, at: object,
                 body: object) -> str:
    """Which field of a row the frame cannot hold, and why."""
    fields = {"seq": (seq, int), "stream": (stream, str), "version": (version, int), "type": (type_, str),
              "at": (at, str), "body": (body, bytes), "prev": (prev, bytes)}
    for name, (value, kind) in fields.items():
        if type(value) is not kind:
            return f"its {name} is {type(value).__name__}, not {kind.__name__}"
        if kind is int and not 0 <= value < 2**64:  # type: ignore[operator]
            return f"its {name} {value} is outside 0..2**64-1"
    return "its text is not encodable"


def genesis(store_id: bytes, key: bytes | None = None) -> bytes:
    """The ``prev`` of seq 1: a hash of the store's random id."""
    hasher = _hasher(key)
    hasher.update(GENESIS_DOMAIN)
    hasher.update(store_id)
    return hasher.digest()


def key_id(key: bytes) -> str:
    """A public identifier of a key (derived, one-way): what the store keeps instead of the key."""
    return blake3.blake3(key, derive_key_context=KEY_ID_CONTEXT).hexdigest()[:32]


def seal_mac(key: bytes | None, payload: bytes) -> str:
    """The MAC (keyed) or checksum (unkeyed) of a seal file's payload, hex."""
    hasher = _hasher(key)
    hasher.update(SEAL_DOMAIN)
    hasher.update(payload)
    return hasher.hexdigest()


def snapshot_tag(store_id: bytes, stream: str, version: int, seq: int, event_hash: bytes, state: bytes,
                 key: bytes | None = None) -> bytes:
    """The tag of a snapshot: a MAC under `key` (keyed), a hash (unkeyed), over all it claims.

    ``blake3(SNAPSHOT_DOMAIN || store_id || stream || version || seq || event_hash || state)``, each byte
    string behind its 8-byte length and each integer as 8 bytes (as an event's fields are), so no two
    snapshots frame alike: the store id binds it to its store, the rest to its stream, its place in the
    log and its state's bytes. Fields no frame can hold (a row edited outside the store) raise ValueError.
    """
    try:
        stream_b = stream.encode()
        hasher = _hasher(key)
        hasher.update(SNAPSHOT_DOMAIN + _U64.pack(len(store_id)) + store_id + _U64.pack(len(stream_b)) + stream_b
                      + _U64.pack(version) + _U64.pack(seq) + _U64.pack(len(event_hash)) + bytes(event_hash)
                      + _U64.pack(len(state)))
        hasher.update(state)
    except (struct.error, TypeError, AttributeError, UnicodeError) as exc:
        raise ValueError(f"a snapshot field cannot be framed: {exc}") from None
    return hasher.digest()
