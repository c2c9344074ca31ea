"""What happened to runners over a window of the log, as spans and marks a picture can show.

    timeline = collect(store.read(), runners={"runner-7"}, since_ms=t0, until_ms=t1, last=50)
    svg = projections.timeline_svg.draw(timeline)

A lease is a span from its acquisition to its settle or park (open when the log ends first), with a
span per unit the host ran for it beneath; a runner's state is a band of spans (accepting, draining,
parked, reclaiming); the facts worth seeing (a drain, a park, a reclaim, a proxy rotation, a hook
authorization, a unit signalled) are marks. Every span and mark keeps the seq it came from. The
parts, and the table of marks (`MARKS`), are in ``timeline_parts.py``.

`collect` reads the events once, in seq order, and keeps only what the window can show: the last
`last` leases that overlap it (a lease acquired before the window is held while it is open, so one
still running when the window starts is drawn), and a bounded number of bands and marks per runner
and per lease. Memory is bounded whatever the log's length. It folds no rules: a log the audit would
refuse is drawn as it is, an event whose body or time it cannot read is counted, not fatal, and a row
the store cannot read ends the pass with what came before it drawn (``Timeline.stopped`` says why).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable
from typing import Any

import msgspec

from lifecycle_es.canonical import iso_ms, parse_iso_ms
from lifecycle_es.errors import InvalidInputError, LifecycleError
from lifecycle_es.log import RecordedEvent
from lifecycle_es.runner import PARK_REASONS

from .timeline_parts import (
    DEFAULT_LAST,
    MARKS,
    MAX_HELD,
    MAX_SPAN_MARKS,
    MAX_UNITS,
    OUTCOMES,
    PROBLEM,
    STATE_AFTER,
    Band,
    Lane,
    Mark,
    MarkKind,
    Span,
    Timeline,
)

__all__ = ["DEFAULT_LAST", "MARKS", "Band", "Lane", "Mark", "MarkKind", "Span", "Timeline", "collect", "describe"]


class _Proxy(msgspec.Struct):
    id: str | None = None
    revision: int | None = None


class _Handle(msgspec.Struct):
    pid: int | None = None
    unit: str | None = None


class _LeaseFacts(msgspec.Struct, kw_only=True):
    """The fields the picture reads of the many events (a lease acquired or settled, a unit's facts); the
    others, a lease's proxy authority among them, are skipped unread, which halves the cost of a decode."""

    lease_id: str | None = None
    session_id: str | None = None
    reason: str | None = None
    outcome: str | None = None
    mode: str | None = None
    handle: _Handle | None = None
    lease_ids: list[str] | None = None


class _Facts(_LeaseFacts, kw_only=True):
    """The fields of the few events drawn as marks, their tooltips' words."""

    cause: str | None = None
    signal: str | None = None
    code: int | None = None
    generation: int | None = None
    deadline_at: str | None = None
    wake_at: int | None = None
    unit: str | None = None
    proxy_authority: _Proxy | None = None
    holder: str | None = None
    token: int | None = None


_FACTS = msgspec.json.Decoder(_Facts)
_LEASE_FACTS = msgspec.json.Decoder(_LeaseFacts)
_SHOWN = ("reason", "cause", "signal", "outcome", "code", "generation", "deadline_at", "lease_id", "holder", "token")


def describe(type_: str, seq: int, at: str, facts: _Facts) -> str:
    """A fact as its tooltip says it: type, seq, time, then the fields that say what happened."""
    parts = [f"{type_} · seq {seq:,} · {at}"]
    parts += [f"{name} {getattr(facts, name)}" for name in _SHOWN if getattr(facts, name) is not None]
    if facts.proxy_authority is not None:
        parts.append(f"proxy {facts.proxy_authority.id} revision {facts.proxy_authority.revision}")
    if facts.wake_at is not None:
        parts.append(f"wake at {iso_ms(facts.wake_at) if 0 <= facts.wake_at < 1 << 45 else facts.wake_at}")
    if facts.lease_ids is not None:
        shown = ", ".join(facts.lease_ids[:5]) + (", ..." if len(facts.lease_ids) > 5 else "")
        parts.append(f"{len(facts.lease_ids)} lease(s) parked: {shown}" if facts.lease_ids else "no lease active")
    return " · ".join(parts)


class _Collector:
    """One pass over the events (see `collect`): the state of the pass and what each event does to it."""

    def __init__(self, runners: Collection[str] | None, since_ms: int | None, until_ms: int | None, last: int,
                 highlight: int | None) -> None:
        self.runners = set(runners) if runners is not None else None
        self.since = since_ms if since_ms is not None else -(1 << 62)
        self.until = until_ms if until_ms is not None else 1 << 62
        self.last = last
        self.highlight_seq = highlight
        self.timeline = Timeline([], None, None, since_ms, until_ms, last)
        self.lanes: dict[str, Lane] = {}
        self.spans: OrderedDict[tuple[str, str], Span] = OrderedDict()  # in acquisition order
        self.certain = 0  # spans known to overlap the window
        # Leases dropped while it was not known whether they overlap the window (acquired before it, open
        # then): counted as left out if they turn out to (bounded: beyond it the count is a lower bound).
        self.dropped_open: set[tuple[str, str]] = set()
        self.first_ms: int | None = None
        self.last_ms = -(1 << 62)
        self.seconds: dict[str, int] = {}  # epoch ms of ``2026-01-01T00:00:00.``: a second is parsed once

    def feed(self, events: Iterable[RecordedEvent]) -> None:
        """Fold every event in; a row the store cannot read ends the pass (what came before is drawn)."""
        try:
            self._feed(events)
        except LifecycleError as exc:  # a row edited outside the store: text that is not UTF-8, a bad type
            self.timeline.stopped = str(exc)

    def _feed(self, events: Iterable[RecordedEvent]) -> None:
        # The loop is the whole cost of a picture, so it does as little as it can.
        runners, actions, lanes, seconds = self.runners, _actions(), self.lanes, self.seconds
        highlight, until, count = self.highlight_seq, self.until, 0
        for recorded in events:
            if recorded.seq == highlight:
                self._highlight(recorded)
            stream = recorded.stream
            if runners is not None and stream not in runners:
                continue
            count += 1
            action = actions.get(recorded.type)
            if action is None:
                continue
            handler, kind, decode, late = action
            at = recorded.at
            try:
                base = seconds.get(at[:20])
                at_ms = base + int(at[20:23]) if base is not None and len(at) == 24 and at[23] == "Z" else self._ms(at)
                if at_ms > until and not late:
                    continue  # after the window only the end of what it holds is drawn: no need to read this
                facts = decode(recorded.body)
            except (msgspec.MsgspecError, ValueError, OverflowError):
                self._unreadable(recorded.seq)
                continue
            if at_ms > self.last_ms:
                self.last_ms = at_ms
            lane = lanes.get(stream)
            if lane is None:
                lane = lanes[stream] = Lane(stream)
                if self.first_ms is None:
                    self.first_ms = at_ms
            if handler is not None:
                handler(self, lane, recorded, at_ms, facts)
            if kind is not None and self.since <= at_ms <= self.until:
                self._mark(lane, kind, recorded, at_ms, facts)
        self.timeline.events += count

    def _ms(self, at: str) -> int:
        if len(at) == 24 and at[19] == "." and at[23] == "Z" and at[20:23].isdigit():  # the log's own form
            if len(self.seconds) > 4096:
                self.seconds.clear()
            base = self.seconds[at[:20]] = parse_iso_ms(at[:19] + "Z")
            return base + int(at[20:23])
        return parse_iso_ms(at)

    def _unreadable(self, seq: int) -> None:
        timeline = self.timeline
        timeline.unreadable += 1
        if timeline.first_unreadable is None:
            timeline.first_unreadable = seq

    def _highlight(self, recorded: RecordedEvent) -> None:
        try:
            at_ms = self._ms(recorded.at)
        except (ValueError, OverflowError):
            return
        self.timeline.highlight = Mark(PROBLEM, recorded.seq, at_ms, recorded.at, f"{recorded.type} · seq "
                                       f"{recorded.seq:,} · {recorded.at} · stream {recorded.stream}")

    def _mark(self, lane: Lane, kind: MarkKind, recorded: RecordedEvent, at_ms: int, facts: _LeaseFacts) -> None:
        assert isinstance(facts, _Facts)  # a mark's body is read with every field its tooltip says
        mark = Mark(kind, recorded.seq, at_ms, recorded.at, describe(recorded.type, recorded.seq, recorded.at, facts))
        if kind.on == "runner":
            holder = lane.marks
        else:
            span = self.spans.get((lane.runner_id, facts.lease_id or ""))
            if span is None:
                return  # its lease is not drawn
            if kind.on == "unit" and span.units:
                span = span.units[-1]
            if span.marks is None:
                span.marks = deque(maxlen=MAX_SPAN_MARKS)
            holder = span.marks
        if len(holder) == holder.maxlen:
            self.timeline.marks_left_out += 1
        holder.append(mark)

    # --- what each event does to the picture -------------------------------------------------------------

    def state(self, lane: Lane, recorded: RecordedEvent, at_ms: int, facts: _LeaseFacts) -> None:
        if lane.state is not None:
            self._band(lane, Band(lane.state, lane.state_seq, lane.state_ms, recorded.seq, at_ms))
        lane.state, lane.state_seq, lane.state_ms = STATE_AFTER[recorded.type], recorded.seq, at_ms

    def _band(self, lane: Lane, band: Band) -> None:
        if (band.end_ms is not None and band.end_ms < self.since) or band.start_ms > self.until:
            return
        if len(lane.bands) == lane.bands.maxlen:
            self.timeline.marks_left_out += 1
        lane.bands.append(band)

    def acquired(self, lane: Lane, recorded: RecordedEvent, at_ms: int, facts: _LeaseFacts) -> None:
        lease_id = facts.lease_id
        if at_ms > self.until or lease_id is None:
            return
        spans, key, certain = self.spans, (lane.runner_id, lease_id), at_ms >= self.since
        old = spans.pop(key, None)
        if old is not None and old.certain:
            self.certain -= 1
        spans[key] = Span(lease_id, facts.session_id or "", recorded.seq, at_ms, recorded.at, certain)
        if certain:
            self.certain += 1
            if self.certain > self.last:
                self._drop_oldest()
        elif len(spans) > self.last + MAX_HELD:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        """Drop spans from the oldest until at most `last` are known to overlap the window."""
        while True:
            key, span = self.spans.popitem(last=False)
            if span.certain:
                self.certain -= 1
                self.timeline.leases_left_out += 1
            elif len(self.dropped_open) < MAX_HELD:
                self.dropped_open.add(key)
            if self.certain <= self.last and len(self.spans) <= self.last + MAX_HELD:
                return

    def _end(self, lane: Lane, lease_id: str, recorded: RecordedEvent, at_ms: int, outcome: str) -> None:
        key = (lane.runner_id, lease_id)
        span = self.spans.get(key)
        if span is None:
            if self.dropped_open and key in self.dropped_open:
                self.dropped_open.discard(key)
                self.timeline.leases_left_out += at_ms >= self.since
            return
        if span.end_seq is not None:
            return
        span.end(recorded.seq, at_ms, recorded.at, recorded.type, outcome)
        if not span.certain:
            if at_ms < self.since:
                del self.spans[key]  # it ended before the window
            else:
                span.certain = True
                self.certain += 1
                if self.certain > self.last:
                    self._drop_oldest()

    def settled(self, lane: Lane, recorded: RecordedEvent, at_ms: int, facts: _LeaseFacts) -> None:
        if facts.lease_id is not None:
            self._end(lane, facts.lease_id, recorded, at_ms, "settled")

    def parked(self, lane: Lane, recorded: RecordedEvent, at_ms: int, facts: _LeaseFacts) -> None:
        if facts.lease_id is not None:
            self._end(lane, facts.lease_id, recorded, at_ms, facts.reason if facts.reason in PARK_REASONS else "ended")

    def expired(self, lane: Lane, recorded: RecordedEvent, at_ms: int, facts: _LeaseFacts) -> None:
        for lease_id in facts.lease_ids or ():
            self._end(lane, lease_id, recorded, at_ms, "drain-expired")

    def unit_starting(self, lane: Lane, recorded: RecordedEvent, at_ms: int, facts: _LeaseFacts) -> None:
        lease = self.spans.get((lane.runner_id, facts.lease_id or ""))
        if lease is None:
            return
        if lease.units is None:
            lease.units = deque(maxlen=MAX_UNITS)
        number = int(lease.units[-1].id) + 1 if lease.units else 1  # a lease's units are numbered from 1
        unit = Span(str(number), facts.mode or "", recorded.seq, at_ms, recorded.at)
        unit.outcome = "starting"
        lease.units.append(unit)

    def unit_started(self, lane: Lane, recorded: RecordedEvent, at_ms: int, facts: _LeaseFacts) -> None:
        lease = self.spans.get((lane.runner_id, facts.lease_id or ""))
        if lease is None:
            return
        if not lease.units or lease.units[-1].outcome != "starting":
            self.unit_starting(lane, recorded, at_ms, facts)
        assert lease.units
        unit = lease.units[-1]
        unit.outcome = "active"
        if facts.handle is not None:
            where = f"pid {facts.handle.pid}" if facts.handle.pid is not None else f"unit {facts.handle.unit}"
            unit.detail = f"{unit.detail} {where}".strip()

    def unit_ended(self, lane: Lane, recorded: RecordedEvent, at_ms: int, facts: _LeaseFacts) -> None:
        lease = self.spans.get((lane.runner_id, facts.lease_id or ""))
        if lease is None or not lease.units or lease.units[-1].end_seq is not None:
            return
        if recorded.type == "UnitStopped":
            outcome = "stopped"
        else:
            outcome = facts.outcome if facts.outcome in OUTCOMES else "ended"
        lease.units[-1].end(recorded.seq, at_ms, recorded.at, recorded.type, outcome or "ended")

    def finish(self) -> Timeline:
        """The timeline: spans open at the end overlap the window, so they count; then the last `last`."""
        timeline = self.timeline
        timeline.leases_left_out += len(self.dropped_open)  # open at the end: they overlap the window
        for span in self.spans.values():
            if not span.certain:
                span.certain = True
                self.certain += 1
        if self.certain > self.last:
            self._drop_oldest()
        for (runner_id, _), span in self.spans.items():
            self.lanes[runner_id].leases.append(span)
        for lane in self.lanes.values():
            if lane.state is not None:
                self._band(lane, Band(lane.state, lane.state_seq, lane.state_ms, None, None))
        timeline.runners_seen = set(self.lanes)
        starts = [span.start_ms for span in self.spans.values()]
        timeline.start_ms = timeline.since_ms if timeline.since_ms is not None else min(starts, default=self.first_ms)
        timeline.end_ms = timeline.until_ms
        if timeline.end_ms is None and timeline.start_ms is not None and self.first_ms is not None:
            # A little room after the last event, so that what happened last (a lease just acquired) shows.
            last = max(self.last_ms, timeline.start_ms)
            timeline.end_ms = last + max(1, (last - timeline.start_ms) // 40)
        start = timeline.start_ms if timeline.start_ms is not None else 0
        wanted = self.runners or set()
        timeline.lanes = sorted((lane for lane in self.lanes.values() if lane.leases or lane.runner_id in wanted
                                 or any(mark.at_ms >= start for mark in lane.marks)), key=lambda lane: lane.runner_id)
        return timeline


_Handler = Callable[[_Collector, Lane, RecordedEvent, int, Any], None]
_HANDLERS: dict[str, _Handler] = {
    **dict.fromkeys(STATE_AFTER, _Collector.state),
    "LeaseAcquired": _Collector.acquired,
    "LeaseSettled": _Collector.settled,
    "LeaseParked": _Collector.parked,
    "DrainExpired": _Collector.expired,
    "UnitStarting": _Collector.unit_starting,
    "UnitStarted": _Collector.unit_started,
    "UnitExited": _Collector.unit_ended,
    "UnitStopped": _Collector.unit_ended,
}
# What still matters after the window: the ends of the leases and units it holds, and state changes.
_LATE = {_Collector.settled, _Collector.parked, _Collector.expired, _Collector.unit_ended, _Collector.state}
_Action = tuple[_Handler | None, MarkKind | None, Callable[[bytes], _LeaseFacts], bool]


def _actions() -> dict[str, _Action]:
    """Per event tag: what it does, the mark it makes, how its body is read (marks need their words), and
    whether it matters after the window.

    Made from `MARKS` as it is when a pass starts, so a kind added to the table is drawn with no other change.
    """
    actions: dict[str, _Action] = {}
    for type_ in {**_HANDLERS, **MARKS}:
        handler = _HANDLERS.get(type_)
        decode = _FACTS.decode if type_ in MARKS else _LEASE_FACTS.decode
        actions[type_] = (handler, MARKS.get(type_), decode, handler in _LATE)
    return actions


def collect(events: Iterable[RecordedEvent], *, runners: Collection[str] | None = None,
            since_ms: int | None = None, until_ms: int | None = None, last: int = DEFAULT_LAST,
            highlight: int | None = None) -> Timeline:
    """Read `events` once (seq order) and keep what a picture of the window can show.

    `runners`: only these streams (None: every runner). `since_ms`/`until_ms`: the window (epoch ms;
    None: open on that side). `last`: at most this many leases, the last acquired of those that overlap
    the window. `highlight`: a seq to mark (the audit's first problem), whatever its runner.
    """
    if type(last) is not int or last < 1:
        raise InvalidInputError("last", f"last must be an integer of at least 1, not {last!r}")
    collector = _Collector(runners, since_ms, until_ms, last, highlight)
    collector.feed(events)
    return collector.finish()
