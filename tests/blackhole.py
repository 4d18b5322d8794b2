"""A TCP proxy in front of a real server that can start dropping what the client sends
(a network that loses the client's packets while the connection looks open)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class Blackhole:
    """Listen on 127.0.0.1 (:attr:`port`) and relay every connection to ``upstream``;
    while :attr:`dropping` is set, bytes from the client are read and thrown away; while
    :attr:`deaf` is set, a new connection is accepted and never answered."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.dropping = threading.Event()
        self.deaf = threading.Event()
        self.dropped = 0
        self.accepted = 0  #: connections accepted
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                self.accepted += 1
                if self.deaf.is_set():
                    self._sockets.append(client)
                    continue
                server = socket.create_connection(self.upstream)
                self._sockets += [client, server]
                for ends in ((client, server, True), (server, client, False)):
                    threading.Thread(target=self._pipe, args=ends, daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if from_client and self.dropping.is_set():
                    self.dropped += len(data)
                    continue
                sink.sendall(data)

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def blackhole(upstream: tuple[str, int]) -> Iterator[Blackhole]:
    proxy = Blackhole(upstream)
    try:
        yield proxy
    finally:
        proxy.close()
