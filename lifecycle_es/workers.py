"""Worker processes for long read-only passes (the audit's ``jobs > 1``), started the one safe way.

A worker is a fresh interpreter running this module's `_serve`, never a fork and never a
``multiprocessing`` child: it needs no ``if __name__ == "__main__"`` guard in the caller's script,
works from any thread, and shares no SQLite connection or lock with its parent. The parent writes
one pickled request to the worker's stdin (the key travels there too: never in argv or the
environment), the worker reports progress as integers on a pipe of its own and writes one pickled
result to stdout. Only functions of this package may be named, so a request cannot run arbitrary code.
A worker whose parent is gone (killed, even with SIGKILL, before it could stop its workers) stops at its
next progress report, exit status `PARENT_GONE`: nobody is left to read its result.

    with Workers("lifecycle_es.walk:walk_share", [args_1, args_2], progress=on_rows) as workers:
        results = workers.results()

A caller with work of its own to do meanwhile sends the requests at once (`begin`), asks how far the
workers got between its own steps (`poll`), and collects the results when it is done.

Pickle is safe here because both ends are this package's own code in processes the parent started;
nothing read from a store is unpickled.
"""

from __future__ import annotations

import importlib
import os
import pickle
import selectors
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .errors import LifecycleError

PACKAGE = "lifecycle_es"
_COUNT = struct.Struct("<q")
_PROGRESS_FD_ENV = "LIFECYCLE_ES_PROGRESS_FD"
# Imported by name, not run as ``-m lifecycle_es.workers``: the package imports this module first, which makes
# ``-m`` warn (RuntimeWarning), and a worker with warnings made errors (PYTHONWARNINGS=error) would not start.
_SERVE = f"from {__name__} import _serve; raise SystemExit(_serve())"
PARENT_GONE = 3  # a worker's exit status when it stopped because its parent is gone


class WorkerError(LifecycleError):
    """A worker process died or failed: what it was doing proves nothing."""


def _resolve(target: str) -> Callable[..., Any]:
    module_name, _, name = target.partition(":")
    if not name or not (module_name == PACKAGE or module_name.startswith(PACKAGE + ".")):
        raise WorkerError(f"worker target {target!r} is not a function of {PACKAGE}")
    function = getattr(importlib.import_module(module_name), name, None)
    if not callable(function):
        raise WorkerError(f"worker target {target!r} is not a function")
    return function  # type: ignore[no-any-return]


class _Worker:
    __slots__ = ("buffer", "done", "process", "progress_fd", "request", "rows")

    def __init__(self, process: subprocess.Popen[bytes], progress_fd: int, request: bytes) -> None:
        self.process = process
        self.progress_fd = progress_fd
        self.request = request
        self.rows = 0
        self.done = False
        self.buffer = b""


class Workers:
    """One worker process per argument tuple, each calling `target` (``"module:function"``) with it.

    `progress`: called from the thread that waits in `results` with the smallest count any worker
    reported so far (each reports the seq it got through, so the slowest is where the pass is). Use as a
    context manager: leaving it kills workers that are still running.
    """

    def __init__(self, target: str, calls: Sequence[tuple[Any, ...]],
                 progress: Callable[[int], None] | None = None) -> None:
        _resolve(target)  # refuse a bad target here, not in every worker
        self._progress = progress
        self._workers: list[_Worker] = []
        self._outputs: dict[int, bytes] = {}
        self._errors: dict[int, bytes] = {}
        self._readers: list[threading.Thread] = []
        try:
            for call in calls:
                self._workers.append(self._start(target, call))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _start(target: str, call: tuple[Any, ...]) -> _Worker:
        read_end, write_end = os.pipe()
        try:
            env = dict(os.environ)
            env[_PROGRESS_FD_ENV] = str(write_end)
            process = subprocess.Popen(
                [sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=(write_end,), env=env, close_fds=True)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        os.set_blocking(read_end, False)
        return _Worker(process, read_end, pickle.dumps((target, call), protocol=pickle.HIGHEST_PROTOCOL))

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the workers still running and release their pipes."""
        for worker in self._workers:
            if worker.process.poll() is None:
                worker.process.kill()
            worker.process.wait()
        for reader in self._readers:
            reader.join()
        for worker in self._workers:
            for stream in (worker.process.stdin, worker.process.stdout, worker.process.stderr):
                if stream is not None:
                    stream.close()
            if worker.progress_fd >= 0:
                os.close(worker.progress_fd)
                worker.progress_fd = -1

    def begin(self) -> None:
        """Send each worker its request now (`results` does it when nobody did), so that they work while the
        caller does something else."""
        if self._readers:
            return
        self._readers = [threading.Thread(target=self._drain, args=(index,), daemon=True)
                         for index in range(len(self._workers))]
        for reader in self._readers:
            reader.start()

    def poll(self) -> int:
        """The smallest count of rows any worker reported so far, reading what they sent without waiting."""
        for worker in self._workers:
            while not worker.done and self._read_progress(worker):
                pass
        return min(worker.rows for worker in self._workers)

    def results(self) -> list[Any]:
        """Each worker's result, in the order of `calls`; WorkerError when one died or raised."""
        self.begin()
        self._watch_progress()
        for reader in self._readers:
            reader.join()
        results = []
        for index, worker in enumerate(self._workers):
            code = worker.process.wait()
            result = self._result(index, code, self._outputs.get(index, b""), self._errors.get(index, b""))
            results.append(result)
        return results

    def _drain(self, index: int) -> None:
        worker = self._workers[index]
        # The request goes in through communicate, which also drains both outputs: no pipe fills up.
        try:
            out, err = worker.process.communicate(worker.request)
        except (OSError, ValueError):  # killed by `close` meanwhile: its result is not wanted
            return
        self._outputs[index], self._errors[index] = out, err

    def _watch_progress(self) -> None:
        selector = selectors.DefaultSelector()
        for worker in self._workers:
            if not worker.done:
                selector.register(worker.progress_fd, selectors.EVENT_READ, worker)
        pending = len(selector.get_map())
        while pending:
            for key, _ in selector.select(timeout=0.5):
                worker = key.data
                if not self._read_progress(worker):
                    continue
                if worker.done:
                    selector.unregister(worker.progress_fd)
                    pending -= 1
                    continue
                if self._progress is not None:
                    self._progress(min(w.rows for w in self._workers))
        selector.close()

    @staticmethod
    def _read_progress(worker: _Worker) -> bool:
        """Read what `worker` sent on its progress pipe (its last whole count is its `rows`; an end of file
        marks it `done`); False when nothing was there to read."""
        try:
            data = os.read(worker.progress_fd, 4096)
        except BlockingIOError:
            return False
        if not data:
            worker.done = True
            return True
        data = worker.buffer + data
        whole = len(data) - len(data) % _COUNT.size
        if whole:
            (worker.rows,) = _COUNT.unpack_from(data, whole - _COUNT.size)
        worker.buffer = data[whole:]
        return True

    @staticmethod
    def _result(index: int, code: int, out: bytes, err: bytes) -> Any:
        if code == 0 and out:
            try:
                failed, value = pickle.loads(out)
            except Exception as exc:
                raise WorkerError(f"worker {index} sent back a result that does not load ({exc})") from None
            if failed:
                kind, message = value
                raise WorkerError(f"worker {index} failed: {kind}: {message}")
            return value
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
        raise WorkerError(f"worker {index} {how}: {tail[0][:200]}")


def report_progress(rows: int) -> None:
    """In a worker: tell the parent how many rows this worker has read (a no-op outside a worker); SystemExit
    (`PARENT_GONE`) when the parent is gone: this worker was handed to another process, or nobody reads."""
    fd = _progress_fd
    if fd is None:
        return
    if os.getppid() != _parent:
        raise SystemExit(PARENT_GONE)
    try:
        os.write(fd, _COUNT.pack(rows))
    except BrokenPipeError:
        raise SystemExit(PARENT_GONE) from None
    except OSError:  # the result still matters
        pass


_progress_fd: int | None = None
_parent = 0


def _serve() -> int:
    global _progress_fd, _parent
    _parent = os.getppid()
    fd_text = os.environ.pop(_PROGRESS_FD_ENV, None)
    _progress_fd = int(fd_text) if fd_text and fd_text.isdigit() else None
    # Run as ``python -m``, this module is ``__main__``; the code a worker calls imports it again by its
    # name, and reports through that copy's `report_progress`: it must hold the pipe too.
    named = importlib.import_module(__spec__.name if __spec__ is not None else __name__)
    setattr(named, "_progress_fd", _progress_fd)  # noqa: B010 (the module as imported by name)
    setattr(named, "_parent", _parent)  # noqa: B010
    target, call = pickle.loads(sys.stdin.buffer.read())
    try:
        value = (False, _resolve(target)(*call))
    except LifecycleError as exc:
        # Sent as text: error classes with keyword-only fields do not survive a pickle round trip.
        value = (True, (type(exc).__name__, str(exc)))
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    if _progress_fd is not None:
        os.close(_progress_fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(_serve())
