"""The standard library as it was before gevent or eventlet patched it. A thread that
must run while a database driver blocks the OS thread (psycopg under eventlet, psycopg2
under gevent: neither yields) cannot be a green thread: the store's watchdog, the cancel
of an interrupted statement, and the store per OS thread are the real ones."""

from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any

#: eventlet's names for the modules it patches
_EVENTLET = {"threading": "thread", "_thread": "thread"}


def original(module: str, name: str) -> Any:
    """``module.name`` as it was before gevent or eventlet patched ``module``."""
    with contextlib.suppress(Exception):  # (imported already if they patched anything)
        if (monkey := sys.modules.get("gevent.monkey")) and monkey.is_module_patched(module):
            return monkey.get_original(module, name)
        patcher = sys.modules.get("eventlet.patcher")
        if patcher and patcher.is_monkey_patched(_EVENTLET.get(module, module)):
            return getattr(patcher.original(module), name)
    return getattr(importlib.import_module(module), name)


def start_os_thread(fn: Any, *args: Any, name: str) -> None:
    """Run ``fn(*args)`` in an OS thread of its own, a daemon named ``name``. Under gevent
    or eventlet ``threading.Thread`` starts a greenlet, even its original class (it
    starts threads through the patched ``_thread``): then an unnamed one of ``_thread``."""
    import _thread
    import threading

    start = original("_thread", "start_new_thread")
    if start is _thread.start_new_thread:  # not patched
        threading.Thread(target=fn, args=args, name=name, daemon=True).start()
    else:
        start(fn, args)

