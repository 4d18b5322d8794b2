"""PostgreSQL store: the claim is ONE statement, ONE round trip, in every case.

The statement locks the existing row (if any) in a materialized CTE that evaluates
the decision table of :mod:`celery_grousset.claim` on it once (SQL generated from
``claim.RULES``), then runs an
``INSERT … ON CONFLICT DO UPDATE`` that applies the decision, and returns the row
it left with the decision's code. A claim that takes nothing (a duplicate, a
fresh in-flight claim) only counts a delivery: it commits with
``synchronous_commit = off`` for that one transaction, so it does not wait for a
WAL flush (a crash may lose a few delivery counts, never a claim or a completion).
Claims and completions commit durably — unless ``GROUSSET["CLAIM_COMMIT"]`` is
``"async"`` (opt-in): then claims that take a row skip the flush too, and only the
completion waits for it (docs/performance.md says what that trades). All times
come from ``clock_timestamp()`` (the database's clock). Statements are prepared
server-side on a private connection in autocommit mode, on the driver Django's
connection uses (psycopg 3 or psycopg2: :mod:`celery_grousset.store.pgdriver`);
``lock_timeout`` and ``statement_timeout`` bound every call by
``GROUSSET["STORE_TIMEOUT"]``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from celery_grousset.claim import (
    ENC_GAVE_UP,
    REDELIVERY,
    WRITES,
    ClaimRequest,
    Kind,
    Write,
    codes,
    decision_sql,
    gave_up_message,
)
from celery_grousset.exceptions import StoreUnavailable
from celery_grousset.store.base import RELEASED, ClaimResult, Completion, Store, data_error
from celery_grousset.store.pgdriver import driver
from celery_grousset.store.pgops import PostgresOperations
from celery_grousset.store.watchdog import Watchdog

T = TypeVar("T")

_NOW = "clock_timestamp()"

# The row of one claim, found through the unique key (fingerprint, processor_id) and
# nothing else. Written plainly, `processor_id = $1` also matches the admin's
# (processor_id, started_at) index, and while the table has no statistics (new, or
# just truncated) the generic plan ties the two and may pick that one: every claim
# then scans all of its processor's rows. `|| ''` keeps the processor a filter on
# the unique index's row, whatever the statistics say.
KEY = "{t}fingerprint = %(f)s AND {t}processor_id || '' = %(p)s"

# In ON CONFLICT DO UPDATE: the decision the CTE made on the locked row (generated from
# claim.RULES, so the SQL and Python forms of the table cannot drift), carried into the
# proposed row in its `error` column (read once in lock_first; '' when the CTE found no
# row). A fresh insert keeps that '' as its error. (Written as a scalar subquery on the
# CTE instead, each of its ~20 uses was a separate sub-plan for the executor to set up on
# every call: measured 3 % of a claim + complete, 7 % of a duplicate claim.)
_A = "EXCLUDED.error"
# The decisions that take the row: their codes, and only theirs, sort after 'q' (one
# comparison instead of a list keeps the statement short; see claim._CODES).
_TAKES = "> 'q'"
_CLAIM = f"{_A} {_TAKES}"
assert {k.code for k, w in WRITES.items() if w in (Write.CLAIM, Write.CLAIM_RESET)} == {
    k.code for k in Kind if k.code > "q"
}
_RESET = f"{_A} = '{Kind.EXPIRED.code}'"
_GIVE_UP = f"{_A} = '{Kind.GAVE_UP.code}'"
_KEEP = f"{_A} = '{Kind.RESUMED.code}'"
_TAKEOVER = f"{_A} = '{Kind.TAKEOVER.code}'"
_ANSWERED = f"{_A} IN {codes(Write.COUNT, Write.GIVE_UP)}"
# The claim's one moment: read once, after the lock (see lock_first), so that
# expires_on - started_at is exactly expires_after.
_T = "EXCLUDED.started_at"
# (a parameter, not a literal: the statement's text stays under psycopg's 4 KiB cache limit)
_GAVE_UP_ERROR = gave_up_message("{n}")
# A new row's fence: the claim's moment in microseconds since the epoch (claim.clock_fence).
_CLOCK_FENCE = "(EXTRACT(EPOCH FROM lock_first.t) * 1000000)::int8"


def _if(cond: str, then: str, col: str) -> str:
    return f"CASE WHEN {cond} THEN {then} ELSE o.{col} END"


_SET = {
    "claim_token": _if(_CLAIM, "EXCLUDED.claim_token", "claim_token"),
    # The clock fence the insert proposed, or one more than the row's (fences never go
    # back, even across a purge: docs/guarantee.md, "Fencing tokens").
    "fence": _if(_CLAIM, "GREATEST(o.fence + 1, EXCLUDED.fence)", "fence"),
    "status": f"CASE WHEN {_CLAIM} THEN 'in_flight' WHEN {_GIVE_UP} THEN 'failed' "
    "ELSE o.status END",
    "task_name": _if(_CLAIM, "EXCLUDED.task_name", "task_name"),
    "task_id": _if(_CLAIM, "EXCLUDED.task_id", "task_id"),
    "worker": _if(_CLAIM, "EXCLUDED.worker", "worker"),
    "args_repr": _if(_CLAIM, "EXCLUDED.args_repr", "args_repr"),
    "payload_hash": _if(_CLAIM, "EXCLUDED.payload_hash", "payload_hash"),
    "started_at": _if(_CLAIM, _T, "started_at"),
    "stale_at": _if(_CLAIM, "EXCLUDED.stale_at", "stale_at"),
    "completed_at": f"CASE WHEN {_CLAIM} THEN NULL WHEN {_GIVE_UP} THEN {_T} "
    "ELSE o.completed_at END",
    "expires_on": f"CASE WHEN {_CLAIM} THEN EXCLUDED.expires_on WHEN {_GIVE_UP} "
    f"THEN {_T} + %(exp)s ELSE o.expires_on END",
    "deliveries": f"CASE WHEN {_RESET} THEN 1 WHEN {_KEEP} THEN o.deliveries "
    "ELSE o.deliveries + 1 END",
    "takeovers": f"CASE WHEN {_RESET} THEN 0 WHEN {_TAKEOVER} THEN o.takeovers + 1 "
    "ELSE o.takeovers END",
    # claim.counted(), in SQL
    "duplicates": f"CASE WHEN {_RESET} THEN 0 WHEN {_ANSWERED} AND NOT {REDELIVERY.sql} "
    "THEN o.duplicates + 1 ELSE o.duplicates END",
    "first_claimed_at": _if(_RESET, _T, "first_claimed_at"),
    "result": f"CASE WHEN {_CLAIM} OR {_GIVE_UP} THEN NULL ELSE o.result END",
    "result_encoding": f"CASE WHEN {_CLAIM} THEN '' WHEN {_GIVE_UP} THEN '{ENC_GAVE_UP}' "
    "ELSE o.result_encoding END",
    "error": f"CASE WHEN {_RESET} THEN '' WHEN {_GIVE_UP} THEN "
    "replace(%(gu)s, '{n}', o.takeovers::text) ELSE o.error END",
}

# A conflict with '' (no row when the CTE looked: a concurrent first insert won the race)
# updates nothing and returns no row; PostgresStore.claim then sends the claim again, and
# the CTE decides on the winner's row like any other.
CLAIM_SQL = f"""
WITH prev AS MATERIALIZED (
    SELECT {decision_sql(_NOW)} AS a, o.task_id AS tid
    FROM celery_grousset_outcome AS o
    WHERE {KEY.format(t='o.')}
    FOR UPDATE
), ins AS (
    INSERT INTO celery_grousset_outcome AS o (
        processor_id, fingerprint, task_name, task_id, status, fence, claim_token,
        started_at, stale_at, expires_on, deliveries, takeovers, result_encoding, error,
        worker, args_repr, payload_hash, first_claimed_at, duplicates)
    SELECT %(p)s, %(f)s, %(task)s, %(tid)s, 'in_flight', {_CLOCK_FENCE}, %(tok)s,
        lock_first.t, lock_first.t + %(mpt)s,
        lock_first.t + %(exp)s, 1, 0, '', lock_first.a,
        %(worker)s, %(args)s, %(ph)s, lock_first.t, 0
    FROM (SELECT {_NOW} AS t, coalesce(max(prev.a), '') AS a FROM prev) AS lock_first
    ON CONFLICT (processor_id, fingerprint) DO UPDATE SET
        {", ".join(f"{col} = {expr}" for col, expr in _SET.items())}
    WHERE {_A} <> ''
    RETURNING o.fence, o.status, o.deliveries, o.takeovers, o.result,
        o.result_encoding, o.error, o.task_id, o.started_at, o.completed_at,
        EXTRACT(EPOCH FROM o.stale_at - {_NOW})::float8, o.payload_hash
), d AS (
    INSERT INTO celery_grousset_delivery (processor_id, fingerprint, task_id, decision, at)
    SELECT %(p)s, %(f)s, CASE WHEN a {_TAKES} THEN tid ELSE %(tid)s END, a, now()
    FROM prev WHERE a <> '{Kind.RESUMED.code}' AND tid <> %(tid)s
)
SELECT ins.*, coalesce(prev.a, ''),
    set_config('synchronous_commit', CASE WHEN prev.a IN {codes(Write.COUNT, Write.NOTHING)}
        OR %(async)s THEN 'off' ELSE 'on' END, true)
FROM ins LEFT JOIN prev ON true
"""
# One line: psycopg caches its %(name)s -> $n conversion only for statements up to 4 KiB.
CLAIM_SQL = " ".join(CLAIM_SQL.split())
assert len(CLAIM_SQL) <= 4096, "keep the claim statement cacheable by psycopg"

FINISH_SQL = f"""
UPDATE celery_grousset_outcome SET status = %(st)s, result = %(res)s,
    result_encoding = %(enc)s, error = %(err)s, completed_at = {_NOW}
WHERE {KEY.format(t='')} AND claim_token = %(tok)s
    AND (status = 'in_flight' OR (status = %(st)s AND result_encoding = %(enc)s))
"""

RELEASE_SQL = f"""
UPDATE celery_grousset_outcome SET status = 'failed', result = NULL, result_encoding = '',
    error = %(err)s, completed_at = {_NOW}
WHERE {KEY.format(t='')} AND status = 'in_flight'
    AND (%(tok)s::text IS NULL OR claim_token = %(tok)s::text)
"""

#: seconds past STORE_TIMEOUT a statement's answer may take before the store shuts its
#: connection down (a half-open connection; the server's statement_timeout fires first)
ANSWER_GRACE = 1.0

_LIBPQ_DROP = ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool")


class PostgresStore(PostgresOperations, Store):
    vendor = "postgresql"
    claim_sql = CLAIM_SQL  # what claim() sends (the partitioned store's differs)
    _watchdog: Watchdog | None = None

    def _params(self) -> dict[str, Any]:
        params = self.driver_params()
        for key in _LIBPQ_DROP:
            params.pop(key, None)
        ms = max(1, int(self.timeout * 1000))
        options = params.pop("options", "") or ""
        params["options"] = (
            f"{options} -c lock_timeout={ms} -c statement_timeout={ms} -c TimeZone=UTC"
            # The claim is prepared once; a custom plan per call would re-plan a large
            # statement every time (measured: 3x the duplicate claim's server time).
            " -c plan_cache_mode=force_generic_plan"
        ).strip()
        params["connect_timeout"] = max(2, math.ceil(self.timeout))
        params.setdefault("application_name", "celery-grousset")
        return params

    def _connect(self) -> Any:
        db = driver()
        try:
            conn = db.connect(self._params())
        except db.Error as exc:
            raise StoreUnavailable(
                f"celery-grousset cannot connect to the journal database "
                f"{self.alias!r} (PostgreSQL): {exc}".strip()
            ) from exc
        self._conn = conn
        return conn

    def _run(self, op: Callable[[Any], T]) -> T:
        db = driver()
        conn = self._conn
        fresh = conn is None or conn.closed
        if fresh:
            conn = self._connect()
        try:
            return self._watched(op, conn)
        except db.DataError as exc:  # too long, a NUL…: permanent, not an outage
            raise data_error(self.alias, exc) from exc
        except (db.QueryCanceled, db.LockNotAvailable) as exc:
            raise StoreUnavailable(
                f"the journal database {self.alias!r} did not answer within "
                f"{self.timeout:g} s (STORE_TIMEOUT): {exc}"
            ) from exc
        except (db.OperationalError, db.InterfaceError) as exc:
            self.discard()
            if fresh:
                raise StoreUnavailable(f"journal database {self.alias!r}: {exc}") from exc
        except db.UndefinedTable as exc:
            raise StoreUnavailable(
                "the table celery_grousset_outcome does not exist in database "
                f"{self.alias!r}: run `manage.py migrate celery_grousset`."
            ) from exc
        except db.Error as exc:
            if db.broken(conn):
                self.discard()
            raise StoreUnavailable(f"journal database {self.alias!r}: {exc}") from exc
        # The connection had gone stale (server restart, idle timeout): once more, fresh.
        conn = self._connect()
        try:
            return self._watched(op, conn)
        except db.DataError as exc:
            raise data_error(self.alias, exc) from exc
        except db.Error as exc:
            if db.broken(conn):
                self.discard()
            raise StoreUnavailable(f"journal database {self.alias!r}: {exc}") from exc

    def _watched(self, op: Callable[[Any], T], conn: Any) -> T:
        """``op(conn)``, its answer awaited at most STORE_TIMEOUT + ANSWER_GRACE seconds:
        the server's statement_timeout cannot fire on a half-open connection."""
        dog = self._watchdog
        if dog is None:
            dog = self._watchdog = Watchdog(self.timeout + ANSWER_GRACE)
        dog.arm(conn.fileno())  # psycopg 3 and psycopg2 alike
        try:
            return op(conn)
        finally:
            dog.disarm()

    def claim_params(self, req: ClaimRequest) -> dict[str, Any]:
        """The parameters of :data:`CLAIM_SQL` for ``req``."""
        return {
            "p": req.processor_id,
            "f": req.fingerprint,
            "task": req.task_name,
            "tid": req.task_id,
            "tok": req.token,
            "exp": timedelta(seconds=req.expires_after),  # intervals: a shorter statement
            "mpt": timedelta(seconds=req.max_processing_time),
            "maxt": int(req.max_takeovers),
            "worker": req.worker,
            "args": req.args_repr,
            "ph": req.payload_hash,
            "async": self.claim_commit == "async",
            "bounce": req.bounce,
            "gu": _GAVE_UP_ERROR,
        }

    def claim(self, req: ClaimRequest) -> ClaimResult:
        params = self.claim_params(req)

        def op(conn: Any) -> Any:
            return driver().execute(conn, self.claim_sql, params, prepare=True).fetchone()

        for _race in range(3):
            row = self._run(op)
            if row is not None:
                return _result(row)
        raise StoreUnavailable(
            f"journal database {self.alias!r}: the claim kept losing a race for a new key"
        )

    def claim_all(self, reqs: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Several claims in ONE transaction: one commit for the batch, the same statement
        and decision table per key. Rows are locked in key order, so two batches never
        deadlock. A claim that lost a race for a new key is sent again on its own."""
        if len(reqs) < 2:
            return [self.claim(req) for req in reqs]
        order = sorted(range(len(reqs)), key=lambda i: (reqs[i].processor_id, reqs[i].fingerprint))

        def op(conn: Any) -> dict[int, Any]:
            db = driver()
            db.execute(conn, "BEGIN")
            try:
                rows = {
                    i: db.execute(conn, CLAIM_SQL, self.claim_params(reqs[i]), prepare=True)
                    .fetchone()
                    for i in order
                }
                # Each statement set synchronous_commit for the transaction, the last one
                # wins: the batch commits durably if any claim in it took a row.
                if self.claim_commit != "async" and any(
                    row is not None and Kind.from_code(row[12]).owned for row in rows.values()
                ):
                    db.execute(conn, "SET LOCAL synchronous_commit TO on")
                db.execute(conn, "COMMIT")
            except BaseException:
                if not db.broken(conn):
                    with contextlib.suppress(db.Error):  # keep the original error
                        db.execute(conn, "ROLLBACK")
                raise
            return rows

        rows = self._run(op)
        return [_result(rows[i]) if rows[i] is not None else self.claim(reqs[i])
                for i in range(len(reqs))]  # fmt: skip

    def finish(
        self, processor_id: str, fingerprint: str, token: str, completion: Completion
    ) -> bool:
        params = {
            "st": completion.status,
            "res": completion.result,
            "enc": completion.result_encoding,
            "err": completion.error,
            "p": processor_id,
            "f": fingerprint,
            "tok": token,
        }

        def op(conn: Any) -> int:
            return int(driver().execute(conn, FINISH_SQL, params, prepare=True).rowcount)

        return self._run(op) == 1

    def release(self, processor_id: str, fingerprint: str, token: str | None = None) -> bool:
        params = {
            "p": processor_id,
            "f": fingerprint,
            "tok": token,
            "err": RELEASED,
        }

        def op(conn: Any) -> int:
            return int(driver().execute(conn, RELEASE_SQL, params).rowcount)

        return self._run(op) == 1

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _result(row: tuple[Any, ...]) -> ClaimResult:
    (fence, status, deliveries, takeovers, result, enc, error, task_id, started_at,
     completed_at, retry_in, payload_hash, code, _durability) = row
    return ClaimResult(
        kind=Kind.from_code(code),
        fence=fence,
        status=status,
        deliveries=deliveries,
        takeovers=takeovers,
        result=bytes(result) if result is not None else None,
        result_encoding=enc,
        error=error,
        task_id=task_id,
        started_at=started_at,
        completed_at=completed_at,
        retry_in=max(0.0, float(retry_in or 0.0)),  # seconds until stale_at (0: stale)
        payload_hash=payload_hash,
    )
