"""lifecycle_es.files: the one way a file someone else controls is read, and the check every named path passes.

Real files of every kind: regular files, links (to a file and dangling), FIFOs, a Unix socket, a
device, a directory, procfs files whose size lies, secrets at every mode. A call that could hang (a
FIFO) runs in a thread whose wait is bounded; should it hang, the FIFO's other end is opened to free
it and the test fails.
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lifecycle_es import InvalidInputError
from lifecycle_es.files import (
    CHUNK,
    LINK,
    NOT_PRIVATE,
    NOT_REGULAR,
    TOO_LARGE,
    UNOPENABLE,
    UnsafeFileError,
    open_regular,
    read_regular,
    sha256_regular,
    text_path,
)

HANG_TIMEOUT_S = 30


def without_hanging(call: Callable[[], Any], fifo: Path) -> Any:
    """`call()`'s result (or its exception, raised here); a call still blocked after the bound fails the test."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed back to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_TIMEOUT_S)
    if thread.is_alive():
        # A reader blocked in open() is released by a writer: open the other end, then fail.
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(HANG_TIMEOUT_S)
        pytest.fail(f"reading the FIFO {fifo} blocked")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def refused(kind: str, call: Callable[[], object]) -> UnsafeFileError:
    with pytest.raises(UnsafeFileError) as info:
        call()
    assert info.value.kind == kind, info.value
    assert isinstance(info.value, OSError)
    return info.value


def test_a_regular_file_is_read_whole_up_to_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "seal"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, limit=100, what="seal") == b"x" * 100
    error = refused(TOO_LARGE, lambda: read_regular(path, limit=99, what="seal"))
    assert "100 bytes" in str(error) and "99 bytes" in str(error) and error.errno == errno.EFBIG
    with open_regular(path, limit=None, what="export") as (fd, info):
        assert info.st_size == 100 and os.read(fd, 1000) == b"x" * 100


def test_a_file_whose_size_lies_is_cut_off_at_the_bound() -> None:
    # procfs says 0 bytes and then reads a page of text: the bound holds on what is read, not what fstat said.
    assert os.stat("/proc/self/status").st_size == 0
    error = refused(TOO_LARGE, lambda: read_regular("/proc/self/status", limit=16, what="status"))
    assert "grew past" in str(error)
    assert read_regular("/proc/self/status", limit=1 << 20, what="status").startswith(b"Name:")


def test_links_are_refused_dangling_or_not_and_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"secret")
    link = tmp_path / "link"
    link.symlink_to(target)
    error = refused(LINK, lambda: read_regular(link, limit=100, what="seal"))
    assert "symbolic link" in str(error) and str(link) in str(error)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    refused(LINK, lambda: read_regular(dangling, limit=100, what="seal"))
    refused(LINK, lambda: sha256_regular(link, limit=100, what="result"))
    assert not (tmp_path / "nowhere").exists()


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for call in (lambda: read_regular(fifo, limit=100, what="seal"),
                 lambda: sha256_regular(fifo, limit=100, what="result"),
                 lambda: read_regular(fifo, limit=100, what="key file", private=True)):
        error = without_hanging(lambda call=call: refused(NOT_REGULAR, call), fifo)
        assert "a FIFO, not a regular file" in str(error)


def test_sockets_devices_and_directories_are_refused(tmp_path: Path) -> None:
    sock_path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(sock_path))
        # Opening a socket fails with ENXIO: looked at first, it is named for what it is.
        assert "a socket" in str(refused(NOT_REGULAR, lambda: read_regular(sock_path, limit=100, what="seal")))
    finally:
        server.close()
    assert "a device" in str(refused(NOT_REGULAR, lambda: read_regular("/dev/zero", limit=100, what="seal")))
    assert "a directory" in str(refused(NOT_REGULAR, lambda: read_regular(tmp_path, limit=100, what="seal")))


def test_missing_and_unopenable_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", limit=100, what="seal")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    error = refused(UNOPENABLE, lambda: read_regular(not_a_dir / "below", limit=100, what="seal"))
    assert error.errno == errno.ENOTDIR


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o640, 0o604, 0o660, 0o610, 0o601])
def test_a_secret_others_may_use_is_refused_naming_its_mode(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "store.key"
    path.write_bytes(b"k" * 32)
    os.chmod(path, mode)
    error = refused(NOT_PRIVATE, lambda: read_regular(path, limit=256, what="key file", private=True))
    assert f"mode {mode:04o}" in str(error) and f"chmod 600 {path}" in str(error)
    assert read_regular(path, limit=256, what="key file") == b"k" * 32  # not a secret: the mode is no matter


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_a_secret_only_its_owner_may_use_is_read(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "store.key"
    path.write_bytes(b"k" * 32)
    os.chmod(path, mode)
    assert read_regular(path, limit=256, what="key file", private=True) == b"k" * 32


def test_a_hash_is_streamed_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "result"
    data = os.urandom(2 * CHUNK + 123)
    path.write_bytes(data)
    assert sha256_regular(path, limit=len(data), what="result") == "sha256:" + hashlib.sha256(data).hexdigest()
    refused(TOO_LARGE, lambda: sha256_regular(path, limit=len(data) - 1, what="result"))


@pytest.mark.parametrize("value", ["/tmp/x\udcff.db", "x\ud800", "\udc80", "", "a\0b", b"/tmp/x.db", None, 5])
def test_text_path_refuses_what_is_not_a_utf8_text_path(value: object) -> None:
    with pytest.raises(InvalidInputError) as info:
        text_path(value, "seal")
    assert info.value.field == "seal"
    str(info.value).encode("utf-8")  # the message itself prints anywhere: a surrogate in it is escaped


def test_text_path_takes_text_and_path_likes(tmp_path: Path) -> None:
    assert text_path(tmp_path / "é.db", "path") == str(tmp_path / "é.db")
    assert text_path("relative.db", "path") == "relative.db"
