"""What a journal row's state allows, as one rule each, for every backend: which rows a
completion may write (:data:`FINISHABLE`) and which a purge deletes
(:func:`purgeable`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery_grousset.claim import ENC_GAVE_UP, Status

#: the error text of a released claim
RELEASED = "released: the claim was given up (revoked, retried or by an operator)"
#: the rows a completion with the claim's token may write (SQL, ``{st}`` / ``{enc}``: the
#: completion's status and encoding): its claim in flight; the same claim released, or
#: given up on (``max_takeovers``: a duplicate found it stale once too often), and not
#: claimed since (an operator's release, a revoke, an attempt slower than
#: max_processing_time: it still ran, its outcome is the truth and no one else holds
#: the key); or the same outcome again (a re-send after a lost answer). A claim taken
#: since has another token: never matched.
FINISHABLE = (
    "(status = 'in_flight' OR (status = 'failed' AND result_encoding IN ('', "
    f"'{ENC_GAVE_UP}')) OR (status = {{st}} AND result_encoding = {{enc}}))"
)


def finishable() -> Any:
    """:data:`FINISHABLE`'s first two rows as a ``Q`` (a completion inside the caller's
    transaction, which is never a re-send)."""
    from django.db.models import Q

    return Q(status=Status.IN_FLIGHT.value) | Q(
        status=Status.FAILED.value, result_encoding__in=("", ENC_GAVE_UP)
    )


def purgeable(cutoff: datetime) -> Any:
    """The rows a purge at ``cutoff`` deletes (a ``Q``; docs/operations.md):

    * settled rows (completed or failed) past their ``expires_on``;
    * abandoned claims: in flight, stale (past their own ``stale_at``) and past
      ``expires_on`` plus their own ``max_processing_time`` (``stale_at -
      started_at``, as the claim wrote it). Nothing holds such a row any more: its
      attempt died and no delivery came to take it over within the whole retention
      window. A live claim is never purgeable (it is not stale).
    """
    from django.db.models import DateTimeField, ExpressionWrapper, F, Q
    from django.db.models.lookups import LessThanOrEqual

    in_flight = Status.IN_FLIGHT.value
    settled = Q(expires_on__lte=cutoff) & ~Q(status=in_flight)
    overdue = ExpressionWrapper(
        F("expires_on") + (F("stale_at") - F("started_at")), output_field=DateTimeField()
    )
    abandoned = Q(status=in_flight, stale_at__lte=cutoff, expires_on__lte=cutoff) & Q(
        LessThanOrEqual(overdue, cutoff)
    )
    return settled | abandoned


def purgeable_sql(alias: str, cutoff: datetime) -> tuple[str, tuple[Any, ...]]:
    """:func:`purgeable` as a SQL condition on the journal table's columns, and its
    parameters."""
    from celery_grousset.models import Outcome

    rows = Outcome.objects.using(alias).filter(purgeable(cutoff))
    sql, params = rows.query.get_compiler(using=alias).compile(rows.query.where)
    return sql, tuple(params)
