"""One operation at a time on a thread's store, each waiting its turn at most
``STORE_TIMEOUT``.

The greenlets of a thread (gevent, eventlet) share its store and its connection
(docs/how-it-works.md). Behind an operation that waits — a claim of a row another
session holds, up to ``STORE_TIMEOUT`` — the others used to wait in turn, for as long as
all the operations ahead of them took: past a task's hard time limit, which gevent
enforces, a task killed before its claim was even sent failed with its message
acknowledged, and its call was lost. Now a turn not had within ``STORE_TIMEOUT`` is
refused like a journal that does not answer (:class:`StoreUnavailable`: the delivery is
sent again with backoff; nothing was written).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from celery_grousset.exceptions import StoreUnavailable


@contextlib.contextmanager
def turn(store: Any) -> Iterator[None]:
    """Hold ``store``'s lock for one operation, waited for at most ``store.timeout``."""
    lock = store._lock
    acquire = getattr(lock, "acquire", None)
    if acquire is None:  # (a store made by hand, not a thread's: no lock)
        yield
        return
    if not acquire(timeout=store.timeout):
        raise StoreUnavailable(
            f"the connection of this thread to the journal database {store.alias!r} stayed "
            f"busy for {store.timeout:g} s (STORE_TIMEOUT) with other calls of the thread: "
            "the greenlets of a gevent or eventlet worker share it, one operation at a "
            "time, and one ahead waited (a row another session holds); the delivery is "
            "sent again"
        )
    try:
        yield
    finally:
        lock.release()
