"""The parts of a timeline: lease and unit spans, state bands, marks, and the table of mark kinds.

`projections.timeline.collect` fills them from the log; `projections.timeline_svg.draw` draws them.
`MARKS` says which events are marks and how each looks: a new kind of fact is one line there.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from lifecycle_es.runner import PARK_REASONS

DEFAULT_LAST = 50
MAX_HELD = 20_000  # spans held beyond `last`: leases acquired before the window, still open
MAX_RUNNER_MARKS = 2_000
MAX_BANDS = 2_000
MAX_SPAN_MARKS = 32
MAX_UNITS = 16


class MarkKind(NamedTuple):
    """How one kind of fact is drawn: its class name, legend label, row (runner, lease or unit), shape, colour."""

    name: str
    label: str
    on: str
    shape: str
    colour: str


# The facts drawn as marks, by event tag. A new kind of fact (a host-lease takeover) is one more line:
# its tag and how it looks; `collect` places it on its runner, its lease or its unit by `on`.
MARKS: dict[str, MarkKind] = {
    "DrainRequested": MarkKind("drain", "drain requested", "runner", "triangle-down", "#b35c00"),
    "DrainExpired": MarkKind("drain-expired", "drain deadline passed", "runner", "triangle-down", "#c00000"),
    "RunnerParked": MarkKind("runner-park", "runner parked", "runner", "square", "#404040"),
    "ReclaimBegun": MarkKind("reclaim", "reclaim begun", "runner", "circle", "#0060a0"),
    "ReclaimCompleted": MarkKind("reclaimed", "reclaim completed", "runner", "ring", "#0060a0"),
    "ProxyRotated": MarkKind("rotation", "proxy rotated", "runner", "diamond", "#6a3d9a"),
    "HostLeaseAcquired": MarkKind("host-lease", "host driver took the runner", "runner", "triangle-up", "#8c6d00"),
    "LeaseParked": MarkKind("park", "lease parked", "lease", "square", "#404040"),
    "HookAuthorized": MarkKind("hook", "post-session hook authorized", "lease", "triangle-up", "#00734f"),
    "UnitSignalled": MarkKind("signal", "unit signalled", "unit", "cross", "#c00000"),
    "UnitWakeRecorded": MarkKind("wake", "unit waits for its wake time", "unit", "ring", "#555555"),
}

PROBLEM = MarkKind("problem", "first problem", "runner", "line", "#d00000")

# The runner's state after each event that changes it.
STATE_AFTER: dict[str, str] = {
    "RunnerInitialized": "accepting", "DrainRequested": "draining", "RunnerParked": "parked",
    "ReclaimBegun": "reclaiming", "ReclaimCompleted": "accepting",
}
# What a span's outcome may be called (a class name in the picture: never a value read from the log).
OUTCOMES = ("active", "settled", *PARK_REASONS, "drain-expired", "stopped", "starting", "ended")


class Mark(NamedTuple):
    """One fact at one moment: its kind, seq, time (epoch ms and as the log has it) and what it says."""

    kind: MarkKind
    seq: int
    at_ms: int
    at: str
    text: str


class Band(NamedTuple):
    """A runner in one state from one event to the next (`end_seq` None: still in it at the end)."""

    state: str
    start_seq: int
    start_ms: int
    end_seq: int | None
    end_ms: int | None


class Span:
    """A lease or a unit from its first event to its end (``end_seq`` None: open when the log ended).

    ``marks`` and ``units`` stay None until the span has one: most leases of a long log are read,
    passed over and dropped, and cost no more than they must.
    """

    __slots__ = ("certain", "detail", "end_at", "end_ms", "end_seq", "id", "marks", "outcome", "start_at",
                 "start_ms", "start_seq", "type", "units")

    def __init__(self, id: str, detail: str, seq: int, at_ms: int, at: str, certain: bool = True) -> None:
        self.id = id
        self.detail = detail
        self.start_seq, self.start_ms, self.start_at = seq, at_ms, at
        self.end_seq: int | None = None
        self.end_ms: int | None = None
        self.end_at: str | None = None
        self.type: str | None = None  # the event type that ended it
        self.outcome = "active"
        self.marks: deque[Mark] | None = None
        self.units: deque[Span] | None = None
        self.certain = certain  # known to overlap the window

    def end(self, seq: int, at_ms: int, at: str, type_: str, outcome: str) -> None:
        """Close the span at an event, with its outcome."""
        self.end_seq, self.end_ms, self.end_at, self.type, self.outcome = seq, at_ms, at, type_, outcome


@dataclass
class Lane:
    """One runner: its state now, its bands and marks in the window (the newest kept), its lease spans."""

    runner_id: str
    state: str | None = None
    state_seq: int = 0
    state_ms: int = 0
    bands: deque[Band] = field(default_factory=lambda: deque(maxlen=MAX_BANDS))
    marks: deque[Mark] = field(default_factory=lambda: deque(maxlen=MAX_RUNNER_MARKS))
    leases: list[Span] = field(default_factory=list)


@dataclass
class Timeline:
    """What `collect` kept: the runners with something to show, the time span, and what was left out."""

    lanes: list[Lane]
    start_ms: int | None
    end_ms: int | None
    since_ms: int | None
    until_ms: int | None
    last: int
    events: int = 0  # events of the chosen runners read
    leases_left_out: int = 0  # leases known to overlap the window beyond the last `last`
    marks_left_out: int = 0
    unreadable: int = 0  # events whose body or time could not be read
    first_unreadable: int | None = None
    highlight: Mark | None = None
    stopped: str | None = None  # why the log could not be read to its end, if it could not
    runners_seen: set[str] = field(default_factory=set)
