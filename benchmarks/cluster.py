"""A throwaway PostgreSQL cluster, for the tests (``tests/pg.py``) and the PostgreSQL benchmark alike:
initdb and pg_ctl from the machine's PostgreSQL binaries, a data directory and a unix socket in a short
temporary directory, no TCP listener, fsync on.

As root (initdb refuses root), both run as ``nobody`` through setpriv, and callers connect as the
cluster's ``postgres`` superuser over the socket (trust authentication: nothing but this machine's users
can reach a socket in a 0700 directory). Where no binaries are found the PostgreSQL tests skip, saying
how to get them, unless ``LIFECYCLE_ES_REQUIRE_POSTGRES`` is set (CI): then they fail.

    with cluster() as server:
        store = EventStore.open(server.url("bench"))
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

NEED = ("PostgreSQL server binaries (initdb, pg_ctl) were not found: install them (Debian: apt-get install -y "
        "postgresql-15) to run the PostgreSQL tests; .ci/run does so")


def binaries() -> str | None:
    """The directory holding initdb and pg_ctl, or None."""
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(os.path.realpath(found))
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda path: int(path.split("/")[-3]) if path.split("/")[-3].isdigit() else 0)
    return os.path.dirname(candidates[-1]) if candidates else None


@dataclass(frozen=True)
class Server:
    """A running cluster: its socket directory, and URLs of stores on it."""

    directory: str

    def url(self, schema: str, **params: str) -> str:
        """The URL of a store in `schema` of the ``postgres`` database."""
        extra = "".join(f"&{name}={value}" for name, value in params.items())
        return f"postgresql://postgres@/postgres?host={self.directory}&schema={schema}{extra}"

    def conninfo(self) -> str:
        """A libpq connection string for the superuser (for tests that reach under the store)."""
        return f"host={self.directory} user=postgres dbname=postgres"

    @property
    def log(self) -> str:
        """The server's log file (``log_statement=all`` in `cluster`'s settings writes every statement there)."""
        return os.path.join(self.directory, "pg.log")

    def connect(self) -> object:
        """An autocommit superuser connection."""
        import psycopg

        return psycopg.connect(self.conninfo(), autocommit=True)

    def new_schema(self) -> str:
        """A schema name no other test uses."""
        return f"t_{uuid.uuid4().hex[:16]}"

    def drop(self, schema: str) -> None:
        """Drop a test's schema (and its store)."""
        import psycopg

        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def _as_owner(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--reset-env", "--", *argv]


@contextlib.contextmanager
def cluster(**settings: str) -> Iterator[Server]:
    """Start a cluster (about a second and a half) and stop and remove it afterwards; `settings` are server
    settings on its command line (``fsync="off"``), beside fsync and synchronous_commit on."""
    bindir = binaries()
    if bindir is None:
        raise FileNotFoundError(NEED)
    # A unix socket's path must stay under 107 bytes: the directory is short.
    directory = tempfile.mkdtemp(prefix="pgt.", dir="/tmp")
    if os.geteuid() == 0:
        shutil.chown(directory, "nobody", "nogroup")
    os.chmod(directory, 0o700)
    data = os.path.join(directory, "data")
    run = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "timeout": 120}
    try:
        subprocess.run(_as_owner([f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust",
                                  "--no-instructions", "-E", "UTF8", "--locale=C.UTF-8"]), **run)  # type: ignore[call-overload]
        chosen = {"fsync": "on", "synchronous_commit": "on", **settings}
        options = f"-k {directory} -c listen_addresses='' " + " ".join(f"-c {k}={v}" for k, v in chosen.items())
        subprocess.run(_as_owner([f"{bindir}/pg_ctl", "-D", data, "-l", f"{directory}/pg.log", "-w", "-o", options,
                                  "start"]), **run)  # type: ignore[call-overload]
        yield Server(directory)
    finally:
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            subprocess.run(_as_owner([f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"]),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)
        _wait_gone(data)
        shutil.rmtree(directory, ignore_errors=True)


def _wait_gone(data: str) -> None:
    """Wait until no process has the data directory open (a postmaster lingering as a zombie counts as gone)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        busy = False
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    state = stat.read().rsplit(")", 1)[1].split()[0]
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if state != "Z" and cwd.startswith(data):
                busy = True
        if not busy:
            return
        time.sleep(0.05)
