"""The PostgreSQL driver of the store: whichever one Django's connection uses.

Django's PostgreSQL backend runs on psycopg 3 when it is installed and on psycopg2
otherwise (``django.db.backends.postgresql.psycopg_any``); the store follows the
same choice, so a project needs no second driver. This module is the store's only
import of either driver: it opens the private autocommit connection, sends a
statement, and names the driver's error classes, which are the same on both (psycopg
3 kept psycopg2's hierarchy and SQLSTATE classes).

A statement marked ``prepare`` is prepared server-side once per connection and then
sent as ONE message per call on both drivers: psycopg 3 prepares it itself
(``prepare=True``: Bind/Execute/Sync); on psycopg2, which only sends client-side
interpolated text, the statement is ``PREPARE``d once (its ``%(name)s`` parameters
numbered ``$1…``) and each call sends ``EXECUTE name(…)`` as one simple query.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import struct
import time
from socket import AF_UNIX, SOCK_STREAM
from types import ModuleType
from typing import Any

from celery_grousset.store.unpatched import original, start_os_thread

_NAMED = re.compile(r"%\((\w+)\)s")
#: the protocol's SSLRequest: a server answers it with one byte, S or N
_SSL_REQUEST = struct.pack("!II", 8, 80877103)


def is_psycopg3() -> bool:
    """True when Django's PostgreSQL backend runs on psycopg 3 (its own test)."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3 as django_choice

    return bool(django_choice)


#: seconds :meth:`Driver.interrupt` waits for its cancel request to be sent
INTERRUPT_WAIT = 2.0


class Driver:
    """One driver's connection, execution and error classes (see the module doc)."""

    name = ""
    module: ModuleType

    def __init__(self) -> None:
        errors = self.module.errors
        self.Error: type[Exception] = self.module.Error
        self.DataError: type[Exception] = self.module.DataError
        self.OperationalError: type[Exception] = self.module.OperationalError
        self.InterfaceError: type[Exception] = self.module.InterfaceError
        self.QueryCanceled: type[Exception] = errors.QueryCanceled
        self.LockNotAvailable: type[Exception] = errors.LockNotAvailable
        self.DeadlockDetected: type[Exception] = errors.DeadlockDetected
        self.UndefinedTable: type[Exception] = errors.UndefinedTable
        self.UndefinedColumn: type[Exception] = errors.UndefinedColumn
        self.UniqueViolation: type[Exception] = errors.UniqueViolation

    def connect(self, params: dict[str, Any]) -> Any:
        """A new connection in autocommit mode (the driver's Error if it fails)."""
        raise NotImplementedError

    def execute(
        self, conn: Any, sql: str, params: Any = None, *, prepare: bool | None = None
    ) -> Any:
        """Send ``sql``; a cursor with the outcome (``fetchone()``, ``rowcount``).
        ``prepare``: True prepares it on the server; otherwise it is not prepared."""
        raise NotImplementedError

    def broken(self, conn: Any) -> bool:
        """The connection was lost (not merely an error on a statement)."""
        raise NotImplementedError

    def interrupt(self, conn: Any, within: float = INTERRUPT_WAIT) -> None:
        """Cancel the statement ``conn`` may be running, whose answer its caller will not
        read (a soft time limit raised while it waited for a lock): it ends on the server
        now, committed or not, instead of whenever the lock is let go. Best effort, waited
        for at most ``within`` seconds: libpq's cancel opens a connection of its own, with
        no timeout (a server that does not answer would hold the caller for minutes)."""

        done: list[bool] = []  # (an OS thread: under gevent or eventlet the driver blocks)

        def cancel() -> None:
            with contextlib.suppress(Exception):  # (the connection is dropped anyway)
                self._cancel(conn, within)
            done.append(True)

        start_os_thread(cancel, name="grousset-cancel")
        deadline = time.monotonic() + within
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)  # (patched under gevent: the hub runs meanwhile)

    def _cancel(self, conn: Any, within: float) -> None:
        """libpq's blocking cancel, sent only to a server that answers within ``within``
        seconds: both drivers hold the GIL while it waits (the whole process would stop,
        every thread, until a server that does not answer let it go)."""
        if answers(conn, within):
            conn.cancel()

    def in_transaction_error(self, conn: Any) -> bool | None:
        """libpq's transaction status of ``conn``: True when its transaction was aborted
        by an error (INERROR), False when it can go on, None when the connection is gone
        (UNKNOWN) or cannot say."""
        try:
            status = self._status(conn)
        except Exception:
            return None
        return None if status == _UNKNOWN else status == _INERROR

    def _status(self, conn: Any) -> int:
        raise NotImplementedError


#: why a pooler refuses the store's connection, and the fix
POOLER_FIX = (
    " (a connection pooler such as PgBouncer refuses the startup options that carry the "
    "store's timeouts, in session and transaction mode alike: point the journal's alias at "
    "PostgreSQL directly, or add options to the pooler's ignore_startup_parameters, which "
    "drops the timeouts; docs/configuration.md, \"PgBouncer and other poolers\")"
)

#: libpq's PGTransactionStatusType: in a failed transaction block; connection bad
_INERROR, _UNKNOWN = 3, 4
_NEVER = 2**62  # psycopg 3's prepare_threshold: never prepared by itself


class Psycopg3(Driver):
    name = "psycopg"

    def __init__(self) -> None:
        import psycopg

        self.module = psycopg
        super().__init__()

    def connect(self, params: dict[str, Any]) -> Any:
        # prepared only when asked (prepare=True): a statement psycopg prepared by itself
        # after a few runs would fail behind a pooler in transaction mode (None would turn
        # off the asked-for ones too)
        return self.module.connect(**{**params, "autocommit": True, "prepare_threshold": _NEVER})

    def execute(
        self, conn: Any, sql: str, params: Any = None, *, prepare: bool | None = None
    ) -> Any:
        return conn.execute(sql, params, prepare=prepare)

    def broken(self, conn: Any) -> bool:
        return bool(conn.broken)

    def _status(self, conn: Any) -> int:
        return int(conn.info.transaction_status)

    def _cancel(self, conn: Any, within: float) -> None:
        capabilities = getattr(self.module, "capabilities", None)  # (psycopg 3.2+)
        if capabilities is not None and capabilities.has_cancel_safe():  # libpq 17: bounded
            conn.cancel_safe(timeout=within)
        else:
            super()._cancel(conn, within)


class Psycopg2(Driver):
    name = "psycopg2"

    def __init__(self) -> None:
        import psycopg2
        import psycopg2.errors
        import psycopg2.extensions

        self.module = psycopg2
        super().__init__()

        class Connection(psycopg2.extensions.connection):  # type: ignore[misc]
            """Remembers which statements this server session has prepared."""

            prepared: set[str]

        self.connection_class = Connection

    def connect(self, params: dict[str, Any]) -> Any:
        conn = self.module.connect(connection_factory=self.connection_class, **params)
        conn.autocommit = True
        conn.prepared = set()
        return conn

    def execute(
        self, conn: Any, sql: str, params: Any = None, *, prepare: bool | None = None
    ) -> Any:
        cur = conn.cursor()
        if prepare:
            sql, params = self._prepared(conn, cur, sql, params)
        try:
            cur.execute(sql, params)
        except ValueError as exc:  # a NUL or a lone surrogate, refused before sending
            raise self.DataError(f"{type(exc).__name__}: {exc}") from exc
        return cur

    def _prepared(self, conn: Any, cur: Any, sql: str, params: dict[str, Any]) -> tuple[str, Any]:
        """``EXECUTE`` of ``sql`` prepared on this connection (``PREPARE`` it first)."""
        names = list(dict.fromkeys(_NAMED.findall(sql)))
        name = "grousset_" + hashlib.blake2b(sql.encode(), digest_size=8).hexdigest()
        if name not in conn.prepared:
            numbered = _NAMED.sub(lambda m: f"${names.index(m.group(1)) + 1}", sql)
            cur.execute(f"PREPARE {name} AS {numbered.replace('%%', '%')}")
            conn.prepared.add(name)
        return f"EXECUTE {name}({', '.join(f'%({n})s' for n in names)})", params

    def broken(self, conn: Any) -> bool:
        return int(conn.closed) == 2

    def _status(self, conn: Any) -> int:
        return _UNKNOWN if conn.closed else int(conn.get_transaction_status())


def answers(conn: Any, within: float) -> bool:
    """The server ``conn`` is connected to answers an SSLRequest within ``within``
    seconds on a new connection: its postmaster accepts and serves one (libpq's cancel
    opens one and waits, with no timeout, for its end). The address is the live
    socket's peer: the one libpq chose (``hostaddr``, one of several hosts or addresses);
    a Unix socket's, by the path this process connected through."""
    try:
        with original("socket", "socket")(fileno=os.dup(conn.fileno())) as live:
            family, address = live.family, live.getpeername()
        if family == AF_UNIX:  # (the server's own path, maybe not this host's: a volume)
            address = f"{conn.info.host}/.s.PGSQL.{conn.info.port}"
        with original("socket", "socket")(family, SOCK_STREAM) as sock:
            sock.settimeout(within)
            sock.connect(address)
            sock.sendall(_SSL_REQUEST)
            return sock.recv(1) in (b"N", b"S", b"E")
    except OSError:
        return False


_driver: Driver | None = None


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg 3 or psycopg2 error (None if it has none)."""
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


def driver() -> Driver:
    """The driver Django's PostgreSQL backend uses in this process."""
    global _driver
    if _driver is None:
        _driver = Psycopg3() if is_psycopg3() else Psycopg2()
    return _driver


def statement_timeout_ms(conn: Any) -> int:
    """The server's ``statement_timeout`` on ``conn``, in ms (0: none). From
    ``current_setting()``, which every role may read (``pg_settings`` may be revoked)."""
    sql = (
        "SELECT (extract(epoch FROM current_setting('statement_timeout')::interval)"
        " * 1000)::bigint"
    )
    return int(driver().execute(conn, sql).fetchone()[0])
