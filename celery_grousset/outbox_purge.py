"""Retention of the transactional outbox: sent rows are deleted once they are older than
the retention window (``grousset_purge``, the ``purge_expired`` beat task); pending and
dead rows are never touched."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import transaction

from celery_grousset.models import OutboxMessage, OutboxStatus
from celery_grousset.outbox import _alias


def purge_sent(*, using: str | None = None, before: datetime, batch_size: int = 10_000,
               progress: Callable[[int], None] | None = None) -> int:  # fmt: skip
    """Delete sent rows whose ``sent_at`` is before ``before``, one transaction per batch.
    Pending and dead rows are never touched."""
    alias = _alias(using)
    manager = OutboxMessage.objects.using(alias)
    total = 0
    while True:
        with transaction.atomic(using=alias):
            old = manager.filter(status=OutboxStatus.SENT, sent_at__lt=before)
            ids = list(old.order_by().values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            deleted, _ = old.filter(pk__in=ids).delete()
        total += deleted
        if progress is not None:
            progress(total)
        if len(ids) < batch_size:
            break
    return total


def sent_before_count(*, using: str | None = None, before: datetime) -> int:
    manager = OutboxMessage.objects.using(_alias(using))
    return manager.filter(status=OutboxStatus.SENT, sent_at__lt=before).count()
