"""Celery tasks shipped with celery-grousset (found by ``app.autodiscover_tasks()``).

Schedule the purge with beat::

    CELERY_BEAT_SCHEDULE = {
        "grousset-purge": {"task": "celery_grousset.purge_expired", "schedule": 3600},
    }
"""

from __future__ import annotations

import logging

from celery import shared_task

from celery_grousset import events


@shared_task(name="celery_grousset.purge_expired", ignore_result=False)
def purge_expired(
    batch_size: int = 10_000, database: str | None = None, outbox: bool = True
) -> int:
    """Delete expired journal entries in batches, and (``outbox=True``) outbox rows sent
    longer ago than the retention window (``GROUSSET["EXPIRES_AFTER"]``), as
    ``manage.py grousset_purge`` does, in ``database`` — by default in every journal
    database: ``GROUSSET["DATABASE"]`` and each guarded task's own ``database``.

    Never an unexpired entry or a live claim, never a pending or dead outbox row. Returns how
    many journal entries were deleted; one log line ``grousset.purged`` per database has
    both counts. A database that fails does not stop the others; the task then fails
    with its error.
    """
    from celery_grousset.checks import journal_databases

    total, failed = 0, None
    for alias in [database] if database else journal_databases():
        try:
            total += _purge(alias, batch_size, outbox)
        except Exception as exc:
            from celery_grousset import events

            events.emit(logging.ERROR, "grousset.purge_failed",
                        {"database": alias, "error": events.error_text(exc)})  # fmt: skip
            failed = failed or exc
    if failed is not None:
        raise failed
    return total


def _purge(alias: str, batch_size: int, outbox: bool) -> int:
    from celery_grousset import journal

    count = journal.purge_expired(alias, batch_size=batch_size)
    sent = purge_sent_outbox(alias, batch_size) if outbox else 0
    fields = {"count": count, "outbox": sent, "database": alias}
    events.emit(logging.INFO, "grousset.purged", fields)
    return count


def purge_sent_outbox(alias: str, batch_size: int = 10_000) -> int:
    """Sent outbox rows older than the retention window (``grousset_purge``'s cutoff
    without ``--older-than``), deleted by :func:`celery_grousset.outbox_purge.purge_sent`."""
    from datetime import timedelta

    from celery_grousset import journal, outbox_purge
    from celery_grousset.conf import grousset_settings, seconds

    retention = seconds(grousset_settings.EXPIRES_AFTER, name="EXPIRES_AFTER") or 0.0
    cutoff = journal.now(alias) - timedelta(seconds=retention)
    return outbox_purge.purge_sent(using=alias, before=cutoff, batch_size=max(1, batch_size))
