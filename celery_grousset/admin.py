"""The outcome journal in the Django admin (DESIGN §7), read from ``GROUSSET["DATABASE"]``.

Read-only for everyone. Two actions, each behind its own permission and a
confirmation page: *release stale claims* (free an in-flight claim so the next
delivery runs) and *forget* (end the retention window now so the next delivery
runs again; the row stays, so the fence keeps growing). Built for large
journals: no full-table ``COUNT`` (PostgreSQL's estimate stands in), distinct
filter values by a loose index scan, fingerprint search as an index range scan,
and every query-string value cleaned (no NUL, bounded) before the database.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import DurationField, ExpressionWrapper, F, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from celery_grousset.conf import grousset_settings, seconds
from celery_grousset.managers import _db_now
from celery_grousset.memo import decode
from celery_grousset.models import Outcome, Status

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[Outcome]
else:
    _Base = admin.ModelAdmin

#: Longest search term or filter value that reaches the database.
MAX_TERM = 255
#: Distinct task names / processors offered by a filter.
MAX_CHOICES = 200
#: Rows one action may touch (the confirmation page lists them all).
MAX_ACTION_ROWS = 500
#: Below this planner estimate the real count is cheap enough to run.
ESTIMATE_THRESHOLD = 10_000
#: Memos of these content types are never decoded in a web process.
UNSAFE_CONTENT_TYPES = ("application/x-python-serialize",)

_HEX = re.compile(r"[0-9a-f]{1,64}")
_NEXT_HEX = {c: n for c, n in zip("0123456789abcde", "123456789abcdef", strict=True)}
_BADGE = {Status.IN_FLIGHT: ("#92400e", "#fde68a"), Status.COMPLETED: ("#166534", "#dcfce7"),
          Status.FAILED: ("#991b1b", "#fee2e2")}  # fmt: skip


def journal_alias() -> str:
    """The database alias that holds the journal (``GROUSSET["DATABASE"]``)."""
    return str(grousset_settings.DATABASE)


def clean_term(value: str | None) -> str:
    """A query-string value made safe for every backend: no NUL, bounded, stripped."""
    return (value or "").replace("\x00", "")[: MAX_TERM * 4].strip()[:MAX_TERM]


def fingerprint_prefix(prefix: str) -> Q:
    """Fingerprints that start with the hex ``prefix``, as a range the b-tree index answers
    under any collation (``LIKE 'ab%'`` alone needs a C collation or a pattern index)."""
    head, match = prefix.rstrip("f"), Q(fingerprint__gte=prefix, fingerprint__startswith=prefix)
    return match & Q(fingerprint__lt=head[:-1] + _NEXT_HEX[head[-1]]) if head else match


def distinct_values(alias: str, column: str, limit: int = MAX_CHOICES) -> list[str]:
    """Up to ``limit`` distinct values of an indexed journal column, in order (on PostgreSQL
    a recursive CTE walks the index value by value: a loose index scan, cheap on big tables)."""
    if column not in ("task_name", "processor_id"):
        raise ValueError(f"not an indexed filter column: {column!r}")
    conn = connections[alias]
    if conn.vendor != "postgresql":
        qs = Outcome.objects.using(alias).order_by(column).values_list(column, flat=True)
        return [str(v) for v in qs.distinct()[:limit]]
    col, table = conn.ops.quote_name(column), conn.ops.quote_name(Outcome._meta.db_table)
    sql = (
        f"WITH RECURSIVE v(x) AS ((SELECT {col} FROM {table} ORDER BY {col} LIMIT 1) "
        f"UNION ALL SELECT (SELECT {col} FROM {table} WHERE {col} > v.x ORDER BY {col} LIMIT 1) "
        f"FROM v WHERE v.x IS NOT NULL) SELECT x FROM v WHERE x IS NOT NULL LIMIT %s"
    )
    with conn.cursor() as cur:
        cur.execute(sql, [limit])
        return [str(row[0]) for row in cur.fetchall()]


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator that does not ``COUNT(*)`` an unfiltered, large PostgreSQL journal:
    the planner's estimate (``pg_class.reltuples``) stands in above 10,000 rows."""

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        if not qs.query.where and connections[qs.db].vendor == "postgresql":
            with connections[qs.db].cursor() as cur:
                sql = "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)"
                cur.execute(sql, [qs.model._meta.db_table])
                row = cur.fetchone()
            if row and row[0] is not None and row[0] > ESTIMATE_THRESHOLD:
                return int(row[0])
        return int(qs.count())


def humanize(delta: timedelta | None) -> str:
    """``timedelta`` → ``"3 d 4 h"``, ``"5 min 2 s"``, ``"0 s"``."""
    if delta is None:
        return "—"
    total, parts = max(0, int(delta.total_seconds())), list[str]()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if total >= size or (unit == "s" and not parts):
            parts.append(f"{total // size} {unit}")
            total %= size
    return " ".join(parts[:2])


def stale_after() -> timedelta | None:
    """``GROUSSET["MAX_PROCESSING_TIME"]`` as a timedelta, when it is set."""
    value = seconds(grousset_settings.MAX_PROCESSING_TIME, name="MAX_PROCESSING_TIME")
    return None if value is None else timedelta(seconds=value)


def memo_text(obj: Outcome) -> tuple[bool, str]:
    """``(ok, text)``: the memo pretty-printed, or why duplicates get no value."""
    if obj.status == Status.IN_FLIGHT:
        return False, "no outcome yet: the claim is in flight"
    content_type = obj.result_encoding.partition(";")[0]
    if content_type in UNSAFE_CONTENT_TYPES:
        size = len(obj.result or b"")
        return False, f"{content_type} memo ({size} bytes): not decoded in the admin"
    raw = bytes(obj.result) if obj.result is not None else None
    try:
        value = decode(raw, obj.result_encoding, obj.error, obj.fingerprint)
    except Exception as exc:  # shown to the operator, as duplicates see it
        return False, f"{type(exc).__name__}: {exc}"
    return True, json.dumps(value, indent=2, default=str, ensure_ascii=False, sort_keys=True)


class _CleanFilter(admin.SimpleListFilter):
    """A filter on one exact column value, cleaned before it reaches the database."""

    column = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(v, v) for v in distinct_values(journal_alias(), self.column)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = clean_term(self.value())
        return queryset.filter(**{self.column: value}) if value else queryset


class StatusFilter(_CleanFilter):
    title = _("status")
    parameter_name = column = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return list(Status.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(status=value) if value in Status.values else queryset


class TaskNameFilter(_CleanFilter):
    title, parameter_name, column = _("task"), "task", "task_name"


class ProcessorFilter(_CleanFilter):
    title, parameter_name, column = _("processor"), "processor", "processor_id"


class StartedFilter(admin.SimpleListFilter):
    """When the claim was taken, in fixed windows (no query to list the choices)."""

    title, parameter_name = _("started"), "started"
    windows = {"1h": (_("Last hour"), timedelta(hours=1), "gte"),
               "24h": (_("Last 24 hours"), timedelta(days=1), "gte"),
               "7d": (_("Last 7 days"), timedelta(days=7), "gte"),
               "older7d": (_("More than 7 days ago"), timedelta(days=7), "lt")}  # fmt: skip

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(key, window[0]) for key, window in self.windows.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        window = self.windows.get(self.value() or "")
        if window is None:
            return queryset
        return queryset.filter(**{f"started_at__{window[2]}": _db_now(queryset.db) - window[1]})


Plan = list[tuple[Outcome, bool, str]]
_Response = TemplateResponse | None


def release_plan(obj: Outcome, now: datetime) -> tuple[bool, str]:
    """Whether *Release stale claims* frees this row, and why."""
    limit, age = stale_after(), now - obj.started_at
    if obj.status != Status.IN_FLIGHT:
        return False, f"not in flight ({obj.status})"
    if limit is not None and age < limit:
        return False, f"fresh: younger than MAX_PROCESSING_TIME ({limit})"
    return True, f"in flight for {humanize(age)}"


def forget_plan(obj: Outcome, now: datetime) -> tuple[bool, str]:
    """Whether *Forget* ends the retention window of this row, and why."""
    if obj.status == Status.IN_FLIGHT:
        return False, "in flight: release it first"
    if obj.expires_on <= now:
        return False, "already expired: the next delivery runs again"
    return True, f"{obj.status}, remembered until {_ts(obj.expires_on)}"


@admin.register(Outcome)
class OutcomeAdmin(_Base):
    """The journal: list, filters, search, a read-only detail page, two actions."""

    list_display = ("status_badge", "task_name", "processor_id", "short_fingerprint",
                    "deliveries", "takeovers", "started_at", "completed_at", "age")  # fmt: skip
    list_display_links = ("status_badge", "task_name")
    list_filter = (StatusFilter, TaskNameFilter, ProcessorFilter, StartedFilter)
    search_fields = ("=task_id",)  # the search itself: get_search_results
    search_help_text = _("A fingerprint prefix (hex) or an exact task id.")
    ordering = ("-started_at",)
    show_full_result_count = False
    if hasattr(admin, "ShowFacets"):  # Django >= 5.0 (4.2 has no facets)
        show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    list_per_page = 50
    actions = ("release_stale_claims", "forget_outcomes")
    _record = ("status_badge", "task_name", "task_id", "processor_id", "fingerprint", "worker")
    _outcome = ("memo", "result_encoding", "error", "args_repr")
    _timeline = ("timeline", "fence", "deliveries", "takeovers", "claim_token")
    readonly_fields = _record + _outcome + _timeline
    fieldsets = (
        (None, {"fields": _record}),
        (_("Outcome"), {"fields": _outcome}),
        (_("Timeline"), {"fields": _timeline}),
    )

    class Media:
        js = ("celery_grousset/admin.js",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Outcome]:
        age = ExpressionWrapper(Now() - F("started_at"), output_field=DurationField())
        qs = super().get_queryset(request).using(journal_alias())
        return qs.annotate(grousset_age=age)  # on the database clock

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Outcome], bool]:
        term = clean_term(search_term)
        match = Q(task_id=term)  # exact; anything else only as a fingerprint prefix
        if _HEX.fullmatch(term.lower()):
            match |= fingerprint_prefix(term.lower())
        return (queryset.filter(match) if term else queryset), False

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        # Only the list filters above filter the list: no ad-hoc ?field=value lookups.
        return lookup in {"status", "task", "processor", "started"}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Outcome | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Outcome | None = None) -> bool:
        return False

    def has_release_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_grousset.release_outcome"))

    def has_forget_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_grousset.forget_outcome"))

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Outcome) -> SafeString:
        fg, bg = _BADGE.get(Status(obj.status), ("#374151", "#f3f4f6"))
        return format_html(
            '<span class="grousset-status grousset-status-{}" style="color:{};background:{};'
            'padding:2px 8px;border-radius:10px;font-weight:600;white-space:nowrap">{}</span>',
            obj.status, fg, bg, obj.get_status_display(),
        )  # fmt: skip

    @admin.display(description=_("fingerprint"), ordering="fingerprint")
    def short_fingerprint(self, obj: Outcome) -> SafeString:
        fp = obj.fingerprint
        return format_html(
            '<span style="white-space:nowrap"><code class="grousset-fp" title="{}" data-copy="{}">'
            '{}</code> <button type="button" class="grousset-copy" data-copy="{}" title="{}" '
            'style="cursor:pointer;font-size:10px;padding:0 3px">copy</button></span>',
            fp, fp, fp[:12], fp, _("Copy the full fingerprint"),
        )  # fmt: skip

    @admin.display(description=_("age"), ordering=F("started_at").desc())
    def age(self, obj: Outcome) -> str:
        return humanize(getattr(obj, "grousset_age", None))

    @admin.display(description=_("memo"))
    def memo(self, obj: Outcome) -> SafeString:
        ok, text = memo_text(obj)
        html = '<pre class="grousset-memo">{}</pre>' if ok else "<p><em>{}</em></p>"
        return format_html(html, text)

    @admin.display(description=_("timeline"))
    def timeline(self, obj: Outcome) -> SafeString:
        now, start = _db_now(journal_alias()), obj.started_at
        rows = [(_("started"), f"{_ts(start)} ({humanize(now - start)} ago)")]
        end = obj.completed_at
        done = f"{_ts(end)} (after {humanize(end - start)})" if end is not None else None
        rows.append((_("finished"), done or f"not yet: in flight for {humanize(now - start)}"))
        left = obj.expires_on - now
        when = f"in {humanize(left)}" if left > timedelta(0) else f"{humanize(-left)} ago"
        rows.append((_("expires"), f"{_ts(obj.expires_on)} ({when})"))
        claims = f"fence {obj.fence}, {obj.takeovers} takeover(s), {obj.deliveries} delivery(ies)"
        rows.append((_("claims"), claims))
        body = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
        return format_html('<table class="grousset-timeline">{}</table>', body)

    @admin.action(description=_("Release stale claims"), permissions=["release"])
    def release_stale_claims(self, request: HttpRequest, queryset: QuerySet[Outcome]) -> _Response:
        from celery_grousset.store import get_store

        store = get_store(queryset.db)

        def release(obj: Outcome) -> str | None:
            # With the token seen here: a claim taken over since then stays.
            if not store.release(obj.processor_id, obj.fingerprint, obj.claim_token):
                return None
            return f"Released the claim of fence {obj.fence} (started {_ts(obj.started_at)})."

        warning = _("Each released claim is marked failed; the next delivery of its message "
                    "runs the task again.")  # fmt: skip
        return self._run_action(request, queryset, "release_stale_claims", release_plan,
                                release, warning, "Released {} claim(s)")  # fmt: skip

    @admin.action(description=_("Forget (allow re-run)"), permissions=["forget"])
    def forget_outcomes(self, request: HttpRequest, queryset: QuerySet[Outcome]) -> _Response:
        def forget(obj: Outcome) -> str | None:
            now = _db_now(queryset.db)
            rows = Outcome.objects.using(queryset.db).filter(pk=obj.pk, expires_on__gt=now)
            if not rows.exclude(status=Status.IN_FLIGHT).update(expires_on=now):
                return None
            return f"Forgotten: expires_on set to {_ts(now)} (was {_ts(obj.expires_on)})."

        warning = _("The next delivery of each forgotten message runs the task again: its "
                    "side effect happens again.")  # fmt: skip
        return self._run_action(request, queryset, "forget_outcomes", forget_plan, forget,
                                warning, "Forgot {} outcome(s)")  # fmt: skip

    def _run_action(
        self, request: HttpRequest, queryset: QuerySet[Outcome], name: str,
        planner: Callable[[Outcome, datetime], tuple[bool, str]],
        apply: Callable[[Outcome], str | None], warning: Any, summary: str,
    ) -> _Response:  # fmt: skip
        """List the rows on a confirmation page; once confirmed, apply and log each."""
        rows = list(queryset.order_by("-started_at", "-pk")[: MAX_ACTION_ROWS + 1])
        if len(rows) > MAX_ACTION_ROWS:
            text = f"Select at most {MAX_ACTION_ROWS} rows for this action."
            self.message_user(request, text, messages.ERROR)
            return None
        now = _db_now(queryset.db)
        plan: Plan = [(obj, *planner(obj, now)) for obj in rows]
        if "post" not in request.POST:
            context = {
                **self.admin_site.each_context(request),
                "title": getattr(getattr(self, name), "short_description", name), "action": name,
                "plan": plan, "warning": warning, "eligible": sum(1 for p in plan if p[1]),
                "opts": self.model._meta, "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
                "select_across": request.POST.get("select_across", "0"), "media": self.media,
            }  # fmt: skip
            template = "celery_grousset/admin/confirm_action.html"
            return TemplateResponse(request, template, context)
        done = 0
        for obj, eligible, _note in plan:
            message = apply(obj) if eligible else None
            if message is not None:
                self.log_change(request, obj, message)
                done += 1
        text = summary.format(done) + f"; {len(plan) - done} left as they were."
        self.message_user(request, text, messages.SUCCESS if done else messages.WARNING)
        return None


def _ts(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


from celery_grousset import outbox_admin  # noqa: E402,F401
