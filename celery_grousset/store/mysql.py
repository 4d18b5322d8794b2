"""MySQL / MariaDB store: ``SELECT … FOR UPDATE`` then insert or update, one short
transaction at READ COMMITTED on a private connection.

A lost first-insert race (duplicate key) or a deadlock retries the whole
transaction (bounded); a lock wait over ``GROUSSET["STORE_TIMEOUT"]`` is
:class:`StoreUnavailable`. Times come from ``UTC_TIMESTAMP(6)`` (``SYSDATE(6)`` after a row lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

from celery_grousset.claim import ENC_NOT_STORED, ClaimRequest
from celery_grousset.exceptions import StoreUnavailable
from celery_grousset.store import refusals
from celery_grousset.store.base import (
    ID_LIMITS,
    ClaimResult,
    Completion,
    data_error,
)
from celery_grousset.store.locking import COLS, TABLE, LockingStore
from celery_grousset.store.turns import turn

T = TypeVar("T")

_RETRY = {1213, 1062, 1020}  # deadlock, duplicate key (lost insert race), record changed
_GONE = {2006, 2013, 2055, 4031}  # server gone / lost connection / idle disconnect
_TIMEOUT = {1205, 1969, 3024}  # lock wait timeout, statement time limit (MariaDB, MySQL)
_TOO_BIG = 1153  # a statement over max_allowed_packet (the server drops the connection)
_UNKNOWN_VARIABLE = 1193  # a system variable this server does not have
#: table access denied; --read-only, a read-only transaction, read-only mode
_REFUSALS = {1142: refusals.DENIED, 1290: refusals.READ_ONLY, 1792: refusals.READ_ONLY,
             1836: refusals.READ_ONLY}  # fmt: skip
_BAD_STRING = 1366  # text the column's character set cannot hold: the data, every time
#: room for the completion's SQL text, its other parameters and the row read back
PACKET_MARGIN = 64 * 1024
#: bytes MySQLdb escapes with a backslash in a string literal (each then takes two)
_ESCAPED = tuple(bytes([c]) for c in b"\x00\n\r\x1a'\"\\")

#: read once per connection: the packet limit, and the character sets of the connection
#: and of the journal's text: both utf8mb4, or a character outside the BMP (an emoji)
#: cannot be stored (utf8mb3: Django 4.2's default connection charset)
CONNECTION_SQL = (
    "SELECT @@max_allowed_packet, @@character_set_connection, (SELECT CHARACTER_SET_NAME "
    "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = "
    f"'{TABLE}' AND COLUMN_NAME = 'args_repr'), @@innodb_rollback_on_timeout"
)
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def four_byte(connection_charset: str, column_charset: str | None) -> bool:
    """Whether text outside the BMP can be stored (a missing table: W009 says so)."""
    return connection_charset == "utf8mb4" and column_charset in (None, "utf8mb4")


def bmp(text: str) -> str:
    """``text`` with each character outside the BMP written as its escape (``\\U0001f600``)."""
    return text if text.isascii() else _ASTRAL.sub(lambda m: f"\\U{ord(m[0]):08x}", text)


#: The row, locked, and the clock read once the lock is ours: SYSDATE(6) is read when it
#: runs (the session's time zone is UTC), UTC_TIMESTAMP(6) as the statement began — before
#: a wait for the row's lock, which would date the claim early by that wait.
_SELECT = (
    f"SELECT {', '.join('o.' + c.strip() for c in COLS.split(','))}, SYSDATE(6) "
    f"FROM (SELECT 1 AS one) AS d LEFT JOIN {TABLE} AS o "
    "ON o.processor_id = %s AND o.fingerprint = %s FOR UPDATE"
)


class MySQLStore(LockingStore):
    vendor = "mysql"
    #: the server's max_allowed_packet, read when the private connection opens
    max_packet: int | None = None
    #: whether the journal stores text outside the BMP as it is (see CONNECTION_SQL)
    astral: bool = True
    #: whether a lock wait timeout rolls the whole transaction back (the server's
    #: innodb_rollback_on_timeout; see CONNECTION_SQL)
    timeout_ends: bool = False

    def ends_on_lock_timeout(self) -> bool:
        if self.max_packet is not None:  # the connection's facts are read
            return self.timeout_ends
        from django.db import connections  # else asked on Django's (a body's: open)

        connections[self.alias].ensure_connection()
        with contextlib.closing(connections[self.alias].connection.cursor()) as cur:
            cur.execute("SELECT @@innodb_rollback_on_timeout")
            return bool(cur.fetchone()[0])

    def _connect(self) -> Any:
        import MySQLdb
        params = self.driver_params()
        secs = max(1, math.ceil(self.timeout))
        params["connect_timeout"] = secs
        params["read_timeout"] = secs + 5
        params["write_timeout"] = secs + 5
        try:
            conn = MySQLdb.connect(**params)
            conn.autocommit(False)
            cur = conn.cursor()
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            # row locks and metadata locks (FLUSH TABLES WITH READ LOCK, LOCK TABLES, an
            # ALTER queued): a claim behind either gives up within the store timeout
            cur.execute(f"SET SESSION innodb_lock_wait_timeout = {secs}, lock_wait_timeout = "
                        f"{secs}, time_zone = '+00:00'")  # fmt: skip
            try:  # MariaDB ends a session stalled mid-transaction (a frozen worker) after T,
                cur.execute(f"SET SESSION idle_transaction_timeout = {secs}")  # not at
            except MySQLdb.Error as exc:  # wait_timeout (8 h): its row locks are freed
                if exc.args[:1] != (_UNKNOWN_VARIABLE,):  # (MySQL has no such variable)
                    raise
            cur.execute(CONNECTION_SQL)  # once per connection
            packet, connection_charset, column_charset, timeout_ends = cur.fetchone()
            self.max_packet, self.timeout_ends = int(packet), bool(timeout_ends)
            self.astral = four_byte(connection_charset, column_charset)
            conn.commit()
        except MySQLdb.Error as exc:
            raise StoreUnavailable(
                f"celery-grousset cannot connect to the journal database {self.alias!r} "
                f"(MySQL/MariaDB): {exc}"
            ) from exc
        self._conn = conn
        return conn

    def _cursor(self) -> Any:
        conn = self._conn or self._connect()
        return conn.cursor()

    def _lock_row(self, cur: Any, req: ClaimRequest) -> tuple[tuple[Any, ...] | None, datetime]:
        cur.execute(_SELECT, (req.processor_id, req.fingerprint))
        row = cur.fetchone()
        now = row[-1].replace(tzinfo=timezone.utc)
        return (tuple(row[:-1]) if row[0] is not None else None), now

    def _now(self, cur: Any) -> datetime:
        cur.execute("SELECT UTC_TIMESTAMP(6)")
        value: datetime = cur.fetchone()[0]
        return value.replace(tzinfo=timezone.utc)

    def _commit(self, cur: Any) -> None:
        cur.connection.commit()

    def _rollback(self, cur: Any) -> None:
        try:
            cur.connection.rollback()
        except Exception:
            self.discard()

    def _ts(self, value: datetime) -> datetime:
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def parse_ts(self, value: Any) -> datetime:
        return value.replace(tzinfo=timezone.utc)  # type: ignore[no-any-return]

    def _guard(self, fn: Callable[[], T]) -> T:
        with turn(self):
            return self._guard_alone(fn)

    def _guard_alone(self, fn: Callable[[], T]) -> T:
        import MySQLdb

        reconnected = False
        for _attempt in range(self.attempts):
            fresh = self._conn is None
            try:
                return fn()
            except MySQLdb.Error as exc:
                code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
                if code in _RETRY:
                    continue
                if isinstance(exc, MySQLdb.DataError) or code in (_TOO_BIG, _BAD_STRING):
                    if code == _TOO_BIG:
                        self.discard()  # the server has closed the connection
                    raise data_error(self.alias, exc) from exc
                if code in _TIMEOUT:
                    raise refusals.timed_out(self.alias, self.timeout, exc) from exc
                if refusals.table_missing(exc):
                    raise refusals.missing_table(self.alias, exc) from exc
                if code == 1054:  # unknown column
                    raise refusals.schema_behind(self.alias, exc) from exc
                if code in _REFUSALS:
                    raise refusals.refused(self.alias, exc, _REFUSALS[code]) from exc
                self.discard()
                if code in _GONE and not fresh and not reconnected:
                    reconnected = True
                    continue
                why = refusals.first_line(exc)  # (not the context the server adds)
                raise StoreUnavailable(f"journal database {self.alias!r}: {why}") from exc
        raise StoreUnavailable(
            f"journal database {self.alias!r}: the claim transaction kept conflicting "
            f"({self.attempts} attempts)"
        )

    # -- text the journal can store ---------------------------------------------------------

    def _facts(self, guarded: bool = False) -> None:
        """Connect if the connection's facts (CONNECTION_SQL) are still unread; ``guarded``:
        the caller's own ``_guard`` handles the errors."""
        if self.max_packet is None:
            self._cursor() if guarded else self._guard(self._cursor)

    def _claim_together(self, reqs: Sequence[ClaimRequest]) -> list[ClaimResult]:
        self._facts(guarded=True)
        return super()._claim_together([self.storable(req) for req in reqs])

    def stored_text(self, text: str) -> str:
        """``text`` as this journal stores it (a look-up's value must compare to it)."""
        self._facts()
        return text if self.astral else bmp(text)

    def storable(self, req: ClaimRequest) -> ClaimRequest:
        """``req``, its text escaped outside the BMP when the journal is utf8mb3 (an emoji
        in the arguments must not refuse the call: ``args_repr`` is for humans)."""
        if self.astral:
            return req
        # an escape takes 10 characters: cut to the column (the same cut for every
        # delivery of the call, so its own task id still compares equal)
        return dataclasses.replace(
            req, task_name=bmp(req.task_name)[: ID_LIMITS["task_name"]],
            task_id=bmp(req.task_id)[: ID_LIMITS["task_id"]],
            worker=bmp(req.worker)[:255], args_repr=bmp(req.args_repr),
        )  # fmt: skip

    # -- completions that fit in one packet ---------------------------------------------

    def finish(
        self, processor_id: str, fingerprint: str, token: str, completion: Completion
    ) -> bool:
        return super().finish(processor_id, fingerprint, token, self.fitted(completion))

    def finish_in_transaction(self, req: ClaimRequest, completion: Completion) -> bool:
        """As on PostgreSQL, the completion waits for a lock at most ``STORE_TIMEOUT``
        (``innodb_lock_wait_timeout``, 50 s by default, else), put back after it; inside
        the caller's own transaction its session's settings are its own."""
        from django.db import connections

        conn: Any = connections[self.alias]
        fitted = self.fitted(completion)
        if len(conn.atomic_blocks) > 1:
            return super().finish_in_transaction(req, fitted)
        secs = max(1, math.ceil(self.timeout))
        sql = f"SET @grousset_lock_wait = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = {secs}"  # noqa: E501
        if conn.mysql_is_mariadb:  # a session gone silent before its commit (a partition)
            if getattr(conn, "grousset_idle_of", None) is not conn.connection:  # (once)
                sql += ", @grousset_idle = @@SESSION.idle_transaction_timeout"
            sql += f", SESSION idle_transaction_timeout = {secs}"
            conn.grousset_idle_of = conn.connection  # this session's: end_transactional
        with conn.cursor() as cur:  # the session's values kept in user variables
            cur.execute(sql)  # ends after T, its row lock freed (not at wait_timeout, 8 h)
        try:
            return super().finish_in_transaction(req, fitted)
        finally:  # on the driver's cursor: Django refuses its own after a failed statement
            try:
                with contextlib.closing(conn.connection.cursor()) as raw:
                    raw.execute("SET SESSION innodb_lock_wait_timeout = @grousset_lock_wait")
            except Exception:  # a broken connection: closed, nothing to put back
                pass

    def end_transactional(self) -> None:
        """The session's ``idle_transaction_timeout`` put back once the transaction whose
        completion bounded it ended: not before its commit, which it bounds too."""
        from django.db import connections

        conn: Any = connections[self.alias]
        session, conn.grousset_idle_of = getattr(conn, "grousset_idle_of", None), None
        if session is not None and session is conn.connection:  # (not a new session's)
            with contextlib.suppress(Exception), contextlib.closing(conn.connection.cursor()) as c:
                c.execute("SET SESSION idle_transaction_timeout = @grousset_idle")

    def fitted(self, completion: Completion) -> Completion:
        """``completion``, or — when its memo would make the statement larger than the
        server's ``max_allowed_packet`` (the server refuses it, every time) — the same
        completion with "result not stored": never a reason to run the effect again."""
        self._facts()
        if not self.astral:
            completion = dataclasses.replace(completion, error=bmp(completion.error))
        raw = completion.result
        if raw is None or completion.status != "completed":
            return completion
        limit = int(self.max_packet or 0)
        size = len(raw) + len(completion.error.encode()) * 2 + PACKET_MARGIN
        if size + len(raw) > limit:  # might not fit: count the escapes exactly
            size += sum(map(raw.count, _ESCAPED))
        if size <= limit:
            return completion
        return Completion(
            completion.status, None, ENC_NOT_STORED,
            f"result not stored: {len(raw)} bytes encoded would not fit in the server's "
            f"max_allowed_packet ({limit} bytes, with a {PACKET_MARGIN}-byte margin); raise "
            "max_allowed_packet on the server or return less",
        )  # fmt: skip

    clock_sql = "SELECT UTC_TIMESTAMP(6)"

    def now_expression(self, plus: float = 0.0) -> Any:
        from django.db.models import DateTimeField
        from django.db.models.expressions import RawSQL

        return RawSQL(
            "UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND",
            (int(plus * 1e6),),
            output_field=DateTimeField(),
        )

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
