"""One operation at a time on a thread's store; a claim waits its turn at most
``STORE_TIMEOUT``.

The greenlets of a thread (gevent, eventlet) share its store and its connection
(docs/how-it-works.md). Behind an operation that waits — a claim of a row another
session holds, up to ``STORE_TIMEOUT`` — the others used to wait in turn, for as long as
all the operations ahead of them took: past a task's hard time limit, which gevent
enforces, a task killed before its claim was even sent failed with its message
acknowledged, and its call was lost. Now a claim (:func:`claiming`: the claim, and
what comes before it — the settling of a claim whose answer was lost, the looks of a
caller that waits) that does not get its turn within ``STORE_TIMEOUT`` is refused like
a journal that does not answer (:class:`StoreUnavailable`: the delivery is sent again
with backoff; nothing was written, no effect ran). Every other operation — a
completion, a release: an effect may have run, and its outcome must be written — waits
for its turn as long as it takes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from celery_grousset.exceptions import StoreUnavailable

T = TypeVar("T")

#: the operation in progress in this context is a claim (its turn is bounded)
_CLAIMING: ContextVar[bool] = ContextVar("grousset_claiming", default=False)


def claiming(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a claim: the store's turn is waited for at most ``STORE_TIMEOUT``."""
    token = _CLAIMING.set(True)
    try:
        return fn(*args)
    finally:
        _CLAIMING.reset(token)


@contextlib.contextmanager
def turn(store: Any) -> Iterator[None]:
    """Hold ``store``'s lock for one operation (a claim's turn bounded by ``timeout``)."""
    lock = store._lock
    acquire = getattr(lock, "acquire", None)
    if acquire is None:  # (a store made by hand, not a thread's: no lock)
        yield
        return
    if not _CLAIMING.get():
        acquire()
    elif not acquire(timeout=store.timeout):
        raise StoreUnavailable(
            f"the connection of this thread to the journal database {store.alias!r} stayed "
            f"busy for {store.timeout:g} s (STORE_TIMEOUT) with other calls of the thread: "
            "the greenlets of a gevent or eventlet worker share it, one operation at a "
            "time, and one ahead waited (a row another session holds); the claim was not "
            "made, and the delivery is sent again"
        )
    try:
        yield
    finally:
        lock.release()
