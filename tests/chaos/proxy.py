"""A TCP proxy in front of PostgreSQL that the chaos tests can stop, restart and
use to cut one answer, without touching the shared server.

* :meth:`TcpProxy.stop` closes the listening socket (new connections are refused)
  and kills every proxied connection — PostgreSQL "stopped" for the workers.
* :meth:`TcpProxy.start` listens again on the same port.
* :meth:`TcpProxy.cut_next_answer` lets the next request on a connection whose
  startup packet contains ``marker`` reach the server, then closes that connection
  instead of forwarding the server's answer: the statement ran (and, in autocommit,
  committed) but the client sees a broken connection — "outcome unknown".
* :meth:`TcpProxy.cut_answers_to` does the same to the next ``times`` requests (on any
  connection) that contain ``pattern`` (case-insensitive): e.g. a claim's fingerprint,
  or MariaDB's ``COMMIT``.
* :meth:`TcpProxy.stall` stops forwarding in both directions without closing anything
  (a half-open connection: the peer's kernel still acknowledges every packet);
  :meth:`TcpProxy.unstall` forwards again.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class _Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.tagged = False
        self.cut_pending = False
        self.started = False

    def close(self) -> None:
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target``; controllable from the test."""

    def __init__(self, target: tuple[str, int], marker: bytes = b"celery-grousset") -> None:
        self.target = target
        self.marker = marker
        self.port = 0
        self._listener: socket.socket | None = None
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._cut_armed = False
        self._pattern = b""
        self._pattern_cuts = 0
        self._flowing = threading.Event()
        self._flowing.set()
        self.cuts = 0
        self.accepted = 0

    # -- control ---------------------------------------------------------------------------

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def stop(self) -> None:
        sock, self._listener = self._listener, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.kill_connections()

    def kill_connections(self) -> int:
        with self._lock:
            pairs, self._pairs = list(self._pairs), set()
        for pair in pairs:
            pair.close()
        return len(pairs)

    def cut_next_answer(self) -> None:
        self._cut_armed = True

    def cut_answers_to(self, pattern: bytes, times: int = 1) -> None:
        with self._lock:
            self._pattern, self._pattern_cuts = pattern.lower(), times

    @property
    def cut_armed(self) -> bool:
        return self._cut_armed or self._pattern_cuts > 0

    def stall(self) -> None:
        self._flowing.clear()

    def unstall(self) -> None:
        self._flowing.set()

    def _pattern_hit(self, data: bytes) -> bool:
        if self._pattern_cuts <= 0 or self._pattern not in data.lower():
            return False
        with self._lock:
            if self._pattern_cuts <= 0:
                return False
            self._pattern_cuts -= 1
            return True

    # -- forwarding ------------------------------------------------------------------------

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.add(pair)
                self.accepted += 1
            threading.Thread(target=self._up, args=(pair,), daemon=True).start()
            threading.Thread(target=self._down, args=(pair,), daemon=True).start()

    def _up(self, pair: _Pair) -> None:
        """client → server"""
        try:
            while data := pair.client.recv(65536):
                self._flowing.wait()
                if not pair.started:
                    pair.started = True
                if self._pattern_hit(data):
                    pair.cut_pending = True
                elif self.marker in data:
                    pair.tagged = True  # the startup packet names the application
                elif pair.tagged and self._cut_armed and not data.startswith(b"X"):
                    # (a Terminate, 'X', has no answer: another thread of the worker
                    # closing its connection must not take the cut meant for a query)
                    with self._lock:
                        if self._cut_armed:
                            self._cut_armed = False
                            pair.cut_pending = True
                pair.upstream.sendall(data)
        except OSError:
            pass
        self._drop(pair)

    def _down(self, pair: _Pair) -> None:
        """server → client"""
        try:
            while data := pair.upstream.recv(65536):
                self._flowing.wait()
                if pair.cut_pending:
                    self.cuts += 1
                    break
                pair.client.sendall(data)
        except OSError:
            pass
        self._drop(pair)

    def _drop(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)
        pair.close()
