"""PostgreSQL store: the claim is ONE statement, ONE round trip, in every case.

The statement (:mod:`celery_grousset.store.pgclaim`) locks the existing row (if any)
in a materialized CTE that evaluates the decision table of :mod:`celery_grousset.claim`
on it once (SQL generated from ``claim.RULES``), then runs an ``INSERT … ON CONFLICT
DO UPDATE`` that applies the decision, and returns the row it left with the decision's
code. A batch of claims (``claim_all``) is one statement too, built from the same pieces:
one round trip and one commit for the batch. A claim that takes nothing (a duplicate, a
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

import logging
import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.exceptions import StoreUnavailable
from celery_grousset.store import refusals
from celery_grousset.store.base import ClaimResult, Completion, Store, data_error, distinct_keys
from celery_grousset.store.pgclaim import BATCH_SQL, CLAIM_SQL, GAVE_UP_ERROR, KEY, NOW, PER_ROW
from celery_grousset.store.pgdriver import POOLER_FIX, driver, sqlstate, statement_timeout_ms
from celery_grousset.store.pgops import PostgresOperations
from celery_grousset.store.rows import FINISHABLE, RELEASED
from celery_grousset.store.turns import turn
from celery_grousset.store.watchdog import Watchdog

T = TypeVar("T")
logger = logging.getLogger("celery_grousset")

FINISH_SQL = f"""
UPDATE celery_grousset_outcome SET status = %(st)s, result = %(res)s,
    result_encoding = %(enc)s, error = %(err)s, completed_at = {NOW}
WHERE {KEY.format(t='')} AND claim_token = %(tok)s
    AND {FINISHABLE.format(st="%(st)s", enc="%(enc)s")}
"""

RELEASE_SQL = f"""
UPDATE celery_grousset_outcome SET status = 'failed', result = NULL, result_encoding = '',
    error = %(err)s, completed_at = {NOW}
WHERE {KEY.format(t='')} AND status = 'in_flight'
    AND (%(tok)s::text IS NULL OR claim_token = %(tok)s::text)
    AND (NOT %(stale)s OR stale_at <= {NOW})
"""

#: times a batch is sent while some of its claims lost a race for a new key or a deadlock
BATCH_ATTEMPTS = 4

#: seconds past STORE_TIMEOUT a statement's answer may take before the store shuts its
#: connection down (a half-open connection; the server's statement_timeout fires first)
ANSWER_GRACE = 1.0
_NO_ARBITER = "42P10"  # invalid_column_reference: ON CONFLICT matches no unique key
#: insufficient_privilege, read_only_sql_transaction
_REFUSALS = {"42501": refusals.DENIED, "25006": refusals.READ_ONLY}

#: A transactional completion runs on Django's connection, in the attempt's transaction:
#: bounded like the store's own statements, for the rest of that transaction only (a row
#: lock another session holds: lock_timeout; a half-open connection: the server ends the
#: session, and its locks, once it has waited that long on the client). Not when that
#: transaction is the caller's own (protect() in an open atomic(), ATOMIC_REQUESTS): the
#: settings would outlive the completion and bound the caller's statements too.
BOUND_TRANSACTION_SQL = (
    "SELECT set_config('lock_timeout', %(ms)s, true), "
    "set_config('idle_in_transaction_session_timeout', %(ms)s, true)"
)

_LIBPQ_DROP = ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool")
#: a prepared statement the server session no longer has, or has already under its name:
#: a pooler in transaction mode hands each transaction another server session
_SESSION_LOST_PREPARED = ("26000", "42P05")
_unbounded: set[str] = set()  # aliases whose dropped timeouts were logged


class PostgresStore(PostgresOperations, Store):
    vendor = "postgresql"
    claim_sql = CLAIM_SQL  # what claim() sends (the partitioned store's differs)
    batch_sql = BATCH_SQL  # what claim_all() sends for a batch, likewise
    _watchdog: Watchdog | None = None
    #: the claim, the batch and the completion are prepared on the server: off when the
    #: alias's OPTIONS say ``prepare_threshold: None`` (psycopg's setting for a pooler),
    #: or once the server's sessions lose them
    prepare = True

    def _send(self, conn: Any, sql: str, params: Any) -> Any:
        """``sql`` on ``conn``, prepared unless :attr:`prepare` is off. A statement the
        server refuses as not (or already) prepared never ran: it is sent again,
        unprepared, and the store prepares nothing more."""
        db = driver()
        if self.prepare:
            try:
                return db.execute(conn, sql, params, prepare=True)
            except db.Error as exc:
                if sqlstate(exc) not in _SESSION_LOST_PREPARED:
                    raise
                self.prepare = False
                logger.warning(
                    "celery-grousset: the journal database %r lost a prepared statement "
                    "(%s): its server sessions do not keep them (a pooler in transaction "
                    "mode?); the store no longer prepares its statements (docs/configuration.md)",
                    self.alias, str(exc).strip()[:200],
                )  # fmt: skip
        return db.execute(conn, sql, params, prepare=False)

    @property
    def _ms(self) -> int:  # STORE_TIMEOUT as the server's timeouts take it
        return max(1, int(self.timeout * 1000))

    def _params(self) -> dict[str, Any]:
        if (self.settings_dict.get("OPTIONS") or {}).get("prepare_threshold", 0) is None:
            self.prepare = False
        params = self.driver_params()
        for key in _LIBPQ_DROP:
            params.pop(key, None)
        ms = self._ms
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
            pooler = POOLER_FIX if "unsupported startup parameter" in str(exc) else ""
            raise StoreUnavailable(
                f"celery-grousset cannot connect to the journal database "
                f"{self.alias!r} (PostgreSQL): {str(exc).strip()}{pooler}"
            ) from exc
        self._conn = conn
        self._check_bounded(conn)
        return conn

    def _check_bounded(self, conn: Any) -> None:
        """Log (once per alias) a connection that came up without the store's timeouts: a
        pooler told to ignore its startup options (it cannot be told apart from here).
        Only a diagnosis: whatever fails here leaves the connection to the claims."""
        if self.alias in _unbounded:
            return
        try:
            ms, server = self._ms, self._answer(statement_timeout_ms, conn)
        except driver().Error:
            logger.debug("celery-grousset: statement_timeout not read", exc_info=True)
            return
        if server != ms:
            _unbounded.add(self.alias)
            logger.warning(
                "celery-grousset: the journal database %r does not apply the store's "
                "statement_timeout (%s ms, STORE_TIMEOUT) but %s ms: a pooler dropped its "
                "startup options? The server no longer bounds the store's statements, only "
                "the store's watchdog does, STORE_TIMEOUT + 1 s later (docs/configuration.md)",
                self.alias, ms, server,
            )  # fmt: skip

    def _run(self, op: Callable[[Any], T]) -> T:
        with turn(self):
            return self._run_alone(op)

    def _run_alone(self, op: Callable[[Any], T]) -> T:
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
            raise refusals.timed_out(self.alias, self.timeout, exc) from exc
        except (db.OperationalError, db.InterfaceError) as exc:
            self.discard()
            if fresh:
                why = refusals.first_line(exc)  # (not the context the server adds)
                raise StoreUnavailable(f"journal database {self.alias!r}: {why}") from exc
        except db.UndefinedTable as exc:
            raise refusals.missing_table(self.alias, exc) from exc
        except db.UndefinedColumn as exc:
            raise refusals.schema_behind(self.alias, exc) from exc
        except db.Error as exc:
            if db.broken(conn):
                self.discard()
            if sqlstate(exc) == _NO_ARBITER and "ON CONFLICT" in str(exc):
                raise StoreUnavailable(  # (processor_id, fingerprint) is no unique key there
                    f"GROUSSET['JOURNAL_LAYOUT'] is 'table', but the journal database "
                    f"{self.alias!r} is partitioned: set JOURNAL_LAYOUT to 'partitioned', "
                    f"or run `manage.py grousset_partition revert --database {self.alias}`."
                ) from exc
            raise self._unavailable(exc) from exc
        # The connection had gone stale (server restart, idle timeout): once more, fresh.
        conn = self._connect()
        try:
            return self._watched(op, conn)
        except db.DataError as exc:
            raise data_error(self.alias, exc) from exc
        except db.Error as exc:
            if db.broken(conn):
                self.discard()
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:  # refusals: their fix
        if (why := _REFUSALS.get(sqlstate(exc) or "")) is not None:
            return refusals.refused(self.alias, exc, why)
        return StoreUnavailable(f"journal database {self.alias!r}: {refusals.first_line(exc)}")

    def _watched(self, op: Callable[[Any], T], conn: Any) -> T:
        """``op(conn)``, sent once more if it met a unique index that is not the claim's
        arbiter: on a journal ``grousset_partition prepare`` has readied (its key with
        ``gen``, docs/scale.md), two first claims of one key that pass ``ON CONFLICT``'s
        check together make the second fail there, not update (PostgreSQL checks only
        the arbiter that way). Each statement is its own transaction, rolled back by the
        error; the other's row is committed by then, so the claim sent again decides on
        it."""
        try:
            return self._answer(op, conn)
        except driver().UniqueViolation:
            return self._answer(op, conn)

    def _answer(self, op: Callable[[Any], T], conn: Any) -> T:
        """``op(conn)``, its answer awaited at most STORE_TIMEOUT + ANSWER_GRACE seconds:
        the server's statement_timeout cannot fire on a half-open connection."""
        dog = self._watchdog
        if dog is None:
            dog = self._watchdog = Watchdog(self.timeout + ANSWER_GRACE)
        dog.arm(conn.fileno())  # psycopg 3 and psycopg2 alike
        try:
            return op(conn)
        except BaseException as exc:
            if not isinstance(exc, driver().Error):  # interrupted mid-statement: its answer
                dog.disarm()  # is never read, nor the connection used again (disarmed
                driver().interrupt(conn)  # first: its fd, once closed, may be reused)
                self.discard()
            raise
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
            "gu": GAVE_UP_ERROR,
        }

    def claim(self, req: ClaimRequest) -> ClaimResult:
        params = self.claim_params(req)

        def op(conn: Any) -> Any:
            return self._send(conn, self.claim_sql, params).fetchone()

        for _race in range(3):
            row = self._run(op)
            if row is not None:
                return _result(row)
        raise StoreUnavailable(
            f"journal database {self.alias!r}: the claim kept losing a race for a new key"
        )

    def claim_all(self, reqs: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Several claims in ONE statement (:data:`~celery_grousset.store.pgclaim.BATCH_SQL`):
        one round trip and one commit for the batch, the same decision table per key. A
        claim that lost a race for a new key is sent again (with the others that lost it)."""
        return distinct_keys(reqs, self._claim_batch)

    def _claim_batch(self, reqs: Sequence[ClaimRequest]) -> list[ClaimResult]:
        if len(reqs) < 2:
            return [self.claim(req) for req in reqs]
        results: dict[int, ClaimResult] = {}
        todo = list(range(len(reqs)))
        for _attempt in range(BATCH_ATTEMPTS):
            rows = self._run(partial(self._send_batch, self.batch_params([reqs[i] for i in todo])))
            for row in rows:
                results[todo[row[0] - 1]] = _result(row[3:])
            todo = [i for i in todo if i not in results]
            if not todo:
                return [results[i] for i in range(len(reqs))]
        raise StoreUnavailable(
            f"journal database {self.alias!r}: the batch claim kept losing a race for a new "
            f"key or a deadlock ({BATCH_ATTEMPTS} attempts)"
        )

    def _send_batch(self, params: dict[str, Any], conn: Any) -> list[Any]:
        """The batch's rows; none when the server broke a deadlock by cancelling it: a
        key locked by this batch's lookup and wanted by another batch's insert, while
        this one waits to insert a key that other batch inserted first (rare: both
        batches must see different rows committed). Nothing was written: send it again."""
        db = driver()
        try:
            return list(self._send(conn, self.batch_sql, params).fetchall())
        except db.DeadlockDetected:
            return []

    def batch_params(self, reqs: Sequence[ClaimRequest]) -> dict[str, Any]:
        """The parameters of :data:`BATCH_SQL` for ``reqs``: one array per request field."""
        each = [self.claim_params(req) for req in reqs]
        params = {name: [p[name] for p in each] for name in PER_ROW}
        return {**params, "async": self.claim_commit == "async", "gu": GAVE_UP_ERROR}

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
            return int(self._send(conn, FINISH_SQL, params).rowcount)

        return self._run(op) == 1

    def finish_in_transaction(self, req: ClaimRequest, completion: Completion) -> bool:
        from django.db import connections

        conn = connections[self.alias]
        if len(conn.atomic_blocks) > 1:  # inside the caller's own transaction: its session
            return super().finish_in_transaction(req, completion)  # settings are its own
        with conn.cursor() as cur:
            cur.execute(BOUND_TRANSACTION_SQL, {"ms": f"{self._ms}ms"})
        return super().finish_in_transaction(req, completion)

    def probe(self) -> None:
        sql = "SELECT 1 FROM celery_grousset_outcome WHERE false"
        self._run(lambda conn: driver().execute(conn, sql).fetchall())

    def release(self, processor_id: str, fingerprint: str, token: str | None = None,
                stale: bool = False) -> bool:  # fmt: skip
        params = {"p": processor_id, "f": fingerprint, "tok": token, "err": RELEASED,
                  "stale": stale}  # fmt: skip

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
