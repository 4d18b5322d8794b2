"""The PostgreSQL store's operator queries (``publish_unique``'s lookup, the admin's
estimate and distinct values, on the Django connection of the journal's database), its
clock expression, and the chaos suite's hook that ends its server session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_grousset.claim import ClaimRequest
from celery_grousset.exceptions import InvalidArgument
from celery_grousset.store.pgdriver import driver

# publish_unique's one query for a chunk of keys (through the unique key, as above).
LOOKUP_SQL = (
    "SELECT fingerprint, status, result_encoding, stale_at, expires_on, takeovers, "
    "payload_hash, clock_timestamp() FROM celery_grousset_outcome "
    "WHERE fingerprint = ANY(%s) AND processor_id || '' = %s"
)

# A loose index scan: the recursive CTE walks the index value by value (cheap on big tables).
DISTINCT_SQL = (
    "WITH RECURSIVE v(x) AS ((SELECT {col} FROM celery_grousset_outcome ORDER BY {col} LIMIT 1) "
    "UNION ALL SELECT (SELECT {col} FROM celery_grousset_outcome WHERE {col} > v.x "
    "ORDER BY {col} LIMIT 1) FROM v WHERE v.x IS NOT NULL) SELECT x FROM v "
    "WHERE x IS NOT NULL LIMIT %s"
)

# The planner's row estimate; on the partitioned journal the sum of its partitions' (the
# parent's own is -1 until someone runs ANALYZE on it: autovacuum never does).
ESTIMATE_SQL = (
    "SELECT CASE WHEN c.relkind = 'p' THEN (SELECT coalesce(sum(greatest(p.reltuples, 0)), 0) "
    "FROM pg_inherits AS i JOIN pg_class AS p ON p.oid = i.inhrelid WHERE i.inhparent = c.oid) "
    "ELSE c.reltuples END FROM pg_class AS c WHERE c.oid = to_regclass('celery_grousset_outcome')"
)

# A late start's renewal of a claim its worker's main process made (WORKER_CLAIM); the
# partitioned journal's moves the row too (pgpartsql.RENEW_SQL)
RENEW_SQL = (
    "UPDATE celery_grousset_outcome SET stale_at = clock_timestamp() + make_interval(secs "
    "=> %(mpt)s) WHERE fingerprint = %(f)s AND processor_id || '' = %(p)s AND claim_token "
    "= %(tok)s AND status = 'in_flight'"
)


class PostgresOperations:
    """The operator queries of :class:`~celery_grousset.store.postgresql.PostgresStore`."""

    alias: str
    _conn: Any

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError

    def _run(self, op: Any) -> Any:
        raise NotImplementedError

    def renew(self, req: ClaimRequest) -> bool:
        """On the private connection: bounded by ``STORE_TIMEOUT`` (``lock_timeout``)."""
        params = {"p": req.processor_id, "f": req.fingerprint, "tok": req.token,
                  "mpt": float(req.max_processing_time)}  # fmt: skip
        return bool(self._run(lambda conn: driver().execute(conn, RENEW_SQL, params).rowcount == 1))

    def delete_batch(
        self, cursor: Any, table: str, ids: list[Any], recheck: str, params: Sequence[Any]
    ) -> int:
        """A purge batch's ``DELETE`` with its ids as one array parameter: planned once,
        not a list of 10,000 parameters (1.7x the rows per second, docs/performance.md)."""
        if not ids:
            return 0
        cursor.execute(f"DELETE FROM {table} WHERE id = ANY(%s) AND ({recheck})", (ids, *params))
        return max(0, int(cursor.rowcount))

    def lookup(self, processor_id: str, fingerprints: Sequence[str]) -> list[tuple[Any, ...]]:
        from django.db import connections

        with connections[self.alias].cursor() as cur:
            cur.execute(LOOKUP_SQL, [list(fingerprints), processor_id])
            return list(cur.fetchall())

    def estimated_count(self) -> int | None:
        from django.db import connections

        with connections[self.alias].cursor() as cur:
            cur.execute(ESTIMATE_SQL)
            row = cur.fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def distinct_values(self, column: str, limit: int) -> list[str]:
        from django.db import connections

        if column not in ("task_name", "processor_id"):
            raise InvalidArgument(f"not an indexed filter column: {column!r}")
        with connections[self.alias].cursor() as cur:
            cur.execute(DISTINCT_SQL.format(col=column), [limit])
            return [str(row[0]) for row in cur.fetchall()]

    clock_sql: str | None = "SELECT clock_timestamp()"

    def now_expression(self, plus: float = 0.0) -> Any:
        from django.db.models import DateTimeField
        from django.db.models.expressions import RawSQL

        if not plus:
            return RawSQL("clock_timestamp()", (), output_field=DateTimeField())
        return RawSQL(
            "clock_timestamp() + make_interval(secs => %s)",
            (float(plus),),
            output_field=DateTimeField(),
        )

    def terminate_connection(self) -> None:
        """Chaos hook: end this store's server session from another connection."""
        conn = self._conn
        if conn is None:
            return
        db = driver()
        other = db.connect(self._params())
        try:
            db.execute(other, "SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        finally:
            other.close()
