"""`Checkpointer`: the host driver signs a checkpoint of the log every N events or every T seconds.

    signer = lifecycle_es.signing.load_signer("ops.key")
    checkpointer = Checkpointer(store, signer, every=1000, seconds=60)   # path: <db>.checkpoints
    thread = threading.Thread(target=checkpointer.serve, args=(stop,))  # its own store connection
    checkpointer.tick()                                                  # or drive it yourself

A checkpoint is signed when the log has moved since the last one and either `every` events were
appended since or `seconds` have passed; the first `tick` signs the head as the host finds it, and
`serve` signs the head once more when it stops, so every event the host saw is vouched for. Signing
reads the head and appends to the checkpoint file only (`lifecycle_es.EventStore.checkpoint`): it
never writes the log, so it needs no lock on it and no store key.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lifecycle_es.checkpoints import Checkpoint
from lifecycle_es.errors import InvalidInputError, LifecycleError
from lifecycle_es.signing import Signer
from lifecycle_es.store import EventStore
from lifecycle_es.values import safe_int, safe_number, safe_progress, safe_stop

DEFAULT_EVERY = 1000
DEFAULT_SECONDS = 60.0


class Checkpointer:
    """Signs the store's head with `signer` every `every` events or `seconds` seconds (see the module).

    `path`: the checkpoint file (default ``<db>.checkpoints``). `clock`: monotonic seconds (injected
    in tests). At least one of `every` and `seconds` must be given.
    """

    def __init__(self, store: EventStore, signer: Signer, *, every: int | None = DEFAULT_EVERY,
                 seconds: float | None = DEFAULT_SECONDS, path: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if every is None and seconds is None:
            raise InvalidInputError("every", "every or seconds must say when to sign a checkpoint")
        if every is not None:
            safe_int(every, "every", 1)
        if seconds is not None:
            safe_number(seconds, "seconds", 0, 86_400, above=True)
        self._store = store
        self._signer = signer
        self._every = every
        self._seconds = seconds
        self._path = path
        self._clock = clock
        self._signed: int | None = None
        self._signed_at = clock()

    def __repr__(self) -> str:
        return f"Checkpointer({self._store.path!r}, every={self._every}, seconds={self._seconds}, " \
               f"last signed seq={self._signed})"

    def tick(self, *, force: bool = False) -> Checkpoint | None:
        """Sign the head when it is due (or when `force`, if the log moved); the checkpoint, or None."""
        head = self._store.head().seq
        if head == self._signed:
            return None  # nothing new to vouch for
        due = force or self._signed is None or (
            self._every is not None and head - self._signed >= self._every) or (
            self._seconds is not None and self._clock() - self._signed_at >= self._seconds)
        if not due:
            return None
        checkpoint = self._store.checkpoint(self._signer, self._path)
        self._signed, self._signed_at = checkpoint.seq, self._clock()
        return checkpoint

    def serve(self, stop_event: threading.Event, *, poll_interval: float = 0.5,
              on_checkpoint: Callable[[Checkpoint], None] | None = None,
              on_error: Callable[[Exception], None] | None = None) -> None:
        """`tick` every `poll_interval` seconds until `stop_event` is set, then sign the head a last time.

        A failure to sign (the checkpoint file unwritable) goes to `on_error` and is tried again on the
        next tick: the host goes on serving its units.
        """
        safe_stop(stop_event, "stop_event")
        safe_number(poll_interval, "poll_interval", 0, 3600, above=True)
        safe_progress(on_checkpoint, "on_checkpoint", "(checkpoint)")
        safe_progress(on_error, "on_error", "(exception)")
        final = False
        while not final:
            final = stop_event.wait(poll_interval)
            try:
                signed = self.tick(force=final)
            except (LifecycleError, OSError) as exc:
                if on_error is not None:
                    on_error(exc)
                continue
            if signed is not None and on_checkpoint is not None:
                on_checkpoint(signed)


__all__ = ["DEFAULT_EVERY", "DEFAULT_SECONDS", "Checkpointer"]
