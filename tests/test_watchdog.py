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


def test_a_watchdog_whose_owner_is_gone_ends_its_thread() -> None:
    """Stores are per thread, each PostgreSQL store with a watchdog: a watchdog's thread
    held its watchdog for ever, so every short-lived thread that used the journal (a
    development server's request thread) left a thread behind."""
    import gc
    import threading

    before = set(threading.enumerate())
    ours, peer = socket.socketpair()
    with ours, peer:
        # Given watchdogs that watched a call each
        dogs = [Watchdog(0.2) for _ in range(3)]
        for dog in dogs:
            dog.arm(ours.fileno())
            dog.disarm()
        started = [t for t in threading.enumerate()
                   if t not in before and t.name == "grousset-watchdog"]  # fmt: skip
        assert len(started) == 3
        time.sleep(0.2)
        assert all(t.is_alive() for t in started)  # (alive while their watchdogs are)
        # When they are dropped
        del dog, dogs
        gc.collect()
        # Then their threads end within a few of their pauses
        for thread in started:
            thread.join(timeout=5)
    assert not any(t.is_alive() for t in started)
