"""The one chain verifier: rows in seq order, each proved against the one before it.

`EventStore.verify` and the audit's walk both run every row through a `ChainCheck`, so a chain is
proved one way whichever asks. A row passes when its seq is the one due (1, 2, ... no gap), its
``prev`` is the hash of the row before (the genesis link, derived from the store id, before seq 1),
its ``hash`` is ``chain.link`` of its contents (a MAC with the key), and its ``at`` is a time as the
store writes one and not earlier than the row before it. Optionally versions run 1, 2, ... per stream.

    check = ChainCheck(store.store_id, key)
    for page in backend.pages(after=0, stream=None):
        for row in page:
            check.row(row)

A range of the chain can be checked alone (the audit's workers): the first row of the range links to
a hash read from the row before it, which the worker of the range before proves.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

import blake3

from . import chain
from .backend import Backend, Row
from .errors import IntegrityError
from .log import Head, VerifyReport
from .values import shown

_SEQ = itemgetter(0)
AT_SEPARATORS = "--T::."  # the separators of YYYY-MM-DDTHH:MM:SS.mmmZ, at positions 4, 7, 10, 13, 16, 19


def well_formed_at(at: str) -> bool:
    """Whether `at` is a time as the store writes one, ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (so text order is time order)."""
    return len(at) == 24 and at[23] == "Z" and at[4:20:3] == AT_SEPARATORS


def time_problem(seq: int, stream: str | None, at: str, after_at: str) -> IntegrityError:
    """The IntegrityError of an event whose `at` is not a time as the store writes one, or is earlier than
    `after_at`, the at of the event before it."""
    if not well_formed_at(at):
        return IntegrityError(seq, f"its at {shown(at)} is not a time as the store writes one "
                                   "(YYYY-MM-DDTHH:MM:SS.mmmZ)", stream=stream)
    return IntegrityError(seq, f"its at {at} is earlier than {after_at}, the at of the event before it: time "
                               "ran backwards (the store never stamps an event before the log's head)", stream=stream)


class ChainCheck:
    """Proves rows one after another (see the module docstring); `row` raises IntegrityError at the first bad one.

    `first`/`last`: the seqs whose links, hashes and times are checked (the rest are only counted, each
    row's hash carried as the next one's ``prev``). `versions`: also check that versions run 1, 2, ...
    per stream. `start`: the seq of the first row it is given (a range's check starts at the row before
    `first`, which is only counted: it gives the range's first row its ``prev`` and its time to follow).
    After the walk, rows up to `expected - 1` were read, `prev`/`prev_at` are the last row's.
    """

    __slots__ = ("expected", "first", "key", "last", "prev", "prev_at", "versions")

    def __init__(self, store_id: bytes, key: bytes | None, *, first: int = 1, last: int | None = None,
                 versions: bool = False, start: int = 1) -> None:
        self.key = key
        self.first = first
        self.last = last
        self.prev = chain.genesis(store_id, key)
        self.prev_at = ""
        self.expected = start
        self.versions: dict[str, int] | None = {} if versions else None

    def row(self, row: Row) -> None:
        """Check the next row of the log (the caller reads rows in seq order from seq 1)."""
        seq, stream, version, type_, at, body, row_prev, digest = row
        expected = self.expected
        if seq != expected:
            raise IntegrityError(expected, f"seq {seq} found where {expected} was due (a gap or a reorder)",
                                 stream=stream)
        versions = self.versions
        if versions is not None:
            wanted = versions.get(stream, 0) + 1
            if version != wanted:
                raise IntegrityError(seq, f"version {version} where {wanted} was due", stream=stream)
            versions[stream] = wanted
        last = self.last
        if seq >= self.first and (last is None or seq <= last):
            prev = self.prev
            if row_prev != prev:
                raise IntegrityError(seq, "prev does not link to the hash of the event before it", stream=stream)
            if chain.link(prev, seq, stream, version, type_, at, body, self.key) != digest:
                raise IntegrityError(seq, "hash does not match the event's contents", stream=stream)
            if at < self.prev_at or not well_formed_at(at):
                raise time_problem(seq, stream, at, self.prev_at)
        self.prev, self.prev_at = digest, at
        self.expected = expected + 1

    def rows(self, rows: Sequence[Row]) -> None:
        """`row` of each of `rows` in turn (the next rows of the log): the same checks and the same error at the
        first bad row, the rows before it counted, a page's rows outside `first`..`last` compared in one step."""
        if not rows:
            return
        expected = self.expected
        last = self.last
        low, high = rows[0][0], rows[-1][0]
        # None of a page's rows outside the range is checked but for its seq: each the one due (a mismatch
        # is named by the loop below).
        if (self.versions is None and type(low) is int and type(high) is int
                and (high < self.first or (last is not None and low > last))
                and list(map(_SEQ, rows)) == list(range(expected, expected + len(rows)))):
            end = rows[-1]
            self.prev, self.prev_at, self.expected = end[7], end[4], expected + len(rows)
            return
        if self.versions is not None:
            for row in rows:
                self.row(row)
            return
        first, key, domain = self.first, self.key, chain.EVENT_DOMAIN
        new: Callable[[bytes], Any] = blake3.blake3 if key is None else functools.partial(blake3.blake3, key=key)
        packs: dict[tuple[int, int, int], Callable[..., bytes]] = {}
        if last is None:
            last = expected + len(rows)  # beyond every seq of the page that can be the one due
        prev, prev_at = self.prev, self.prev_at
        try:
            # `row`'s loop over locals, `chain.link` and `well_formed_at` spelled out (their calls cost a
            # tenth of the chain check): `link` is asked only for a row that no frame can hold, to name it.
            for seq, stream, version, type_, at, body, row_prev, digest in rows:
                if seq != expected:
                    raise IntegrityError(expected, f"seq {seq} found where {expected} was due (a gap or a reorder)",
                                         stream=stream)
                if first <= seq <= last:
                    if row_prev != prev:
                        raise IntegrityError(seq, "prev does not link to the hash of the event before it",
                                             stream=stream)
                    try:
                        stream_b, type_b, at_b = stream.encode(), type_.encode(), at.encode()
                        lengths = (len(stream_b), len(type_b), len(at_b))
                        pack = packs.get(lengths)
                        if pack is None:
                            pack = packs[lengths] = chain.frame_head(lengths).pack
                        hasher = new(domain + prev + pack(seq, lengths[0], stream_b, version, lengths[1], type_b,
                                                          lengths[2], at_b, len(body)))
                        hasher.update(body)
                        computed = hasher.digest()
                    except (struct.error, TypeError, AttributeError, UnicodeError):
                        computed = chain.link(prev, seq, stream, version, type_, at, body, key)
                    if computed != digest:
                        raise IntegrityError(seq, "hash does not match the event's contents", stream=stream)
                    if at < prev_at or len(at) != 24 or at[23] != "Z" or at[4:20:3] != AT_SEPARATORS:
                        raise time_problem(seq, stream, at, prev_at)
                prev, prev_at = digest, at
                expected += 1
        finally:
            self.prev, self.prev_at, self.expected = prev, prev_at, expected

    def finish(self, head: int) -> None:
        """IntegrityError when the walk ended before `head` (a gap or a truncation under the head)."""
        if self.expected <= head:
            raise IntegrityError(self.expected, f"seq {self.expected} is missing (a gap or a truncation)")


def verify_rows(backend: Backend, store_id: bytes, key: bytes | None,
                progress: Callable[[int], None] | None = None) -> VerifyReport:
    """`EventStore.verify`'s walk, inside the caller's read transaction: every row from seq 1 through `ChainCheck`
    (versions too), then the count of rows, so that none lies outside the chain; IntegrityError at the first
    bad seq. `progress`: called with the last seq checked after each page."""
    check = ChainCheck(store_id, key, versions=True)
    for page in backend.pages(after=0, stream=None):
        for row in page:
            check.row(row)
        if progress is not None:
            progress(check.expected - 1)
    read = check.expected - 1
    # The walk reads seq 1, 2, ...; a row moved to seq <= 0 would sit outside it unseen.
    count, lowest = backend.seq_bounds()
    if count != read:
        raise IntegrityError(read + 1, f"the log holds {count} events but its chain only {read}: "
                                       f"an event lies outside it (lowest seq {lowest})")
    assert check.versions is not None
    return VerifyReport(read, len(check.versions), Head(read, check.prev, check.prev_at or None))
