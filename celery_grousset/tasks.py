"""Celery tasks shipped with celery-grousset (found by ``app.autodiscover_tasks()``).

Schedule the purge with beat::

    CELERY_BEAT_SCHEDULE = {
        "grousset-purge": {"task": "celery_grousset.purge_expired", "schedule": 3600},
    }
"""

from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger("celery_grousset")


@shared_task(name="celery_grousset.purge_expired", ignore_result=False)
def purge_expired(batch_size: int = 10_000, database: str | None = None) -> int:
    """Delete expired journal entries in batches (as ``manage.py grousset_purge``).

    Never an unexpired or in-flight entry. Returns how many rows were deleted.
    """
    from celery_grousset import journal
    from celery_grousset.conf import grousset_settings

    alias = database or str(grousset_settings.DATABASE)
    count = journal.purge_expired(alias, batch_size=batch_size)
    logger.info("grousset.purged count=%d database=%s", count, alias)
    return count
