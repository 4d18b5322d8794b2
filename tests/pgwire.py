"""A PostgreSQL wire tap: a TCP proxy in front of the real server that records the
protocol messages each side sends, whatever the client driver (psycopg 3 sends the
extended protocol, psycopg2 simple queries).

The client must not ask for TLS or GSS encryption (``sslmode=disable``,
``gssencmode=disable``): the tap reads the plain protocol. A message is recorded
before it is passed on, so when the client has its answer, everything it sent for
it is already in :attr:`WireTap.sent`.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: frontend message types -> names (PostgreSQL protocol 3)
FRONTEND = {
    "Q": "Query", "P": "Parse", "B": "Bind", "E": "Execute", "S": "Sync",
    "D": "Describe", "C": "Close", "H": "Flush", "X": "Terminate", "p": "Password",
    "d": "CopyData", "c": "CopyDone", "f": "CopyFail", "F": "FunctionCall",
}  # fmt: skip


class WireTap:
    """Listen on 127.0.0.1:``port`` and relay every connection to ``host``:``upstream``."""

    def __init__(self, host: str, upstream: int) -> None:
        self.target = (host, upstream)
        self.sent: list[str] = []  #: frontend message names, in order
        self.rows: list[list[bytes | None]] = []  #: the DataRows the server sent
        self.queries: list[str] = []  #: the text of each simple Query the client sent
        self.last_queries: list[str] = []  #: those sent during the last :meth:`during`
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._server.accept()
                server = socket.create_connection(self.target)
                for src, dst, frontend in ((client, server, True), (server, client, False)):
                    threading.Thread(
                        target=self._pump, args=(src, dst, frontend), daemon=True
                    ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, frontend: bool) -> None:
        buf = b""
        startup = frontend  # the client's first message has no type byte
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                buf += chunk
                while True:
                    head = 4 if startup else 5
                    if len(buf) < head:
                        break
                    size = struct.unpack("!i", buf[head - 4 : head])[0] + head - 4
                    if len(buf) < size:
                        break
                    message, buf = buf[:size], buf[size:]
                    if startup:
                        startup = False
                    else:
                        self._record(message, frontend)
                dst.sendall(chunk)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _record(self, message: bytes, frontend: bool) -> None:
        kind = chr(message[0])
        with self._lock:
            if frontend:
                self.sent.append(FRONTEND.get(kind, kind))
                if kind == "Q":
                    self.queries.append(message[5:-1].decode())
            elif kind == "D":
                self.rows.append(_columns(message[5:]))

    def during(self, fn: Callable[[], Any]) -> tuple[Any, list[str], list[list[bytes | None]]]:
        """``fn``'s value, the messages the client sent and the rows it received (the
        texts of its simple queries: :attr:`last_queries`)."""
        with self._lock:
            sent, rows, queries = len(self.sent), len(self.rows), len(self.queries)
        value = fn()
        with self._lock:
            self.last_queries = self.queries[queries:]
            return value, self.sent[sent:], self.rows[rows:]

    def close(self) -> None:
        self._server.close()


def _columns(body: bytes) -> list[bytes | None]:
    (count,) = struct.unpack("!h", body[:2])
    at, values = 2, []
    for _ in range(count):
        (size,) = struct.unpack("!i", body[at : at + 4])
        at += 4
        values.append(None if size < 0 else body[at : at + size])
        at += max(size, 0)
    return values


@contextlib.contextmanager
def tapped(host: str, port: int) -> Iterator[WireTap]:
    tap = WireTap(host, port)
    try:
        yield tap
    finally:
        tap.close()
