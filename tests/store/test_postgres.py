"""What only a store on a PostgreSQL server has: its URL, the server's settings, the writer role, the exact
schema check against a superuser's edits, NOTIFY for followers, a reconnect, and clear errors for a
server that is not there or not a store. (Everything both backends share runs in the suites and the
backend contract, on both.)"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from pg import Server, cluster

from lifecycle_es import EventStore
from lifecycle_es.backends import has_password, mask_password, server_target
from lifecycle_es.errors import (
    InvalidInputError,
    StoreBehindSealError,
    StoreError,
    StoreFencedError,
    StoreFormatError,
    StoreIOError,
    StorePragmaError,
)
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.store import WriteTransaction


def superuser(server: Server) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(server.conninfo(), autocommit=True)


def event(generation: int = 1) -> ReclaimCompleted:
    return ReclaimCompleted(generation=generation)


@pytest.fixture
def schema(pg_schema: str) -> str:
    return pg_schema


# --- the URL ------------------------------------------------------------------------------------------


def test_a_url_opens_a_store_that_keeps_the_same_chain_bytes_as_a_file(pg_url: str, tmp_path: object) -> None:
    with EventStore.open(pg_url, now=lambda: 1_767_225_600_000) as server, \
            EventStore.open(f"{tmp_path}/events.db", now=lambda: 1_767_225_600_000) as file:
        assert server.path.startswith("postgresql://") and server.head().seq == 0
        for store in (server, file):
            store.append_unchecked("a", [event(1), event(2)])
            store.append_unchecked("b", [event(1)])
        rows = [(e.seq, e.stream, e.version, e.type, e.at, e.body) for e in server.read()]
        assert rows == [(e.seq, e.stream, e.version, e.type, e.at, e.body) for e in file.read()]
        assert server.verify().events == 3 and server.streams() == ["a", "b"]


def test_postgres_scheme_and_schema_parameter(pg_server: Server, schema: str) -> None:
    url = pg_server.url(schema).replace("postgresql://", "postgres://")
    with EventStore.open(url) as store:
        store.append_unchecked("a", [event()])
    with superuser(pg_server) as conn:
        assert conn.execute(f"SELECT count(*) FROM {schema}.events").fetchone() == (1,)  # type: ignore[arg-type]


@pytest.mark.parametrize("query, field", [("schema=Bad-Name", "path"), ("schema=1x", "path"),
                                          ("notify=maybe", "path")])
def test_bad_url_parameters_are_refused(pg_server: Server, query: str, field: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        EventStore.open(f"postgresql://postgres@/postgres?host={pg_server.directory}&{query}")
    assert refused.value.field == field


def test_a_password_never_shows(pg_server: Server) -> None:
    url = f"postgresql://postgres:hunter2@/postgres?host={pg_server.directory}&schema=t_pw"
    target = server_target(url)
    assert "hunter2" not in repr(target) and "hunter2" not in target.shown
    assert mask_password("postgresql://u:hunter2@h/db?password=hunter2") == "postgresql://u:***@h/db?password=***"
    with EventStore.open(url) as store:
        assert "hunter2" not in store.path and "hunter2" not in repr(store)
    pg_server.drop("t_pw")


# --- errors a user meets ------------------------------------------------------------------------------


def test_an_unreachable_server_is_one_clear_store_error(tmp_path: object) -> None:
    with pytest.raises(StoreIOError) as failed:
        EventStore.open(f"postgresql://nobody:hunter2@/postgres?host={tmp_path}")
    assert "cannot connect to postgresql://nobody:***@" in str(failed.value) and "hunter2" not in str(failed.value)


@pytest.mark.parametrize("secret", ["u:hunter2%zz@", "u@?password=hunter2%zz&", "u@?pass%77ord=hunter2%zz&",
                                    "u@?sslpassword=hunter2%zz&"])
def test_a_password_libpq_quotes_from_a_malformed_url_never_shows(tmp_path: object, secret: str) -> None:
    # libpq names the token it could not decode, the whole password with it; the URL is what to fix.
    user, _, query = secret.partition("?")
    with pytest.raises(StoreIOError) as failed:
        EventStore.open(f"postgresql://{user}/postgres?{query}host={tmp_path}")
    message = str(failed.value)
    assert "hunter2" not in message and "percent-encoded" in message and "fix the URL" in message, message


def test_every_password_parameter_libpq_reads_is_masked() -> None:
    # libpq decodes a parameter's name as it does its value, and sslpassword unlocks the client's key.
    url = "postgresql://u@h/db?pass%77ord=hunter2&sslpassword=s3cret&sslmode=require"
    assert mask_password(url) == "postgresql://u@h/db?pass%77ord=***&sslpassword=***&sslmode=require"
    assert has_password(url) and has_password("postgresql://u@h/db?sslpassword=s3cret")


@pytest.mark.parametrize("url", ["postgresql://[::1/db?password=hunter2", "postgresql://u@[::1/db?sslpassword=hunter2&x=1",
                                 "postgresql://u:hunter2@[::1/db"])
def test_a_url_too_malformed_to_split_never_shows_its_password(url: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        EventStore.open(url)
    assert "hunter2" not in str(refused.value) and "not a valid URL" in str(refused.value)


def test_a_refused_login_is_a_store_io_error(pg_server: Server) -> None:
    with pytest.raises(StoreIOError) as failed:
        EventStore.open(f"postgresql://postgres@/no_such_database?host={pg_server.directory}")
    assert "no_such_database" in str(failed.value)


def test_a_schema_that_is_not_a_store_is_refused(pg_server: Server, schema: str) -> None:
    with superuser(pg_server) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
        conn.execute(f"CREATE TABLE {schema}.meta (key text, value text)")  # type: ignore[arg-type]
    with pytest.raises(StoreFormatError, match="not a lifecycle-es store"):
        EventStore.open(pg_server.url(schema))


def test_a_read_only_open_of_a_missing_store_is_refused_and_creates_nothing(pg_server: Server, schema: str) -> None:
    with pytest.raises(StoreFormatError, match="holds no lifecycle-es store"):
        EventStore.open(pg_server.url(schema), read_only=True)
    with superuser(pg_server) as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone() == (None,)


def test_a_schema_from_a_newer_version_is_refused(pg_server: Server, pg_url: str) -> None:
    EventStore.open(pg_url).close()
    schema = server_target(pg_url).schema
    with superuser(pg_server) as conn:
        conn.execute(f"UPDATE {schema}.meta SET value = '9' WHERE key = 'schema_version'")  # type: ignore[arg-type]
    with pytest.raises(StoreFormatError, match="newer than this library"):
        EventStore.open(pg_url)


# --- the server's settings ------------------------------------------------------------------------------


def test_synchronous_commit_off_is_refused_unless_durability_is_normal(pg_server: Server, pg_url: str) -> None:
    with superuser(pg_server) as conn:
        conn.execute("CREATE ROLE lazy LOGIN SUPERUSER")
        conn.execute("ALTER ROLE lazy SET synchronous_commit = off")
    try:
        url = pg_url.replace("postgresql://postgres@", "postgresql://lazy@")
        with pytest.raises(StorePragmaError) as refused:
            EventStore.open(url)
        assert refused.value.pragma == "synchronous_commit" and "durability='normal'" in str(refused.value)
        with EventStore.open(url, durability="normal") as store:
            store.append_unchecked("a", [event()])
    finally:
        with superuser(pg_server) as conn:
            conn.execute("DROP OWNED BY lazy")
            conn.execute("DROP ROLE lazy")


@pytest.mark.parametrize("setting", ["fsync", "full_page_writes"])
def test_a_server_that_may_lose_acknowledged_commits_is_refused(pg_server: Server, setting: str) -> None:
    with cluster(**{setting: "off"}) as careless:
        with pytest.raises(StorePragmaError) as refused:
            EventStore.open(careless.url("fleet"))
        assert refused.value.pragma == setting and f"set {setting} = on" in str(refused.value)
        with superuser(careless) as conn:  # refused before anything was made
            assert conn.execute("SELECT to_regnamespace('fleet')").fetchone() == (None,)


# --- the writer role and a superuser's edits --------------------------------------------------------------


def test_the_writer_role_appends_but_cannot_change_events(pg_server: Server, pg_url: str) -> None:
    from lifecycle_es.postgres_schema import writer_grants

    EventStore.open(pg_url).close()
    schema = server_target(pg_url).schema
    with superuser(pg_server) as conn:
        conn.execute("CREATE ROLE fleet_writer LOGIN")
        for statement in writer_grants(schema, "fleet_writer"):
            conn.execute(statement)  # type: ignore[arg-type]
    try:
        url = pg_url.replace("postgresql://postgres@", "postgresql://fleet_writer@")
        with EventStore.open(url) as store:
            store.append_unchecked("a", [event(1), event(2)])
            assert store.verify().events == 2
        with psycopg.connect(f"host={pg_server.directory} user=fleet_writer dbname=postgres",
                             autocommit=True) as writer:
            for statement in (f"UPDATE {schema}.events SET at = at", f"DELETE FROM {schema}.events",
                              f"TRUNCATE {schema}.events", f"ALTER TABLE {schema}.events DISABLE TRIGGER ALL",
                              f"CREATE RULE r AS ON INSERT TO {schema}.events DO INSTEAD NOTHING"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    writer.execute(statement)  # type: ignore[arg-type]
    finally:
        with superuser(pg_server) as conn:
            conn.execute("DROP OWNED BY fleet_writer")
            conn.execute("DROP ROLE fleet_writer")


def test_triggers_refuse_update_delete_and_truncate_even_for_the_owner(pg_server: Server, pg_url: str) -> None:
    with EventStore.open(pg_url) as store:
        store.append_unchecked("a", [event()])
    schema = server_target(pg_url).schema
    with superuser(pg_server) as conn:
        for statement in (f"UPDATE {schema}.events SET at = at", f"DELETE FROM {schema}.events",
                          f"TRUNCATE {schema}.events"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(statement)  # type: ignore[arg-type]


@pytest.mark.parametrize("alteration", [
    "ALTER TABLE {s}.events DISABLE TRIGGER events_no_change",
    "DROP TRIGGER events_no_truncate ON {s}.events",
    "CREATE RULE hide AS ON INSERT TO {s}.events DO INSTEAD NOTHING",
    "CREATE TRIGGER extra BEFORE INSERT ON {s}.events FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
    "ALTER TABLE {s}.events ENABLE ROW LEVEL SECURITY",
    "CREATE VIEW {s}.v AS SELECT 1",
    "CREATE INDEX extra ON {s}.events (at)",
    "ALTER TABLE {s}.events DROP CONSTRAINT events_stream_version_key",
    "CREATE TABLE {s}.shadow () INHERITS ({s}.events)",
    "CREATE OR REPLACE FUNCTION {s}.advance_head(first_seq bigint, first_prev bytea, last_seq bigint,"
    " last_hash bytea, last_at text) RETURNS void LANGUAGE plpgsql AS $$BEGIN END$$",
    "INSERT INTO {s}.meta VALUES ('extra', 'x')",
    "UPDATE {s}.head SET seq = seq + 5",
])
def test_a_schema_altered_by_a_superuser_is_reported_and_refused_to_writers(pg_server: Server, pg_url: str,
                                                                            alteration: str) -> None:
    with EventStore.open(pg_url) as store:
        store.append_unchecked("a", [event()])
    schema = server_target(pg_url).schema
    with superuser(pg_server) as conn:
        conn.execute(alteration.format(s=schema))  # type: ignore[arg-type]
    with EventStore.open(pg_url, read_only=True) as reader:
        assert reader.schema_problems(), alteration
    with pytest.raises(StoreFormatError, match="altered outside lifecycle-es"):
        EventStore.open(pg_url)


def test_a_rule_planted_under_an_open_writer_loses_no_acknowledged_write(pg_server: Server, pg_url: str) -> None:
    with EventStore.open(pg_url) as store:
        store.append_unchecked("a", [event(1)])
        with superuser(pg_server) as conn:
            conn.execute(f"CREATE RULE hide AS ON INSERT TO {server_target(pg_url).schema}.events "  # type: ignore[arg-type]
                         "DO INSTEAD NOTHING")
        with pytest.raises(StoreFormatError, match="did not keep the write"):
            store.append_unchecked("a", [event(2)])
        assert store.head().seq == 1 and [e.seq for e in store.read()] == [1]


# --- identity, reconnects, followers ------------------------------------------------------------------------


def test_a_lost_connection_reconnects_and_a_head_rolled_back_behind_it_fences(pg_server: Server, pg_url: str) -> None:
    with EventStore.open(pg_url) as store:
        store.append_unchecked("a", [event(1)])
        backend = store.backend
        pid = backend.conn.info.backend_pid  # type: ignore[attr-defined]
        with superuser(pg_server) as conn:
            conn.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
        store.append_unchecked("a", [event(2)])  # reconnected: the same store on the same cluster
        assert store.head().seq == 2
        schema = server_target(pg_url).schema
        with superuser(pg_server) as conn:
            # A restore of an older copy: the log rolled back by one event under the open handle.
            conn.execute(f"ALTER TABLE {schema}.events DISABLE TRIGGER events_no_change")  # type: ignore[arg-type]
            conn.execute(f"DELETE FROM {schema}.events WHERE seq = 2")  # type: ignore[arg-type]
            conn.execute(f"ALTER TABLE {schema}.events ENABLE TRIGGER events_no_change")  # type: ignore[arg-type]
            conn.execute(f"UPDATE {schema}.head SET (seq, hash, at) = (SELECT seq, hash, at FROM "  # type: ignore[arg-type]
                         f"{schema}.events WHERE seq = 1)")
            conn.execute("SELECT pg_terminate_backend(%s, 10000)", (backend.conn.info.backend_pid,))  # type: ignore[attr-defined]
        with pytest.raises(StoreBehindSealError):
            store.append_unchecked("a", [event(2)])


def test_another_store_under_the_url_fences_the_handle(pg_server: Server, pg_url: str) -> None:
    with EventStore.open(pg_url) as store:
        store.append_unchecked("a", [event(1)])
        pg_server.drop(server_target(pg_url).schema)
        EventStore.open(pg_url).close()
        with pytest.raises(StoreFencedError):
            store.append_unchecked("a", [event(2)])
        assert store.fenced is not None


@pytest.mark.parametrize("notify", ["on", "off"])
def test_a_follower_is_woken_by_appends(pg_server: Server, schema: str, notify: str) -> None:
    url = pg_server.url(schema, notify=notify)
    with EventStore.open(url) as writer, EventStore.open(url, read_only=True) as reader:
        stop = threading.Event()
        seen: list[int] = []

        def follow() -> None:
            for recorded in reader.follow(poll_interval=0.05, stop=stop):
                seen.append(recorded.seq)
                if len(seen) == 3:
                    stop.set()

        thread = threading.Thread(target=follow)
        thread.start()
        for generation in (1, 2, 3):
            writer.append_unchecked("a", [event(generation)])
        thread.join(30)
        stop.set()
        assert not thread.is_alive() and seen == [1, 2, 3]


def test_a_store_on_a_server_seals_only_to_a_named_file(pg_url: str, tmp_path: object) -> None:
    with EventStore.open(pg_url) as store:
        store.append_unchecked("a", [event()])
        with pytest.raises(InvalidInputError) as refused:
            store.seal()
        assert refused.value.field == "path"
        sealed = store.seal(f"{tmp_path}/fleet.seal")
    assert sealed.seq == 1
    with EventStore.open(pg_url, seal=f"{tmp_path}/fleet.seal") as store:
        assert store.head().seq == 1


def test_host_leases_expire_by_the_servers_clock_not_a_drivers(pg_url: str, tmp_path: object) -> None:
    from lifecycle_es import HostLeaseHeldError, Resources, RunnerLifecycle

    wall = time.time_ns() // 1_000_000
    handles = []
    with EventStore.open(pg_url) as store:
        for skew in (0, 3_600_000):  # the second driver's clock runs an hour ahead
            handles.append(RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(tmp_path),
                                           resources=Resources(cpu_seconds=60, memory_bytes=1 << 30),
                                           post_session_hook_digest="sha256:" + "a" * 64,
                                           now=lambda skew=skew: time.time_ns() // 1_000_000 + skew))
        handles[0].initialize()
        grant = handles[0].take_host_lease(holder="host-a/boot/1", ttl_ms=60_000)
        assert abs(grant.taken_ms - wall) < 600_000  # judged by the server's clock
        with pytest.raises(HostLeaseHeldError):  # by its own clock the lease expired long ago; not by the server's
            handles[1].take_host_lease(holder="host-b/boot/1", ttl_ms=60_000)
        handles[0].renew_host_lease(grant)


def test_a_transaction_whose_statement_failed_and_whose_caller_went_on_does_not_pass_for_committed(
        pg_url: str) -> None:
    # The server answers COMMIT in a failed transaction with ROLLBACK, no error: a commit whose work caught a
    # statement's error returned as if its other writes (a host lease row here) had landed.
    with EventStore.open(pg_url) as store:
        def goes_on(tx: WriteTransaction) -> str:
            tx.put_host_lease("runner-1", "host-a", 1, 10**12)
            with pytest.raises(StoreError):
                store.backend.execute("SELECT 1/0")  # type: ignore[attr-defined]
            return "went on"

        with pytest.raises(StoreError, match="nothing of it was committed"):
            store.commit("goes on", goes_on)
        assert store.host_lease("runner-1") is None
        store.commit("writes", lambda tx: tx.put_host_lease("runner-1", "host-a", 1, 10**12))
        assert store.host_lease("runner-1") == ("host-a", 1, 10**12)
