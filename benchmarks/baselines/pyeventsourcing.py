"""The ``eventsourcing`` library (PyPI 9.x) on its SQLite (or PostgreSQL) persistence module: the Python baseline.

One aggregate per runner; each command is one event saved in its own transaction
(``app.save(runner)``), the library's own pattern (the aggregate stays in memory between commands).
Reconstruction is ``app.repository.get(id)`` on a fresh application (a new connection), without
snapshots. Configured only through its environment: ``PERSISTENCE_MODULE=eventsourcing.sqlite``,
``SQLITE_DBNAME=<file>``; on PostgreSQL (`postgres_env`) ``PERSISTENCE_MODULE=eventsourcing.postgres``
and the ``POSTGRES_*`` variables (a unix socket directory is a host). Optional: install with
``pip install -e '.[bench]'``; `available()` says whether it is there (and `postgres_problem` why its
PostgreSQL module cannot run); the classes below exist only then; they sit at module level because
the library finds an aggregate's class again by its import path.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata
from typing import Any
from uuid import UUID


def available() -> bool:
    """Whether the library is installed."""
    return importlib.util.find_spec("eventsourcing") is not None


def postgres_problem() -> str | None:
    """Why its PostgreSQL module cannot run here (it needs psycopg_pool), or None when it can."""
    if not available():
        return "eventsourcing is not installed: pip install -e '.[bench]'"
    try:
        import eventsourcing.postgres  # noqa: F401
    except ImportError as exc:
        return (f"eventsourcing {version()}'s PostgreSQL module cannot be imported ({type(exc).__name__}: {exc}): "
                "pip install -e '.[bench]' (eventsourcing[postgres])")
    return None


def postgres_env(host: str, schema: str, *, dbname: str = "postgres", user: str = "postgres") -> dict[str, str]:
    """The environment that puts an application on a PostgreSQL server (`host`: a socket directory too)."""
    return {"PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": dbname, "POSTGRES_HOST": host,
            "POSTGRES_PORT": "5432", "POSTGRES_USER": user, "POSTGRES_PASSWORD": "", "POSTGRES_SCHEMA": schema}


def version() -> str:
    """The installed library's version."""
    return metadata.version("eventsourcing")


if available():
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event

    class Runner(Aggregate):  # type: ignore[misc]
        """A runner as an eventsourcing aggregate: the leases it granted and settled."""

        @event("Initialized")
        def __init__(self, runner_id: str, target: str, base_dir: str) -> None:
            self.runner_id = runner_id
            self.target = target
            self.base_dir = base_dir
            self.generation = 1
            self.leases: dict[str, str] = {}

        @event("LeaseAcquired")
        def acquire_lease(self, lease_id: str, session_id: str, lease_generation: int, expires_at: str) -> None:
            self.leases[lease_id] = "active"

        @event("LeaseSettled")
        def settle_lease(self, lease_id: str, lease_generation: int, result_digest: str) -> None:
            self.leases[lease_id] = "settled"

    class Runners(Application):  # type: ignore[misc]
        """The application that saves and loads runners."""


class Fleet:
    """An eventsourcing application on one SQLite file (or on a server, given `env`), and the runners it saves."""

    def __init__(self, path: str, *, env: dict[str, str] | None = None) -> None:
        self.path = path
        self.env = env if env is not None else {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": path}
        self.app = self._open()

    def _open(self) -> Any:
        return Runners(env=self.env)

    def synchronous(self) -> int:
        """The ``PRAGMA synchronous`` its connections run with (2 = FULL, 1 = NORMAL)."""
        with self.app.recorder.datastore.transaction(commit=False) as cursor:
            cursor.execute("PRAGMA synchronous")
            return int(cursor.fetchone()[0])

    def new_runner(self, runner_id: str) -> Any:
        """A runner created and saved (its first event)."""
        runner = Runner(runner_id=runner_id, target="local", base_dir=f"/srv/runners/{runner_id}")
        self.app.save(runner)
        return runner

    def acquire_settle(self, runner: Any, n: int, *, save_each: bool = True) -> int:
        """One lease acquired then settled: two events, two saves (or none when `save_each` is off)."""
        lease_id = f"lease-{n:08d}"
        runner.acquire_lease(lease_id=lease_id, session_id=f"session-{n:08d}", lease_generation=1,
                             expires_at="2026-01-01T00:10:00.000Z")
        if save_each:
            self.app.save(runner)
        runner.settle_lease(lease_id=lease_id, lease_generation=1, result_digest="sha256:" + "ab" * 32)
        if save_each:
            self.app.save(runner)
        return 2

    def runner_with(self, runner_id: str, events: int, *, chunk: int = 1000) -> UUID:
        """A runner with `events` events, saved `chunk` events per transaction (set-up, not measured)."""
        runner = self.new_runner(runner_id)
        done, n = 1, 0
        while done < events:
            done += self.acquire_settle(runner, n, save_each=False)
            n += 1
            if done % chunk < 2 or done >= events:
                self.app.save(runner)
        return runner.id  # type: ignore[no-any-return]

    def reopen(self) -> None:
        """A fresh application on the same file (new connections, nothing cached)."""
        self.app.close()
        self.app = self._open()

    def load(self, aggregate_id: UUID) -> int:
        """Reconstruct a runner from its events (no snapshots); its version, i.e. its event count."""
        return int(self.app.repository.get(aggregate_id).version)

    def close(self) -> None:
        """Close the application's connections."""
        self.app.close()
