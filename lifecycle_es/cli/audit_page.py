"""``lifecycle-es audit FILE --html report.html``: the audit's findings as one self-contained page.

The page holds the summary the terminal shows, every problem found (the first one marked), and the
timeline of the log around the first problem with a red line at its seq: the last leases of its
runner up to a little after it (of every runner when the problem names none; the log's last leases
when it is whole). No script, no stylesheet or font to fetch: it opens the same from a USB stick.
It is well-formed XML as well as HTML, so tools can read it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from lifecycle_es._version import __version__
from lifecycle_es.log import RecordedEvent
from lifecycle_es.store import EventStore

from .timeline import readable, write_output

CONTEXT_EVENTS = 200  # events drawn after the first problem, for what followed it
LAST_LEASES = 40

STYLE = """
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 8px; }
.verdict { display: inline-block; padding: 4px 10px; border-radius: 4px; color: #fff; font-weight: bold; }
.ok { background: #2e7d32; } .failed { background: #c62828; }
pre { background: #f6f6f6; padding: 12px; border: 1px solid #ddd; overflow-x: auto; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
tr.first td { background: #fdecea; font-weight: bold; }
.note { color: #555; font-size: 13px; }
.timeline { overflow-x: auto; border: 1px solid #ddd; }
"""


def write_page(path: str, report: Any, store: EventStore, summary: str) -> None:
    """Draw the page for `report` (an `AuditReport` of `store`) and write it to `path` ('-': stdout)."""
    write_output(path, page(report, store, summary))


def page(report: Any, store: EventStore, summary: str) -> str:
    """The page's text."""
    from projections.timeline_svg import svg_text, timeline_svg  # the read side: only when a page is drawn

    first = report.first_problem
    runners = [first.stream] if first is not None and first.stream is not None else None
    until = first.seq + CONTEXT_EVENTS if first is not None and first.seq is not None else None
    events = _until(readable(store), until)
    svg = timeline_svg(events, title=f"{report.path}: timeline" + (f" of {first.stream}" if runners else ""),
                       problem=first.reason if first is not None else None, runners=runners, last=LAST_LEASES,
                       highlight=first.seq if first is not None else None)
    if first is None:
        what = f"The last {LAST_LEASES} leases of the log, every runner."
    else:
        who = f"runner {first.stream}" if runners else "every runner"
        where = f"seq {first.seq:,}" if first.seq is not None else "the log"
        what = (f"The last {LAST_LEASES} leases of {who} up to {CONTEXT_EVENTS} events after the first problem "
                f"({where}), which the red line marks.")
    rows = [f'<tr class="{"first" if problem == first else "other"}"><td>'
            f'{"-" if problem.seq is None else f"{problem.seq:,}"}</td><td>{svg_text(problem.stream or "-")}</td>'
            f"<td>{svg_text(problem.reason)}</td></tr>"
            for problem in sorted(report.problems, key=lambda p: (p.seq is None, p.seq or 0))]
    problems = ("<p>No problem found.</p>" if not rows else
                "<table><tr><th>seq</th><th>stream</th><th>reason</th></tr>" + "".join(rows) + "</table>")
    verdict = ('<span class="verdict ok">OK: the log is whole</span>' if report.ok else
               '<span class="verdict failed">FAILED</span>')
    return "\n".join([
        "<!DOCTYPE html>",
        '<html xmlns="http://www.w3.org/1999/xhtml" lang="en"><head><meta charset="utf-8"/>',
        f"<title>{svg_text(f'lifecycle-es audit of {report.path}')}</title><style>{STYLE}</style></head><body>",
        f"<h1>lifecycle-es audit of {svg_text(report.path)}</h1>",
        f"<p>{verdict}</p>",
        "<pre>" + "\n".join(svg_text(line) for line in summary.splitlines()) + "</pre>",
        "<h2>Problems</h2>", problems,
        "<h2>Timeline</h2>", f'<p class="note">{svg_text(what)} Hover a shape for its seq.</p>',
        f'<div class="timeline">{svg}</div>',
        f'<p class="note">lifecycle-es {svg_text(__version__)}</p>',
        "</body></html>", ""])


def _until(events: Iterable[RecordedEvent], seq: int | None) -> Iterator[RecordedEvent]:
    for recorded in events:
        if seq is not None and recorded.seq > seq:
            return
        yield recorded
