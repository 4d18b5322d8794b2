"""Querysets of the outcome journal (no SQL text here: statements live in ``store/``,
operators' verbs in :mod:`celery_grousset.journal`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.db.models import Value
from django.db.models.functions import Concat

if TYPE_CHECKING:
    from celery_grousset.models import Outcome  # noqa: F401 (used in string generics)


class OutcomeQuerySet(models.QuerySet["Outcome"]):
    def by_key(self, processor_id: str, fingerprint: str) -> OutcomeQuerySet:
        """The row of one claim, found through the unique key (fingerprint, processor_id).

        The processor is compared as an expression: a plain ``processor_id = %s`` also
        matches the admin's (processor_id, started_at) index, which a journal without
        statistics (new, or just truncated) may pick, scanning all of the processor's
        rows."""
        return self.alias(grousset_processor=Concat("processor_id", Value(""))).filter(
            fingerprint=fingerprint, grousset_processor=processor_id
        )


class OutcomeManager(models.Manager["Outcome"]):
    def get_queryset(self) -> OutcomeQuerySet:
        return OutcomeQuerySet(self.model, using=self._db)

    def by_key(self, processor_id: str, fingerprint: str) -> OutcomeQuerySet:
        return self.get_queryset().by_key(processor_id, fingerprint)
