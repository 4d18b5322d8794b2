"""The client-side bound on a statement's answer (celery_grousset.store.watchdog): a
half-open connection — the peer acknowledges, no answer comes — is cut, with real
sockets (the PostgreSQL store uses it; tests/chaos/test_network.py, scenario 30, runs
it against a stalled proxy)."""

from __future__ import annotations

import socket
import time

import pytest

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


def test_a_call_whose_answer_came_but_was_not_read_yet_is_left_alone() -> None:
    """Under gevent a greenlet whose answer had arrived, but that was not scheduled to
    read it before the bound passed (another greenlet's body blocking the thread in a C
    call), had its connection cut: a reconnect, a claim sent again, or a refusal on a
    new connection (a review)."""
    # Given a call whose answer is in the socket, unread, past the bound
    ours, peer = socket.socketpair()
    dog = Watchdog(0.2)
    with ours, peer:
        dog.arm(ours.fileno())
        peer.sendall(b"answer")
        time.sleep(0.6)  # (the caller held up, not reading)
        # When the caller reads it at last / Then it is there, and the socket still works
        assert ours.recv(6) == b"answer"
        dog.disarm()
        ours.sendall(b"next")
        assert peer.recv(4) == b"next" and dog.fired == 0


def test_a_late_call_that_found_part_of_its_answer_is_cut_if_the_rest_never_comes() -> None:
    """A caller late to read (the answer's first part there) was left unwatched: when the
    rest never came (a half-open connection), its read waited for ever (a review)."""
    import threading

    # Given a call whose answer's first part is in the socket, unread, past the bound
    ours, peer = socket.socketpair()
    dog, got = Watchdog(0.2), []
    with ours, peer:
        dog.arm(ours.fileno())
        peer.sendall(b"first")
        time.sleep(0.6)
        # When the caller reads it, then waits for the rest, which never comes
        reader = threading.Thread(target=lambda: got.extend([ours.recv(5), ours.recv(5)]))
        reader.start()
        reader.join(5)
        # Then the wait is cut
        assert not reader.is_alive() and got == [b"first", b""] and dog.fired == 1, got


def test_a_call_answered_in_time_is_left_alone() -> None:
    # Given calls that get their answer at once
    ours, peer = socket.socketpair()
    dog = Watchdog(1.0)  # (a thread held up past it between arm and recv would be cut)
    with ours, peer:
        for _ in range(50):
            dog.arm(ours.fileno())
            peer.sendall(b"x")
            assert ours.recv(1) == b"x"
            dog.disarm()
        time.sleep(1.5)  # longer than the bound, between calls: nothing is armed
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


GREEN_SCRIPT = """
import sys, time
if sys.argv[1] == "gevent":
    from gevent import monkey
    monkey.patch_all()
from celery_grousset.store.watchdog import Watchdog

import _socket  # (never patched: a driver's own socket, which blocks the OS thread)
a, b = _socket.socketpair()
dog = Watchdog(0.5)
dog.arm(a.fileno())
t0 = time.monotonic()
data = a.recv(1)  # as psycopg2 under gevent, psycopg under eventlet: no yield
print(dog.fired, data, round(time.monotonic() - t0, 1))
"""


def test_the_watchdog_fires_while_a_green_worker_s_driver_blocks_the_thread() -> None:
    """Under gevent or eventlet the watchdog was a green thread: a driver that blocks the
    OS thread without yielding (psycopg under eventlet) never let it run, and a half-open
    connection hung the whole worker (a review: no answer after 45 s)."""
    import subprocess
    import sys

    pytest.importorskip("gevent")
    # When a call blocks the OS thread of a gevent-patched process past the bound
    done = subprocess.run([sys.executable, "-c", GREEN_SCRIPT, "gevent"], capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    # Then the watchdog (a real thread) shut the socket down: the call returned
    assert done.returncode == 0, done.stderr[-2000:]
    fired, data, seconds = done.stdout.split()
    assert (fired, data) == ("1", "b''") and float(seconds) < 3, done.stdout
