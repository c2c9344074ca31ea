"""The log's value types: an event as the log holds it (`RecordedEvent`), the log's `Head`, and what a
verification proved (`VerifyReport`). Plain values; the store makes them, readers keep them."""

from __future__ import annotations

from typing import NamedTuple

from .backend import Row
from .events import Event, decode_recorded


class RecordedEvent:
    """One event as the log holds it: its place in the log, its bytes, its links, and the event.

    ``event`` decodes ``body`` on first use (an unknown tag or a body that is not an event raises
    IntegrityError then, naming the seq).
    """

    __slots__ = ("_event", "at", "body", "hash", "prev", "seq", "stream", "type", "version")

    def __init__(self, seq: int, stream: str, version: int, type: str, at: str, body: bytes,
                 prev: bytes, hash: bytes, event: Event | None = None) -> None:
        self.seq = seq
        self.stream = stream
        self.version = version
        self.type = type
        self.at = at
        self.body = body
        self.prev = prev
        self.hash = hash
        self._event = event

    @classmethod
    def from_row(cls, row: Row) -> RecordedEvent:
        """A recorded event from a backend row."""
        return cls(*row)

    @property
    def event(self) -> Event:
        """The decoded event object."""
        if self._event is None:
            self._event = decode_recorded(self.seq, self.stream, self.type, self.body)
        return self._event

    def row(self) -> Row:
        """The event as a backend row."""
        return (self.seq, self.stream, self.version, self.type, self.at, self.body, self.prev, self.hash)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordedEvent) and self.row() == other.row()

    def __hash__(self) -> int:
        return hash(self.hash)

    def __repr__(self) -> str:
        return f"RecordedEvent(seq={self.seq}, stream={self.stream!r}, version={self.version}, type={self.type!r})"


class Head(NamedTuple):
    """The last event of the log: its seq (0 for an empty log), hash and at."""

    seq: int
    hash: bytes
    at: str | None


class VerifyReport(NamedTuple):
    """What `verify` proved: how many events, how many streams, and the head it reached."""

    events: int
    streams: int
    head: Head
