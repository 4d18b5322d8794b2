"""``manage.py grousset_stats``: what the journal holds, in numbers.

Entries by status and by task (top 20), deliveries split into duplicates and redeliveries
(``deliveries - entries - duplicates``), takeovers, stale claims (past their own
``stale_at``, or in flight longer than ``--stale-after``) and what ``grousset_purge``
would delete. By default the entries started in the last 24 hours (``--since``, on the
``started_at`` index), in one statement, and the expired entries up to 10,000; on
PostgreSQL and MariaDB the window narrows (the last hour, then 10 minutes) past
``STATS_BUDGET`` seconds or ``STATS_ROWS`` planned entries, and the output says so. The
stale claims of the whole journal are listed too (within ``STALE_BUDGET``). An explicit
``--since`` is counted whatever it takes; ``--all`` counts every entry. Only E012 runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count, Q, Sum

from celery_grousset.management import (
    MAX_DURATION_DAYS,
    add_database_argument,
    add_duration_argument,
    database_errors,
    duration_option,
    human_seconds,
    journal_alias,
    other_journals,
    printable,
    refuse_naive_clock,
)

TOP_TASKS = 20
#: ``--since``'s default: the entries started in the last day
DEFAULT_SINCE = timedelta(days=1)
#: where the count of expired entries stops unless ``--all``
EXPIRED_CAP = 10_000
#: seconds a statement of the default window may take before it is narrowed
STATS_BUDGET = 0.25
#: the stale claims of the whole journal (no index finds in-flight rows: one is left out
#: so that a completion stays a HOT update) are listed within this, up to STALE_LISTED
STALE_BUDGET = 2.0
STALE_LISTED = 10
#: the narrower windows the default falls back to, in turn (the last one unbudgeted)
NARROWER = (3600.0, 600.0)
#: a window the planner expects to hold more entries is skipped without being started:
#: about what STATS_BUDGET reads from a cold cache (5-7 us an entry, 50M-row journal)
STATS_ROWS = 50_000


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


def _since(value: object) -> timedelta | None:
    return duration_option(value, option="--since", positive=True)


def window(since: object, every: bool) -> float | None:
    """Seconds of ``--since`` (default a day); None with ``--all``: every entry."""
    if every:
        if since is not None:
            raise CommandError("--since and --all exclude each other: give one of them")
        return None
    value = _since(since)
    return (value or DEFAULT_SINCE).total_seconds()


def _deliveries(counts: Mapping[str, Any]) -> dict[str, int]:
    """Deliveries, duplicates and the rest beyond each entry's first claim (``n_…``)."""
    entries, deliveries, duplicates = (
        int(counts[k] or 0) for k in ("n_entries", "n_deliveries", "n_duplicates")
    )
    return {
        "deliveries": deliveries,
        "duplicates": duplicates,
        "redeliveries": deliveries - entries - duplicates,
    }


def _expired(
    alias: str, now: datetime, processor_id: str | None, cap: int | None
) -> dict[str, Any]:
    """What ``grousset_purge`` would delete now, counted up to ``cap`` (None: all)."""
    from celery_grousset import journal

    qs = journal.expired(alias, now, processor_id).order_by()
    if cap is None:
        return {"expired": int(qs.count()), "expired_capped": False}
    found = int(qs[: cap + 1].count())
    return {"expired": min(found, cap), "expired_capped": found > cap}


def _groups(qs: Any, stale: Q) -> list[dict[str, Any]]:
    """One statement, one pass over the window: per task and status, the entries, their
    deliveries, duplicates, takeovers, entries taken over and stale claims."""
    return list(
        qs.order_by()
        .values("task_name", "status")
        .annotate(
            n_entries=Count("pk"),
            n_deliveries=Sum("deliveries"),
            n_duplicates=Sum("duplicates"),
            n_takeovers=Sum("takeovers"),
            n_taken_over=Count("pk", filter=Q(takeovers__gt=0)),
            n_stale=Count("pk", filter=stale),
        )
    )


_SUMMED = ("n_entries", "n_deliveries", "n_duplicates", "n_takeovers", "n_taken_over", "n_stale")


def _summed(groups: list[dict[str, Any]]) -> dict[str, int]:
    return {k: sum(int(g[k] or 0) for g in groups) for k in _SUMMED}


def _by_task(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The top tasks by entries, each with its deliveries, takeovers, in-flight and failed."""
    from celery_grousset.models import Status

    tasks: dict[str, list[dict[str, Any]]] = {}
    for g in groups:
        tasks.setdefault(g["task_name"], []).append(g)
    rows: list[dict[str, Any]] = []
    for name, mine in tasks.items():
        t = _summed(mine)
        n = {g["status"]: int(g["n_entries"]) for g in mine}
        rows.append({
            "task_name": name, "entries": t["n_entries"], **_deliveries(t),
            "takeovers": t["n_takeovers"], "in_flight": n.get(Status.IN_FLIGHT.value, 0),
            "failed": n.get(Status.FAILED.value, 0),
        })  # fmt: skip
    rows.sort(key=lambda t: (-t["entries"], t["task_name"]))
    return rows[:TOP_TASKS]


def _window(alias: str, processor_id: str | None, since: datetime | None) -> Any:
    from celery_grousset.models import Outcome

    qs = Outcome.objects.using(alias).all()
    if processor_id is not None:
        qs = qs.filter(processor_id=processor_id)
    return qs if since is None else qs.filter(started_at__gte=since)


def counts(
    alias: str, processor_id: str | None, stale_seconds: float | None,
    since_seconds: float | None, now: datetime,
) -> dict[str, Any]:  # fmt: skip
    """The window's numbers, JSON-ready, in one statement: the entries started in the
    last ``since_seconds`` before ``now`` (on the ``started_at`` index), or every entry."""
    from celery_grousset import journal
    from celery_grousset.models import Status

    since = None if since_seconds is None else now - timedelta(seconds=since_seconds)
    qs = _window(alias, processor_id, since)
    groups = _groups(qs, _stale(journal.stale(now), now, stale_seconds))
    totals = _summed(groups)
    by_status = {str(s): 0 for s in Status.values}
    for g in groups:
        by_status[g["status"]] += int(g["n_entries"])
    return {
        "database": alias, "processor_id": processor_id,
        "since": since.isoformat() if since is not None else None, "since_seconds": since_seconds,
        "entries": totals["n_entries"],
        "by_status": by_status,
        **_deliveries(totals),
        "takeovers": totals["n_takeovers"], "entries_taken_over": totals["n_taken_over"],
        "stale_claims": totals["n_stale"],
        "stale_after_seconds": stale_seconds,
        "by_task": _by_task(groups),
    }  # fmt: skip


def stale_listed(
    alias: str, now: datetime, processor_id: str | None, stale_seconds: float | None
) -> dict[str, Any]:
    """Up to :data:`STALE_LISTED` stale claims of the whole journal, whenever they started
    (the window's count misses a claim started before it): what an operator releases."""
    from celery_grousset import journal

    qs = _window(alias, processor_id, None).filter(_stale(journal.stale(now), now, stale_seconds))
    rows = qs.order_by().values("fingerprint", "task_name", "processor_id", "started_at")
    found = [{**r, "started_at": r["started_at"].isoformat()} for r in rows[: STALE_LISTED + 1]]
    return {"stale": found[:STALE_LISTED], "stale_capped": len(found) > STALE_LISTED}


def collect(
    alias: str, processor_id: str | None, stale_seconds: float | None,
    since_seconds: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """:func:`counts` of the window and the expired entries of the whole journal (up to
    ``EXPIRED_CAP`` in a window, all of them for every entry), whatever they take."""
    from celery_grousset import journal

    now = journal.now(alias)
    cap = None if since_seconds is None else EXPIRED_CAP
    data = counts(alias, processor_id, stale_seconds, since_seconds, now)
    listed = stale_listed(alias, now, processor_id, stale_seconds)
    return data | _expired(alias, now, processor_id, cap) | listed


def collect_default(
    alias: str, processor_id: str | None, stale_seconds: float | None
) -> dict[str, Any]:
    """:func:`collect` of the default window, each statement within :data:`STATS_BUDGET`:
    the window is narrowed while its statement needs more, or while the planner expects
    more than :data:`STATS_ROWS` entries in it (``narrowed_from_seconds`` says from
    what), and expired entries that take more to count are not counted (``expired``
    None: ``--since`` counts them)."""
    from celery_grousset import journal
    from celery_grousset.store.budget import BudgetExceeded, estimated_rows, statement_budget

    now = journal.now(alias)
    default = DEFAULT_SINCE.total_seconds()
    windows = [default, *NARROWER]
    data = None
    for seconds in windows[:-1]:
        expected = estimated_rows(_window(alias, processor_id, now - timedelta(seconds=seconds)))
        if expected is not None and expected > STATS_ROWS:
            continue  # not worth starting: it would not fit the budget
        try:
            with statement_budget(alias, STATS_BUDGET):
                data = counts(alias, processor_id, stale_seconds, seconds, now)
            break
        except BudgetExceeded:
            continue
    if data is None:
        data = counts(alias, processor_id, stale_seconds, windows[-1], now)
    narrowed = data["since_seconds"] != default
    try:
        with statement_budget(alias, STATS_BUDGET):
            expired = _expired(alias, now, processor_id, EXPIRED_CAP)
    except BudgetExceeded:
        expired = {"expired": None, "expired_capped": False}
    try:
        with statement_budget(alias, STALE_BUDGET):
            listed = stale_listed(alias, now, processor_id, stale_seconds)
    except BudgetExceeded:
        listed = {"stale": None, "stale_capped": False}
    return data | expired | listed | {"narrowed_from_seconds": default if narrowed else None}


def _why(data: dict[str, Any]) -> str:
    wide = data.get("narrowed_from_seconds")
    if not wide:
        return "--since to widen, "
    return (
        f"the default {human_seconds(wide)} needs more than {STATS_BUDGET} s on this journal: "
        f"--since {human_seconds(wide).replace(' ', '')} counts it anyway, "
    )


def _stale_lines(data: dict[str, Any]) -> list[str]:
    if data["stale"] is None:
        return [f"  stale now    not looked up: more than {STALE_BUDGET} s on this journal "
                "(--all lists them; the grousset_stale_claims gauge counts them)"]  # fmt: skip
    if not data["stale"]:
        of = f" for processor {data['processor_id']!r}" if data["processor_id"] else ""
        return [f"  stale now    none in the whole journal{of}"]
    more = f"more than {STALE_LISTED}, any" if data["stale_capped"] else "all"  # (no sort)
    age = data["stale_after_seconds"]  # (--stale-after: by age; a claim may be fresh yet)
    cmd = "grousset_release" + ("" if data["database"] == journal_alias(None)  # (its journal)
                                else f" --database {data['database']}")  # fmt: skip
    frees = (f"{cmd} <fingerprint> frees one" if age is None else f"older than "
             f"{human_seconds(age)}: {cmd} frees only those past their own deadline")
    lines = [f"  stale now    in the whole journal ({more} {len(data['stale'])}; {frees}):"]
    lines += [f"    {r['fingerprint'][:16]}  {r['task_name']}  started {r['started_at']}"
              + (f"  processor {r['processor_id']}" if not data["processor_id"] else "")
              for r in data["stale"]]  # fmt: skip
    return lines


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


class Command(BaseCommand):
    help = "Journal statistics: entries by status and task, duplicates, takeovers, stale claims."
    requires_system_checks: list[str] = []  # a read-only report: only E012 (handle())

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--skip-checks", action="store_true", help="Skip the E012 check.")
        add_duration_argument(
            parser,
            "--stale-after",
            _stale_after,
            "Count in-flight claims older than this as stale: seconds or 30m, 12h, 7d, 2w "
            f"(above 0, at most {MAX_DURATION_DAYS}d; default: each claim's own deadline, "
            "started_at + its task's max_processing_time).",
        )
        add_duration_argument(
            parser,
            "--since",
            _since,
            "Count the entries started in this window: seconds or 30m, 12h, 7d, 2w "
            f"(default 24h; at most {MAX_DURATION_DAYS}d). Expired entries are counted "
            f"up to {EXPIRED_CAP:,}.",
        )
        parser.add_argument(
            "--all",
            action="store_true",
            dest="every",
            help="Count every entry and every expired one (a full scan of the journal).",
        )
        parser.add_argument("--processor-id", default=None, help="Only this processor's entries.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["skip_checks"]:
            refuse_naive_clock()  # its expiry and stale figures would be off
        stale_seconds = stale_after(options["stale_after"])  # checked before any query
        since_seconds = window(options.get("since"), bool(options.get("every")))
        alias = journal_alias(options["database"])
        default = options.get("since") is None and not options.get("every")
        with database_errors(alias, "could not read the journal"):
            if default:
                data = collect_default(alias, options["processor_id"], stale_seconds)
            else:
                data = collect(alias, options["processor_id"], stale_seconds, since_seconds)
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2))
            return
        text = self.render(data)
        if others := other_journals(alias):  # their stale claims are not in these figures
            text += f"\n  only this journal database{others}"
        self.stdout.write(printable(text))  # (task names are the journal's text)

    @staticmethod
    def render(data: dict[str, Any]) -> str:
        where = f"{data['database']!r}" + (
            f", processor {data['processor_id']!r}" if data["processor_id"] else ""
        )
        status = ", ".join(f"{name} {n}" for name, n in data["by_status"].items())
        expired = (
            f"not counted: more than {STATS_BUDGET} s on this journal (--since counts them"
            if data["expired"] is None
            else (f"{data['expired']:,}+" if data["expired_capped"] else str(data["expired"]))
            + " (in the whole journal"
        )
        lines = [
            f"celery-grousset journal on {where}",
            "  counted      "
            + (
                "every entry (--all)"
                if data["since"] is None
                else f"the entries started in the last {human_seconds(data['since_seconds'])}"
                f" (since {data['since']}; " + _why(data) + "--all for every entry)"
            ),
            f"  entries      {data['entries']} ({status})",
            f"  deliveries   {data['deliveries']} ("
            + _n(data["duplicates"], "duplicate", "duplicates")
            + " answered or deferred; "
            + _n(data["redeliveries"], "redelivery, requeue or re-claim", "redeliveries, "
                 "requeues or re-claims")
            + ")",
            f"  takeovers    {data['takeovers']} (on "
            + _n(data["entries_taken_over"], "entry", "entries")
            + ")",
            f"  stale claims {data['stale_claims']} in the counted entries ("
            + (
                "past their own max_processing_time"
                if data["stale_after_seconds"] is None
                else f"in flight for more than {human_seconds(data['stale_after_seconds'])}"
            )
            + ")",
            f"  expired      {expired}; grousset_purge deletes them)",
            *_stale_lines(data),
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
