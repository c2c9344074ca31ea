"""The base directory preflight, run before a lease is granted or refreshed.

As the original's ``preflightWritableDirectory``: the base directory must be a real directory (not a
symbolic link), and a probe file created there with O_EXCL, written, fsynced and removed. A lease is
never granted on a directory its session could not write to.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Callable

from .errors import PreflightError


def preflight_writable_directory(base_dir: str, random_id: Callable[[], str] | None = None) -> None:
    """PreflightError unless `base_dir` is a real directory that a probe file can be written and synced in."""
    try:
        info = os.lstat(base_dir)
    except OSError as exc:
        raise PreflightError(f"execution location base directory must be a real directory (base_dir "
                             f"{base_dir!r}: {exc.strerror})") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise PreflightError(f"execution location base directory must be a real directory (base_dir {base_dir!r})")
    probe = os.path.join(base_dir, f".cc-runner-preflight-{(random_id or (lambda: uuid.uuid4().hex))()}")
    descriptor: int | None = None
    try:
        descriptor = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        os.write(descriptor, b"preflight\n")
        os.fsync(descriptor)
    except OSError as exc:
        raise PreflightError(f"execution location base directory is not writable (base_dir {base_dir!r}: "
                             f"{exc.strerror})") from None
    finally:
        if descriptor is not None:
            os.close(descriptor)
            # The probe is removed even when the write failed; its own error would hide the first one.
            with contextlib.suppress(OSError):
                os.unlink(probe)
