"""Reading and purging the outcome journal (claims live in ``store/``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING

from django.db import models, transaction
from django.db.models import Value
from django.db.models.functions import Concat

if TYPE_CHECKING:
    from celery_grousset.models import Outcome  # noqa: F401 (used in string generics)


def _db_now(using: str) -> datetime:
    """The database's clock (DESIGN §3: never a worker's clock)."""
    from django.db import connections
    from django.utils import timezone

    conn = connections[using]
    sql = {"postgresql": "SELECT clock_timestamp()", "mysql": "SELECT UTC_TIMESTAMP(6)"}.get(
        conn.vendor
    )
    if sql is None:
        return timezone.now()
    with conn.cursor() as cur:
        cur.execute(sql)
        value: datetime = cur.fetchone()[0]
    if timezone.is_naive(value):
        value = value.replace(tzinfo=dt_timezone.utc)
    return value


class OutcomeQuerySet(models.QuerySet["Outcome"]):
    def expired(self, now: datetime | None = None) -> OutcomeQuerySet:
        """Rows whose retention window has passed and that no attempt holds."""
        if now is None:
            now = _db_now(self.db)
        return self.filter(expires_on__lte=now).exclude(status="in_flight")

    def by_key(self, processor_id: str, fingerprint: str) -> OutcomeQuerySet:
        """The row of one claim, found through the unique key (fingerprint, processor_id).

        The processor is compared as an expression: a plain ``processor_id = %s`` also
        matches the admin's (processor_id, started_at) index, which a journal without
        statistics (new, or just truncated) may pick, scanning all of the processor's
        rows."""
        return self.alias(grousset_processor=Concat("processor_id", Value(""))).filter(
            fingerprint=fingerprint, grousset_processor=processor_id
        )

    def purge_expired(
        self,
        *,
        batch_size: int = 10_000,
        before: datetime | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete expired rows in batches, one short transaction per batch.

        ``before``: delete only rows that expired before this moment (default: now,
        database clock). In-flight rows and unexpired rows are never touched: each
        batch re-checks the condition in its ``DELETE``, so a row re-claimed
        between the select and the delete survives.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        now = _db_now(self.db)
        cutoff = min(before, now) if before is not None else now
        from django.db import connections

        batch = self.expired(cutoff).order_by().values_list("id", flat=True)[:batch_size]
        sql, params = batch.query.get_compiler(using=self.db).as_sql()

        conn = connections[self.db]
        table = conn.ops.quote_name(self.model._meta.db_table)
        if conn.vendor == "mysql":
            # MySQL refuses a LIMIT subquery on the table being deleted from, unless it is
            # wrapped in a derived table (which it materializes first).
            delete = f"DELETE FROM {table} WHERE id IN (SELECT batch.id FROM ({sql}) AS batch)"
        else:
            delete = f"DELETE FROM {table} WHERE id IN ({sql})"
        total = 0
        while True:
            # One statement per batch, in its own short transaction: the subquery picks
            # the batch by the expires_on index and re-checks both conditions.
            with transaction.atomic(using=self.db), conn.cursor() as cursor:
                cursor.execute(delete, params)
                deleted = max(0, int(cursor.rowcount))
            total += deleted
            if progress is not None and deleted:
                progress(total)
            if deleted < batch_size:
                break
        return total


class OutcomeManager(models.Manager["Outcome"]):
    def get_queryset(self) -> OutcomeQuerySet:
        return OutcomeQuerySet(self.model, using=self._db)

    def expired(self, now: datetime | None = None) -> OutcomeQuerySet:
        return self.get_queryset().expired(now)

    def by_key(self, processor_id: str, fingerprint: str) -> OutcomeQuerySet:
        return self.get_queryset().by_key(processor_id, fingerprint)

    def purge_expired(
        self,
        *,
        batch_size: int = 10_000,
        before: datetime | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        return self.get_queryset().purge_expired(
            batch_size=batch_size, before=before, progress=progress
        )
