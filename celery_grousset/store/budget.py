"""A time budget for the statements of a read-only page on the journal's database.

The admin's lists and filters run through the ORM on the journal's Django connection;
on a journal of tens of millions of rows a filter the indexes cannot serve (a rare
status: ``status`` has no index, on purpose — docs/scale.md) reads every row. Inside
:func:`statement_budget` each statement stops after ``seconds`` and the block raises
:class:`BudgetExceeded` instead of keeping the page (and a server backend) busy:

* PostgreSQL: ``SET LOCAL statement_timeout`` in a transaction around the block;
* MariaDB: ``max_statement_time`` (and ``lock_wait_timeout``, which bounds a wait for
  a table lock) for the session, put back after the block;
* SQLite and MySQL: no limit (an embedded or small journal).

:func:`estimated_rows` asks the planner (PostgreSQL, MariaDB) how many rows a query would return,
so a caller can skip a query that could not fit its budget without running it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_PG_CANCELED = "57014"  # query_canceled: the statement_timeout
_MARIADB_TIMEOUT = 1969  # ER_STATEMENT_TIMEOUT: max_statement_time exceeded
_MARIADB_LOCK_WAIT = 1205  # ER_LOCK_WAIT_TIMEOUT: here, lock_wait_timeout (a table lock)


class BudgetExceeded(Exception):
    """A statement ran past the block's time budget and was stopped by the server."""


def _stopped(exc: BaseException) -> bool:
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == _PG_CANCELED or getattr(cause, "pgcode", None) == (
        _PG_CANCELED
    ):
        return True
    return bool(exc.args) and exc.args[0] in (_MARIADB_TIMEOUT, _MARIADB_LOCK_WAIT)


@contextmanager
def statement_budget(alias: str, seconds: float | None) -> Iterator[None]:
    """Every statement the block runs on ``alias`` stops after ``seconds`` (None: no
    limit); one that does raises :class:`BudgetExceeded` (the block's reads are lost)."""
    from django.db import DatabaseError, connections, transaction

    conn = connections[alias]
    if seconds is None or conn.vendor not in ("postgresql", "mysql"):
        yield
        return
    if conn.vendor == "mysql" and not getattr(conn, "mysql_is_mariadb", False):
        yield
        return
    try:
        if conn.vendor == "postgresql":
            with transaction.atomic(using=alias):
                with conn.cursor() as cur:
                    cur.execute("SELECT current_setting('statement_timeout')")
                    (before,) = cur.fetchone()
                    cur.execute(f"SET LOCAL statement_timeout = {max(1, int(seconds * 1000))}")
                yield
                # A savepoint in the caller's transaction keeps a SET LOCAL past its end:
                # put back the limit the caller had (its own or the server's default).
                with conn.cursor() as cur:
                    cur.execute("SELECT set_config('statement_timeout', %s, true)", [before])
            return
        with conn.cursor() as cur:
            cur.execute("SELECT @@SESSION.max_statement_time, @@SESSION.lock_wait_timeout")
            before, waits = cur.fetchone()
            cur.execute(f"SET SESSION max_statement_time = {max(0.001, float(seconds))}, "
                        f"lock_wait_timeout = {max(1, math.ceil(seconds))}")  # fmt: skip
        try:
            yield
        finally:
            with conn.cursor() as cur:
                cur.execute(f"SET SESSION max_statement_time = {float(before)}, "
                            f"lock_wait_timeout = {int(waits)}")  # fmt: skip
    except DatabaseError as exc:
        if _stopped(exc):
            raise BudgetExceeded(f"a statement on {alias!r} ran past {seconds} s") from exc
        raise


def estimated_rows(qs: Any) -> int | None:
    """The planner's estimate of the rows ``qs`` returns, without reading them (one
    ``EXPLAIN``; PostgreSQL and MariaDB, None elsewhere or when the plan cannot be read)."""
    from django.db import DatabaseError, connections

    conn = connections[qs.db]
    mariadb = conn.vendor == "mysql" and getattr(conn, "mysql_is_mariadb", False)
    if conn.vendor != "postgresql" and not mariadb:
        return None
    sql, params = qs.query.get_compiler(using=qs.db).as_sql()  # the journal's own dialect
    explain = "EXPLAIN (FORMAT JSON) " if conn.vendor == "postgresql" else "EXPLAIN FORMAT=JSON "
    try:
        with conn.cursor() as cur:
            cur.execute(explain + sql, params)
            doc = cur.fetchone()[0]
        doc = json.loads(doc) if isinstance(doc, str) else doc
        if conn.vendor == "postgresql":
            return int(doc[0]["Plan"]["Plan Rows"])
        return _mariadb_rows(doc)
    except (DatabaseError, ValueError, LookupError, TypeError):
        return None


def _mariadb_rows(doc: Any) -> int | None:
    """The rows of the (one) table node of a MariaDB JSON plan, wherever it is nested,
    times its ``filtered`` share."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            table = node.get("table")
            if isinstance(table, dict) and "rows" in table:
                return int(float(table["rows"]) * float(table.get("filtered", 100)) / 100)
            stack.extend(node.values())
    return None
