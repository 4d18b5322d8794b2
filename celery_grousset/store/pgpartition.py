"""The partitioned journal on PostgreSQL (``GROUSSET["JOURNAL_LAYOUT"] = "partitioned"``).

The journal is ``PARTITION BY RANGE (gen)``: one partition per **generation**, a time
bucket of the database clock (``grousset_generation()``, its width fixed when the table
was converted: ``manage.py grousset_partition convert``). A row's ``gen`` is the
generation of the claim that last took or counted it. PostgreSQL requires ``gen`` in
every unique key, so uniqueness across partitions is not the index's job: the claim is
ONE call of the function ``grousset_claim`` (one statement, one round trip, prepared),
which

1. takes a transaction-scoped advisory lock on a 64-bit hash of ``(processor_id,
   fingerprint)``: claims of one key queue there until the holder commits;
2. moves the key's row, if it sits in any other generation, into the current one
   (``UPDATE … SET gen``: PostgreSQL moves the row between partitions), reading the
   generation again after that statement locked every partition (a retention run that
   began meanwhile is over by then, see :mod:`celery_grousset.store.pgpartops`);
3. runs :data:`~celery_grousset.store.postgresql.CLAIM_SQL` itself, restricted to
   ``gen = _cur``: the same decision table, derived here by text substitution.

A batch (``claim_all``, the worker's main-process claim) is one statement too
(:data:`~celery_grousset.store.pgpartsql.BATCH_CALL_SQL`): every key's lock first, then
one call of the function per request, one commit for the batch.

Completions and releases are the table layout's statements on the parent table; one
that meets a row a concurrent claim is moving (``40001``) is sent once more. Retention
(``purge_expired``) drops whole generations (docs/scale.md, "The partitioned layout").
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from celery_grousset.claim import ClaimRequest
from celery_grousset.exceptions import InvalidArgument, StoreUnavailable
from celery_grousset.store.pgdriver import driver, sqlstate
from celery_grousset.store.pgpartsql import BATCH_CALL_SQL, CALL_SQL, RENEW_SQL
from celery_grousset.store.postgresql import PostgresStore

T = TypeVar("T")

_SERIALIZATION = "40001"  # the row was moved to another partition meanwhile
_UNDEFINED_FUNCTION = "42883"
_UNDEFINED_COLUMN = "42703"
_NO_PARTITION = "23514"  # check_violation: "no partition of relation … found for row"


class PartitionedStore(PostgresStore):
    """:class:`PostgresStore` on the partitioned journal (see the module doc)."""

    claim_sql = CALL_SQL
    batch_sql = BATCH_CALL_SQL

    def _watched(self, op: Callable[[Any], T], conn: Any) -> T:
        db = driver()
        try:
            return super()._watched(op, conn)
        except db.Error as exc:
            state = sqlstate(exc)
            # no function: never converted; no "gen" column: the single table made again
            # by `migrate` beside the functions of an earlier conversion
            if (state == _UNDEFINED_FUNCTION and "grousset_" in str(exc)) or (
                state == _UNDEFINED_COLUMN and '"gen"' in str(exc)
            ):
                raise StoreUnavailable(
                    f"GROUSSET['JOURNAL_LAYOUT'] is 'partitioned', but the journal database "
                    f"{self.alias!r} is the single table: "
                    f"run `manage.py grousset_partition convert --database {self.alias}`, or "
                    "set JOURNAL_LAYOUT to 'table'."
                ) from exc
            if state == _NO_PARTITION and "no partition" in str(exc):
                raise StoreUnavailable(
                    f"the partitioned journal of {self.alias!r} has no partition for the "
                    "current generation: run `manage.py grousset_partition create-ahead "
                    f"--database {self.alias}`, and run grousset_purge (or the purge_expired "
                    "task) more often than every three generations."
                ) from exc
            if state != _SERIALIZATION:
                raise
        return super()._watched(op, conn)  # once more: the moved row is in its new place

    def renew(self, req: ClaimRequest) -> bool:
        """The renewal moves the claim's row into the current generation (RENEW_SQL)."""
        params = {"p": req.processor_id, "f": req.fingerprint, "tok": req.token,
                  "mpt": float(req.max_processing_time)}  # fmt: skip
        return self._run(lambda conn: int(self._send(conn, RENEW_SQL, params).rowcount)) == 1

    def purge_expired(
        self,
        *,
        batch_size: int = 10_000,
        before: datetime | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Retention by generation: detach and drop each generation older than the current
        one whose every row is purgeable (no ``DELETE`` of rows), then create the next
        generations ahead. A row therefore outlives its expiry by up to a generation (and
        while a live claim shares its generation). Returns the rows dropped."""
        from celery_grousset.store import pgpartops, pgpartretire

        if batch_size < 1:
            raise InvalidArgument("batch_size must be at least 1")
        now = self.now()
        cutoff = min(before, now) if before is not None else now
        try:
            dropped = pgpartretire.retire(self.alias, cutoff)
        finally:  # the generations ahead, whatever became of retention
            pgpartops.create_ahead(self.alias)
        if progress is not None and dropped:
            progress(dropped)
        return dropped
