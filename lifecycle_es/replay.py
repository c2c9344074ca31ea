"""Rebuilding a runner's state from its events: from the start, or from a verified snapshot.

A snapshot is a cache: ``(stream, version, seq, tag || state bytes, hash of the event at seq)``. The
tag (``EventStore.snapshot_tag``: a MAC under the store's key when keyed, bound in every mode to the
store, the stream, the version, the seq, the event's hash and the state's bytes) proves who wrote it
when keyed; unkeyed it is a hash anyone who reads the file can compute, which catches damage, staleness
and copies but not a forgery by whoever writes the file (the audit compares every snapshot with the
replay). A command only acts on state it can prove, so a snapshot is only folded from when its tag verifies and
the log still holds that hash at that seq for that stream and version. Any other snapshot (edited,
copied from another store or stream, written before snapshots were tagged, or read without the key)
is ignored: the runner is replayed from its first event, and the next snapshot or `projections.rebuild`
writes over it. In a keyed store opened with its key, every event folded after the snapshot is proven too
(`prove_row`): its hash is the MAC of its bytes under the key, at the stream's next version; so a command never
decides against, nor tags as a snapshot, a body edited by someone without the key. A replay that meets an event
the rules could not have produced raises IntegrityError at that event's seq.
"""

from __future__ import annotations

import bisect
import hmac
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import msgspec

from . import chain
from .backend import Row
from .canonical import canonical_ms, parse_iso_ms
from .draft import RunnerDraft, is_keyed, thaw
from .errors import IntegrityError, InvalidInputError, LifecycleError, StoreError, StoreKeyError
from .events import TAG_OF, Event, decode_body, decode_recorded
from .log import RecordedEvent
from .runner import RULES, STATES, start, step, step_timed
from .state import RunnerState, decode_state, encode_state, index_of
from .store import EventStore
from .values import MAX_SAFE_INTEGER

# Each event class's tag and the rule a replay calls for it directly (None: through `step_timed`), in one look-up.
_TAG_AND_RULE: dict[type[Event], tuple[str, Callable[[RunnerDraft, Any, int, str], None] | None]] = {
    cls: (tag, RULES.get(cls)) for cls, tag in TAG_OF.items()}


class Folded(NamedTuple):
    """A runner's state and the place in its stream it was folded up to."""

    state: RunnerState | None
    version: int
    seq: int


EMPTY = Folded(None, 0, 0)
# A stored snapshot's state column: its tag (`EventStore.snapshot_tag`), then the state's bytes.
TAG_BYTES = chain.HASH_BYTES
# A Fold re-keeps its draft's leases keyed after this many events: copying a runner's leases into a
# dict once costs about what a handful of events cost copying tuples (a catch-up of one or two events
# never pays it).
_KEY_AFTER = 4


def fold(state: RunnerState | None, recorded: RecordedEvent) -> RunnerState:
    """Apply one recorded event to `state` through the rules; any broken rule is IntegrityError at its seq.

    The same path as a `Fold` of one event (every replay folds one way).
    """
    folding = Fold(Folded(state, recorded.version - 1, recorded.seq - 1))
    folding.add(recorded)
    folded = folding.state()
    assert folded is not None  # an event was folded
    return folded


def snapshot_blob(store: EventStore, stream: str, version: int, seq: int, event_hash: bytes, state: bytes) -> bytes:
    """What the snapshots table holds as a snapshot's state: its tag, then the state's bytes."""
    return store.snapshot_tag(stream, version, seq, event_hash, state) + state


def proven_state(store: EventStore, stream: str, version: int, seq: int, blob: bytes, event_hash: bytes, *,
                 strict: bool = False) -> bytes | None:
    """The state bytes of a stored snapshot of `stream` when its tag proves them, else None.

    A tag proves the snapshot was written by this store (by its key's holder when keyed) for this
    stream, version, seq and event. A keyed store opened without its key proves none: None, or with
    `strict` the StoreKeyError that says so (a check that must not pass for want of a key).
    """
    if not isinstance(blob, bytes) or len(blob) <= TAG_BYTES:
        return None
    state = blob[TAG_BYTES:]
    try:
        wanted = store.snapshot_tag(stream, version, seq, event_hash, state)
    except StoreKeyError:
        if strict:
            raise
        return None
    except ValueError:  # fields no frame can hold: a row edited outside the store
        return None
    return state if hmac.compare_digest(blob[:TAG_BYTES], wanted) else None


def snapshot_of(store: EventStore, stream: str) -> Folded | None:
    """The stream's snapshot, if there is one, its tag proves it, and the log still holds its event."""
    try:
        with store.lock:  # committed only: another thread's batch may hold a snapshot it has not committed
            found = store.backend.snapshot(stream)
    except StoreError:
        return None
    if found is None:
        return None
    version, seq, blob, event_hash = found
    data = proven_state(store, stream, version, seq, blob, event_hash)
    # A seq no log holds (an unkeyed file's writer can tag any): not one for `event_at` to refuse as an argument.
    if data is None or not 0 < seq <= MAX_SAFE_INTEGER:
        return None
    recorded = store.event_at(seq)
    if recorded is None or recorded.hash != event_hash or recorded.stream != stream or recorded.version != version:
        return None
    try:
        state = decode_state(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    # A state no replay can leave (a state or lease status the rules do not have), tagged by whoever can tag an
    # unkeyed store's snapshots: ignored as an unproven one is, where counting its leases raised KeyError.
    if state.state not in STATES or index_of(state).other:
        return None
    return Folded(state, version, seq)


def load(store: EventStore, stream: str, *, base: Folded | None = None, use_snapshot: bool = True,
         until_seq: int | None = None) -> Folded:
    """Fold `stream` forward from `base` (or its snapshot, or the start) to its end or `until_seq`."""
    if base is None:
        base = EMPTY
        if use_snapshot:
            snap = snapshot_of(store, stream)
            if snap is not None and (until_seq is None or snap.seq <= until_seq):
                base = snap
    folding = Fold(base)
    key = store._key
    for row in _rows(stream_pages(store, stream, base.version)):
        if until_seq is not None and row[0] > until_seq:
            break
        if key is not None:
            prove_row(row, folding.version + 1, key)
        folding.add_row(row)
    return folding.folded()


def prove_row(row: Row, version: int, key: bytes) -> None:
    """IntegrityError unless `row` is the stream's event at `version` and its hash is the MAC of its bytes under
    the store's `key`: what a keyed store folds into a state it may tag as a snapshot must be what a holder of
    the key wrote, or the tag would vouch for a body edited underneath. (How the row links to the rows around
    it in the chain is the audit's to prove.)"""
    seq, stream, row_version, type_, at, body, prev, digest = row
    if row_version != version:
        raise IntegrityError(seq, f"version {row_version} where {version} was due", stream=stream)
    if chain.link(prev, seq, stream, row_version, type_, at, body, key) != digest:
        raise IntegrityError(seq, "hash does not match the event's contents under the store's key: it was "
                                  "written or edited without the key", stream=stream)


def stream_pages(store: EventStore, stream: str, after_version: int = 0) -> Iterator[list[Row]]:
    """`store.read_stream` as pages of backend rows (a replay keeps no event, so it makes no RecordedEvent).

    Each page is read under the store's lock and none is held between them, as every read of the store is:
    one connection serves all its threads, and a batch another thread has open on it is never read.
    """
    return store.locked_pages(store.backend.stream_pages(stream, after_version=after_version))


def log_pages(store: EventStore, after: int = 0) -> Iterator[list[Row]]:
    """The log's rows after seq `after` as pages of backend rows, each read under the store's lock (see
    `stream_pages`)."""
    return store.locked_pages(store.backend.pages(after=after, stream=None))


def _rows(pages: Iterator[list[Row]]) -> Iterator[Row]:
    for rows in pages:
        yield from rows


class Fold:
    """One stream's events folded through the rules into a draft, frozen when the result is asked for.

    Every replay folds this way (commands catching up, projections, rebuild, the audit): a row's body
    decoded by ``events.decode_recorded`` and each event stepped through the rules, a broken rule an
    IntegrityError at its seq; without a frozen state per event: after the first few events the draft keeps its leases
    keyed and changes them in place (see ``draft.py``), so an event costs the same however many leases
    the runner retains. `hash` is the last event's hash and `steps` how many were folded. A Fold that
    raised is not to be used again.
    """

    __slots__ = ("_draft", "_folded", "_folded_at", "hash", "seq", "steps", "version")

    def __init__(self, base: Folded = EMPTY) -> None:
        state, self.version, self.seq = base
        self._draft: RunnerDraft | None = thaw(state) if state is not None else None
        # The draft as a value, and the steps folded when it was made: it holds while no event was folded since
        # (told by the count, so that folding an event writes nothing more).
        self._folded: RunnerState | None = state
        self._folded_at = 0
        self.steps = 0
        self.hash: bytes | None = None

    def add(self, recorded: RecordedEvent) -> None:
        """Fold one recorded event (its body decoded; a broken rule is IntegrityError at its seq)."""
        self._step(recorded.event, recorded.seq, recorded.stream, recorded.type, recorded.at)
        self.version = recorded.version
        self.hash = recorded.hash

    def add_row(self, row: Row) -> None:
        """`add` of an event given as its backend row: the same checks and errors as ``RecordedEvent.event``."""
        seq, stream, version, type_, at, body, _, digest = row
        # `decode_recorded` spelled out, a call less per event replayed; it names the row when either test fails.
        try:
            event = decode_body(body)
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
            event = decode_recorded(seq, stream, type_, body)
        tag, rule = _TAG_AND_RULE[type(event)]
        if tag != type_:
            event = decode_recorded(seq, stream, type_, body)  # raises: it names the row and both tags
        draft = self._draft
        # The hot path of every replay, `_step` and `step_timed` spelled out: a time that is canonical and
        # not before the runner's last one is proved here once, and the event's rule is called directly
        # when nothing is due before it (anything else, and every refusal, goes through `step_timed`).
        if draft is not None and self.steps != _KEY_AFTER:
            at_ms = canonical_ms(at)
            if at_ms is not None and at >= draft.last_at:
                if draft.pending_park is not None:
                    rule = None
                try:
                    if rule is None:
                        step_timed(draft, event, at_ms, at)
                    else:
                        rule(draft, event, at_ms, at)
                        draft.last_at = at
                except (LifecycleError, ValueError) as exc:
                    if isinstance(exc, IntegrityError):
                        raise
                    raise IntegrityError(seq, f"{type_} breaks the rules: {exc}", stream=stream) from None
                self.steps += 1
                self.seq = seq
                self.version = version
                self.hash = digest
                return
        self._step(event, seq, stream, type_, at)
        self.version = version
        self.hash = digest

    def add_event(self, event: Event, seq: int, stream: str, at: str) -> None:
        """Fold an event about to be appended at `seq`, stamped `at` (the checks and errors of `add`)."""
        self._step(event, seq, stream, event.__struct_config__.tag, at)  # type: ignore[arg-type]
        self.version += 1

    def _step(self, event: Event, seq: int, stream: str, type_: str, at: str) -> None:
        try:
            # Checked as canonical by the rules either way; a time in another spelling is parsed for their message.
            at_ms = canonical_ms(at)
            if at_ms is None:
                at_ms = parse_iso_ms(at)
            draft = self._draft
            if draft is None:
                self._draft = start(event, at, stream)
            else:
                if self.steps == _KEY_AFTER and not is_keyed(draft):
                    self._draft = draft = thaw(draft.freeze(), keyed=True)
                step(draft, event, at_ms, at)
        except IntegrityError:
            raise
        except (LifecycleError, ValueError) as exc:
            raise IntegrityError(seq, f"{type_} breaks the rules: {exc}", stream=stream) from None
        self.steps += 1
        self.seq = seq

    def state(self) -> RunnerState | None:
        """The state folded so far, frozen (None before the stream's first event)."""
        if self._folded_at != self.steps:
            assert self._draft is not None  # an event was folded into it
            self._folded = self._draft.freeze()
            self._folded_at = self.steps
        return self._folded

    def folded(self) -> Folded:
        """The state folded so far, with the version and seq it was folded up to."""
        return Folded(self.state(), self.version, self.seq)


def unforeseen(row: Row, exc: Exception) -> IntegrityError:
    """The IntegrityError of a row whose replay raised what no rule foresaw (a value of a type no command
    writes, smuggled past STRICT): the row is refused at its seq, never a crash."""
    return IntegrityError(row[0], f"{row[3]} could not be replayed: {type(exc).__name__}: {exc}", stream=row[1])


def fold_log(store: EventStore, *, until_seq: int | None = None,
             progress: Callable[[int], None] | None = None) -> dict[str, Fold]:
    """Every stream of the log folded in seq order (up to `until_seq`), one `Fold` per stream.

    What a whole-log replay that only wants the end states (rebuild, the fleet view) runs: each runner's
    draft is frozen once, when its `Fold` is asked for the state, not after every event. `progress`:
    called with the last seq folded after each page of rows.
    """
    folds: dict[str, Fold] = {}
    get = folds.get
    for rows in log_pages(store):
        # Rows come in seq order: the page that passes `until_seq` is cut there, and is the last.
        last = False
        if until_seq is not None and rows[-1][0] > until_seq:
            rows, last = rows[:bisect.bisect_right(rows, until_seq, key=_seq_of)], True
        for row in rows:
            folding = get(row[1])
            if folding is None:
                folding = folds[row[1]] = Fold()
            try:
                folding.add_row(row)
            except IntegrityError:
                raise
            except Exception as exc:
                raise unforeseen(row, exc) from None
        if last:
            return folds
        if progress is not None:
            progress(rows[-1][0])
    return folds


def _seq_of(row: Row) -> int:
    return row[0]


def check_events(store: EventStore, stream: str, events: Sequence[Event], *, version: int, seq: int,
                 at: str) -> None:
    """InvalidInputError("events") unless the rules accept `events` appended to `stream` (now at `version`,
    the log at `seq`) stamped `at`, ending where the rules allow (no park left pending). Read under the
    caller's write lock; what `EventStore.append` runs before it writes anything."""
    base = load(store, stream)
    if base.version != version:  # the stream moved between two reads under one lock: never expected
        raise IntegrityError(seq, f"the stream {stream!r} is at version {base.version}, its tail says {version}")
    folding = Fold(base)
    for offset, event in enumerate(events):
        try:
            folding.add_event(event, seq + offset + 1, stream, at)
        except IntegrityError as exc:
            raise InvalidInputError("events", f"events[{offset}] ({type(event).__name__}) is refused by the rules: "
                                              f"{exc.reason}") from None
    state = folding.state()
    if state is not None and state.pending_park is not None:
        raise InvalidInputError("events", f"the events leave runner {stream!r} with a park pending "
                                          f"({state.pending_park}): append the RunnerParked the rules require "
                                          "with them")


def write_snapshot(store: EventStore, stream: str, folded: Folded, event_hash: bytes) -> bool:
    """Store a tagged snapshot of `folded` (inside the current write transaction); whether one was written.

    A state with a park pending is never a snapshot (the RunnerParked that follows belongs with it).
    A keyed store opened without its key cannot tag one: StoreKeyError.
    """
    if folded.state is None or folded.state.pending_park is not None:
        return False
    blob = snapshot_blob(store, stream, folded.version, folded.seq, event_hash, encode_state(folded.state))
    store.backend.put_snapshot(stream, folded.version, folded.seq, blob, event_hash)
    return True
