"""``lifecycle-es timeline`` and `projections.timeline`: the picture holds the marks of the life it draws.

Golden structure, not golden pixels: the SVG parses as XML, and its bars, bands and marks are counted
by class, each tied by ``data-seq`` and its ``<title>`` to an event of the log of that type.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from fleets import HOOK, attack, authority, copy_store, one_error_line, run

from lifecycle_es import EventStore, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.errors import InvalidInputError
from lifecycle_es.events import UnitExited, UnitRecord, UnitSignalled, UnitStarted, UnitStarting, UnitStopped
from lifecycle_es.log import RecordedEvent
from lifecycle_es.testing import FakeClock
from projections.timeline import MARKS, MarkKind, collect
from projections.timeline_svg import draw, svg_text, timeline_svg

SVG = "{http://www.w3.org/2000/svg}"
DIGEST = "sha256:" + "ab" * 32


Life = tuple[Path, dict[str, int], list[str], dict[int, RecordedEvent]]


def scripted_life(path: Path) -> tuple[dict[str, int], list[str]]:
    """One runner's life: three leases and their units, a lost poll, a rotation, a drain that expires, a
    hook, a reclaim, and a fourth lease still active at the end. Returns the seqs worth knowing and the
    lease ids in the order they were acquired."""
    clock = FakeClock()
    ids = iter(f"{n:03d}" for n in range(1, 1000))
    seqs: dict[str, int] = {}
    with EventStore.open(path, now=clock) as store:
        runner = RunnerLifecycle(store, runner_id="runner-a", target="local", base_dir=path.parent,
                                 resources=Resources(cpu_seconds=600, memory_bytes=1 << 30),
                                 post_session_hook_digest=HOOK, now=clock, random_id=lambda: next(ids))
        runner.initialize()
        leases = []
        for n in (1, 2, 3):
            clock.advance(1000)
            lease = runner.acquire_lease(session_id=f"s-{n}", expected_generation=1,
                                         proxy_authority=authority(clock, 1)).lease
            leases.append(lease)
            clock.advance(200)
            unit = UnitRecord(mode="child", host="h", boot_id="b", run_dir=f"/r/{lease.id}", pid=100 + n,
                              start_ticks=1000 + n)
            store.append_unchecked("runner-a", [UnitStarting(lease_id=lease.id, lease_generation=1, mode="child",
                                                   run_dir=f"/r/{lease.id}"),
                                      UnitStarted(lease_id=lease.id, lease_generation=1, handle=unit)])
        one, two, three = leases
        clock.advance(5000)
        store.append_unchecked("runner-a", [UnitExited(lease_id=one.id, code=None, signal="SIGKILL",
                                                       outcome="lost-poll")])
        runner.park_lease(lease_id=one.id, lease_generation=1, result_digest=DIGEST, reason="lost-poll")
        seqs["lease_parked"] = store.head().seq
        clock.advance(2000)
        runner.rotate_proxy_authority(expected_generation=1, proxy_authority=authority(clock, 2))
        seqs["rotated"] = store.head().seq
        clock.advance(2000)
        runner.request_drain(expected_generation=2, timeout_ms=30_000)
        seqs["drain"] = store.head().seq
        store.append_unchecked("runner-a", [UnitSignalled(lease_id=two.id, signal="SIGTERM", reason="drain")])
        clock.advance(3000)
        store.append_unchecked("runner-a", [UnitExited(lease_id=two.id, code=0, signal=None, outcome="settled")])
        runner.settle_lease(lease_id=two.id, lease_generation=1, result_digest=DIGEST)
        seqs["settled"] = store.head().seq
        clock.advance(30_000)
        runner.park_expired_drain(expected_generation=3)
        seqs["runner_parked"] = store.head().seq
        store.append_unchecked("runner-a", [UnitStopped(lease_id=three.id, reason="lease-ended")])
        clock.advance(1000)
        runner.authorize_post_session_hook(expected_runner_generation=4, lease_id=two.id, lease_generation=1,
                                           result_digest=DIGEST, hook_digest=HOOK)
        clock.advance(1000)
        runner.begin_reclaim(expected_generation=4, proxy_authority=authority(clock, 3))
        clock.advance(1000)
        runner.complete_reclaim(expected_generation=5)
        clock.advance(1000)
        leases.append(runner.acquire_lease(session_id="s-4", expected_generation=6,
                                           proxy_authority=authority(clock, 3)).lease)
        seqs["head"] = store.head().seq
    return seqs, [lease.id for lease in leases]


def parsed(svg: str) -> ET.Element:
    """The SVG as XML (a parse error fails the test)."""
    return ET.fromstring(svg)


def shapes(root: ET.Element, kind: str) -> list[ET.Element]:
    """The ``<g>`` elements whose class list holds `kind` (``bar``, ``mark``, ``band``, ``mark-drain``...)."""
    return [g for g in root.iter(f"{SVG}g") if kind in (g.get("class") or "").split()]


def classes(elements: list[ET.Element], prefix: str) -> Counter[str]:
    """How many of `elements` carry each class starting with `prefix`."""
    return Counter(name for g in elements for name in (g.get("class") or "").split() if name.startswith(prefix))


@pytest.fixture(scope="module")
def life(tmp_path_factory: pytest.TempPathFactory) -> Life:
    """The scripted life's file, its seqs, its lease ids, and its events by seq."""
    path = tmp_path_factory.mktemp("timeline") / "life.db"
    seqs, leases = scripted_life(path)
    with EventStore.open(path) as store:
        events = {recorded.seq: recorded for recorded in store.read()}
    return path, seqs, leases, events


def test_the_picture_holds_every_mark_of_a_scripted_life(life: Life) -> None:
    _path, seqs, _, events = life
    root = parsed(timeline_svg(events.values()))
    leases = shapes(root, "lease")
    assert classes(leases, "outcome-") == {"outcome-lost-poll": 1, "outcome-settled": 1, "outcome-drain-expired": 1,
                                          "outcome-active": 1}
    units = shapes(root, "unit")
    assert classes(units, "outcome-") == {"outcome-lost-poll": 1, "outcome-settled": 1, "outcome-stopped": 1}
    assert [band.get("class") for band in shapes(root, "band")] == [
        "band state-accepting", "band state-draining", "band state-parked", "band state-reclaiming",
        "band state-accepting"]
    marks = shapes(root, "mark")
    assert classes(marks, "mark-") == {"mark-park": 1, "mark-rotation": 1, "mark-drain": 1, "mark-signal": 1,
                                       "mark-drain-expired": 1, "mark-runner-park": 1, "mark-hook": 1,
                                       "mark-reclaim": 1, "mark-reclaimed": 1}
    by_name = {kind.name: tag for tag, kind in MARKS.items()}
    for mark in marks:  # each mark is the event its seq names, and its tooltip says so
        seq = int(mark.get("data-seq", "0"))
        kind = next(name[5:] for name in mark.get("class", "").split() if name.startswith("mark-"))
        assert events[seq].type == by_name[kind]
        title = mark.find(f"{SVG}title")
        assert title is not None and f"seq {seq:,}" in (title.text or "") and events[seq].type in (title.text or "")
    assert int(shapes(root, "mark-drain")[0].get("data-seq", "0")) == seqs["drain"]
    assert int(shapes(root, "mark-park")[0].get("data-seq", "0")) == seqs["lease_parked"]
    for bar in leases + units + shapes(root, "band"):
        title = bar.find(f"{SVG}title")
        assert title is not None and f"seq {int(bar.get('data-seq', '0')):,}" in (title.text or "")
    for bar in leases:
        assert events[int(bar.get("data-seq", "0"))].type == "LeaseAcquired"
        if bar.get("data-end-seq"):
            assert events[int(bar.get("data-end-seq", "0"))].type in ("LeaseSettled", "LeaseParked", "DrainExpired")
    assert not [element for element in root.iter() if element.tag in (f"{SVG}script", f"{SVG}a", f"{SVG}image",
                                                                       f"{SVG}foreignObject")]
    assert not [name for element in root.iter() for name in element.attrib
                if name.startswith("on") or "href" in name]


def test_a_window_keeps_the_leases_that_overlap_it_and_the_last_n_by_default(life: Life) -> None:
    _path, seqs, leases, events = life
    drain = events[seqs["drain"]]
    drain_ms = _ms(drain.at)
    # A window from the drain on: the three first leases were acquired before it; two of them were
    # still open then (the first was parked before), and the fourth was acquired after.
    timeline = collect(events.values(), since_ms=drain_ms, until_ms=drain_ms + 60_000)
    drawn = [span.id for lane in timeline.lanes for span in lane.leases]
    assert drawn == leases[1:]
    assert next(mark.kind.name for mark in timeline.lanes[0].marks) == "drain"  # the rotation came before it
    # At most the last N leases: the newest, and the count of those left out.
    timeline = collect(events.values(), last=2)
    assert [span.id for span in timeline.lanes[0].leases] == leases[2:]
    assert timeline.leases_left_out == 2
    root = parsed(draw(timeline))
    assert len(shapes(root, "lease")) == 2
    assert any("2 earlier lease(s) of the log left out" in (text.text or "") for text in root.iter(f"{SVG}text"))
    with pytest.raises(InvalidInputError) as refused:
        collect(events.values(), last=0)
    assert refused.value.field == "last"


def _ms(at: str) -> int:
    from lifecycle_es.canonical import parse_iso_ms

    return parse_iso_ms(at)


HOSTILE = "<b>&amp;\"'</b>]]>\u202eevil\u2066\x01\x00"


def _recorded(seq: int, stream: str, type_: str, at_ms: int, body: dict[str, object]) -> RecordedEvent:
    return RecordedEvent(seq, stream, seq, type_, iso_ms(at_ms), msgspec.json.encode({"type": type_, **body}),
                         b"", b"")


def test_hostile_text_is_escaped_and_its_controls_shown() -> None:
    start = 1_767_225_600_000
    events = [
        _recorded(1, HOSTILE, "RunnerInitialized", start, {}),
        _recorded(2, HOSTILE, "LeaseAcquired", start + 1000, {"lease_id": HOSTILE, "session_id": HOSTILE}),
        _recorded(3, HOSTILE, "LeaseParked", start + 2000, {"lease_id": HOSTILE, "reason": HOSTILE}),
        _recorded(4, HOSTILE, "DrainRequested", start + 3000, {"signal": HOSTILE}),
        _recorded(5, HOSTILE, "LeaseSettled", start + 4000, {"lease_id": 7}),  # not of the event's types
        RecordedEvent(6, HOSTILE, 6, "LeaseSettled", "yesterday", b'{"lease_id": "x"}', b"", b""),  # no time
    ]
    svg = timeline_svg(events, title=HOSTILE)
    root = parsed(svg)  # markup characters and controls did not break the XML
    for raw in ("<b>", "]]>", "\u202e", "\u2066", "\x01", "\x00"):
        assert raw not in svg
    texts = " ".join(element.text or "" for element in root.iter())
    assert "<b>&amp;\"'</b>]]>\\u202eevil\\u2066\\x01\\x00" in texts  # the title, shown as it is, controls escaped
    assert classes(shapes(root, "lease"), "outcome-") == {"outcome-ended": 1}  # a reason not of the rules
    assert "2 event(s) could not be read" in texts and "the first at seq 5" in texts
    assert svg_text("a\u202eb<", 9) == "a\\u202eb&lt;" and svg_text("<&>\"'") == "&lt;&amp;&gt;&quot;&#39;"
    assert svg_text("lease-0123456789", 8) == "lease-0\u2026"  # cut before escaping: never inside an entity


def test_the_command_draws_a_file_and_refuses_bad_input(life: Life, tmp_path: Path) -> None:
    path, seqs, _, events = life
    out = tmp_path / "timeline.svg"
    done = run("timeline", path, "--runner", "runner-a", "-o", out)
    assert done.returncode == 0, done.stderr
    root = parsed(out.read_text())
    assert len(shapes(root, "lease")) == 4 and len(shapes(root, "mark")) == 9
    drain_at = events[seqs["drain"]].at
    a_second_later = iso_ms(_ms(drain_at) + 1000)[:19]  # with no offset: UTC
    done = run("timeline", path, "--since", drain_at, "--until", a_second_later, "-o", "-")
    assert done.returncode == 0, done.stderr
    assert len(shapes(parsed(done.stdout), "lease")) == 2  # open in that second: the second and third
    assert run("timeline", path, "--since", "yesterday", "-o", out).returncode == 64
    assert run("timeline", path, "--runner", "no such<id", "-o", out).returncode == 64
    assert run("timeline", path, "--since", "2026-01-02", "--until", "2026-01-01", "-o", out).returncode == 64
    missing = run("timeline", path, "--runner", "runner-b", "-o", out)
    assert missing.returncode == 66 and "runner-b" in one_error_line(missing)
    assert run("timeline", tmp_path / "absent.db", "-o", out).returncode == 66


def tampered_copy(source: Path, target: Path, seq: int) -> Path:
    """A copy of the scripted life with the body at `seq` edited (its hash no longer matches)."""
    copy_store(source, target, seal=False)
    attack(target, ("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'SIGTERM', 'SIGKILL') AS BLOB) "
                    "WHERE seq = ?", (seq,)))
    return target


XHTML = "{http://www.w3.org/1999/xhtml}"


def test_the_audit_page_marks_the_first_problem_on_the_timeline(life: Life, tmp_path: Path) -> None:
    path, seqs, _, _ = life
    bad = tampered_copy(path, tmp_path / "bad.db", seqs["drain"])
    out = tmp_path / "report.html"
    done = run("audit", bad, "--html", out)
    assert done.returncode == 65, done.stderr
    page = ET.parse(out).getroot()  # the page is well-formed XML as well as HTML
    assert not [element for element in page.iter() if element.tag.endswith(("script", "link", "img", "iframe"))]
    first = next(row for row in page.iter(f"{XHTML}tr") if row.get("class") == "first")
    assert [cell.text for cell in first] == [str(seqs["drain"]), "runner-a", "hash does not match the event's contents"]
    svg = next(page.iter(f"{SVG}svg"))
    (problem,) = shapes(svg, "problem")
    assert problem.get("data-seq") == str(seqs["drain"])
    assert "hash does not match" in (problem.findtext(f"{SVG}title") or "")
    assert len(shapes(svg, "lease")) == 4 and shapes(svg, "mark-drain")
    whole = tmp_path / "whole.html"
    done = run("audit", path, "--html", whole)
    assert done.returncode == 0, done.stderr
    page = ET.parse(whole).getroot()
    assert "OK: the log is whole" in ET.tostring(page, encoding="unicode")
    assert not shapes(next(page.iter(f"{SVG}svg")), "problem") and shapes(next(page.iter(f"{SVG}svg")), "lease")


def test_a_new_kind_of_mark_is_one_line_in_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host-lease takeover (an event this version does not have) drawn from one more entry in MARKS.
    monkeypatch.setitem(MARKS, "HostLeaseTakenOver",
                        MarkKind("takeover", "host lease taken over", "runner", "hexagon", "#8b008b"))
    start = 1_767_225_600_000
    events = [_recorded(1, "runner-a", "RunnerInitialized", start, {}),
              _recorded(2, "runner-a", "LeaseAcquired", start + 1000, {"lease_id": "lease-1", "session_id": "s"}),
              _recorded(3, "runner-a", "HostLeaseTakenOver", start + 2000, {"reason": "host-b took over"})]
    root = parsed(timeline_svg(events))
    (mark,) = shapes(root, "mark-takeover")
    assert mark.get("data-seq") == "3"
    assert "HostLeaseTakenOver · seq 3" in (mark.findtext(f"{SVG}title") or "")
    assert "reason host-b took over" in (mark.findtext(f"{SVG}title") or "")
    assert any(text.text == "host lease taken over" for text in root.iter(f"{SVG}text"))  # in the legend


def test_a_host_driver_taking_the_runner_is_a_mark_on_its_runner() -> None:
    start = 1_767_225_600_000
    events = [_recorded(1, "runner-a", "RunnerInitialized", start, {}),
              _recorded(2, "runner-a", "HostLeaseAcquired", start + 1000, {"holder": "host-b/boot/i", "token": 2})]
    (mark,) = shapes(parsed(timeline_svg(events)), "mark-host-lease")
    assert mark.get("data-seq") == "2" and "holder host-b/boot/i · token 2" in (mark.findtext(f"{SVG}title") or "")


def test_a_long_stream_keeps_the_window_and_what_was_open_at_its_start() -> None:
    # 20,000 short leases; one long lease acquired first and still open through the window; the window
    # in the middle. The long lease is drawn (it overlaps the window), with the last leases of the window.
    start = 1_767_225_600_000

    def events() -> Iterator[RecordedEvent]:
        yield _recorded(1, "runner-a", "RunnerInitialized", start, {})
        yield _recorded(2, "runner-a", "LeaseAcquired", start, {"lease_id": "long", "session_id": "s"})
        seq = 2
        for n in range(20_000):
            at = start + 1000 * n
            yield _recorded(seq + 1, "runner-a", "LeaseAcquired", at, {"lease_id": f"l-{n}", "session_id": "s"})
            yield _recorded(seq + 2, "runner-a", "LeaseSettled", at + 500, {"lease_id": f"l-{n}"})
            seq += 2
        yield _recorded(seq + 1, "runner-a", "LeaseSettled", start + 20_000_000, {"lease_id": "long"})

    since, until = start + 10_000_000, start + 10_010_000  # ten seconds: leases 10,000 to 10,010 overlap it
    timeline = collect(events(), since_ms=since, until_ms=until, last=5)
    (lane,) = timeline.lanes
    assert [span.id for span in lane.leases] == [f"l-{n}" for n in range(10_006, 10_011)]
    assert timeline.leases_left_out == 7  # l-10000 to l-10005, and the long lease, older than all of them
    timeline = collect(events(), since_ms=since, until_ms=until, last=20)
    assert [span.id for span in timeline.lanes[0].leases] == ["long"] + [f"l-{n}" for n in range(10_000, 10_011)]
    assert timeline.lanes[0].leases[0].end_seq == 40_003 and timeline.leases_left_out == 0


def test_a_row_the_store_cannot_read_ends_the_picture_which_says_so(life: Life, tmp_path: Path) -> None:
    path, seqs, _, _ = life
    broken = copy_store(path, tmp_path / "broken.db", seal=False)
    attack(broken, ("UPDATE events SET stream = CAST(x'ff41' AS TEXT) WHERE seq = ?", (seqs["rotated"],)))
    out = tmp_path / "broken.svg"
    done = run("timeline", broken, "-o", out)
    assert done.returncode == 65 and f"seq {seqs['rotated']}" in one_error_line(done)
    root = parsed(out.read_text())
    assert len(shapes(root, "lease")) == 3 and shapes(root, "mark-park")  # what came before is drawn
    assert not shapes(root, "mark-drain")  # and nothing after
    assert any("could not be read further" in (text.text or "") for text in root.iter(f"{SVG}text"))
