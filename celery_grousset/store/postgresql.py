"""PostgreSQL store: the claim is ONE statement, ONE round trip, in every case.

The statement locks the existing row (if any) in a materialized CTE that evaluates
the decision table of :mod:`celery_grousset.claim` on it once, then runs an
``INSERT … ON CONFLICT DO UPDATE`` that applies the decision, and returns the row
it left joined with the status it found. A claim that takes nothing (a duplicate, a
fresh in-flight claim) only counts a delivery: it commits with
``synchronous_commit = off`` for that one transaction, so it does not wait for a
WAL flush (a crash may lose a few delivery counts, never a claim or a completion).
Claims and completions commit durably — unless ``GROUSSET["CLAIM_COMMIT"]`` is
``"async"`` (opt-in): then claims that take a row skip the flush too, and only the
completion waits for it (docs/performance.md says what that trades). All times
come from ``clock_timestamp()`` (the database's clock). Statements are prepared
server-side on a private psycopg 3 connection in autocommit mode; ``lock_timeout``
and ``statement_timeout`` bound every call by ``GROUSSET["STORE_TIMEOUT"]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from celery_grousset.claim import ENC_GAVE_UP, ClaimRequest, gave_up_message, kind_of
from celery_grousset.exceptions import StoreUnavailable
from celery_grousset.store.base import ClaimResult, Completion, Store

T = TypeVar("T")

_NOW = "clock_timestamp()"

# The row of one claim, found through the unique key (fingerprint, processor_id) and
# nothing else. Written plainly, `processor_id = $1` also matches the admin's
# (processor_id, started_at) index, and while the table has no statistics (new, or
# just truncated) the generic plan ties the two and may pick that one: every claim
# then scans all of its processor's rows. `|| ''` keeps the processor a filter on
# the unique index's row, whatever the statistics say.
_KEY = "{t}fingerprint = %(f)s AND {t}processor_id || '' = %(p)s"

# The decision table (celery_grousset.claim.decide), evaluated ONCE on the locked old row:
# n(one), t(akeover), g(ive up), e(xpired: reclaim, counters reset), r(eclaim a release).
_ACTION = f"""CASE
    WHEN o.status = 'in_flight' THEN CASE
        WHEN o.claim_token = %(tok)s THEN 'n'
        WHEN o.started_at > {_NOW} - make_interval(secs => %(mpt)s) THEN 'n'
        WHEN o.takeovers >= %(maxt)s THEN 'g'
        ELSE 't' END
    WHEN o.expires_on <= {_NOW} THEN 'e'
    WHEN o.status = 'failed' AND o.result_encoding = '' THEN 'r'
    ELSE 'n' END"""

# In ON CONFLICT DO UPDATE: the action found by the CTE, carried into the proposed row in
# its `error` column (read once in lock_first; '' when the CTE found no row). A fresh
# insert keeps that '' as its error. '' on a conflict means the row appeared after the
# CTE looked, i.e. a concurrent first insert — a fresh claim, so nothing to take. (Written
# as a scalar subquery on the CTE instead, each of its ~20 uses was a separate sub-plan for
# the executor to set up on every call: measured 3 % of a claim + complete, 7 % of a
# duplicate claim.)
_A = "EXCLUDED.error"
_CLAIM = f"{_A} IN ('e', 'r', 't')"
_GIVE_UP = f"{_A} = 'g'"
_EXPIRED = f"{_A} = 'e'"
# The claim's one moment: read once, after the lock (see lock_first), so that
# expires_on - started_at is exactly expires_after.
_T = "EXCLUDED.started_at"
_GAVE_UP_ERROR = gave_up_message("{n}").replace("'", "''")


def _if(cond: str, then: str, col: str) -> str:
    return f"CASE WHEN {cond} THEN {then} ELSE o.{col} END"


_SET = {
    "claim_token": _if(_CLAIM, "EXCLUDED.claim_token", "claim_token"),
    "fence": _if(_CLAIM, "o.fence + 1", "fence"),
    "status": f"CASE WHEN {_CLAIM} THEN 'in_flight' WHEN {_GIVE_UP} THEN 'failed' "
    "ELSE o.status END",
    "task_name": _if(_CLAIM, "EXCLUDED.task_name", "task_name"),
    "task_id": _if(_CLAIM, "EXCLUDED.task_id", "task_id"),
    "worker": _if(_CLAIM, "EXCLUDED.worker", "worker"),
    "args_repr": _if(_CLAIM, "EXCLUDED.args_repr", "args_repr"),
    "started_at": _if(_CLAIM, _T, "started_at"),
    "completed_at": f"CASE WHEN {_CLAIM} THEN NULL WHEN {_GIVE_UP} THEN {_T} "
    "ELSE o.completed_at END",
    "expires_on": f"CASE WHEN {_CLAIM} THEN EXCLUDED.expires_on WHEN {_GIVE_UP} "
    f"THEN {_T} + make_interval(secs => %(exp)s) ELSE o.expires_on END",
    "deliveries": f"CASE WHEN {_EXPIRED} THEN 1 WHEN o.claim_token = EXCLUDED.claim_token "
    "THEN o.deliveries ELSE o.deliveries + 1 END",
    "takeovers": f"CASE WHEN {_EXPIRED} THEN 0 WHEN {_A} = 't' THEN o.takeovers + 1 "
    "ELSE o.takeovers END",
    "result": f"CASE WHEN {_CLAIM} OR {_GIVE_UP} THEN NULL ELSE o.result END",
    "result_encoding": f"CASE WHEN {_CLAIM} THEN '' WHEN {_GIVE_UP} THEN '{ENC_GAVE_UP}' "
    "ELSE o.result_encoding END",
    "error": f"CASE WHEN {_EXPIRED} THEN '' WHEN {_GIVE_UP} THEN "
    f"replace('{_GAVE_UP_ERROR}', '{{n}}', o.takeovers::text) ELSE o.error END",
}

CLAIM_SQL = f"""
WITH prev AS MATERIALIZED (
    SELECT o.status, o.claim_token, {_ACTION} AS a
    FROM celery_grousset_outcome AS o
    WHERE {_KEY.format(t='o.')}
    FOR UPDATE
), ins AS (
    INSERT INTO celery_grousset_outcome AS o (
        processor_id, fingerprint, task_name, task_id, status, fence, claim_token,
        started_at, completed_at, expires_on, deliveries, takeovers, result,
        result_encoding, error, worker, args_repr)
    SELECT %(p)s, %(f)s, %(task)s, %(tid)s, 'in_flight', 1, %(tok)s,
        lock_first.t, NULL, lock_first.t + make_interval(secs => %(exp)s), 1, 0, NULL,
        '', lock_first.a, %(worker)s, %(args)s
    FROM (SELECT {_NOW} AS t, coalesce(max(prev.a), '') AS a FROM prev) AS lock_first
    ON CONFLICT (processor_id, fingerprint) DO UPDATE SET
        {", ".join(f"{col} = {expr}" for col, expr in _SET.items())}
    RETURNING o.claim_token, o.fence, o.status, o.deliveries, o.takeovers, o.result,
        o.result_encoding, o.error, o.task_id, o.started_at, o.completed_at,
        GREATEST(0, EXTRACT(EPOCH FROM (o.started_at + make_interval(secs => %(mpt)s)
            - {_NOW})))::float8
)
SELECT ins.*, prev.status, prev.claim_token,
    set_config('synchronous_commit', CASE WHEN prev.a = 'n' OR %(async)s THEN 'off'
        ELSE 'on' END, true)
FROM ins LEFT JOIN prev ON true
"""
# One line: psycopg caches its %(name)s -> $n conversion only for statements up to 4 KiB.
CLAIM_SQL = " ".join(CLAIM_SQL.split())
assert len(CLAIM_SQL) <= 4096, "keep the claim statement cacheable by psycopg"

FINISH_SQL = f"""
UPDATE celery_grousset_outcome SET status = %(st)s, result = %(res)s,
    result_encoding = %(enc)s, error = %(err)s, completed_at = {_NOW}
WHERE {_KEY.format(t='')} AND claim_token = %(tok)s
    AND (status = 'in_flight' OR (status = %(st)s AND result_encoding = %(enc)s))
"""

RELEASE_SQL = f"""
UPDATE celery_grousset_outcome SET status = 'failed', result = NULL, result_encoding = '',
    error = %(err)s, completed_at = {_NOW}
WHERE {_KEY.format(t='')} AND status = 'in_flight'
    AND (%(tok)s::text IS NULL OR claim_token = %(tok)s::text)
"""

_LIBPQ_DROP = ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool")


class PostgresStore(Store):
    vendor = "postgresql"

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
        import psycopg

        try:
            conn = psycopg.connect(autocommit=True, **self._params())
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"celery-grousset cannot connect to the journal database "
                f"{self.alias!r} (PostgreSQL): {exc}".strip()
            ) from exc
        self._conn = conn
        return conn

    def _run(self, op: Callable[[Any], T]) -> T:
        import psycopg
        from psycopg import errors

        conn = self._conn
        fresh = conn is None or conn.closed
        if fresh:
            conn = self._connect()
        try:
            return op(conn)
        except (errors.QueryCanceled, errors.LockNotAvailable) as exc:
            raise StoreUnavailable(
                f"the journal database {self.alias!r} did not answer within "
                f"{self.timeout:g} s (STORE_TIMEOUT): {exc}"
            ) from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self.discard()
            if fresh:
                raise StoreUnavailable(f"journal database {self.alias!r}: {exc}") from exc
        except errors.UndefinedTable as exc:
            raise StoreUnavailable(
                "the table celery_grousset_outcome does not exist in database "
                f"{self.alias!r}: run `manage.py migrate celery_grousset`."
            ) from exc
        except psycopg.Error as exc:
            if conn.broken:
                self.discard()
            raise StoreUnavailable(f"journal database {self.alias!r}: {exc}") from exc
        # The connection had gone stale (server restart, idle timeout): once more, fresh.
        conn = self._connect()
        try:
            return op(conn)
        except psycopg.Error as exc:
            if conn.broken:
                self.discard()
            raise StoreUnavailable(f"journal database {self.alias!r}: {exc}") from exc

    def claim_params(self, req: ClaimRequest) -> dict[str, Any]:
        """The parameters of :data:`CLAIM_SQL` for ``req``."""
        return {
            "p": req.processor_id,
            "f": req.fingerprint,
            "task": req.task_name,
            "tid": req.task_id,
            "tok": req.token,
            "exp": float(req.expires_after),
            "mpt": float(req.max_processing_time),
            "maxt": int(req.max_takeovers),
            "worker": req.worker,
            "args": req.args_repr,
            "async": self.claim_commit == "async",
        }

    def claim(self, req: ClaimRequest) -> ClaimResult:
        params = self.claim_params(req)

        def op(conn: Any) -> Any:
            return conn.execute(CLAIM_SQL, params, prepare=True).fetchone()

        row = self._run(op)
        (
            token,
            fence,
            status,
            deliveries,
            takeovers,
            result,
            enc,
            error,
            task_id,
            started_at,
            completed_at,
            retry_in,
            prev_status,
            prev_token,
            _durability,
        ) = row
        owned = token == req.token
        kind = kind_of(prev_status, owned, prev_token == req.token, status, enc)
        return ClaimResult(
            kind=kind,
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
            retry_in=float(retry_in or 0.0),
        )

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
            return int(conn.execute(FINISH_SQL, params, prepare=True).rowcount)

        return self._run(op) == 1

    def release(self, processor_id: str, fingerprint: str, token: str | None = None) -> bool:
        params = {
            "p": processor_id,
            "f": fingerprint,
            "tok": token,
            "err": "released: the claim was given up (revoked, retried or by an operator)",
        }

        def op(conn: Any) -> int:
            return int(conn.execute(RELEASE_SQL, params).rowcount)

        return self._run(op) == 1

    def now_expression(self) -> Any:
        from django.db.models import DateTimeField
        from django.db.models.expressions import RawSQL

        return RawSQL("clock_timestamp()", (), output_field=DateTimeField())

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
