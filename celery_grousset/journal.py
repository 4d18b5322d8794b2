"""Operators' verbs on the outcome journal, shared by the admin, the management
commands, the metrics and Celery's revoke handler (docs/operations.md).

"Stale" has one definition here, the claim's own (:data:`celery_grousset.claim.STALE`):
an in-flight row past the ``stale_at`` its holder's claim wrote. No tool guesses a
task's ``max_processing_time`` from settings.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import Q

from celery_grousset import events, memo
from celery_grousset.claim import ENC_NONE, Kind, Status, unwritten_deadline
from celery_grousset.conf import redact_keys
from celery_grousset.shown import shown_json, shown_time
from celery_grousset.store import get_store
from celery_grousset.store.rows import purgeable

if TYPE_CHECKING:
    from celery_grousset.models import Outcome

#: shortest fingerprint prefix the commands accept
MIN_PREFIX = 8

_HEX = re.compile(r"^[0-9a-f]{1,64}$")
_NEXT_HEX = {c: n for c, n in zip("0123456789abcde", "123456789abcdef", strict=True)}


def now(alias: str) -> datetime:
    """The journal database's clock."""
    return get_store(alias).now()


# -- stale claims ---------------------------------------------------------------------------


def stale(at: datetime) -> Q:
    """Rows whose claim is stale at ``at``: in flight, past their own ``stale_at``."""
    return Q(status=Status.IN_FLIGHT.value, stale_at__lte=at)


def is_stale(rec: Outcome, at: datetime) -> bool:
    return rec.status == Status.IN_FLIGHT and rec.stale_at <= at


# -- finding rows ---------------------------------------------------------------------------


def fingerprint_prefix(prefix: str) -> Q:
    """Fingerprints that start with the hex ``prefix``, as a range the b-tree index answers
    under any collation (``LIKE 'ab%'`` alone needs a C collation or a pattern index)."""
    head, match = prefix.rstrip("f"), Q(fingerprint__gte=prefix, fingerprint__startswith=prefix)
    return match & Q(fingerprint__lt=head[:-1] + _NEXT_HEX[head[-1]]) if head else match


def fingerprint_like(needle: str) -> bool:
    """``needle`` (stripped, lower case) is a fingerprint or a prefix :func:`lookup` takes."""
    return bool(_HEX.match(needle)) and len(needle) >= MIN_PREFIX


def lookup(needle: str, min_prefix: int = MIN_PREFIX) -> Q:
    """A task id (exact), a fingerprint, or a fingerprint prefix of ``min_prefix`` or more
    hex characters. An empty needle matches nothing (``protect()``'s entries have an
    empty task id)."""
    fp = needle.strip().lower()
    if not fp:
        return Q(pk__in=[])
    query = Q(task_id=needle)
    if _HEX.match(fp) and len(fp) >= min_prefix:
        query |= Q(fingerprint=fp) if len(fp) == 64 else fingerprint_prefix(fp)
    return query


def find(
    alias: str, needle: str, processor_id: str | None = None, limit: int = 50
) -> list[Outcome]:
    """Journal entries matching ``needle`` (see :func:`lookup`), or whose key a delivery
    with that task id was answered for (:func:`deliveries_of`), newest first."""
    from celery_grousset.models import Outcome

    query = lookup(needle)
    for d in deliveries_of(alias, needle, limit):
        query |= Q(processor_id=d.processor_id, fingerprint=d.fingerprint)
    qs = Outcome.objects.using(alias).filter(query)
    if processor_id is not None:
        qs = qs.filter(processor_id=processor_id)
    return list(qs.order_by("-started_at", "processor_id")[:limit])


# -- what an entry holds --------------------------------------------------------------------


#: the only memos the admin and the commands decode (display only: never pickle)
SHOWN_CONTENT_TYPES = ("application/json",)


def memo_value(rec: Outcome, at: datetime) -> tuple[bool, Any]:
    """``(True, value)`` of a JSON memo, or ``(False, what is stored instead)``.

    For display (the admin, ``grousset_inspect``), redacted as an outbox row's options
    are (:func:`celery_grousset.shown.shown_json`): only JSON is decoded, a memoized
    failure is described by its stored type name and message (nothing is imported), and
    any other memo is shown as its content type and size, never decoded."""
    if rec.status == Status.IN_FLIGHT:
        if is_stale(rec, at):
            return False, "no outcome yet: the claim is stale (its holder died or is stuck)"
        return False, "no outcome yet: the claim is in flight"
    if rec.status == Status.FAILED and rec.result_encoding == ENC_NONE:
        return False, "released: the last attempt failed and nothing is memoized"
    if rec.expires_on <= at:
        return False, (f"expired at {shown_time(rec.expires_on)}: a duplicate no "
                       "longer gets this outcome; the next delivery runs the task again")
    raw = bytes(rec.result) if rec.result is not None else None
    content_type = rec.result_encoding.partition(";")[0]
    stored = raw is not None and "/" in content_type and not content_type.startswith("grousset/")
    if stored and content_type not in SHOWN_CONTENT_TYPES:
        size = len(raw or b"")
        return False, (
            f"{content_type} memo ({size} bytes): not decoded in the admin or by the "
            "commands (they show JSON memos only)"
        )
    try:
        value = memo.decode(
            raw, rec.result_encoding, rec.error, rec.fingerprint, accept=SHOWN_CONTENT_TYPES
        )
    except Exception as exc:  # what a duplicate would raise is the answer
        return False, f"{type(exc).__name__}: {exc}"
    return True, shown_json(value, redact_keys())  # kept whole for duplicates, shown redacted


# -- release and forget ---------------------------------------------------------------------


def release_plan(rec: Outcome, at: datetime) -> tuple[bool, str]:
    """Whether *release stale claims* frees this row, and why."""
    if rec.status != Status.IN_FLIGHT:
        return False, f"not in flight ({rec.status})"
    if unwritten_deadline(rec.fence, rec.started_at):
        return False, (f"claimed by a 0.1.0 worker at {shown_time(rec.started_at)}, "
                       "which writes no deadline: the next delivery takes it over after its "
                       "own max_processing_time; `manage.py grousset_release --force` it once "
                       "its worker is gone")  # fmt: skip
    if not is_stale(rec, at):
        return False, f"fresh: its claim turns stale at {shown_time(rec.stale_at)}"
    return True, f"stale since {shown_time(rec.stale_at)}"


def release(rec: Outcome, alias: str, *, token: str | None = None, stale: bool = False) -> bool:
    """Free an in-flight claim (marked failed; the next delivery runs). With ``token``,
    only if that attempt still holds it; ``stale``: only while it is stale (a claim
    renewed since the plan read it stays). Logged (``grousset.released``); ``rec`` then
    reads ``failed``, as the row does (the admin's history shows it)."""
    done = get_store(alias).release(rec.processor_id, rec.fingerprint, token, stale=stale)
    if done:
        _operated("grousset.released", rec, alias, started_at=rec.started_at.isoformat())
        rec.status = Status.FAILED.value
    return done


def forget_plan(rec: Outcome, at: datetime) -> tuple[bool, str]:
    """Whether *forget* ends the retention window of this row, and why."""
    if rec.status == Status.IN_FLIGHT:
        if is_stale(rec, at):
            return False, "in flight, stale: release it first (Release stale claims)"
        return False, ("in flight, fresh (its attempt may be running): wait until it turns "
                       "stale, or `manage.py grousset_release --force` it")  # fmt: skip
    if rec.expires_on <= at:
        return False, "already expired: the next delivery runs again"
    if rec.status == Status.FAILED and rec.result_encoding == ENC_NONE:
        return False, "failed and released: the next delivery runs again"
    return True, f"{rec.status}, remembered until {shown_time(rec.expires_on)}"


def forget(rec: Outcome, alias: str) -> datetime | None:
    """End the retention window now (the row and its fence stay: the next claim gets
    fence + 1). None: the row changed meanwhile (claimed again, or a given-up row
    completed by its attempt) and was left alone."""
    from celery_grousset.models import Outcome

    at = now(alias)
    done = (
        Outcome.objects.using(alias)
        # as read: a given-up row's attempt may have completed it since
        .filter(pk=rec.pk, fence=rec.fence, expires_on__gt=at, status=rec.status,
                result_encoding=rec.result_encoding)
        .exclude(status=Status.IN_FLIGHT.value)
        .update(expires_on=at)
    )
    if done:
        _operated("grousset.forgotten", rec, alias, status=rec.status,
                  was_kept_until=rec.expires_on.isoformat())  # fmt: skip
    return at if done else None


def _operated(event: str, rec: Outcome, alias: str, **extra: Any) -> None:
    """An operator's change to a row (the admin's actions, ``grousset_release``): one
    WARNING line, as the next delivery of that call runs again."""
    events.emit(logging.WARNING, event, {
        "fingerprint": rec.fingerprint, "task": rec.task_name, "task_id": rec.task_id,
        "processor": rec.processor_id, "database": alias, "fence": rec.fence, **extra,
    })  # fmt: skip


def release_held_by(alias: str, task_id: str) -> list[tuple[str, str]]:
    """Release the in-flight claims a delivery holds (a terminated revoke), each with the
    token seen, so a claim taken over since stays. ``[(processor_id, fingerprint)]``."""
    from celery_grousset.models import Outcome

    store = get_store(alias)
    held = Outcome.objects.using(alias).filter(task_id=task_id, status=Status.IN_FLIGHT.value)
    released = []
    for processor_id, fp, token in held.values_list("processor_id", "fingerprint", "claim_token"):
        if store.release(processor_id, fp, token):
            released.append((processor_id, fp))
    return released


def purge_expired(
    alias: str,
    *,
    batch_size: int = 10_000,
    before: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete expired, settled rows and abandoned claims in batches
    (:func:`~celery_grousset.store.rows.purgeable`; never a live claim or an unexpired
    row), then the deliveries recorded for keys whose row is gone
    (:func:`purge_deliveries`)."""
    count = get_store(alias).purge_expired(batch_size=batch_size, before=before, progress=progress)
    purge_deliveries(alias, batch_size=batch_size)
    return count


# -- deliveries that are not a row's own (celery_grousset.models.Delivery) ------------------

#: what a recorded delivery's decision says about that delivery
DELIVERY_FATES = {
    Kind.IN_FLIGHT: "a duplicate, deferred while another attempt held the claim",
    Kind.COMPLETED: "a duplicate, answered from the memo",
    Kind.FAILED: "a duplicate, answered with the memoized failure",
    Kind.GAVE_UP: "a duplicate, answered GaveUp (max_takeovers reached)",
    Kind.MISMATCH: "refused with PayloadMismatch: the key's record is of other arguments",
    Kind.TAKEOVER: "it held the claim until a later delivery took it over (stale)",
    Kind.RECLAIM: "it failed and released the claim; a later delivery claimed it again",
    Kind.EXPIRED: "its outcome expired; a later delivery claimed the key afresh",
}


def deliveries_of(alias: str, task_id: str, limit: int = 50) -> list[Any]:
    """The recorded deliveries (``Delivery``) with this task id, newest first."""
    from celery_grousset.models import Delivery

    if not task_id.strip():
        return []
    qs = Delivery.objects.using(alias).filter(task_id=task_id.strip())
    return list(qs.order_by("-at", "-id")[:limit])


def delivery_fate(decision: str) -> str:
    return DELIVERY_FATES.get(Kind.from_code(decision), decision)


def purge_deliveries(alias: str, *, batch_size: int = 10_000) -> int:
    """Delete recorded deliveries whose key has no row any more, or a row claimed afresh
    after them (a new life after expiry), in batches."""
    from django.db.models import Exists, OuterRef

    from celery_grousset.models import Delivery, Outcome

    live = Outcome.objects.using(alias).filter(
        Q(first_claimed_at__lt=OuterRef("at")) | Q(first_claimed_at=None),  # (before 0006)
        processor_id=OuterRef("processor_id"),
        fingerprint=OuterRef("fingerprint"),
    )
    stale = Delivery.objects.using(alias).filter(~Exists(live)).order_by()
    total = 0
    while True:
        ids = list(stale.values_list("id", flat=True)[:batch_size])
        if not ids:
            return total
        total += Delivery.objects.using(alias).filter(id__in=ids).delete()[0]


def expired(alias: str, at: datetime | None = None, processor_id: str | None = None) -> Any:
    """The rows :func:`purge_expired` would delete now (a queryset: counts, dry runs);
    ``at`` is capped at the database clock, as the purge caps it."""
    from celery_grousset.models import Outcome

    cutoff = now(alias) if at is None else min(at, now(alias))
    qs = Outcome.objects.using(alias).filter(purgeable(cutoff))
    if processor_id is not None:
        qs = qs.filter(processor_id=processor_id)
    return qs


# -- gauges (celery_grousset.metrics) -------------------------------------------------------

#: where the counts of :func:`gauges` stop: every gauge query is bounded
GAUGE_CAP = 10_000
#: seconds each statement of :func:`gauges` may take (a lock wait included): under
#: Prometheus's default scrape timeout (10 s), so a slow read loses the gauges, not the
#: scrape and its counters
GAUGE_BUDGET = 8.0


def gauges(alias: str, cap: int = GAUGE_CAP) -> dict[str, float]:
    """The gauges of ``alias``'s journal and outbox (``celery_grousset.metrics.GAUGES``),
    on the database clock (read first), then in three bounded queries: the ``cap`` oldest
    in-flight claims give the in-flight count, how many of them are :func:`stale` and
    the oldest claim's age; pending and dead outbox rows are counted up to ``cap`` on the
    outbox's status index. A caller's open transaction gets a savepoint; a connection
    this call had to open is closed again (a metrics server thread keeps none). On
    PostgreSQL and MariaDB each statement stops after :data:`GAUGE_BUDGET` (a wait for
    a lock included): a scrape behind a locked journal answers within Prometheus's
    default scrape timeout, without the gauges."""
    from django.db import connections, transaction
    from django.db.models import Count, Min

    from celery_grousset.models import OutboxMessage, OutboxStatus, Outcome
    from celery_grousset.store.budget import statement_budget

    conn = connections[alias]
    opened = conn.connection is None
    try:
        with statement_budget(alias, GAUGE_BUDGET), transaction.atomic(using=alias):
            at = now(alias)
            in_flight = Outcome.objects.using(alias).filter(status=Status.IN_FLIGHT.value)
            oldest_first = in_flight.order_by("started_at")[:cap]
            row = oldest_first.aggregate(
                claims=Count("pk"), stale=Count("pk", filter=stale(at)), oldest=Min("started_at")
            )
            outbox = OutboxMessage.objects.using(alias).order_by()
            pending = outbox.filter(status=OutboxStatus.PENDING)[:cap].count()
            dead = outbox.filter(status=OutboxStatus.DEAD)[:cap].count()
            due = outbox.filter(status=OutboxStatus.PENDING, available_at__lte=at).aggregate(
                oldest=Min("available_at"))["oldest"]  # (the due index's first entry)
    finally:
        if opened and not conn.in_atomic_block:
            conn.close()
    oldest = row["oldest"]
    return {
        "grousset_in_flight_claims": float(row["claims"]),
        "grousset_stale_claims": float(row["stale"]),
        "grousset_oldest_in_flight_seconds": (
            max(0.0, (at - oldest).total_seconds()) if oldest is not None else 0.0
        ),
        "grousset_outbox_pending": float(pending),
        "grousset_outbox_dead": float(dead),
        "grousset_outbox_oldest_due_seconds": (
            max(0.0, (at - due).total_seconds()) if due is not None else 0.0
        ),
    }
