"""The chain's hash is a file format: pinned to fixed vectors and to a reference written from DESIGN.md.

``hash = blake3(domain || prev || frame(seq, stream, version, type, at, body))``, every field
length-prefixed (integers as 8 big-endian bytes). Any change to how `chain.link` computes it (an
optimisation, a refactor) that changes one bit makes every existing store fail verification, so it
must fail here first.
"""

from __future__ import annotations

import itertools
import struct

import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from lifecycle_es import chain
from lifecycle_es.events import ReclaimCompleted, encode

U64 = struct.Struct(">Q")
PREV = bytes(32)
KEY = bytes(range(32))
AT = "2026-01-01T00:00:00.000Z"
BODY = b'{"generation":1,"type":"ReclaimCompleted"}'


def prefixed(data: bytes) -> bytes:
    return U64.pack(len(data)) + data


def reference_link(prev: bytes, seq: int, stream: str, version: int, type_: str, at: str, body: bytes,
                   key: bytes | None = None) -> bytes:
    data = (b"lifecycle-es/event/v1\x00" + prev + U64.pack(seq) + prefixed(stream.encode()) + U64.pack(version)
            + prefixed(type_.encode()) + prefixed(at.encode()) + prefixed(body))
    return (blake3.blake3(data, key=key) if key is not None else blake3.blake3(data)).digest()


def test_fixed_vectors() -> None:
    assert encode(ReclaimCompleted(generation=1)) == BODY
    assert chain.link(PREV, 1, "runner-1", 1, "ReclaimCompleted", AT, BODY).hex() == (
        "59af0d35a7a9d6e4591a9fede17612d0db47b4e111509ac263ab31b58384beef")
    assert chain.link(PREV, 1, "runner-1", 1, "ReclaimCompleted", AT, BODY, KEY).hex() == (
        "646d34dad1b3bfc45c92c69b7c1b3f70127e308a3dcdf04ce878e1ece48b5081")
    assert chain.genesis(bytes(range(16))).hex() == "7b7ab0c465432c81c9b6400f8057376bbf02b810504bc00fd888e76422ad6293"
    assert chain.key_id(KEY) == "c04ff2bcd25f1fa093540bea97da3b4c"


texts = st.text(max_size=300)
ints = st.integers(0, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(prev=st.binary(min_size=32, max_size=32), seq=ints, stream=texts, version=ints, type_=texts, at=texts,
       body=st.binary(max_size=5000), key=st.one_of(st.none(), st.binary(min_size=32, max_size=32)))
def test_link_matches_the_reference(prev: bytes, seq: int, stream: str, version: int, type_: str, at: str,
                                    body: bytes, key: bytes | None) -> None:
    assert chain.link(prev, seq, stream, version, type_, at, body, key) == reference_link(
        prev, seq, stream, version, type_, at, body, key)


def test_framing_keeps_fields_apart() -> None:
    # The same characters split differently between fields must never hash alike.
    base = chain.link(PREV, 1, "ab", 1, "c", AT, BODY)
    assert chain.link(PREV, 1, "a", 1, "bc", AT, BODY) != base
    assert chain.link(PREV, 1, "ab", 1, "", "c" + AT, BODY) != base
    assert chain.link(PREV, 1, "ab", 1, "c", AT[:-1], AT[-1:].encode() + BODY) != base
    assert chain.link(PREV, 1, "ab", 1, "c", AT, BODY, KEY) != base


@settings(max_examples=200, deadline=None)
@given(prev=st.binary(min_size=32, max_size=32), seq=st.integers(0, 2**64 - 1), stream=texts,
       version=st.integers(0, 2**64 - 1), at=texts,
       events=st.lists(st.tuples(st.sampled_from(["LeaseAcquired", "LeaseSettled", "ü"]), st.binary(max_size=500)),
                       min_size=1, max_size=6),
       key=st.one_of(st.none(), st.binary(min_size=32, max_size=32)))
def test_a_batch_of_links_is_link_after_link(prev: bytes, seq: int, stream: str, version: int, at: str,
                                             events: list[tuple[str, bytes]], key: bytes | None) -> None:
    # chain.links frames a batch's stream and time once; every hash must still be link's, and a seq or
    # version past what the frame holds must fail as link fails.
    wanted: list[bytes] | Exception = []
    link_prev = prev
    try:
        for offset, (type_, body) in enumerate(events, 1):
            link_prev = chain.link(link_prev, seq + offset, stream, version + offset, type_, at, body, key)
            wanted.append(link_prev)  # type: ignore[union-attr]
    except Exception as exc:
        wanted = exc
    if isinstance(wanted, Exception):
        try:
            chain.links(prev, seq, stream, version, at, events, key)
        except Exception as exc:
            assert (type(exc), str(exc)) == (type(wanted), str(wanted))
        else:
            raise AssertionError("links hashed what link refused")
    else:
        assert chain.links(prev, seq, stream, version, at, events, key) == wanted


STORE_ID = bytes(range(16))
# What may be done to a row of a good chain: each kind of damage the verifier names, and values of the wrong type.
DAMAGE = st.sampled_from(["none", "none", "none", "gap", "repeat", "prev", "hash", "at-back", "at-shape",
                          "at-int", "stream-int", "body-none"])


def _rows(count: int, damage: list[str], key: bytes | None) -> list[tuple[object, ...]]:
    """A chain of `count` rows (good but for `damage`, one per row), as a backend reads them."""
    rows: list[tuple[object, ...]] = []
    prev = chain.genesis(STORE_ID, key)
    for index in range(count):
        seq, at = index + 1, f"2026-01-01T00:00:{index % 60:02d}.{index:03d}Z"[:24]
        stream, body = f"runner-{index % 3}", b'{"generation":%d,"type":"ReclaimCompleted"}' % index
        digest = chain.link(prev, seq, stream, index // 3 + 1, "ReclaimCompleted", at, body, key)
        row = [seq, stream, index // 3 + 1, "ReclaimCompleted", at, body, prev, digest]
        what = damage[index] if index < len(damage) else "none"
        if what == "gap":
            row[0] = seq + 1
        elif what == "repeat":
            row[0] = seq - 1
        elif what == "prev":
            row[6] = bytes(32)
        elif what == "hash":
            row[7] = bytes(32)
        elif what == "at-back":
            row[4] = "2025-01-01T00:00:00.000Z"
        elif what == "at-shape":
            row[4] = "2026-01-01 00:00:00.000Z"
        elif what == "at-int":
            row[4] = 5
        elif what == "stream-int":
            row[1] = 7
        elif what == "body-none":
            row[5] = None
        rows.append(tuple(row))
        prev = digest
    return rows


def _outcome(check: object, run: object) -> tuple[object, ...]:
    """What a check did: the error it raised (kind and message, or none), and where it stood after."""
    try:
        run()  # type: ignore[operator]
        raised: tuple[object, ...] = ()
    except Exception as exc:
        raised = (type(exc), str(exc))
    return raised, check.expected, check.prev, check.prev_at  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(count=st.integers(0, 40), damage=st.lists(DAMAGE, max_size=40), first=st.integers(1, 45),
       span=st.one_of(st.none(), st.integers(-1, 45)), cuts=st.lists(st.integers(0, 40), max_size=4),
       key=st.one_of(st.none(), st.just(KEY)))
def test_a_page_of_rows_is_checked_as_row_after_row(count: int, damage: list[str], first: int, span: int | None,
                                                  cuts: list[int], key: bytes | None) -> None:
    # ChainCheck.rows (the audit's walk, a page at a time) must raise what `row` raises, at the same row,
    # and stand where it stands, whatever the damage, the checked range and the pages.
    from lifecycle_es.verify import ChainCheck

    rows = _rows(count, damage, key)
    last = None if span is None else first + span
    one = ChainCheck(STORE_ID, key, first=first, last=last)

    def row_by_row() -> None:
        for row in rows:
            one.row(row)  # type: ignore[arg-type]

    paged = ChainCheck(STORE_ID, key, first=first, last=last)
    bounds = [0, *sorted(cut for cut in cuts if cut < count), count]

    def page_by_page() -> None:
        for start, end in itertools.pairwise(bounds):
            paged.rows(rows[start:end])  # type: ignore[arg-type]

    assert _outcome(paged, page_by_page) == _outcome(one, row_by_row)
