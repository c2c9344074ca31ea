"""A host's loops and the asyncio store refuse what they cannot call or watch, before they start.

`LocalHost.serve`, `Checkpointer.serve` and `HostServer.run` loop until a stop event is set, calling back
as they go; `AsyncEventStore.run` calls its function in a thread. A stop that is no event, a callback that
is not callable or a poll interval that is no number was met only later (an AttributeError or TypeError
in the loop, after threads had started, or in the pool's thread): each is InvalidInputError naming it now.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hosts.checkpointing import Checkpointer
from hosts.local import LocalHost
from hosts.serving import HostServer
from lifecycle_es import EventStore, InvalidInputError, RunnerLifecycle
from lifecycle_es.aio import AsyncEventStore
from lifecycle_es.testing import RUNNER_DEFAULTS, FakeClock


def refused(field: str, call: Callable[[], Any]) -> None:
    with pytest.raises(InvalidInputError) as info:
        call()
    assert info.value.field == field


@pytest.fixture
def host(tmp_path: Path) -> Any:
    store = EventStore.open(str(tmp_path / "events.db"), now=FakeClock())
    lifecycle = RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "base_dir": str(tmp_path)})  # type: ignore[arg-type]
    lifecycle.initialize()
    yield LocalHost(lifecycle, run_root=str(tmp_path / "runs"))
    store.close()


def test_local_host_serve_refuses_what_it_cannot_watch_or_call(host: LocalHost) -> None:
    stop = threading.Event()
    stop.set()
    refused("stop_event", lambda: host.serve(None))  # type: ignore[arg-type]
    refused("stop_event", lambda: host.serve(True))  # type: ignore[arg-type]
    refused("on_actions", lambda: host.serve(stop, on_actions=5))  # type: ignore[arg-type]
    refused("poll_interval", lambda: host.serve(stop, poll_interval="0.1"))  # type: ignore[arg-type]
    refused("tick", lambda: host.serve(stop, tick=-1))
    host.serve(stop)


def test_checkpointer_serve_refuses_what_it_cannot_watch_or_call(host: LocalHost) -> None:
    checkpointer = Checkpointer(host.lifecycle.store, None, every=10)  # type: ignore[arg-type]
    stop = threading.Event()
    refused("stop_event", lambda: checkpointer.serve(None))  # type: ignore[arg-type]
    refused("on_error", lambda: checkpointer.serve(stop, on_error="log"))  # type: ignore[arg-type]
    refused("on_checkpoint", lambda: checkpointer.serve(stop, on_checkpoint=[]))  # type: ignore[arg-type]
    refused("poll_interval", lambda: checkpointer.serve(stop, poll_interval=0))


def test_host_server_refuses_what_it_cannot_call_or_watch(host: LocalHost) -> None:
    store = host.lifecycle.store
    options: dict[str, Any] = {"make_host": lambda lifecycle, keeper: host, "holder": "host/boot/1",
                               "ttl_ms": 15_000, "grace_ms": 2_000}
    for field, value in (("make_host", None), ("report", 5), ("on_stuck", "exit"), ("tick", None),
                         ("poll_interval", 0), ("no_wait", "yes")):
        refused(field, lambda field=field, value=value: HostServer(store, [], **{**options, field: value}))
    server = HostServer(store, [], **options)
    refused("stop", lambda: server.run(None))  # type: ignore[arg-type]
    refused("on_tick", lambda: server.run(threading.Event(), on_tick=1))  # type: ignore[arg-type]
    assert [thread for thread in threading.enumerate() if thread.name.startswith("lease-")] == []


def test_the_asyncio_store_refuses_to_run_what_is_not_callable(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncEventStore.open(tmp_path / "events.db", now=FakeClock()) as store:
            with pytest.raises(InvalidInputError) as info:
                await store.run(5)  # type: ignore[arg-type]
            assert info.value.field == "call"

    asyncio.run(main())
