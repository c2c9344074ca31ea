"""The event store: a hash-chained, append-only log of events in one WAL-mode SQLite file.

One file holds many streams (one per runner). Every event has a global ``seq`` (1..n, no gaps), a
``version`` within its stream (1..n), a ``type`` (its tag), an ``at`` (ISO-8601 UTC, milliseconds),
its canonical ``body`` bytes, and ``prev``/``hash`` links of the chain (see ``chain.py``).

    with EventStore.open("runners.db") as store:
        store.append("runner-1", [event], expected_version=0)
        for recorded in store.read(stream="runner-1"):
            print(recorded.seq, recorded.type, recorded.event)

Appends run under the write lock taken up front (``BEGIN IMMEDIATE``): the head and the stream's
version are read, the new rows chained, inserted and read back (a write the file did not keep is never
acknowledged), and every attached projector updates its read model, all in one transaction. A batch
is all or nothing. Threads writing to one store at the same time share transactions, each write under
a savepoint of its own (`commit`, see ``group_commit.py``); one connection serves them all, so reads
take its lock in turn and never see a batch in flight.

Time never runs backwards: an event is stamped at least the head's ``at`` (the clock, or the head's
``at`` when the clock is behind it), an explicit earlier ``at`` is refused, and `verify` and the audit
report an event stamped before the one before it. An event's body is at most `MAX_EVENT_BYTES` (512
KiB; the largest a command writes, a DrainExpired naming 1024 lease ids, is about 270 KB): a larger one
is refused on append, and reported at its seq when a read meets it. Reads are paged by rows and bytes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from . import appending, chain, forked
from .backend import PAGE_ROWS, Backend
from .backends import is_url, open_backend
from .canonical import iso_ms
from .errors import (
    ConcurrencyError,
    InvalidInputError,
    StoreError,
    StoreFencedError,
    StoreFormatError,
    StoreIOError,
    StoreKeyError,
)
from .events import Event
from .files import text_path
from .group_commit import GroupCommit
from .log import RecordedEvent, VerifyReport
from .seal import Seal, check_seal, read_seal, write_seal
from .store_reads import StoreReads
from .transaction import WriteTransaction as WriteTransaction  # re-exported: where it was always imported from
from .transaction import _Fencing
from .values import safe_choice, safe_id, safe_int, safe_progress
from .verify import verify_rows

if TYPE_CHECKING:
    from .checkpoints import Checkpoint
    from .signing import Signer

PAGE = PAGE_ROWS
T = TypeVar("T")


class Projector(Protocol):
    """Something that keeps a read model in step with the log, inside the event transaction.

    Its writes roll back with the transaction; anything it keeps in memory between appends it drops once
    `EventStore.rollbacks` has moved since it kept it.
    """

    def catch_up(self, store: EventStore) -> None:
        """Bring the read model up to the log's head (called inside the write transaction)."""
        ...

    def apply(self, store: EventStore, recorded: Sequence[RecordedEvent]) -> None:
        """Apply newly appended events (called inside the write transaction, after the insert)."""
        ...


def _validate_key(key: object) -> bytes | None:
    if key is None:
        return None
    if not isinstance(key, bytes | bytearray) or len(key) != chain.KEY_BYTES:
        raise InvalidInputError("key", f"key must be {chain.KEY_BYTES} bytes")
    return bytes(key)


class EventStore(StoreReads):
    """The durable, hash-chained event log. Open it with `EventStore.open`."""

    def __init__(self, backend: Backend, *, key: bytes | None, now: Callable[[], int]) -> None:
        self._backend = backend
        self._now = now
        self._fence: str | None = None
        self._projectors: list[Projector] = []
        self._local_commits = 0
        self._rollbacks = 0
        self._writing: int | None = None  # the thread that holds a write transaction open, while one does
        self._write_busy = False  # a write transaction begins, is open or ends on the connection (see `forked`)
        self._pid = os.getpid()
        forked.track(self)
        # One connection serves every thread: a write transaction, a page of a read, holds it in turn, so
        # no thread reads another's uncommitted batch or starts a transaction inside it.
        self._lock = threading.RLock()
        self._group = GroupCommit(self)
        # A backend that checks the store's identity as its write transaction begins (a server's, in the
        # same round trip as the lock); the others are checked here first (`_write`).
        self._identity_in_write: bool = getattr(backend, "checks_identity_in_write", False)
        store_id = backend.meta("store_id")
        if store_id is None:
            raise StoreFormatError(f"{backend.path!r} has no store id: not a lifecycle-es store")
        self.store_id: bytes = store_id
        stored_key_id = backend.meta("key_id")
        # A key id that is not text is a schema problem (`schema_problems`); reading it must not crash.
        self.key_id: str | None = stored_key_id.decode("utf-8", "replace") if stored_key_id is not None else None
        self._key = self._check_key(key)
        self._genesis = chain.genesis(self.store_id, self._key) if self._key or not self.key_id else b""

    # --- opening -------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, key: bytes | None = None, durability: str = "full",
             busy_timeout_ms: int = 5000, now: Callable[[], int] | None = None, vfs: str | None = None,
             seal: str | os.PathLike[str] | None = None, read_only: bool = False) -> EventStore:
        """Open the store at `path`, creating it (mode 0600) when it is missing.

        `path` is an SQLite file, or a ``postgresql://`` URL naming a schema on a PostgreSQL server (the
        ``postgres`` extra; see ``backends.py`` for its ``schema`` and ``notify`` parameters), created
        there when missing. Everything below holds on both, except `vfs` (SQLite only) and the default
        seal (a file store's ``<path>.seal``; a server's store checks a seal only when one is named).

        `key`: 32 bytes; a store created with a key is keyed for life (its hashes are blake3 MACs),
        and opening it with a different key raises StoreKeyError. Without the key a keyed store opens
        read-only. `durability`: ``"full"`` (every commit is synced: nothing acknowledged is lost on
        power loss) or ``"normal"`` (WAL synced at checkpoints: a power loss may lose the commits since
        the last checkpoint, never corrupt the file; a process crash loses nothing). `busy_timeout_ms`:
        how long a writer waits for the lock before StoreBusyError. `now`: epoch-ms clock for events'
        ``at`` (default: the system clock). `vfs`: an SQLite VFS name (fault injection in tests).
        `seal`: the seal file checked on open (default ``<path>.seal`` when it exists). `read_only`:
        open an existing store without changing it (auditing, asserting lease authority); writes
        then raise StoreIOError.
        """
        path = text_path(path, "path")
        safe_choice(durability, "durability", ("full", "normal"))
        safe_int(busy_timeout_ms, "busy_timeout_ms", 0, 3_600_000)
        key = _validate_key(key)
        if now is not None and not callable(now):
            raise InvalidInputError("now", "now must be a callable returning epoch milliseconds")
        if vfs is not None and type(vfs) is not str:
            raise InvalidInputError("vfs", f"vfs is invalid: {type(vfs).__name__} is not a VFS name (a plain str)")
        if seal is not None:
            seal = text_path(seal, "seal")
        if not isinstance(read_only, bool):
            # bool() would read "no" or "false" as True; only a real bool says what the caller meant.
            raise InvalidInputError("read_only", f"read_only is invalid: {read_only!r} is not a bool")
        backend = open_backend(path, durability=durability, busy_timeout_ms=busy_timeout_ms, vfs=vfs,
                               read_only=read_only)
        try:
            store = cls(backend, key=key, now=now or (lambda: time.time_ns() // 1_000_000))
            seal_path = seal if seal is not None or is_url(path) else path + ".seal"
            # lexists: a link where the seal belongs, dangling or not, is read (and refused), not skipped.
            if seal_path is not None and (seal is not None or os.path.lexists(seal_path)):
                store.check_seal(seal_path)
        except BaseException:
            backend.close()
            raise
        return store

    def _check_key(self, key: bytes | None) -> bytes | None:
        if key is None:
            return None
        if self.key_id is None:
            if self._backend.head()[0] > 0:
                raise StoreKeyError("the store is not keyed: its events were hashed without a key")
            with self._backend.write("record key id"):
                if self._backend.meta("key_id") is None:
                    self._backend.set_meta("key_id", chain.key_id(key).encode())
            self.key_id = self._backend.meta("key_id").decode()  # type: ignore[union-attr]
        if chain.key_id(key) != self.key_id:
            raise StoreKeyError("wrong key: its key id differs from the one the store was created with")
        return key

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"fenced: {self._fence}" if self._fence else "open"
        return f"EventStore({self.path!r}, {state}, keyed={self.key_id is not None})"

    @property
    def path(self) -> str:
        """The store file's path, or a server store's URL (its password masked)."""
        return self._backend.path

    @property
    def backend(self) -> Backend:
        """The backend; read models run their SQL through it inside the event transaction."""
        return self._backend

    @property
    def lock(self) -> threading.RLock:
        """The connection's lock: every write transaction holds it, every read takes it in turn. A thread that
        reads the backend directly while other threads write through this store holds it around those reads, so
        that it sees committed state only; a command it issues meanwhile commits in a transaction of its own."""
        return self._lock

    @property
    def rollbacks(self) -> int:
        """How many writes this handle rolled back: write transactions that did not commit, and the works of a
        `commit` batch undone under their savepoints. A cache of what a write applied (a projector's) holds only
        while this has not moved since: what it kept may be of a write the log never held."""
        return self._rollbacks

    @property
    def in_transaction(self) -> bool:
        """Whether the calling thread holds a write transaction of this store open (its own, or the batch of
        `commit` it writes): what it reads then may never commit, so a cache must not keep it."""
        return self._writing == threading.get_ident()

    @property
    def group_commit(self) -> GroupCommit:
        """The queue `commit` gathers concurrent writes in (`GroupCommit.tune` sets its batch size and linger)."""
        return self._group

    @property
    def keyed(self) -> bool:
        """Whether the store's chain is keyed."""
        return self.key_id is not None

    @property
    def holds_key(self) -> bool:
        """Whether the store is keyed and this handle was opened with its key (it can tag and prove snapshots)."""
        return self._key is not None

    @property
    def now(self) -> Callable[[], int]:
        """The store's epoch-ms clock."""
        return self._now

    # --- writing -------------------------------------------------------------------------------------

    def attach(self, projector: Projector) -> None:
        """Keep `projector`'s read model in the same transaction as every later append."""
        with self.transaction("attach projector"):
            projector.catch_up(self)
        self._projectors.append(projector)

    def fence(self, cause: str) -> None:
        """Refuse every later write with StoreFencedError; nothing is retried on a fenced store."""
        if self._fence is None:
            self._fence = str(cause)

    @property
    def fenced(self) -> str | None:
        """The fence's cause, or None."""
        return self._fence

    def transaction(self, action: str = "write", *, streams: Sequence[str] = ()) -> WriteTransaction:
        """A write transaction of its own: read the head and streams under the lock, then append. All or nothing.

        `streams`: the streams it will read the tails of, which a server backend reads with the lock, in
        one round trip (a hint: any stream may be read)."""
        return WriteTransaction(self, action, streams)

    def commit(self, action: str, work: Callable[[WriteTransaction], T], *, stream: str | None = None) -> T:
        """Run `work(tx)` in a write transaction shared with the writes other threads make at the same time
        (group commit, see ``group_commit.py``), and return what it returned once that commit is durable.

        `work` decides against the log as the writes before it in the batch left it; when it raises, its
        writes are rolled back alone and its exception is raised here, the others committing. When the
        commit fails, every caller whose work succeeded gets that error (with ``outcome_unknown``, the
        store is fenced). Alone, it costs what a `transaction` costs. `stream`: the stream `work` appends
        to, if one (see `transaction`'s `streams`).
        """
        return self._group.run(action, work, stream)

    def _write(self, action: str, streams: Sequence[str] = ()) -> Any:
        if self._fence is not None:
            raise StoreFencedError(self._fence)
        if self._backend.read_only:
            raise StoreIOError(f"{action}: the store {self.path!r} was opened read-only")
        if not self._identity_in_write:
            try:
                self._backend.check_files()  # a file replaced, removed or cut short: a stat per file
            except StoreFencedError as exc:
                raise self._fenced_by(exc) from None
        # Its head checked as it begins (a log restored behind what this handle committed fences the store).
        return _Fencing(self, self._backend.write(action, streams))

    def _fenced_by(self, exc: StoreFencedError) -> StoreFencedError:
        """Fence the store for `exc`'s cause; the error to raise (its cause the fence's, the first one)."""
        self.fence(exc.cause)
        return StoreFencedError(self._fence or exc.cause)

    def append(self, stream: str, events: Sequence[Event], *, expected_version: int | None = None,
               at: str | None = None) -> list[RecordedEvent]:
        """Append `events` to `stream` in one transaction and return them as recorded.

        The events must be ones the rules accept after the stream's last event (the rules the commands
        obey, every field held to its command's bounds, a park the rules require included in the same
        append): otherwise InvalidInputError("events") names the first refused event and nothing is
        appended. Many events in one call are one transaction: the path for bulk work and imports.
        `expected_version`: the stream's version the caller decided against (0 for a new stream);
        a mismatch raises ConcurrencyError and appends nothing. `at`: the events' timestamp (default:
        the store's clock, or the head's ``at`` when the clock is behind it); one earlier than the head's
        raises InvalidInputError. A body beyond MAX_EVENT_BYTES raises InvalidInputError("events").
        """
        return self.commit("append", lambda tx: tx.append(stream, events, expected_version=expected_version, at=at),
                           stream=stream if isinstance(stream, str) else None)

    def append_unchecked(self, stream: str, events: Sequence[Event], *, expected_version: int | None = None,
                         at: str | None = None) -> list[RecordedEvent]:
        """`append` without the rules: the events go in chained and bounded, whatever they say.

        For tests and tools that must write what the rules refuse (a forged log to test an audit with,
        a benchmark of the store alone). A log written this way can hold events no command could have
        written, which its audit then reports; a host or an importer uses `append`.
        """
        return self.commit("append", lambda tx: tx.append_unchecked(stream, events, expected_version=expected_version,
                                                                   at=at),
                           stream=stream if isinstance(stream, str) else None)

    def _append(self, stream: str, events: Sequence[Event], expected_version: int | None,
                at: str | None, *, checked: bool) -> list[RecordedEvent]:
        safe_id(stream, "stream")
        bodies = appending.encoded(events)  # refuses what is not an event before anything else
        if expected_version is not None:
            safe_int(expected_version, "expected_version")
        if self.key_id is not None and self._key is None:
            raise StoreKeyError("this keyed store was opened without its key: it is read-only")
        stamped = at is None
        at = appending.stamp(at, self._now)
        backend = self._backend
        # One statement under the lock for all (answered without one when the command just read them).
        version, seq, prev, head_at = backend.tail(stream)
        if expected_version is not None and expected_version != version:
            raise ConcurrencyError(stream, expected_version, version)
        if head_at is not None and (type(head_at) is not str or at < head_at):
            at = appending.not_before(at, seq, head_at, stamped=stamped)
        if checked:
            # The rules fold the stream (replay reads through this module, so it is imported here).
            from .replay import check_events

            check_events(self, stream, events, version=version, seq=seq, at=at)
        rows = appending.chained(bodies, prev if prev is not None else self._genesis, seq, stream, version, at,
                                 self._key)
        backend.insert(rows)
        recorded = [RecordedEvent(*row, event=event) for row, event in zip(rows, events, strict=True)]
        for projector in self._projectors:
            projector.apply(self, recorded)
        return recorded

    # --- proving -------------------------------------------------------------------------------------

    def _verify_key(self, key: bytes | None) -> bytes | None:
        key = _validate_key(key) if key is not None else self._key
        if self.key_id is not None:
            if key is None:
                raise StoreKeyError("this store is keyed: verifying it needs its key")
            if chain.key_id(key) != self.key_id:
                raise StoreKeyError("wrong key: its key id differs from the one the store was created with")
        elif key is not None:
            raise StoreKeyError("the store is not keyed: its events were hashed without a key")
        return key

    def verify(self, *, key: bytes | None = None, seal: str | os.PathLike[str] | None = None,
               progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Verify the whole chain in constant memory; IntegrityError names the first bad seq.

        Checks seqs contiguous from 1, versions contiguous per stream, every ``prev`` link and every
        hash (a MAC with the key, for a keyed store), that no event's ``at`` is earlier than the one
        before it, and that no body is beyond MAX_EVENT_BYTES; then the seal when one is given.
        """
        key = self._verify_key(key)
        with self._lock, self._backend.read_tx("verify"):
            report = verify_rows(self._backend, self.store_id, key, safe_progress(progress, takes="(done)"))
        if seal is not None:
            self.check_seal(text_path(seal, "seal"), key=key)
        return report

    def seal(self, path: str | os.PathLike[str] | None = None) -> Seal:
        """Write the head durably to a side file (default ``<db>.seal``, 0600, MAC'd when keyed).

        A later open or audit whose head is behind the seal raises StoreBehindSealError: that catches a
        rollback to an older copy and a truncated tail, which the chain alone cannot.
        """
        self._outside_writes("seal")
        if self.key_id is not None and self._key is None:
            raise StoreKeyError("sealing a keyed store needs its key")
        head = self.head()
        if path is None and is_url(self.path):
            raise InvalidInputError("path", "a store on a server has no file to seal beside: name the seal file "
                                            "(it stays on the host that keeps it)")
        target = text_path(path, "path") if path is not None else self.path + ".seal"
        sealed = Seal(store_id=self.store_id.hex(), seq=head.seq, hash=head.hash.hex(),
                      at=head.at or iso_ms(self._now()), key_id=self.key_id)
        write_seal(target, sealed, self._key)
        return sealed

    def checkpoint(self, signer: Signer, path: str | os.PathLike[str] | None = None) -> Checkpoint:
        """Sign the head with `signer` and append it to a checkpoint file (default ``<db>.checkpoints``).

        Anyone with the signer's public key can later prove the log still holds that head
        (``lifecycle_es.audit(..., trust=...)``); see `lifecycle_es.checkpoints`. Needs ``cryptography``.
        """
        from .checkpoints import append_checkpoint, default_path

        self._outside_writes("checkpoint")
        return append_checkpoint(self, signer, text_path(path, "path") if path is not None else default_path(self.path))

    def _outside_writes(self, action: str) -> None:
        """StoreError when the calling thread holds a write transaction of this store open (a `commit` work, a
        `transaction` block): the head it reads there may never commit, and a seal or checkpoint of it would
        leave the log behind its seal for good."""
        if self.in_transaction:
            raise StoreError(f"{action}: cannot {action} the head within a write transaction (it is not committed "
                             "yet): call it after the transaction or the command returns")

    def check_seal(self, path: str | os.PathLike[str], *, key: bytes | None = None) -> Seal:
        """Check that the log has not fallen behind the seal at `path`; return the seal."""
        sealed = read_seal(text_path(path, "path"), key if key is not None else self._key, self.key_id)
        seq = sealed.seq
        with self._lock:
            row = self._backend.row_at(seq) if seq > 0 else None
            check_seal(sealed, store_id=self.store_id, head_seq=self.head().seq,
                       hash_at_seq=row[7] if row else None)
        return sealed

    def close(self) -> None:
        """Close the store; later calls fail. In a process forked from the one that opened it, the connection is
        left to that one (closing it here would end a server session both share)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            self._backend.close()

    def _inherited(self) -> None:
        """This process was forked from the one that opened the store: fence it, with locks of its own (so that
        every call reaches the fence instead of a lock a thread of the parent held; see ``forked``)."""
        self._fence = (f"the store {self.path!r} was opened in process {self._pid}, which this process was forked "
                       "from, and a connection does not survive a fork: open the store again in this process")
        self._lock = threading.RLock()
        self._group = GroupCommit(self)
        self._writing = None
        self._write_busy = False
        self._backend = forked.inherited(self._backend, self._fence)

    def snapshot_tag(self, stream: str, version: int, seq: int, event_hash: bytes, state: bytes) -> bytes:
        """The tag a snapshot of `stream` at `version`/`seq` (the event hashed `event_hash`) of `state` carries.

        ``chain.snapshot_tag`` under this store's id, and its key when keyed: only the key holder can tag
        a snapshot of a keyed store, so one opened without its key proves none (StoreKeyError). ValueError
        for a field no frame can hold.
        """
        if self.key_id is not None and self._key is None:
            raise StoreKeyError("this keyed store was opened without its key: its snapshots cannot be proven")
        return chain.snapshot_tag(self.store_id, stream, version, seq, event_hash, state, self._key)
