"""A client-side bound on a statement's answer, for drivers without a read timeout.

``statement_timeout`` is enforced by the server: it never fires when the statement
does not reach the server, or its answer does not come back — a half-open connection
(a NAT or firewall that dropped the flow, a proxy that stopped forwarding), where the
peer's kernel keeps acknowledging and no error ever comes. psycopg then waits forever.
:class:`Watchdog` bounds that wait: one daemon thread per store watches the call in
progress, and shuts its socket down when the answer is overdue, so the driver's
blocked read fails at once (the store then treats it as a broken connection).
Arming and disarming are attribute writes; no thread is started or woken per call.
"""

from __future__ import annotations

import os
import time
import weakref
from contextlib import suppress

from celery_grousset.store.unpatched import original, start_os_thread


class Watchdog:
    """Shut down the socket of a call still waiting ``bound`` seconds after it began
    (checked ``CHECKS`` times per bound: it fires between ``bound`` and
    ``bound * (1 + 1/CHECKS)``)."""

    CHECKS = 4

    def __init__(self, bound: float) -> None:
        self.bound = bound
        self.fired = 0  #: how many calls it cut (for tests and logs)
        self._armed: tuple[float, int] | None = None  #: (deadline, socket fd)
        self._pid = 0

    def arm(self, fd: int) -> None:
        """Bound the call about to be made on the socket ``fd`` (until :meth:`disarm`).
        One attribute write: no lock, no wake-up (the thread polls)."""
        if self._pid != os.getpid():  # first use, or a forked child: start the thread (an
            self._pid = os.getpid()  # OS thread: the driver may block this one, unyielding)
            start_os_thread(_watch, weakref.ref(self), name="grousset-watchdog")
        self._armed = (time.monotonic() + self.bound, fd)

    def disarm(self) -> None:
        self._armed = None


def _watch(ref: weakref.ref[Watchdog]) -> None:
    """The watchdog's thread: it ends once its store (and watchdog) is gone, e.g. with
    the thread that used it (stores are per thread)."""
    sleep = original("time", "sleep")
    while (dog := ref()) is not None:
        pause = dog.bound / dog.CHECKS
        armed = dog._armed
        if (armed is not None and armed[0] <= time.monotonic() and dog._armed is armed
                and not _answered(armed[1])):  # (answered: left armed, looked at again)
            dog._armed = None
            dog.fired += 1
            _shut_down(armed[1])
        del dog
        sleep(pause)


def _answered(fd: int) -> bool:
    """The socket has something to read: its answer came (all of it, or a part: then the
    call is looked at again, and cut if it waits for the rest), and the caller is late
    to read it (a greenlet not scheduled, a thread held up), not waiting for it."""
    with suppress(OSError), original("socket", "socket")(fileno=os.dup(fd)) as sock:
        return bool(original("select", "select")([sock], [], [], 0)[0])
    return False


def _shut_down(fd: int) -> None:
    """Shut the socket down (both ways): a read blocked on it returns at once. The fd is
    duplicated, so closing our handle leaves the driver's own fd to the driver."""
    with suppress(OSError):
        sock = original("socket", "socket")(fileno=os.dup(fd))
        with suppress(OSError):
            sock.shutdown(2)  # SHUT_RDWR
        sock.close()
