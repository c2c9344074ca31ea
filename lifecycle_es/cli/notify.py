"""systemd's notify protocol for ``lifecycle-es host`` under ``Type=notify``: a few lines of socket code.

    notifier = Notifier.from_environment()      # None outside systemd (no $NOTIFY_SOCKET)
    notifier.send("READY=1")                    # once serving
    notifier.watchdog_interval()                # half of $WATCHDOG_USEC, in seconds, or None
    notifier.send("WATCHDOG=1")                 # at least that often while the loop is alive

The socket is an AF_UNIX datagram socket named by ``$NOTIFY_SOCKET``: a path, or an abstract name
written with a leading ``@``. ``$WATCHDOG_PID``, when set, must be this process. A send that fails
(systemd gone) is ignored: the service's own work never depends on its supervisor's ear.
"""

from __future__ import annotations

import os
import socket

from .options import ascii_int


class Notifier:
    """Sends notify messages to the socket systemd gave this service."""

    def __init__(self, address: str, watchdog_usec: int | None) -> None:
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_usec = watchdog_usec

    def __repr__(self) -> str:
        return f"Notifier({self.address!r}, watchdog_usec={self.watchdog_usec})"

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> Notifier | None:
        """The notifier $NOTIFY_SOCKET names (with $WATCHDOG_USEC when it is for this pid), or None."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        if not address or not (address.startswith("/") or address.startswith("@")):
            return None
        usec: int | None = None
        pid = env.get("WATCHDOG_PID")
        if pid is None or pid == str(os.getpid()):
            usec = max(ascii_int(env.get("WATCHDOG_USEC", "")) or 0, 0) or None
        return cls(address, usec)

    def watchdog_interval(self) -> float | None:
        """How often to send WATCHDOG=1 (half the watchdog timeout, in seconds), or None without a watchdog."""
        return self.watchdog_usec / 2_000_000 if self.watchdog_usec else None

    def send(self, message: str) -> bool:
        """Send one message (``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``, ``STATUS=...``); whether it went."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), self.address)
        except OSError:
            return False
        return True


__all__ = ["Notifier"]
