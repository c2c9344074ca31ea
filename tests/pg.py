"""The throwaway PostgreSQL cluster the tests run on: `benchmarks.cluster`, shared with the PostgreSQL
benchmark (the tests name it through this module, as they always have)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from benchmarks.cluster import NEED, Server, binaries, cluster

__all__ = ["NEED", "Blackhole", "Server", "SocketLink", "binaries", "cluster"]


class SocketLink:
    """A socket directory of its own whose socket is a link to a cluster's: `server` reaches that cluster
    through it until `point` turns the link to another one (a failover, or a restore on another machine,
    at the same address). Connections made before stay with the cluster they reached."""

    def __init__(self, server: Server) -> None:
        self.directory = tempfile.mkdtemp(prefix="pgl.", dir="/tmp")
        self.server = Server(self.directory)
        self.point(server)

    def point(self, server: Server) -> None:
        """From now on, new connections reach `server`."""
        link = os.path.join(self.directory, ".s.PGSQL.5432")
        os.symlink(os.path.join(server.directory, ".s.PGSQL.5432"), link + ".new")
        os.replace(link + ".new", link)

    def close(self) -> None:
        """Remove the link's directory."""
        shutil.rmtree(self.directory, ignore_errors=True)


class Blackhole:
    """A relay between a socket directory of its own and a cluster's socket: a store URL whose ``host`` is
    `directory` reaches the cluster through it, until `cut` silences it. After the cut nothing passes either
    way and nothing is closed: the client's reads wait for ever, as across a network partition."""

    def __init__(self, server: Server) -> None:
        import socket
        import threading

        self.directory = tempfile.mkdtemp(prefix="pgp.", dir="/tmp")
        self._upstream = os.path.join(server.directory, ".s.PGSQL.5432")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(os.path.join(self.directory, ".s.PGSQL.5432"))
        self._listener.listen(16)
        self._cut = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str) -> str:
        """`url` (a store on the cluster) reached through this relay."""
        return url.replace(f"host={self._upstream.rsplit('/', 1)[0]}", f"host={self.directory}")

    def cut(self) -> None:
        """From now on, nothing passes."""
        self._cut.set()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self._upstream)
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    def _relay(self, source: object, sink: object) -> None:
        while True:
            try:
                data = source.recv(65536)  # type: ignore[attr-defined]
            except OSError:
                return
            if not data:
                if not self._cut.is_set():
                    with contextlib.suppress(OSError):
                        sink.shutdown(1)  # type: ignore[attr-defined]
                return
            if not self._cut.is_set():
                with contextlib.suppress(OSError):
                    sink.sendall(data)  # type: ignore[attr-defined]

    def close(self) -> None:
        """Close the relay and every connection through it."""
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)
