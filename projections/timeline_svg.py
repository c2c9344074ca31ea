"""A `Timeline` drawn as one self-contained SVG: no script, no link, no font to fetch.

    svg = draw(collect(store.read(), runners={"runner-7"}, since_ms=t0, until_ms=t1))

Along the top, a legend and a UTC time axis; then, per runner, its state band (accepting, draining,
parked, reclaiming) with the runner's marks on it and a dashed guide down through its rows, a row per
lease (a bar from acquisition to settle or park, coloured by outcome) and a row per unit under it.
Every bar, band and mark carries an SVG ``<title>`` that names its seq, so the picture leads back to
the log; classes and ``data-seq`` attributes say what each shape is, for tests and for tools.

Every text from the log goes through `svg_text`: markup characters are escaped, and control, bidi
and invisible characters are shown as ``\\u202e``-style escapes (XML 1.0 cannot hold most controls at all,
and a bidi override would make a lease id read as another).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

from lifecycle_es.log import RecordedEvent

from .timeline import collect
from .timeline_parts import MARKS, Band, Lane, Mark, MarkKind, Span, Timeline

WIDTH = 1280
LABEL_X = 10
PLOT_X0 = 300
PLOT_X1 = WIDTH - 24
LABEL_CHARS = 40  # of an 11 px monospace label in the label column
LEASE_ROW, UNIT_ROW, BAND_ROW, HEAD_ROW, LANE_GAP = 18, 14, 18, 22, 10
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"

OUTCOME_STYLE: dict[str, tuple[str, str]] = {
    "settled": ("#2e9e5b", "settled"),
    "lost-poll": ("#e69f00", "parked: lost poll"),
    "resource-limit": ("#d55e00", "parked: resource limit"),
    "checkout-failure": ("#cc79a7", "parked: checkout failure"),
    "drain-expired": ("#a50f15", "parked: drain deadline"),
    "active": ("#3b7dd8", "still active"),
    "stopped": ("#8fa8c8", "unit stopped"),
    "starting": ("#b8c7db", "unit starting"),
    "ended": ("#9a9a9a", "other end"),
}
STATE_STYLE: dict[str, str] = {
    "accepting": "#d3ecd0", "draining": "#fdd49e", "parked": "#d6d6d6", "reclaiming": "#c6dbef",
}
GRID, AXIS_TEXT, MUTED = "#e6e6e6", "#444444", "#666666"

# XML 1.0 cannot hold C0 controls (but tab and newlines, escaped here as well), lone surrogates or
# U+FFFE/U+FFFF; C1 controls, bidi controls and invisible characters would mislead a reader.
_HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
                     "\ud800-\udfff\ufffe\uffff]")
_MARKUP = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}
_MARKUP_RE = re.compile("[&<>\"']")


def visible(text: str) -> str:
    """`text` with control, bidi and invisible characters shown as ``\\x1b``-style / ``\\u202e``-style escapes."""
    return _HIDDEN.sub(lambda match: f"\\x{ord(match.group()):02x}" if ord(match.group()) < 0x100
                       else f"\\u{ord(match.group()):04x}", text)


def svg_text(text: object, limit: int | None = None) -> str:
    """Text from the log made safe for SVG/HTML text and attributes: `visible`, cut to `limit`, escaped."""
    shown = visible(str(text))
    if limit is not None and len(shown) > limit:
        shown = shown[: limit - 1] + "\u2026"
    return _MARKUP_RE.sub(lambda match: _MARKUP[match.group()], shown)


def duration(ms: int) -> str:
    """A duration as people say it: 850 ms, 4.2 s, 3 min 12 s, 2 h 05 min, 3 d 4 h."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    if seconds < 86_400:
        return f"{seconds // 3600} h {seconds // 60 % 60:02d} min"
    return f"{seconds // 86_400} d {seconds // 3600 % 24} h"


_STEPS_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000, 120_000,
             300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000,
             86_400_000, 172_800_000, 604_800_000, 2_592_000_000, 31_536_000_000]


def ticks(start_ms: int, end_ms: int, most: int = 10) -> tuple[int, list[int]]:
    """A round step and the times of its ticks within [start, end]: at most `most` of them."""
    span = max(end_ms - start_ms, 1)
    step = next((step for step in _STEPS_MS if span / step <= most), _STEPS_MS[-1])
    first = -(-start_ms // step) * step
    return step, list(range(first, end_ms + 1, step))


def tick_label(ms: int, step: int, span: int) -> str:
    """A tick's UTC label, as precise as the step needs."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if span > 2 * 86_400_000:
        return moment.strftime("%m-%d %H:%M")
    if step < 1000:
        return moment.strftime("%H:%M:%S.") + f"{ms % 1000:03d}"
    return moment.strftime("%H:%M" if step >= 60_000 else "%H:%M:%S")


def _shape(kind: MarkKind, x: float, y: float, r: float = 5.0) -> str:
    colour = kind.colour
    if kind.shape == "triangle-down":
        return f'<path d="M{x - r:.1f},{y - r:.1f}h{2 * r:.1f}l{-r:.1f},{2 * r:.1f}z" fill="{colour}" stroke="#fff"/>'
    if kind.shape == "triangle-up":
        return f'<path d="M{x - r:.1f},{y + r:.1f}h{2 * r:.1f}l{-r:.1f},{-2 * r:.1f}z" fill="{colour}" stroke="#fff"/>'
    if kind.shape == "square":
        return (f'<rect x="{x - r + 1:.1f}" y="{y - r + 1:.1f}" width="{2 * r - 2:.1f}" height="{2 * r - 2:.1f}" '
                f'fill="{colour}" stroke="#fff"/>')
    if kind.shape == "diamond":
        return f'<path d="M{x:.1f},{y - r:.1f}l{r:.1f},{r:.1f}l{-r:.1f},{r:.1f}l{-r:.1f},{-r:.1f}z" fill="{colour}" ' \
               'stroke="#fff"/>'
    if kind.shape == "cross":
        return (f'<path d="M{x - r + 1:.1f},{y - r + 1:.1f}l{2 * r - 2:.1f},{2 * r - 2:.1f}m0,{-2 * r + 2:.1f}'
                f'l{-2 * r + 2:.1f},{2 * r - 2:.1f}" stroke="{colour}" stroke-width="2.5"/>')
    if kind.shape == "ring":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r - 1:.1f}" fill="#fff" stroke="{colour}" stroke-width="2"/>'
    if kind.shape == "hexagon":
        h = r * 0.87
        return (f'<path d="M{x - r:.1f},{y:.1f}l{r / 2:.1f},{-h:.1f}h{r:.1f}l{r / 2:.1f},{h:.1f}l{-r / 2:.1f},{h:.1f}'
                f'h{-r:.1f}z" fill="{colour}" stroke="#fff"/>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{colour}" stroke="#fff"/>'


class _Canvas:
    """The SVG being written: parts in order, the time scale, and the y of the next row."""

    def __init__(self, start_ms: int, end_ms: int) -> None:
        self.parts: list[str] = []
        self.start = start_ms
        self.end = end_ms if end_ms > start_ms else start_ms + 1000
        self.scale = (PLOT_X1 - PLOT_X0) / (self.end - self.start)
        self.y = 0

    def x(self, ms: int) -> float:
        """The x of a time, held to the plot."""
        return PLOT_X0 + (min(max(ms, self.start), self.end) - self.start) * self.scale

    def add(self, part: str) -> None:
        self.parts.append(part)

    def text(self, x: float, y: float, text: str, *, size: int = 11, fill: str = "#222", weight: str = "normal",
             anchor: str = "start", mono: bool = False, cls: str = "") -> None:
        """A text element (`text` escaped already)."""
        family = MONO if mono else FONT
        extra = f' class="{cls}"' if cls else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}" font-weight="{weight}" '
                 f'text-anchor="{anchor}" font-family="{family}"{extra}>{text}</text>')


def _legend(canvas: _Canvas, y: int) -> int:
    """The legend, wrapping across the width; the y below it."""
    groups: list[tuple[str, list[tuple[str, str]]]] = [
        ("leases and units", [("bar:" + colour, label) for colour, label in OUTCOME_STYLE.values()]),
        ("runner state", [("band:" + colour, name) for name, colour in STATE_STYLE.items()]),
        ("marks", [("mark:" + name, kind.label) for name, kind in _mark_kinds().items()]),
    ]
    for title, items in groups:
        canvas.text(LABEL_X, y + 4, svg_text(title + ":"), size=11, fill=MUTED, weight="bold")
        x = 120.0
        for swatch, label in items:
            width = 26 + 6.4 * len(label)
            if x + width > WIDTH - 10:
                x, y = 120.0, y + 17
            what, value = swatch.split(":", 1)
            if what == "bar":
                canvas.add(f'<rect x="{x:.1f}" y="{y - 4}" width="16" height="9" rx="2" fill="{value}"/>')
            elif what == "band":
                canvas.add(f'<rect x="{x:.1f}" y="{y - 5}" width="16" height="11" fill="{value}" stroke="#bbb"/>')
            else:
                canvas.add(_shape(_mark_kinds()[value], x + 8, y + 0.5))
            canvas.text(x + 21, y + 4, svg_text(label), size=11)
            x += width
        y += 19
    return y


def _mark_kinds() -> dict[str, MarkKind]:
    return {kind.name: kind for kind in MARKS.values()}


def _axis(canvas: _Canvas, top: int, bottom: int) -> None:
    step, times = ticks(canvas.start, canvas.end)
    span = canvas.end - canvas.start
    for ms in times:
        x = canvas.x(ms)
        canvas.add(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{bottom}" stroke="{GRID}"/>')
        label = svg_text(tick_label(ms, step, span))
        canvas.text(x, top - 8, label, size=10, fill=AXIS_TEXT, anchor="middle", cls="tick")
        if bottom - top > 400:
            canvas.text(x, bottom + 13, label, size=10, fill=AXIS_TEXT, anchor="middle")
    canvas.add(f'<line x1="{PLOT_X0}" y1="{top - 4}" x2="{PLOT_X1}" y2="{top - 4}" stroke="#999"/>')
    first, last = (datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d") for ms in (canvas.start, canvas.end))
    days = first if first == last else f"{first} to {last}"
    canvas.text(LABEL_X, top - 8, svg_text(f"time (UTC, {days}), a tick every {duration(step)}"), size=10,
                fill=AXIS_TEXT)


def _title(text: str) -> str:
    return f"<title>{svg_text(text)}</title>"


def _bar(canvas: _Canvas, span: Span, y: float, height: float, what: str, label: str) -> None:
    x0 = canvas.x(span.start_ms)
    x1 = canvas.x(span.end_ms if span.end_ms is not None else canvas.end)
    colour, outcome_text = OUTCOME_STYLE.get(span.outcome, OUTCOME_STYLE["ended"])
    began = f"{'acquired' if what == 'lease' else 'started'} seq {span.start_seq:,} at {span.start_at}"
    if span.end_seq is None:
        ended = "still open when the log ends"
        end_attr = ""
    else:
        ended = f"{outcome_text} ({span.type}) seq {span.end_seq:,} at {span.end_at}, after " \
                f"{duration(max(0, (span.end_ms or 0) - span.start_ms))}"
        end_attr = f' data-end-seq="{span.end_seq}"'
    title = f"{label} · {began} · {ended}"
    canvas.add(f'<g class="bar {what} outcome-{span.outcome}" data-seq="{span.start_seq}"{end_attr}>'
               f'{_title(title)}<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 2):.1f}" '
               f'height="{height}" rx="2" fill="{colour}"/>')
    if span.end_seq is None:  # an arrow head: it goes on beyond the picture
        canvas.add(f'<path d="M{x1:.1f},{y - 1:.1f}l5,{height / 2 + 1:.1f}l-5,{height / 2 + 1:.1f}z" fill="{colour}"/>')
    canvas.add("</g>")


def _mark(canvas: _Canvas, mark: Mark, y: float) -> None:
    if not canvas.start <= mark.at_ms <= canvas.end:
        return
    canvas.add(f'<g class="mark mark-{mark.kind.name}" data-seq="{mark.seq}">{_title(mark.text)}'
               f'{_shape(mark.kind, canvas.x(mark.at_ms), y)}</g>')


def _lane(canvas: _Canvas, lane: Lane) -> None:
    y = canvas.y
    canvas.add(f'<g class="runner" data-runner="{svg_text(lane.runner_id)}">')
    canvas.add(f'<rect x="0" y="{y}" width="{WIDTH}" height="{HEAD_ROW}" fill="#f4f4f4"/>')
    state = f" · {lane.state} at the end of the log" if lane.state is not None else ""
    canvas.text(LABEL_X, y + 15, "runner " + svg_text(lane.runner_id, LABEL_CHARS), size=12, weight="bold",
                mono=True)
    canvas.text(PLOT_X1, y + 15, svg_text(f"{len(lane.leases)} lease(s) drawn{state}"), size=10, fill=MUTED,
                anchor="end")
    y += HEAD_ROW + 2
    band_y = y
    canvas.text(LABEL_X + 12, y + 12, "state", size=10, fill=MUTED)
    for band in lane.bands:
        _band(canvas, band, y + 3)
    rows_top = y + BAND_ROW
    y = rows_top
    for lease in lane.leases:
        label = f"{svg_text(lease.id, 24)} {svg_text(lease.detail, LABEL_CHARS - 25)}"
        canvas.text(LABEL_X + 12, y + 12.5, label, size=11, mono=True)
        _bar(canvas, lease, y + 4, 10, "lease", f"lease {lease.id} · session {lease.detail}")
        for mark in lease.marks or ():
            _mark(canvas, mark, y + 9)
        y += LEASE_ROW
        for unit in lease.units or ():
            canvas.text(LABEL_X + 28, y + 10, svg_text(f"unit {unit.id} {unit.detail}", LABEL_CHARS - 4), size=10,
                        fill=MUTED, mono=True)
            _bar(canvas, unit, y + 4, 6, "unit", f"unit {unit.id} of lease {lease.id} ({unit.detail})")
            for mark in unit.marks or ():
                _mark(canvas, mark, y + 7)
            y += UNIT_ROW
    for mark in lane.marks:  # the runner's marks last, over the rows their guides cross
        if canvas.start <= mark.at_ms <= canvas.end:
            x = canvas.x(mark.at_ms)
            canvas.add(f'<line x1="{x:.1f}" y1="{band_y + 9}" x2="{x:.1f}" y2="{y}" stroke="{mark.kind.colour}" '
                       'stroke-dasharray="3,3" stroke-opacity="0.6"/>')
        _mark(canvas, mark, band_y + 9)
    canvas.add("</g>")
    canvas.y = y + LANE_GAP


def _band(canvas: _Canvas, band: Band, y: float) -> None:
    end = band.end_ms if band.end_ms is not None else canvas.end
    if end < canvas.start or band.start_ms > canvas.end:
        return
    x0, x1 = canvas.x(band.start_ms), canvas.x(end)
    until = f"until seq {band.end_seq:,}" if band.end_seq is not None else "to the end of the log"
    title = f"{band.state} · from seq {band.start_seq:,} {until} · {duration(max(0, end - band.start_ms))}"
    canvas.add(f'<g class="band state-{band.state}" data-seq="{band.start_seq}">{_title(title)}'
               f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 1):.1f}" height="12" '
               f'fill="{STATE_STYLE.get(band.state, "#eee")}"/></g>')


def draw(timeline: Timeline, *, title: str = "lifecycle-es timeline", problem: str | None = None) -> str:
    """The timeline as SVG text. `title` heads it; `problem` explains the highlighted seq (the audit's)."""
    start = timeline.start_ms if timeline.start_ms is not None else 0
    end = timeline.end_ms if timeline.end_ms is not None else start
    canvas = _Canvas(start, max(start, end))
    canvas.text(LABEL_X, 22, svg_text(title), size=15, weight="bold")
    leases = sum(len(lane.leases) for lane in timeline.lanes)
    window = (f"window {_when(timeline.since_ms, 'the start')} to {_when(timeline.until_ms, 'the end')}"
              if timeline.since_ms is not None or timeline.until_ms is not None
              else f"the last {timeline.last} lease(s) of the log")
    canvas.text(LABEL_X, 40, svg_text(f"{window} · {len(timeline.lanes)} runner(s), {leases} lease(s) drawn, from "
                                      f"{timeline.events:,} event(s) · drawn from the log as it is: "
                                      "lifecycle-es audit proves it whole"), size=11, fill=MUTED)
    notes = _notes(timeline)
    y = 56
    for note in notes:
        canvas.text(LABEL_X, y, svg_text(note, 200), size=11, fill="#a00000")
        y += 15
    y = _legend(canvas, y + 8)
    top = y + 22
    canvas.y = top
    if not timeline.lanes:
        canvas.text(PLOT_X0, top + 20, "nothing to draw: no lease, state or mark of the chosen runners in this window",
                    size=12, fill=MUTED)
        canvas.y = top + 40
    for lane in timeline.lanes:
        _lane(canvas, lane)
    bottom = canvas.y
    body, canvas.parts = canvas.parts, []
    if timeline.lanes:
        _axis(canvas, top, bottom)  # the grid goes under the rows
    grid, canvas.parts = canvas.parts, []
    if timeline.highlight is not None:
        _problem(canvas, timeline.highlight, problem, top, bottom)  # and the problem's line over them
    height = bottom + 24
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="{FONT}">'
            f'<title>{svg_text(title)}</title>'
            f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>')
    return "\n".join([head, *grid, *body, *canvas.parts, "</svg>\n"])


def _problem(canvas: _Canvas, mark: Mark, problem: str | None, top: int, bottom: int) -> None:
    x = canvas.x(mark.at_ms)
    text = f"first problem: seq {mark.seq:,}" + (f": {problem}" if problem else "") + f" · {mark.text}"
    anchor = "end" if x > (PLOT_X0 + PLOT_X1) / 2 else "start"
    dx = -4 if anchor == "end" else 4
    canvas.add(f'<g class="problem" data-seq="{mark.seq}"><title>{svg_text(text)}</title>'
               f'<line x1="{x:.1f}" y1="{top - 20}" x2="{x:.1f}" y2="{bottom}" stroke="{mark.kind.colour}" '
               f'stroke-width="2"/><text x="{x + dx:.1f}" y="{top - 22}" font-size="11" font-weight="bold" '
               f'fill="{mark.kind.colour}" text-anchor="{anchor}">{svg_text(f"first problem: seq {mark.seq:,}")}'
               "</text></g>")


def _when(ms: int | None, otherwise: str) -> str:
    if ms is None:
        return otherwise
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _notes(timeline: Timeline) -> list[str]:
    notes = []
    if timeline.leases_left_out:
        where = "the window" if timeline.since_ms is not None or timeline.until_ms is not None else "the log"
        notes.append(f"{timeline.leases_left_out:,} earlier lease(s) of {where} left out: only the last "
                     f"{timeline.last} are drawn (narrow the window with --since/--until, or raise --last)")
    if timeline.marks_left_out:
        notes.append(f"{timeline.marks_left_out:,} older mark(s) or state change(s) left out (each row keeps its "
                     "newest)")
    if timeline.stopped is not None:
        notes.append(f"the log could not be read further, so this is what came before: {timeline.stopped}")
    if timeline.unreadable:
        notes.append(f"{timeline.unreadable:,} event(s) could not be read and are not drawn (the first at seq "
                     f"{timeline.first_unreadable:,}): lifecycle-es audit says why")
    return notes


def timeline_svg(events: Iterable[RecordedEvent], *, title: str = "lifecycle-es timeline",
                 problem: str | None = None, **options: object) -> str:
    """`collect` the events with `options` and `draw` the result: events in, SVG text out."""
    return draw(collect(events, **options), title=title, problem=problem)  # type: ignore[arg-type]
