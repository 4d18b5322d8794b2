"""The store contract: one atomic claim, a fenced completion, a release.

A store talks to the journal's database on a connection of its own (one per
process and database alias), in autocommit mode, so that:

* the claim commits on its own even when the caller is inside
  ``transaction.atomic()`` (DESIGN §4);
* Celery's Django fixup, which closes Django's connections around every task,
  does not make every claim pay for a new connection (DESIGN §10).

A connection that breaks is dropped and opened again on the next call; an
operation that fails on a connection that had been idle is retried once on a
fresh one (safe: a claim re-sent with the same token is recognised as the
caller's own, a completion re-sent with the same token matches its own row).
Anything else is :class:`~celery_grousset.exceptions.StoreUnavailable`: the
guard fails closed.
"""

from __future__ import annotations

import abc
import contextlib
import os
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery_grousset.claim import ENC_NONE, ClaimRequest, Kind


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What the claim found and left: the caller acts on ``kind``."""

    kind: Kind
    fence: int
    status: str
    deliveries: int
    takeovers: int
    result: bytes | None
    result_encoding: str
    error: str
    task_id: str
    started_at: datetime | None
    completed_at: datetime | None
    #: seconds (database clock) until an in-flight claim turns stale; 0 otherwise
    retry_in: float

    @property
    def owned(self) -> bool:
        return self.kind.owned


@dataclass(frozen=True, slots=True)
class Completion:
    """The terminal write of an attempt."""

    status: str  #: "completed" or "failed"
    result: bytes | None = None
    result_encoding: str = ENC_NONE
    error: str = ""


class Store(abc.ABC):
    """One database alias' journal, on a private connection."""

    vendor: str = ""

    def __init__(
        self,
        alias: str,
        settings_dict: dict[str, Any],
        timeout: float,
        claim_commit: str = "durable",
    ) -> None:
        self.alias = alias
        self.settings_dict = settings_dict
        self.timeout = timeout
        #: GROUSSET["CLAIM_COMMIT"]: "async" lets an owning claim skip the WAL flush
        #: (PostgreSQL only; the other stores always commit durably).
        self.claim_commit = claim_commit

    @abc.abstractmethod
    def claim(self, req: ClaimRequest) -> ClaimResult:
        """Atomically claim ``(processor_id, fingerprint)`` or report what holds it."""

    @abc.abstractmethod
    def finish(
        self, processor_id: str, fingerprint: str, token: str, completion: Completion
    ) -> bool:
        """Fenced terminal write. False: the claim was lost (taken over)."""

    @abc.abstractmethod
    def release(self, processor_id: str, fingerprint: str, token: str | None = None) -> bool:
        """Free an in-flight claim so the next delivery runs (token None: any holder)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the private connection (only from the process that opened it)."""

    def driver_params(self) -> dict[str, Any]:
        """Connection keyword arguments for the driver, as Django's own backend builds
        them from ``self.settings_dict`` (so OPTIONS such as sslmode are honoured)."""
        from django.db import connections

        wrapper = type(connections[self.alias])(self.settings_dict, self.alias)
        return dict(wrapper.get_connection_params())

    def now_expression(self) -> Any:
        """The database clock as an ORM expression (used by transactional completion)."""
        from django.utils import timezone

        return timezone.now()

    def discard(self) -> None:
        """Forget the connection without I/O (after fork: the socket is the parent's)."""
        self._conn = None

    _conn: Any = None


_lock = threading.Lock()
_stores: dict[str, Store] = {}
_pid = os.getpid()


def store_class(engine: str) -> type[Store]:
    """The claim store for a Django database ``ENGINE`` (ImproperlyConfigured if none)."""
    if "postgresql" in engine or "postgis" in engine:
        from celery_grousset.store.postgresql import PostgresStore

        return PostgresStore
    if "sqlite" in engine:
        from celery_grousset.store.sqlite import SQLiteStore

        return SQLiteStore
    if "mysql" in engine:
        from celery_grousset.store.mysql import MySQLStore

        return MySQLStore
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"celery-grousset has no claim store for the database engine {engine!r}; "
        "supported: PostgreSQL, SQLite, MySQL/MariaDB. Point GROUSSET['DATABASE'] "
        "at a database alias using one of them."
    )


def get_store(alias: str | None = None) -> Store:
    """The store of ``alias`` (default: ``GROUSSET["DATABASE"]``) for this process."""
    global _pid
    from celery_grousset.conf import grousset_settings

    if alias is None:
        alias = grousset_settings.DATABASE
    pid = os.getpid()
    if pid != _pid:  # forked without the at-fork hook (e.g. os.fork in a test)
        _after_fork()
    store = _stores.get(alias)
    if store is not None:
        return store
    with _lock:
        store = _stores.get(alias)
        if store is None:
            from django.db import connections

            try:
                settings_dict = connections.settings[alias]
            except Exception as exc:
                from django.core.exceptions import ImproperlyConfigured

                raise ImproperlyConfigured(
                    f"celery-grousset: GROUSSET['DATABASE'] is {alias!r}, which is not "
                    f"in settings.DATABASES ({sorted(connections.settings)})."
                ) from exc
            cls = store_class(settings_dict["ENGINE"])
            store = cls(
                alias,
                settings_dict,
                float(grousset_settings.STORE_TIMEOUT),
                str(grousset_settings.CLAIM_COMMIT),
            )
            _stores[alias] = store
    return store


def reset_stores() -> None:
    """Close and forget every store of this process (settings changed, tests)."""
    with _lock:
        for store in _stores.values():
            with contextlib.suppress(Exception):
                store.close()
        _stores.clear()


def _after_fork() -> None:
    global _pid
    _pid = os.getpid()
    for store in _stores.values():
        store.discard()
    _stores.clear()


os.register_at_fork(after_in_child=_after_fork)


def _on_reload() -> None:
    reset_stores()


def install_reload_hook() -> None:
    from celery_grousset.conf import on_reload

    on_reload(_on_reload)


install_reload_hook()
