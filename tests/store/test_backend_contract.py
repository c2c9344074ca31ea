"""The contract every backend meets, in one abstract case: `BackendContract` speaks only through the
`Backend` protocol (and an `EventStore` over it), and each backend's subclass says only how to make one.

A backend's subclass (named ``Test...``, so pytest collects it; the abstract case is not) overrides the
`store_place` fixture (room for one test's store, cleaned up after it) and the four hooks below it.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import apsw
import psycopg
import pytest
from backend_contract import KEY_ID, LogRows, commit, flat, lease_row, runner_row, store_over
from faultvfs import FaultVFS
from pg import Server

from lifecycle_es import audit
from lifecycle_es.backend import MAX_EVENT_BYTES, MAX_SNAPSHOT_BYTES, PAGE_BYTES, PAGE_ROWS, Backend, Row
from lifecycle_es.backends import open_backend, server_target
from lifecycle_es.checkpoints import Checkpoint, sign_checkpoint
from lifecycle_es.errors import (
    IntegrityError,
    StoreBusyError,
    StoreError,
    StoreFencedError,
    StoreFormatError,
    StoreIOError,
)
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.postgres import PostgresBackend
from lifecycle_es.postgres_write import ServerTransaction
from lifecycle_es.signing import generate_key, load_signer
from lifecycle_es.sqlite import SqliteBackend

READ_MODEL_TABLES = {"runners", "leases", "read_model_position"}


class BackendContract:
    """The `Backend` contract; subclass it once per backend."""

    # --- what each backend's subclass says ------------------------------------------------------------

    @pytest.fixture
    def store_place(self) -> Iterator[None]:
        """Room for this test's store (none exists yet), and the cleaning up after the test."""
        raise NotImplementedError

    def open_backend(self, *, read_only: bool = False, busy_timeout_ms: int = 5000) -> Backend:
        """A new connection to this test's store; the first read-write one creates it, empty."""
        raise NotImplementedError

    def open_with_unknown_outcome(self) -> Backend:
        """A new connection to this test's store (which exists) whose next commit fails with its outcome
        unknown: whether it reached the storage cannot be told."""
        raise NotImplementedError

    def replace_storage(self) -> None:
        """Put another store where this test's store is, under the connections open on it."""
        raise NotImplementedError

    def drop_inserts(self) -> None:
        """Through another connection, make the storage silently skip every row inserted into the log."""
        raise NotImplementedError

    # --- the case's own plumbing ----------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _connections(self, store_place: None) -> Iterator[None]:
        self._opened: list[Backend] = []
        yield
        for backend in reversed(self._opened):
            backend.close()

    def connect(self, *, read_only: bool = False, busy_timeout_ms: int = 5000) -> Backend:
        """`open_backend`, closed after the test."""
        backend = self.open_backend(read_only=read_only, busy_timeout_ms=busy_timeout_ms)
        self._opened.append(backend)
        return backend

    def connect_unknown(self) -> Backend:
        """`open_with_unknown_outcome` (after the store was made), closed after the test."""
        self.connect()
        backend = self.open_with_unknown_outcome()
        self._opened.append(backend)
        return backend

    # --- a new store ------------------------------------------------------------------------------------

    def test_a_new_store_is_empty_exact_and_has_an_id(self) -> None:
        backend = self.connect()
        assert backend.head() == (0, None, None) and backend.head_at() is None
        assert backend.tail("a") == (0, 0, None, None) and backend.stream_version("a") == 0
        assert flat(backend.pages(after=0, stream=None)) == [] and backend.row_at(1) is None
        assert backend.streams() == [] and backend.seq_bounds() == (0, None)
        assert backend.snapshot_positions() == [] and backend.read_model_tables() == set()
        assert backend.schema_problems() == []
        assert isinstance(backend.meta("store_id"), bytes) and backend.meta("no such key") is None
        assert backend.read_only is False and backend.identity == backend.file_identity()

    # --- the log --------------------------------------------------------------------------------------

    def test_inserted_rows_read_back_in_order_by_after_stream_and_limit(self) -> None:
        backend, log = self.connect(), LogRows()
        rows = log.next("a", "b", "a", "b", "a")
        commit(backend, rows[:2])
        commit(backend, rows[2:])
        assert flat(backend.pages(after=0, stream=None)) == rows
        assert flat(backend.pages(after=2, stream=None)) == rows[2:]
        assert flat(backend.pages(after=0, stream="a")) == rows[0::2]
        assert flat(backend.pages(after=1, stream="a")) == [rows[2], rows[4]]
        assert flat(backend.pages(after=1, stream=None, limit=2)) == rows[1:3]
        assert flat(backend.pages(after=0, stream="b", limit=1)) == [rows[1]]
        assert flat(backend.pages(after=0, stream=None, limit=0)) == []
        assert flat(backend.pages(after=5, stream=None)) == []
        assert flat(backend.stream_pages("a", after_version=1)) == [rows[2], rows[4]]
        assert flat(backend.stream_pages("c", after_version=0)) == []

    def test_pages_within_read_a_seq_range_and_some_streams_in_seq_order(self) -> None:
        backend, log = self.connect(), LogRows()
        weird = ["it's", 'we"ird', "back\\slash", "ünï ⊕ 日本 🦀", "x') OR 1=1 --"]
        rows = log.next(*(["a", "b", "c", *weird] * (PAGE_ROWS // 4)))
        commit(backend, rows)
        head = rows[-1][0]

        def within(after: int, through: int, seqs: tuple[int, int], streams: Sequence[str]) -> list[list[Row]]:
            return list(backend.pages_within(after=after, through=through, seqs=seqs, streams=streams))

        def expected(after: int, through: int, seqs: tuple[int, int], streams: Sequence[str]) -> list[Row]:
            return [row for row in rows if after < row[0] <= through
                    and (seqs[0] <= row[0] <= seqs[1] or row[1] in streams)]

        cases = [(0, head, (100, PAGE_ROWS + 50), ["a"]),  # a range across a page's end, one stream beside it
                 (0, head, (1, 10), weird),  # the log's first rows; streams with quotes, a backslash, SQL
                 (0, head, (head - 5, head), ["b", "c"]),  # the log's last rows
                 (0, head, (head - 5, head + 10), []),  # no stream: the range alone, past the head
                 (0, head, (1, 0), ["c", "no such stream"]),  # an empty range: the streams alone
                 (50, head - 50, (1, head), []),  # after and through bound the range too
                 (0, head, (1, head), [])]  # the whole log
        for after, through, seqs, streams in cases:
            pages = within(after, through, seqs, streams)
            assert flat(pages) == expected(after, through, seqs, streams), (after, through, seqs, streams)
            assert all(0 < len(page) <= PAGE_ROWS for page in pages)
        whole = within(0, head, (1, head), [])
        assert [len(page) for page in whole] == [PAGE_ROWS, len(rows) - PAGE_ROWS] and flat(whole) == rows
        # One stream's rows alone span several pages' worth of seqs and still come back paged by rows.
        assert [len(page) for page in within(0, head, (1, 0), ["a", "b", "c", *weird])] == [PAGE_ROWS,
                                                                                          len(rows) - PAGE_ROWS]
        assert within(0, head, (1, 0), []) == [] and within(head, head + 5, (1, head), ["a"]) == []

    def test_pages_within_meet_an_oversized_body_where_pages_do(self) -> None:
        backend, log = self.connect(), LogRows()
        rows = log.next("a", "b") + log.next("b", size=MAX_EVENT_BYTES + 1) + log.next("a", "b")
        commit(backend, rows)
        assert flat(backend.pages_within(after=0, through=5, seqs=(1, 1), streams=["a"])) == [rows[0], rows[3]]
        read = []
        with pytest.raises(IntegrityError) as caught:
            for page in backend.pages_within(after=0, through=5, seqs=(5, 5), streams=["b"]):
                read.extend(page)
        assert caught.value.seq == 3 and read == [rows[1]]  # the rows before it are read first
        with pytest.raises(IntegrityError) as caught:
            flat(backend.pages_within(after=0, through=5, seqs=(2, 4), streams=[]))
        assert caught.value.seq == 3

    def test_a_read_is_paged_by_rows(self) -> None:
        backend, log = self.connect(), LogRows()
        rows = log.next(*["a"] * (PAGE_ROWS + 3))
        commit(backend, rows)
        pages = list(backend.pages(after=0, stream=None))
        assert [len(page) for page in pages] == [PAGE_ROWS, 3] and flat(pages) == rows
        assert [len(page) for page in backend.pages(after=0, stream="a", limit=PAGE_ROWS + 1)] == [PAGE_ROWS, 1]
        assert [len(page) for page in backend.stream_pages("a", after_version=2)] == [PAGE_ROWS, 1]

    def test_a_page_ends_once_its_bodies_reach_page_bytes(self) -> None:
        backend, log = self.connect(), LogRows()
        size = MAX_EVENT_BYTES - 24_288
        per_page = math.ceil(PAGE_BYTES / size)  # the row whose body reaches PAGE_BYTES ends the page
        assert per_page < PAGE_ROWS
        rows = log.next(*["a"] * (per_page + 2), size=size)
        commit(backend, rows)
        for pages in (list(backend.pages(after=0, stream=None)), list(backend.stream_pages("a", after_version=0))):
            assert [len(page) for page in pages] == [per_page, 2] and flat(pages) == rows

    def test_a_body_beyond_the_bound_is_an_integrity_error_at_its_seq(self) -> None:
        backend, log = self.connect(), LogRows()
        rows = log.next("a", "a") + log.next("a", size=MAX_EVENT_BYTES + 1) + log.next("a")
        commit(backend, rows)
        read = []
        with pytest.raises(IntegrityError) as caught:
            for page in backend.pages(after=0, stream=None):
                read.extend(page)
        assert caught.value.seq == 3 and read == rows[:2]  # the rows before it are read first
        with pytest.raises(IntegrityError) as caught:
            backend.row_at(3)
        assert caught.value.seq == 3
        with pytest.raises(IntegrityError) as caught:
            flat(backend.stream_pages("a", after_version=2))
        assert caught.value.seq == 3
        assert flat(backend.pages(after=3, stream=None)) == rows[3:]

    def test_stream_versions(self) -> None:
        backend, log = self.connect(), LogRows()
        commit(backend, log.next("a", "b", "a"))
        assert [backend.stream_version(s) for s in ("a", "b", "c")] == [2, 1, 0]
        commit(backend, log.next("b", "b", "a"))
        assert [backend.stream_version(s) for s in ("a", "b", "c")] == [3, 3, 0]
        assert [row[2] for row in flat(backend.pages(after=0, stream="b"))] == [1, 2, 3]

    def test_tail_and_head_after_appends(self) -> None:
        backend, log = self.connect(), LogRows()
        rows = log.next("a", "b", "a")
        commit(backend, rows)
        _, _, _, _, at, _, _, digest = rows[-1]
        assert backend.head() == (3, digest, at) and backend.head_at() == at
        assert backend.tail("a") == (2, 3, digest, at)
        assert backend.tail("b") == (1, 3, digest, at)
        assert backend.tail("new") == (0, 3, digest, at)

    def test_tail_and_head_inside_a_write_transaction(self) -> None:
        backend, log = self.connect(), LogRows()
        first = log.next("a")
        commit(backend, first)
        more = log.next("a", "b")
        with backend.write("append"):
            assert backend.tail("a") == (1, 1, first[0][7], first[0][4])
            assert backend.head_at() == first[0][4]
            backend.insert(more)  # what is written inside the transaction is seen inside it
            assert backend.head_at() == more[1][4]
            assert backend.tail("a") == (2, 3, more[1][7], more[1][4])
            assert backend.head() == (3, more[1][7], more[1][4])
            backend.put_snapshot("a", 2, 3, b"state", more[1][7])  # a write that is not an insert
            assert backend.tail("b") == (1, 3, more[1][7], more[1][4])
        assert backend.tail("a") == (2, 3, more[1][7], more[1][4])

    def test_every_read_inside_a_write_transaction_sees_its_rows(self) -> None:
        # A server backend may hold the rows back until the next statement: each kind of read must see them.
        backend, log = self.connect(), LogRows()
        commit(backend, log.next("a"))
        more = log.next("a", "b")
        reads = {
            "pages": lambda: flat(backend.pages(after=0, stream=None))[1:],
            "stream_pages": lambda: flat(backend.stream_pages("b", after_version=0)),
            "row_at": lambda: [backend.row_at(2), backend.row_at(3)],
            "stream_version": lambda: [backend.stream_version("b")],
            "seq_bounds": lambda: [backend.seq_bounds()],
            "streams": lambda: backend.streams(),
        }
        expected = {"pages": more, "stream_pages": more[1:], "row_at": more, "stream_version": [1],
                    "seq_bounds": [(3, 1)], "streams": ["a", "b"]}
        for name, read in reads.items():
            # Each read in a transaction of its own, rolled back: the next meets the rows held back afresh.
            with pytest.raises(RuntimeError, match="undo"), backend.write("append"):
                backend.insert(more)
                assert read() == expected[name], name
                raise RuntimeError("undo")
        assert backend.seq_bounds() == (1, 1) and backend.streams() == ["a"]

    def test_tail_sees_what_another_connection_committed(self) -> None:
        mine, other, log = self.connect(), self.connect(), LogRows()
        commit(mine, log.next("a"))  # what this connection last committed is not the head for long
        theirs = log.next("a")
        commit(other, theirs)
        with mine.write("append"):
            assert mine.tail("a") == (2, 2, theirs[0][7], theirs[0][4])
            assert mine.head_at() == theirs[0][4]

    def test_a_failed_write_transaction_keeps_nothing(self) -> None:
        backend, log = self.connect(), LogRows()
        commit(backend, log.next("a"))
        with pytest.raises(RuntimeError), backend.write("append"):
            backend.insert(log.next("a"))
            backend.set_meta("key_id", KEY_ID)
            raise RuntimeError("the block failed")
        assert backend.head()[0] == 1 and backend.meta("key_id") is None and backend.tail("a")[:2] == (1, 1)

    def test_the_database_clock_is_none_or_epoch_ms(self) -> None:
        clock = self.connect().clock_ms()
        # A file has no clock (the store's decides); a server's is its own: epoch ms, this century.
        assert clock is None or (isinstance(clock, int) and 1_700_000_000_000 < clock < 4_102_444_800_000)

    def test_a_savepoint_rolls_back_its_block_alone(self) -> None:
        backend, log = self.connect(), LogRows()
        commit(backend, log.next("a"))
        kept = log.next("a")
        with backend.write("batch"):
            with backend.savepoint("kept") as savepoint:
                backend.insert(kept)
            assert savepoint.lost is False
            with pytest.raises(RuntimeError, match="refused"), backend.savepoint("refused") as savepoint:
                backend.tail("b")
                backend.insert(log.next("b", "a"))  # its last write: what the backend keeps of the head
                raise RuntimeError("refused")
            assert savepoint.lost is False
            assert backend.tail("b") == (0, 2, kept[0][7], kept[0][4]) and backend.head_at() == kept[0][4]
        # Committed: the kept block only, and the head the next append chains onto is its row.
        assert flat(backend.pages(after=0, stream=None))[1:] == kept and backend.streams() == ["a"]
        with backend.write("append"):
            assert backend.tail("a") == (2, 2, kept[0][7], kept[0][4])

    def test_rows_keep_every_byte_of_their_text_and_bodies(self) -> None:
        # Streams the store would refuse still go in and come back as written (a backend stores, never
        # judges): quotes, backslashes, braces, a comma, and a stream spelled NULL, in one batch; then each
        # alone (a backend may spell a lone row differently from a batch's).
        backend, log = self.connect(), LogRows()
        weird = ['we"ird', "it's", "back\\slash", "{brace,comma}", "NULL", "E'\\x00'", "ünï ⊕ 日本"]
        rows = log.next(*weird, "NULL")
        rows = [(*row[:5], bytes(range(256)) + row[5], *row[6:]) for row in rows]
        commit(backend, rows)
        alone = []
        for stream in weird:
            row = log.next(stream)
            alone += [(*row[0][:5], bytes(range(255, -1, -1)) + row[0][5], *row[0][6:])]
            commit(backend, alone[-1:])
        assert flat(backend.pages(after=0, stream=None)) == rows + alone
        assert backend.tail("NULL")[:2] == (3, 15) and backend.stream_version('we"ird') == 2
        assert backend.stream_version("it's") == 2 and backend.stream_version("ünï ⊕ 日本") == 2

    def test_text_that_cannot_be_encoded_is_refused_and_the_next_commit_goes_through(self) -> None:
        # A lone surrogate has no UTF-8 form: refused whole, lone or batched, and nothing of it stays open.
        backend, log = self.connect(), LogRows()
        commit(backend, log.next("a"))
        rewind = (log.seq, log.versions.copy(), log.prev)
        for streams in (("bad",), ("b", "bad")):
            rows = [(row[0], "bad\udcff", *row[2:]) if row[1] == "bad" else row for row in log.next(*streams)]
            with pytest.raises((StoreError, ValueError)):
                commit(backend, rows)
            log.seq, log.versions, log.prev = rewind[0], rewind[1].copy(), rewind[2]
        # Nothing held open: another connection writes at once (a lock left behind would make it wait, then fail).
        other = self.connect(busy_timeout_ms=300)
        commit(other, log.next("b"))
        commit(backend, log.next("c"))
        assert [row[1] for row in flat(backend.pages(after=0, stream=None))] == ["a", "b", "c"]

    def test_a_block_that_only_appended_then_raised_is_undone_alone(self) -> None:
        # No statement of its own: a server backend may have kept its rows back; either way they are gone, the
        # head and versions it moved are put back, and the next block appends the same seqs.
        backend, log = self.connect(), LogRows()
        commit(backend, log.next("a"))
        kept = log.next("a")
        with backend.write("batch", ["a", "b"]):
            with backend.savepoint("kept"):
                backend.insert(kept)
            rewind = (log.seq, log.versions.copy(), log.prev)
            with pytest.raises(RuntimeError, match="refused"), backend.savepoint("refused") as savepoint:
                backend.insert(log.next("b", "a"))
                raise RuntimeError("refused")
            assert savepoint.lost is False
            assert backend.tail("a") == (2, 2, kept[0][7], kept[0][4]) and backend.tail("b")[0] == 0
            log.seq, log.versions, log.prev = rewind
            after = log.next("b")
            with backend.savepoint("after"):
                backend.insert(after)
            assert backend.tail("b") == (1, 3, after[0][7], after[0][4])
        assert flat(backend.pages(after=0, stream=None))[1:] == kept + after

    def test_rows_the_storage_drops_fail_their_batch_and_nothing_commits(self) -> None:
        backend, log = self.connect(), LogRows()
        first = log.next("a")
        commit(backend, first)
        self.drop_inserts()
        with pytest.raises(StoreFormatError), backend.write("batch", ["a", "b"]):
            with backend.savepoint("one"):
                backend.insert(log.next("a"))
            with backend.savepoint("two"):
                backend.insert(log.next("b"))
        assert backend.head() == (1, first[0][7], first[0][4]) and backend.streams() == ["a"]

    def test_row_at_streams_and_seq_bounds(self) -> None:
        backend, log = self.connect(), LogRows()
        rows = log.next("c", "a", "b", "a")
        commit(backend, rows)
        assert [backend.row_at(seq) for seq in (1, 4)] == [rows[0], rows[3]]
        assert backend.row_at(0) is None and backend.row_at(5) is None
        assert backend.streams() == ["a", "b", "c"]
        assert backend.seq_bounds() == (4, 1)

    def test_read_transaction_is_one_view(self) -> None:
        mine, other, log = self.connect(), self.connect(), LogRows()
        commit(mine, log.next("a"))
        with mine.read_tx("read twice"):
            before = mine.head()
            commit(other, log.next("a"))
            assert mine.head() == before and flat(mine.pages(after=0, stream=None))[-1][0] == 1
        assert mine.head()[0] == 2

    # --- metadata, snapshots, read models -------------------------------------------------------------

    def test_meta_is_set_and_read(self) -> None:
        backend = self.connect()
        store_id = backend.meta("store_id")
        with backend.write("meta"):
            backend.set_meta("key_id", KEY_ID)
        assert backend.meta("key_id") == KEY_ID and backend.meta("store_id") == store_id
        assert backend.meta("question") is None and backend.schema_problems() == []

    def test_snapshots_are_put_replaced_listed_and_cleared(self) -> None:
        backend = self.connect()
        assert backend.snapshot("a") is None
        with backend.write("snapshots"):
            backend.put_snapshot("b", 4, 9, b"state b", b"h9")
            backend.put_snapshot("a", 2, 5, b"state a", b"h5")
        assert backend.snapshot("a") == (2, 5, b"state a", b"h5")
        assert backend.snapshot_positions() == [("a", 5), ("b", 9)]
        with backend.write("snapshots"):
            backend.put_snapshot("a", 7, 12, b"state a'", b"h12")
        assert backend.snapshot("a") == (7, 12, b"state a'", b"h12")
        assert backend.snapshot_positions() == [("b", 9), ("a", 12)]
        with backend.write("snapshots"):
            backend.clear_snapshots()
        assert backend.snapshot("a") is None and backend.snapshot_positions() == []

    def test_a_snapshot_beyond_the_bound_reads_as_empty_bytes(self) -> None:
        # A state no store writes (a file's or a table's writer made it): its size read, never the value.
        backend = self.connect()
        with backend.write("snapshots"):
            backend.put_snapshot("a", 2, 5, b"s" * MAX_SNAPSHOT_BYTES, b"h5")
            backend.put_snapshot("b", 3, 6, b"s" * (MAX_SNAPSHOT_BYTES + 1), b"h6")
        assert backend.snapshot("a") == (2, 5, b"s" * MAX_SNAPSHOT_BYTES, b"h5")
        assert backend.snapshot("b") == (3, 6, b"", b"h6")

    def test_host_leases_are_put_replaced_and_read_per_runner(self) -> None:
        backend = self.connect()
        assert backend.host_lease("a") is None
        with backend.write("take"):
            backend.put_host_lease("a", "host-1/boot/i1", 1, 15_000)
            backend.put_host_lease("b", "host-2/boot/i2", 7, 9_000)
            assert backend.host_lease("a") == ("host-1/boot/i1", 1, 15_000)  # seen inside the transaction
        with backend.write("take over"):
            backend.put_host_lease("a", "host-3/boot/i3", 2, 40_000)
        assert backend.host_lease("a") == ("host-3/boot/i3", 2, 40_000)
        assert backend.host_lease("b") == ("host-2/boot/i2", 7, 9_000)
        assert backend.schema_problems() == []

    def test_a_host_lease_row_is_what_another_connection_committed_and_a_failed_write_keeps_none(self) -> None:
        mine, other = self.connect(), self.connect()
        with other.write("take"):
            other.put_host_lease("a", "host-1/boot/i1", 3, 15_000)
        with mine.write("check"):
            assert mine.host_lease("a") == ("host-1/boot/i1", 3, 15_000)
        with pytest.raises(RuntimeError), mine.write("renew"):
            mine.put_host_lease("a", "host-1/boot/i1", 3, 99_000)
            raise RuntimeError("the block failed")
        assert other.host_lease("a") == ("host-1/boot/i1", 3, 15_000)

    def test_read_model_tables_are_created_kept_and_dropped(self) -> None:
        backend = self.connect()
        assert backend.read_model_position() is None and backend.read_model_rows("runners") == []
        with backend.write("create"):
            backend.create_read_models(indexes=False)
            backend.create_read_model_indexes()
        assert backend.read_model_tables() == READ_MODEL_TABLES and backend.read_model_position() == 0
        with backend.write("fill"):
            backend.upsert_runner_rows([runner_row("r2", 1), runner_row("r1", 1)])
            backend.upsert_lease_rows([lease_row("r2", "l1"), lease_row("r1", "l2"), lease_row("r1", "l1")])
            backend.set_read_model_position(3)
        assert backend.read_model_rows("runners") == [runner_row("r1", 1), runner_row("r2", 1)]
        assert backend.read_model_rows("leases") == [lease_row("r1", "l1"), lease_row("r1", "l2"),
                                                     lease_row("r2", "l1")]
        with backend.write("change"):
            backend.upsert_runner_rows([runner_row("r1", 2)])
            backend.upsert_lease_rows([lease_row("r1", "l2", "settled")])
            backend.delete_lease_rows([("r1", "l1")])
            backend.set_read_model_position(5)
        assert backend.read_model_rows("runners") == [runner_row("r1", 2), runner_row("r2", 1)]
        assert backend.lease_rows_of("r1") == [lease_row("r1", "l2", "settled")]
        assert backend.lease_rows_of("r3") == [] and backend.read_model_position() == 5
        with backend.write("drop"):
            backend.drop_read_models()
        assert backend.read_model_tables() == set() and backend.read_model_position() is None
        assert backend.read_model_rows("leases") == [] and backend.lease_rows_of("r1") == []

    def test_read_models_read_inside_a_write_transaction_see_it(self) -> None:
        # The projector reads its position and a runner's lease rows in the event transaction: a read there
        # that came back empty would replay the whole log into the tables on every append.
        backend = self.connect()
        with backend.write("create and fill"):
            backend.create_read_models()
            assert backend.read_model_tables() == READ_MODEL_TABLES and backend.read_model_position() == 0
            backend.upsert_runner_rows([runner_row("r1", 1)])
            backend.upsert_lease_rows([lease_row("r1", "l1")])
            backend.set_read_model_position(4)
            assert backend.read_model_position() == 4
            assert backend.read_model_rows("runners") == [runner_row("r1", 1)]
            assert backend.lease_rows_of("r1") == [lease_row("r1", "l1")]
        with backend.write("advance"):
            assert backend.read_model_position() == 4
            backend.set_read_model_position(6)
            assert backend.read_model_position() == 6

    # --- connections: busy, read-only, fence, data_version, identity ------------------------------------

    def test_a_write_waits_for_the_lock_then_is_busy(self) -> None:
        waiting, holder = self.connect(busy_timeout_ms=50), self.connect()
        store = store_over(waiting)
        with holder.write("hold the lock"):
            with pytest.raises(StoreBusyError), waiting.write("meta"):
                waiting.set_meta("key_id", KEY_ID)
            with pytest.raises(StoreBusyError):
                store.append_unchecked("a", [ReclaimCompleted(generation=1)])
            assert waiting.head()[0] == 0  # reads go on beside a writer
        assert waiting.meta("key_id") is None
        assert store.append_unchecked("a", [ReclaimCompleted(generation=1)])[0].seq == 1

    def test_a_read_only_backend_reads_everything_and_the_store_refuses_writes(self) -> None:
        writer, log = self.connect(), LogRows()
        rows = log.next("a", "b")
        with writer.write("fill"):
            writer.insert(rows)
            writer.put_snapshot("a", 1, 1, b"state", rows[0][7])
            writer.create_read_models()
            writer.upsert_runner_rows([runner_row("r1", 1)])
            writer.upsert_lease_rows([lease_row("r1", "l1")])
            writer.set_read_model_position(2)
        reader = self.connect(read_only=True)
        assert reader.read_only is True and reader.schema_problems() == []
        assert flat(reader.pages(after=0, stream=None)) == rows and reader.row_at(2) == rows[1]
        assert flat(reader.stream_pages("b", after_version=0)) == rows[1:]
        assert reader.head() == writer.head() and reader.tail("a") == (1, 2, rows[1][7], rows[1][4])
        assert reader.streams() == ["a", "b"] and reader.seq_bounds() == (2, 1) and reader.stream_version("b") == 1
        assert reader.meta("store_id") == writer.meta("store_id") and reader.meta("key_id") is None
        assert reader.snapshot("a") == (1, 1, b"state", rows[0][7]) and reader.snapshot_positions() == [("a", 1)]
        assert reader.read_model_tables() == READ_MODEL_TABLES and reader.read_model_position() == 2
        assert reader.read_model_rows("runners") == [runner_row("r1", 1)]
        assert reader.lease_rows_of("r1") == [lease_row("r1", "l1")]
        with pytest.raises(StoreIOError):
            store_over(reader).append("a", [ReclaimCompleted(generation=1)])
        assert writer.head()[0] == 2

    def test_a_fenced_store_refuses_writes_and_still_reads(self) -> None:
        store = store_over(self.connect())
        store.append_unchecked("a", [ReclaimCompleted(generation=1)])
        store.fence("another process took over")
        for _ in range(2):
            with pytest.raises(StoreFencedError):
                store.append_unchecked("a", [ReclaimCompleted(generation=2)])
        assert store.fenced == "another process took over"
        assert store.head().seq == 1 and [e.seq for e in store.read()] == [1] and store.verify().events == 1

    def test_data_version_moves_when_another_connection_commits(self) -> None:
        mine, other = self.connect(), self.connect()
        before = mine.data_version()
        assert mine.data_version() == before
        with other.read_tx("read"):
            other.head()
        assert mine.data_version() == before  # a read elsewhere is no change
        commit(other, LogRows().next("a"))
        after = mine.data_version()
        assert after != before and mine.data_version() == after

    def test_identity_holds_until_the_storage_is_replaced(self) -> None:
        backend = self.connect()
        store = store_over(backend)
        store.append_unchecked("a", [ReclaimCompleted(generation=1)])
        assert backend.identity == backend.file_identity()
        self.replace_storage()
        assert backend.file_identity() != backend.identity
        with pytest.raises(StoreFencedError):
            backend.data_version()  # a follower's poll: never a number of the storage now there
        with pytest.raises(StoreFencedError) as fenced:
            store.append_unchecked("a", [ReclaimCompleted(generation=2)])
        assert store.fenced is not None and store.fenced == fenced.value.cause
        assert str(fenced.value).count("the store is fenced") == 1
        with pytest.raises(StoreFencedError):  # the fence stays
            store.append_unchecked("a", [ReclaimCompleted(generation=2)])

    def test_check_followed_passes_up_to_the_head_and_names_the_first_seq_gone_past_it(self) -> None:
        store = store_over(self.connect())
        store.check_followed(0)
        store.append_unchecked("a", [ReclaimCompleted(generation=1), ReclaimCompleted(generation=2)])
        store.check_followed(2)
        with pytest.raises(IntegrityError) as caught:
            store.check_followed(4)  # a follower yielded seq 4: the log went back under it
        assert caught.value.seq == 3 and "went back from seq 4 to 2" in str(caught.value)
        assert store.fenced is None  # the log's state, not this handle's: it still writes
        store.append_unchecked("a", [ReclaimCompleted(generation=3)])

    # --- commits the storage may not have kept ---------------------------------------------------------

    def test_a_commit_of_unknown_outcome_says_so(self) -> None:
        backend = self.connect_unknown()
        with pytest.raises(StoreIOError) as caught, backend.write("append"):
            backend.insert(LogRows().next("a"))
        assert caught.value.outcome_unknown is True

    def test_a_store_whose_commit_outcome_is_unknown_fences_itself(self) -> None:
        store = store_over(self.connect_unknown())
        with pytest.raises(StoreIOError) as caught:
            store.append_unchecked("a", [ReclaimCompleted(generation=1)])
        assert caught.value.outcome_unknown is True and store.fenced is not None
        # Said as it is, whatever left it unknown (a failed fsync, a connection lost at the commit).
        assert "outcome unknown" in store.fenced and "reopen the store" in store.fenced
        assert ("fsync" in store.fenced) == ("fsync" in str(caught.value))
        with pytest.raises(StoreFencedError):
            store.append_unchecked("a", [ReclaimCompleted(generation=2)])
        store.head()  # reads go on

    def test_an_insert_the_storage_drops_is_refused(self) -> None:
        backend, log = self.connect(), LogRows()
        first = log.next("a")
        commit(backend, first)
        self.drop_inserts()
        with pytest.raises(StoreFormatError), backend.write("append"):
            backend.insert(log.next("a", "b"))
        assert backend.head() == (1, first[0][7], first[0][4]) and backend.tail("a")[:2] == (1, 1)
        store = store_over(backend)
        with pytest.raises(StoreFormatError):
            store.append_unchecked("a", [ReclaimCompleted(generation=1)])
        assert store.head().seq == 1 and [e.seq for e in store.read()] == [1]

    # --- signed checkpoints ----------------------------------------------------------------------------

    def test_a_signed_checkpoint_names_the_head_and_is_held_to_it(self) -> None:
        # A checkpoint is (store id, seq, head hash, at, key id): nothing of the database's, so a store over
        # any backend signs, and is audited against its checkpoints, the same way.
        store = store_over(self.connect())
        store.append_unchecked("a", [ReclaimCompleted(generation=1), ReclaimCompleted(generation=2)])
        with tempfile.TemporaryDirectory() as directory:
            key, checkpoints = os.path.join(directory, "ops.key"), os.path.join(directory, "cp")
            generate_key(key)
            signed = store.checkpoint(load_signer(key), checkpoints)
            head = store.head()
            assert (signed.store_id, signed.seq, signed.hash, signed.key_id) == (
                store.store_id.hex(), 2, head.hash.hex(), None)
            store.append_unchecked("a", [ReclaimCompleted(generation=3)])
            report = audit(store, trust=key + ".pub", checkpoints=checkpoints)
            assert report.checks["checkpoints"] is True and report.checkpoints == {
                "path": checkpoints, "ok": True, "checked": 1, "seq": 2}
            forged = Checkpoint(signed.store_id, 3, signed.hash, signed.at, None)
            with open(checkpoints, "a", encoding="utf-8") as out:
                out.write(sign_checkpoint(forged, load_signer(key)) + "\n")
            report = audit(store, trust=key + ".pub", checkpoints=checkpoints)
            assert [problem.seq for problem in report.problems if problem.kind == "checkpoint"] == [3]


class TestSqliteBackend(BackendContract):
    """The SQLite backend: a store file in the test's temporary directory."""

    @pytest.fixture
    def store_place(self, tmp_path: Path) -> Iterator[None]:
        self.path = os.path.join(tmp_path, "events.db")
        self.vfs: list[FaultVFS] = []
        yield
        for vfs in self.vfs:
            vfs.unregister()

    def open_backend(self, *, read_only: bool = False, busy_timeout_ms: int = 5000) -> Backend:
        return SqliteBackend(self.path, durability="full", busy_timeout_ms=busy_timeout_ms, read_only=read_only)

    def open_with_unknown_outcome(self) -> Backend:
        # The fault-injecting VFS fails the next fsync: the one a commit makes of the WAL.
        vfs = FaultVFS(f"contract-{len(self.vfs)}-{os.getpid()}")
        self.vfs.append(vfs)
        backend = SqliteBackend(self.path, durability="full", busy_timeout_ms=5000, vfs=vfs.name)
        vfs.inject("sync", apsw.SQLITE_IOERR_FSYNC, at=1)
        return backend

    def replace_storage(self) -> None:
        other = self.path + ".other"
        SqliteBackend(other, durability="full", busy_timeout_ms=5000).close()
        os.rename(self.path, self.path + ".moved")
        os.replace(other, self.path)

    def drop_inserts(self) -> None:
        conn = apsw.Connection(self.path)
        with contextlib.closing(conn):
            conn.set_busy_timeout(5000)
            conn.execute("CREATE TRIGGER skip BEFORE INSERT ON events BEGIN SELECT RAISE(IGNORE); END")


    def test_pages_within_name_text_that_is_not_utf8_at_its_seq(self) -> None:
        # A file edited by hand: a row's type is bytes that do not decode. A page that reaches it ends before
        # it, and the page it begins names its seq, as `pages` does; a row not wanted is never decoded.
        backend, log = self.connect(), LogRows()
        rows = log.next("a", "b", "a", "b")
        commit(backend, rows)
        conn = apsw.Connection(self.path)
        with contextlib.closing(conn):
            conn.execute("DROP TRIGGER events_no_update")
            conn.execute("UPDATE events SET type = CAST(X'ff' AS TEXT) WHERE seq = 3")
        assert flat(backend.pages_within(after=0, through=4, seqs=(1, 1), streams=["b"])) == [rows[0], rows[1], rows[3]]
        with pytest.raises(IntegrityError) as caught:
            flat(backend.pages_within(after=0, through=4, seqs=(1, 0), streams=["a"]))
        assert caught.value.seq == 3 and "not valid UTF-8" in caught.value.reason


class TestPostgresBackend(BackendContract):
    """The PostgreSQL backend: a store in a schema of its own on the throwaway cluster."""

    @pytest.fixture
    def store_place(self, pg_server: Server) -> Iterator[None]:
        self.server = pg_server
        self.schema = pg_server.new_schema()
        self.url = pg_server.url(self.schema)
        yield
        pg_server.drop(self.schema)

    def open_backend(self, *, read_only: bool = False, busy_timeout_ms: int = 5000) -> Backend:
        return open_backend(self.url, busy_timeout_ms=busy_timeout_ms, read_only=read_only)

    def open_with_unknown_outcome(self) -> Backend:
        # The server process serving this connection is killed once the transaction's statements ran and
        # before its COMMIT is sent: the connection is lost with the COMMIT in flight.
        return _DyingAtCommit(server_target(self.url), durability="full", busy_timeout_ms=5000)

    def replace_storage(self) -> None:
        with self.server.connect() as conn:  # type: ignore[attr-defined]
            conn.execute(f"DROP SCHEMA {self.schema} CASCADE")
        open_backend(self.url).close()

    def drop_inserts(self) -> None:
        with self.server.connect() as conn:  # type: ignore[attr-defined]
            conn.execute(f"CREATE RULE skip AS ON INSERT TO {self.schema}.events DO INSTEAD NOTHING")

    @pytest.mark.parametrize("setting", ["off", "on"])
    def test_a_commit_spells_its_rows_the_same_whatever_standard_conforming_strings_says(self, setting: str) -> None:
        # A transaction's last rows go with its COMMIT as constants in the query's text: quotes, backslashes and
        # every byte of a body come back as written, lone and batched, with backslashes escapes or not.
        backend, log = self.connect(), LogRows()
        backend.conn.execute(f"SET standard_conforming_strings = {setting}")  # type: ignore[attr-defined]
        weird = ["it's", "back\\slash", "E'\\x00'", "'; COMMIT; --"]
        written = []
        for stream in weird:
            for rows in (log.next(stream), log.next(stream, stream)):
                written += [(*row[:5], bytes(range(256)) + b"\\'" + row[5], *row[6:]) for row in rows]
                commit(backend, written[-len(rows):])
        assert flat(backend.pages(after=0, stream=None)) == written
        assert [backend.stream_version(stream) for stream in weird] == [3, 3, 3, 3]

    def test_a_nul_in_a_text_is_refused_before_it_can_cut_a_commit_short(self) -> None:
        # A query's text ends at a NUL: such a row goes with parameters, which the client refuses whole.
        backend, log = self.connect(), LogRows()
        commit(backend, log.next("a"))
        for rows in (log.next("a\0b"), log.next("c", "a\0b")):
            with pytest.raises(StoreError) as refused:
                commit(backend, rows)
            assert "NUL" in str(refused.value) and not getattr(refused.value, "outcome_unknown", False), refused.value
        assert [row[1] for row in flat(backend.pages(after=0, stream=None))] == ["a"]


class _DyingAtCommit(PostgresBackend):
    """A backend whose write transactions lose their connection just before COMMIT."""

    def write(self, action: str, streams: Sequence[str] = ()) -> ServerTransaction:
        return _DyingTransaction(self, action, streams)


class _DyingTransaction(ServerTransaction):
    __slots__ = ()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> Literal[False]:
        if exc is None:
            conn = self.backend.conn
            pid = conn.info.backend_pid
            with psycopg.connect(conn.info.dsn, autocommit=True) as killer:
                killer.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
        return super().__exit__(kind, exc, tb)
