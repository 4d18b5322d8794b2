"""Claim stores, one per database vendor (see :mod:`celery_grousset.store.base`):
every SQL statement of the package and the database clock live in this package.

:func:`get_store` gives the store of a database alias, one per thread of a process (the
greenlets of a thread share it): a store's connection runs one transaction at a time.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref

from celery_grousset.store.base import ClaimResult, Completion, Store, check_claimable
from celery_grousset.store.unpatched import original

__all__ = [
    "ClaimResult",
    "Completion",
    "Store",
    "check_claimable",
    "get_store",
    "reset_stores",
    "store_class",
]


def store_class(engine: str) -> type[Store]:
    """The claim store for a Django database ``ENGINE`` (ConfigurationError if none)."""
    if "postgresql" in engine or "postgis" in engine:
        from celery_grousset.store.postgresql import PostgresStore

        return PostgresStore
    if "sqlite" in engine:
        from celery_grousset.store.sqlite import SQLiteStore

        return SQLiteStore
    if "mysql" in engine:
        from celery_grousset.store.mysql import MySQLStore

        return MySQLStore
    from celery_grousset.exceptions import ConfigurationError

    raise ConfigurationError(
        f"celery-grousset has no claim store for the database engine {engine!r}; "
        "supported: PostgreSQL, SQLite, MySQL/MariaDB. Point GROUSSET['DATABASE'] "
        "at a database alias using one of them."
    )


def _os_thread_local() -> type:
    """``threading.local`` as it was before gevent or eventlet patched it: greenlets of
    one OS thread share a store (a store per task would open a connection per task), as
    they shared the one store of a process before stores were per thread."""
    return original("threading", "local")  # type: ignore[no-any-return]


class _Stores(dict):  # type: ignore[type-arg]
    """One thread's stores by alias; when the thread ends, its stores' connections are
    closed (only by the process that opened them; after a fork, dropped without I/O).
    Not at the interpreter's exit: a daemon thread may still be using them."""

    def __init__(self, generation: int) -> None:
        super().__init__()
        self.generation = generation
        self.opened: list[Store] = []
        weakref.finalize(self, _close, self.opened, os.getpid()).atexit = False


def _close(stores: list[Store], pid: int) -> None:
    for store in stores:
        with contextlib.suppress(Exception):
            store.close() if os.getpid() == pid else store.discard(forked=True)


_lock = threading.Lock()
_local = _os_thread_local()()
#: every store of this process, for :func:`reset_stores` and after a fork (weak: a
#: thread's stores go with it)
_every: weakref.WeakSet[Store] = weakref.WeakSet()
_held: list[Store] = []  # every store, held across a fork (see _before_fork)
#: the stores a component keeps for itself (:func:`private_store`): never reset, but
#: discarded in a forked child as every other store is
_private: weakref.WeakSet[Store] = weakref.WeakSet()
_generation = [0]  # moved on by reset_stores: every thread's stores are then new
_pid = os.getpid()


def get_store(alias: str | None = None) -> Store:
    """The store of ``alias`` (default: ``GROUSSET["DATABASE"]``) for this thread. Threads
    of one process never share a store: two claims interleaved on one connection (a
    ``--pool threads`` worker, threads calling ``protect()``) undo each other's
    transactions. (Greenlets of one thread share it: see :func:`_os_thread_local`.)"""
    from celery_grousset.conf import grousset_settings

    if alias is None:
        alias = grousset_settings.DATABASE
    if os.getpid() != _pid:  # forked without the at-fork hook (e.g. os.fork in a test)
        _after_fork()
    stores: _Stores | None = getattr(_local, "stores", None)
    if stores is None or stores.generation != _generation[0]:
        stores = _local.stores = _Stores(_generation[0])
    store = stores.get(alias)
    if store is None:
        store = _install(alias, _new_store(alias), stores)
    return store


def private_store(alias: str) -> Store:
    """A store of ``alias`` that the caller keeps for itself, not this thread's (the
    worker's claim thread keeps one per database and closes it on its stop). A forked
    child discards it, as it does every store: freed there, its connection could end
    the parent's session."""
    store = _new_store(alias)
    with _lock:
        _private.add(store)
    return store


def _install(alias: str, store: Store, stores: _Stores | None = None) -> Store:
    """Make ``store`` this thread's store of ``alias`` (tests inject one this way)."""
    if stores is None:
        get_store(alias)  # this thread's current generation of stores
        stores = _local.stores
    store._lock = threading.RLock()  # the greenlets of a thread share it (a green lock)
    stores[alias] = store
    stores.opened.append(store)
    with _lock:
        _every.add(store)
    return store


def _new_store(alias: str) -> Store:
    from django.db import connections

    from celery_grousset.conf import grousset_settings
    from celery_grousset.exceptions import ConfigurationError

    try:
        settings_dict = connections.settings[alias]
    except Exception as exc:
        named = (f"GROUSSET['DATABASE'] is {alias!r}" if alias == grousset_settings.DATABASE
                 else f"the journal database {alias!r} (a task's database option, or the "
                 "database argument given)")  # fmt: skip
        raise ConfigurationError(
            f"celery-grousset: {named}, which is not in settings.DATABASES "
            f"({sorted(connections.settings)})."
        ) from exc
    cls = store_class(settings_dict["ENGINE"])
    if grousset_settings.JOURNAL_LAYOUT == "partitioned":
        if cls.vendor != "postgresql":
            raise ConfigurationError(
                f"GROUSSET['JOURNAL_LAYOUT'] is 'partitioned', but the journal database "
                f"{alias!r} is not PostgreSQL: only PostgreSQL has the partitioned layout. "
                "Set JOURNAL_LAYOUT to 'table' (the default)."
            )
        from celery_grousset.store.pgpartition import PartitionedStore

        cls = PartitionedStore
    return cls(
        alias,
        settings_dict,
        float(grousset_settings.STORE_TIMEOUT),
        str(grousset_settings.CLAIM_COMMIT),
    )


def reset_stores() -> None:
    """Close and forget every store of this process, in every thread (settings changed,
    tests)."""
    with _lock:
        _generation[0] += 1
        for store in _all():
            with contextlib.suppress(Exception):
                store.close()
        _every.clear()


def _all(stores: weakref.WeakSet[Store] | None = None) -> list[Store]:
    while True:
        with contextlib.suppress(RuntimeError):  # a thread's stores went (or came) meanwhile
            return list(_every if stores is None else stores)


def _before_fork() -> None:
    """Hold every store across the fork: in the child, the other threads' stores are
    freed, and a connection freed there could close the parent's session (mysqlclient
    says goodbye on the socket), unless it is discarded first."""
    _held[:] = [*_all(), *_all(_private)]


def _after_fork() -> None:
    global _pid, _lock
    _pid = os.getpid()
    _lock = threading.Lock()  # another thread may have held it at the fork
    _generation[0] += 1
    for store in [*_held, *_all()]:
        store.discard(forked=True)
    _held.clear()
    _every.clear()
    _private.clear()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork,
                    after_in_parent=_held.clear)  # fmt: skip


def _install_reload_hook() -> None:
    from celery_grousset.conf import on_reload

    on_reload(reset_stores)


_install_reload_hook()
