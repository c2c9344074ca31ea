"""What the audit proves of the caches: snapshots and read models against a fresh replay.

Snapshots and read models are caches of the log; the log is the truth. `SnapshotCheck` checks every
stored snapshot (its tag, then its state against the replay at its seq as the replay streams by), and
`check_read_models` every read-model row against the replayed states. Both read through the backend's
named methods, so any backend's caches are proved the same way.
"""

from __future__ import annotations

import msgspec

from .log import RecordedEvent
from .read_model import Replayed, compare_read_models
from .replay import proven_state
from .state import RunnerState, decode_state, encode_state
from .store import EventStore


class SnapshotCheck:
    """Checks every stored snapshot: its tag at once, its state against the replay at its seq as the replay
    streams by (`observe`), then what is left (`finish`).

    A snapshot whose tag does not verify is a problem: nobody holding the store (and its key, when keyed)
    wrote it for that stream and event. One written before snapshots were tagged (its bytes are a state
    and nothing else) is ignored by commands; when it equals the replay it is only a warning, since the
    next snapshot or a rebuild writes over it. Problems are ``(seq, stream, reason)``.
    """

    def __init__(self, store: EventStore) -> None:
        # By seq, a list: a forged snapshot may name the seq of another stream's.
        self._due: dict[int, list[tuple[str, int, bytes, bytes, bool]]] = {}
        self.problems: list[tuple[int, str, str]] = []
        self.warnings: list[str] = []
        self.checked = 0
        keyed = " under its key" if store.keyed else ""
        for stream in store.streams():
            found = store.backend.snapshot(stream)
            if found is None:
                continue
            version, seq, blob, event_hash = found
            data = proven_state(store, stream, version, seq, blob, event_hash, strict=True)
            if data is not None:
                self._due.setdefault(seq, []).append((stream, version, data, event_hash, True))
            elif _untagged(blob):
                self._due.setdefault(seq, []).append((stream, version, blob, event_hash, False))
            else:
                self.checked += 1
                self.problems.append((seq, stream, f"snapshot of {stream!r} has a tag that does not verify: this "
                                                   f"store{keyed} did not write it for this stream and event "
                                                   f"(edited, or copied from elsewhere; rebuild rewrites it)"))

    def observe(self, recorded: RecordedEvent, state: RunnerState) -> None:
        """Check the snapshots taken at this event, if there are any."""
        for stream, version, data, event_hash, tagged in self._due.pop(recorded.seq, ()):
            self.checked += 1
            if stream != recorded.stream or version != recorded.version or event_hash != recorded.hash:
                self.problems.append((recorded.seq, stream, f"snapshot of {stream!r} does not name this event"))
            elif data != encode_state(state):
                self.problems.append((recorded.seq, stream, f"snapshot of {stream!r} differs from the replayed state"))
            elif not tagged:
                self.warnings.append(f"snapshot of {stream!r} at seq {recorded.seq} has no tag (written before "
                                     f"snapshots were tagged): commands ignore it; rebuild rewrites it")

    def finish(self) -> list[tuple[int, str, str]]:
        """Snapshots that named no event of the log are problems too; return every problem found."""
        for seq, found in sorted(self._due.items()):
            for stream, _, _, _, _ in found:
                self.problems.append((seq, stream, f"snapshot of {stream!r} names seq {seq}, which the log does "
                                                   "not hold"))
        self._due.clear()
        return self.problems


def _untagged(blob: object) -> bool:
    """Whether a snapshot's bytes are a state and nothing else (the format before snapshots were tagged)."""
    try:
        decode_state(blob)  # type: ignore[arg-type]
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
        return False
    return True


def check_read_models(store: EventStore, replayed: Replayed) -> list[tuple[str, str]]:
    """Compare every row of ``runners`` and ``leases`` with `replayed` states ``{id: (state, version, seq)}``.

    Every row is compared, whatever seq the read models say they applied (see
    ``read_model.compare_read_models``). Returns (runner id, what differs) pairs; empty when the tables
    equal the replay or do not exist.
    """
    backend = store.backend
    return compare_read_models(backend.read_model_rows("runners"), backend.read_model_rows("leases"), replayed)
