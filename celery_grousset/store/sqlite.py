"""SQLite store (the embedded default): the claim inside ``BEGIN IMMEDIATE``.

``BEGIN IMMEDIATE`` takes SQLite's single write lock before the row is read, so
read-decide-write is atomic across processes. The database file is switched to
WAL mode (readers never block the writer). A lock not obtained within
``GROUSSET["STORE_TIMEOUT"]`` is :class:`StoreUnavailable` — never "run it".
SQLite's clock is the host's clock: SQLite serves one host.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

from celery_grousset.claim import ClaimRequest
from celery_grousset.exceptions import StoreUnavailable
from celery_grousset.store import refusals
from celery_grousset.store.base import (
    ClaimResult,
    check_claimable,
    data_error,
)
from celery_grousset.store.locking import COLS, TABLE, LockingStore
from celery_grousset.store.turns import turn

T = TypeVar("T")


class SQLiteStore(LockingStore):
    vendor = "sqlite"
    remote = False  # a failed statement of this process did not commit
    ph = "?"

    def _connect(self) -> sqlite3.Connection:
        name = str(self.settings_dict["NAME"])
        uri = name.startswith("file:")
        try:
            conn = sqlite3.connect(
                name, timeout=self.timeout, isolation_level=None, check_same_thread=False, uri=uri
            )
            if name != ":memory:" and "mode=memory" not in name:
                conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the SQLite journal {name!r}: {exc}") from exc
        self._conn = conn
        return conn

    def _cursor(self) -> Any:
        conn = self._conn or self._connect()
        return conn.cursor()

    def _lock_row(self, cur: Any, req: ClaimRequest) -> tuple[tuple[Any, ...] | None, datetime]:
        # (the transaction's BEGIN IMMEDIATE took the database's write lock)
        cur.execute(
            f"SELECT {COLS} FROM {TABLE} WHERE processor_id = ? AND fingerprint = ?",
            (req.processor_id, req.fingerprint),
        )
        return cur.fetchone(), datetime.now(timezone.utc)

    def _begin_write(self, cur: Any) -> None:
        """Take the write lock, waiting up to ``timeout``: the busy timeout does, but not
        on a database whose connections share a cache (Django's in-memory test database),
        where SQLite answers "database table is locked" at once: that wait is polled."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                cur.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "table is locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.005)

    def _now(self, cur: Any) -> datetime:
        return datetime.now(timezone.utc)

    def _commit(self, cur: Any) -> None:
        cur.execute("COMMIT")

    def _rollback(self, cur: Any) -> None:
        conn = self._conn
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                self.discard()

    def _ts(self, value: datetime) -> str:
        # Django's own SQLite format for an aware datetime under USE_TZ: naive UTC text.
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

    def parse_ts(self, value: Any) -> datetime:
        parsed = datetime.fromisoformat(str(value))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)

    def _claim_locked(self, cur: Any, req: ClaimRequest) -> ClaimResult:
        # SQLite does not enforce the columns' lengths: the store enforces the journal's.
        check_claimable(req)
        return super()._claim_locked(cur, req)

    def _guard(self, fn: Callable[[], T]) -> T:
        with turn(self):
            return self._guard_alone(fn)

    def _guard_alone(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except sqlite3.DataError as exc:  # permanent: the data, not the database
            raise data_error(self.alias, exc) from exc
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if "locked" in text or "busy" in text:
                raise StoreUnavailable(
                    f"the SQLite journal stayed locked for {self.timeout:g} s "
                    f"(STORE_TIMEOUT): {self._lock_holder()}"
                ) from exc
            if refusals.table_missing(exc):
                raise refusals.missing_table(self.alias, exc) from exc
            if "no such column" in text or "has no column named" in text:
                raise refusals.schema_behind(self.alias, exc) from exc
            self.discard()
            raise StoreUnavailable(f"SQLite journal {self.alias!r}: {exc}") from exc
        except sqlite3.Error as exc:
            self.discard()
            raise StoreUnavailable(f"SQLite journal {self.alias!r}: {exc}") from exc

    def _lock_holder(self) -> str:
        """Who holds the write lock: this thread's own ``transaction.atomic()`` on the same
        file (a guarded call run in-process inside it waits for itself), or another."""
        from django.db import connections

        mine = os.path.realpath(str(self.settings_dict["NAME"]))
        for conn in connections.all(initialized_only=True):
            if (conn.vendor == "sqlite" and conn.in_atomic_block
                    and os.path.realpath(str(conn.settings_dict["NAME"])) == mine):  # fmt: skip
                return (
                    f"this thread's own transaction.atomic() on {conn.alias!r} holds its "
                    "write lock (SQLite has one writer): a guarded call run in this process "
                    "inside it waits for itself; call it after the commit "
                    "(transaction.on_commit). (transactional=True helps only a call made "
                    "before the transaction's first write: its claim, on the journal's own "
                    "connection, needs the lock too; a key called twice in one transaction "
                    "waits for itself either way)"
                )
        return ("another connection holds its write lock (a transactional=True body for its "
                "whole run, an outbox relay's batch, a purge, a write of your own)")

    def lock_for_batch(self, queryset: Any) -> Any:
        """SQLite has one writer: take the write lock before the batch is read."""
        self._write_lock(queryset.model._meta.db_table)
        return queryset

    def begin_transactional(self) -> None:
        """SQLite has one writer: a transactional body holds the write lock from its start
        (a body that read first had its first write refused at once when another
        connection had committed since: WAL's snapshot rule)."""
        self._write_lock(TABLE)

    def _write_lock(self, table: str) -> None:
        """This transaction takes the database's write lock (a no-op write), waiting
        for it up to the connection's ``timeout``."""
        from django.db import connections

        with connections[self.alias].cursor() as cur:
            cur.execute(f"UPDATE {table} SET id = id WHERE 1 = 0")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
