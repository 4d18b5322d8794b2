"""The client-side bound on a statement's answer (celery_grousset.store.watchdog): a
half-open connection — the peer acknowledges, no answer comes — is cut, with real
sockets (the PostgreSQL store uses it; tests/chaos/test_network.py, scenario 30, runs
it against a stalled proxy)."""

from __future__ import annotations

import socket
import time

from celery_grousset.store.watchdog import Watchdog


def test_a_call_waiting_past_its_bound_has_its_socket_shut_down() -> None:
    # Given a connected socket whose peer never answers
    ours, peer = socket.socketpair()
    dog = Watchdog(0.3)
    with ours, peer:
        t0 = time.monotonic()
        # When a call waits for the answer under the watchdog
        dog.arm(ours.fileno())
        got = ours.recv(10)
        dog.disarm()
        waited = time.monotonic() - t0
    # Then the blocked read returned (end of stream) once the bound had passed
    assert got == b"" and 0.3 <= waited < 5 and dog.fired == 1


def test_a_call_answered_in_time_is_left_alone() -> None:
    # Given calls that get their answer at once
    ours, peer = socket.socketpair()
    dog = Watchdog(0.2)
    with ours, peer:
        for _ in range(50):
            dog.arm(ours.fileno())
            peer.sendall(b"x")
            assert ours.recv(1) == b"x"
            dog.disarm()
        time.sleep(0.4)  # longer than the bound, between calls: nothing is armed
        # Then the connection still works and nothing was cut
        peer.sendall(b"y")
        assert ours.recv(1) == b"y" and dog.fired == 0
