"""``manage.py grousset_stats``: what the journal holds, in numbers.

Entries by status and by task (top 20), deliveries, the duplicates among them
(other deliveries answered from the journal) and the redeliveries (the same delivery
again, in-flight requeues, re-claims: ``deliveries - entries - duplicates``), takeovers,
stale claims (in flight past their own ``stale_at``, i.e. older than their task's
``max_processing_time``; or, with ``--stale-after``, in flight for longer than that) and
the entries ``grousset_purge`` would delete.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from django.db.models import Count, Q, Sum

from celery_grousset.management import (
    MAX_DURATION_DAYS,
    add_database_argument,
    argparse_type,
    duration_option,
    human_seconds,
    journal_alias,
)

TOP_TASKS = 20


def _stale_after(value: object) -> timedelta | None:
    return duration_option(value, option="--stale-after", positive=True)


def stale_after(explicit: object) -> float | None:
    """``--stale-after`` seconds; None: each claim's own deadline (its ``stale_at``)."""
    value = _stale_after(explicit)
    return value.total_seconds() if value is not None else None


def _stale(own_deadline: Q, now: datetime, stale_seconds: float | None) -> Q:
    """Stale by each claim's own deadline, or (``--stale-after``) by age."""
    if stale_seconds is None:
        return own_deadline
    return Q(status="in_flight", started_at__lt=now - timedelta(seconds=stale_seconds))


def _deliveries(counts: Mapping[str, Any]) -> dict[str, int]:
    """Deliveries, the duplicates among them, and the rest beyond each entry's first claim
    (redeliveries, requeues, re-claims), from ``n_entries``, ``n_deliveries``, ``n_duplicates``."""
    entries, deliveries, duplicates = (
        int(counts[k] or 0) for k in ("n_entries", "n_deliveries", "n_duplicates")
    )
    return {
        "deliveries": deliveries,
        "duplicates": duplicates,
        "redeliveries": deliveries - entries - duplicates,
    }


def collect(alias: str, processor_id: str | None, stale_seconds: float | None) -> dict[str, Any]:
    """The numbers, JSON-ready."""
    from celery_grousset import journal
    from celery_grousset.models import Outcome, Status

    now = journal.now(alias)
    qs = Outcome.objects.using(alias).all()
    if processor_id is not None:
        qs = qs.filter(processor_id=processor_id)
    totals = qs.aggregate(
        n_entries=Count("pk"),
        n_deliveries=Sum("deliveries"),
        n_duplicates=Sum("duplicates"),
        n_takeovers=Sum("takeovers"),
        n_taken_over=Count("pk", filter=Q(takeovers__gt=0)),
    )
    entries = int(totals["n_entries"] or 0)
    by_status = {str(s): 0 for s in Status.values}
    for row in qs.order_by().values("status").annotate(n=Count("pk")):
        by_status[row["status"]] = int(row["n"])
    tasks = (
        qs.order_by()
        .values("task_name")
        .annotate(
            n_entries=Count("pk"),
            n_deliveries=Sum("deliveries"),
            n_duplicates=Sum("duplicates"),
            n_takeovers=Sum("takeovers"),
            n_in_flight=Count("pk", filter=Q(status=Status.IN_FLIGHT)),
            n_failed=Count("pk", filter=Q(status=Status.FAILED)),
        )
        .order_by("-n_entries", "task_name")[:TOP_TASKS]
    )
    return {
        "database": alias,
        "processor_id": processor_id,
        "entries": entries,
        "by_status": by_status,
        **_deliveries(totals),
        "takeovers": int(totals["n_takeovers"] or 0),
        "entries_taken_over": int(totals["n_taken_over"] or 0),
        "stale_claims": qs.filter(_stale(journal.stale(now), now, stale_seconds)).count(),
        "stale_after_seconds": stale_seconds,
        "expired": journal.expired(alias, now, processor_id).count(),
        "by_task": [
            {
                "task_name": t["task_name"],
                "entries": int(t["n_entries"]),
                **_deliveries(t),
                "takeovers": int(t["n_takeovers"] or 0),
                "in_flight": int(t["n_in_flight"]),
                "failed": int(t["n_failed"]),
            }
            for t in tasks
        ],
    }


class Command(BaseCommand):
    help = "Journal statistics: entries by status and task, duplicates, takeovers, stale claims."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--stale-after",
            type=argparse_type(_stale_after),
            default=None,
            metavar="DURATION",
            help="Count in-flight claims older than this as stale: seconds or 30m, 12h, 7d "
            f"(above 0, at most {MAX_DURATION_DAYS}d; default: each claim's own deadline, "
            "started_at + its task's max_processing_time).",
        )
        parser.add_argument("--processor-id", default=None, help="Only this processor's entries.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        stale_seconds = stale_after(options["stale_after"])  # checked before any query
        alias = journal_alias(options["database"])
        try:
            data = collect(alias, options["processor_id"], stale_seconds)
        except DatabaseError as exc:
            raise CommandError(f"could not read the journal on {alias!r}: {exc}") from exc
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2))
            return
        self.stdout.write(self.render(data))

    @staticmethod
    def render(data: dict[str, Any]) -> str:
        where = f"{data['database']!r}" + (
            f", processor {data['processor_id']!r}" if data["processor_id"] else ""
        )
        status = ", ".join(f"{name} {n}" for name, n in data["by_status"].items())
        lines = [
            f"celery-grousset journal on {where}",
            f"  entries      {data['entries']} ({status})",
            f"  deliveries   {data['deliveries']} ({data['duplicates']} duplicates answered "
            f"or deferred; {data['redeliveries']} redeliveries, requeues or re-claims)",
            f"  takeovers    {data['takeovers']} (on {data['entries_taken_over']} entries)",
            f"  stale claims {data['stale_claims']} ("
            + (
                "past their own max_processing_time"
                if data["stale_after_seconds"] is None
                else f"in flight for more than {human_seconds(data['stale_after_seconds'])}"
            )
            + ")",
            f"  expired      {data['expired']} (grousset_purge deletes them)",
        ]
        if data["by_task"]:
            width = max(len(t["task_name"]) for t in data["by_task"])
            lines.append(f"  top tasks by entries (at most {TOP_TASKS}):")
            lines.append(
                f"    {'task'.ljust(width)}  entries  duplicates  takeovers  in_flight  failed"
            )
            for t in data["by_task"]:
                lines.append(
                    f"    {t['task_name'].ljust(width)}  {t['entries']:>7}  {t['duplicates']:>10}"
                    f"  {t['takeovers']:>9}  {t['in_flight']:>9}  {t['failed']:>6}"
                )
        return "\n".join(lines)
