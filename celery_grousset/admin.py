"""The outcome journal in the Django admin (docs/operations.md), read from ``GROUSSET["DATABASE"]``
or another journal database picked with the *journal database* filter.

Read-only for everyone. Two actions, each behind its own permission and a
confirmation page: *release stale claims* (free an in-flight claim so the next
delivery runs) and *forget* (end the retention window now so the next delivery
runs again; the row stays, so the fence keeps growing). Built for large
journals: no full-table ``COUNT`` (PostgreSQL's estimate stands in), distinct
filter values by a loose index scan, fingerprint search as an index range scan,
and every query-string value cleaned (no NUL, bounded) before the database.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Q, QuerySet, Value
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from celery_grousset import journal
from celery_grousset.admin_base import (
    DATABASE_PARAM,
    MAX_ACTION_ROWS,
    ReadOnlyAdmin,
    clean_term,
    humanize,
    journal_alias,
    journal_databases_shown,
    picked_alias,
    when_html,
)
from celery_grousset.models import Outcome, Status
from celery_grousset.shown import shown_time, visible
from celery_grousset.store import get_store
from celery_grousset.textcut import encodable

#: Distinct task names / processors offered by a filter.
MAX_CHOICES = 200
#: Memos of these content types are never decoded in a web process.
UNSAFE_CONTENT_TYPES = ("application/x-python-serialize",)

_HEX = re.compile(r"[0-9a-f]{1,64}")
#: the copy control's glyph: two overlapping sheets, drawn in the text colour (no font needed)
COPY_ICON = mark_safe(
    '<svg class="grousset-copy-icon" viewBox="0 0 16 16" width="14" height="14" '
    'aria-hidden="true" focusable="false" fill="none" stroke="currentColor" '
    'stroke-width="1.5"><rect x="5.5" y="5.5" width="8" height="9" rx="1.5"/>'
    '<path d="M10.5 3.5v-1a1 1 0 0 0-1-1h-6a1 1 0 0 0-1 1v8a1 1 0 0 0 1 1h1"/></svg>'
)
_BADGE = {Status.IN_FLIGHT: ("#92400e", "#fde68a"), Status.COMPLETED: ("#166534", "#dcfce7"),
          Status.FAILED: ("#991b1b", "#fee2e2")}  # fmt: skip


def memo_text(obj: Outcome, now: datetime) -> tuple[bool, str]:
    """``(ok, text)``: a JSON memo pretty-printed, or what is stored instead (its content
    type and size; a failure's stored type and message). Display only: nothing but JSON is
    decoded and nothing is imported (:func:`celery_grousset.journal.memo_value`)."""
    ok, value = journal.memo_value(obj, now)
    if not ok:
        return False, str(value)
    return True, encodable(json.dumps(value, indent=2, default=str, ensure_ascii=False,
                                      sort_keys=True))  # fmt: skip


class _CleanFilter(admin.SimpleListFilter):
    """A filter on one exact column value, cleaned before it reaches the database."""

    column = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        values = get_store(model_admin.alias(request)).distinct_values(self.column, MAX_CHOICES)
        return [(v, v) for v in values]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = clean_term(self.value(), queryset.db)
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


class DatabaseFilter(admin.SimpleListFilter):
    """Which journal database the pages show, when there is more than one (a task's
    ``database`` option): ``GROUSSET["DATABASE"]`` unless another is picked."""

    title, parameter_name = _("journal database"), DATABASE_PARAM

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        aliases = journal_databases_shown()
        return [(alias, alias) for alias in aliases] if len(aliases) > 1 else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset  # the page's database is chosen by get_queryset

    def choices(self, changelist: Any) -> Any:
        current = picked_alias(self.value())
        for alias, label in self.lookup_choices:
            query = changelist.get_query_string({DATABASE_PARAM: alias})
            yield {"selected": alias == current, "display": label, "query_string": query}


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
        return queryset.filter(**{f"started_at__{window[2]}": journal.now(queryset.db) - window[1]})


Plan = list[tuple[Outcome, bool, str]]
_Response = TemplateResponse | None


@admin.register(Outcome)
class OutcomeAdmin(ReadOnlyAdmin):
    """The journal: list, filters, search, a read-only detail page, two actions."""

    list_display = ("status_badge", "task", "processor_id", "short_fingerprint",
                    "delivery_count", "takeover_count", "started", "completed", "age")  # fmt: skip
    list_display_links = ("status_badge", "task")
    list_filter = (DatabaseFilter, StatusFilter, TaskNameFilter, ProcessorFilter, StartedFilter)
    database_param = True
    search_fields = ("=task_id",)  # the search itself: get_search_results
    search_help_text = _("A fingerprint prefix (hex) or an exact task id.")
    ordering = ("-started_at",)
    list_per_page = 50
    actions = ("release_stale_claims", "forget_outcomes")
    _record = ("status_badge", "task_name", "task_id", "processor_id", "fingerprint", "worker")
    _outcome = ("memo", "result_encoding", "error_shown", "args_shown")
    _timeline = ("timeline", "stale_at", "fence", "deliveries", "duplicates", "takeovers",
                 "claim_token")  # fmt: skip
    readonly_fields = _record + _outcome + _timeline
    fieldsets = (
        (None, {"fields": _record}),
        (_("Outcome"), {"fields": _outcome}),
        (_("Timeline"), {"fields": _timeline}),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """A settled record (completed, failed) shows no claim deadline nor claim token:
        they mean something only while a claim is in flight."""
        if obj is None or obj.status == Status.IN_FLIGHT:
            return self.fieldsets
        live = ("stale_at", "claim_token")
        return [(name, {"fields": tuple(f for f in opts["fields"] if f not in live)})
                for name, opts in self.fieldsets]  # fmt: skip

    class Media:
        css = {"all": ("celery_grousset/admin.css",)}
        js = ("celery_grousset/admin.js",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Outcome]:
        qs: QuerySet[Outcome] = super().get_queryset(request)
        now = get_store(qs.db).now_expression()  # the journal's clock, as the claim reads it
        if not hasattr(now, "resolve_expression"):  # (SQLite: a value)
            now = Value(now, output_field=DateTimeField())
        age = ExpressionWrapper(now - F("started_at"), output_field=DurationField())
        return qs.annotate(grousset_age=age)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Outcome], bool]:
        term = clean_term(search_term, queryset.db)
        match = Q(task_id=term)  # exact; anything else only as a fingerprint prefix
        for d in journal.deliveries_of(queryset.db, term) if term else ():
            match |= Q(processor_id=d.processor_id, fingerprint=d.fingerprint)
        if _HEX.fullmatch(term.lower()):
            match |= journal.fingerprint_prefix(term.lower())
        return (queryset.filter(match) if term else queryset), False

    def narrowed(self, request: HttpRequest) -> list[HttpRequest]:
        """Past the query budget: the same filters, on the claims of the last hour (the
        ``started_at`` index bounds the rows read)."""
        if request.GET.get("started") == "1h":
            return []
        narrow = copy.copy(request)
        params = request.GET.copy()
        params["started"] = "1h"
        narrow.GET = params  # type: ignore[assignment]
        return [narrow]

    def narrowed_note(self, shown: HttpRequest | None) -> str:
        if shown is None:
            return super().narrowed_note(shown)
        further = ("add a task or processor filter (each has an index; a wider 'started' "
                   "window alone is narrowed again)")  # fmt: skip
        if shown.GET.get("status") == Status.IN_FLIGHT:  # (old stale claims are the point)
            further = "filter by status alone, without a task or processor filter"
        return (f"These filters need more than {self.query_budget} s per query on the whole "
                f"journal: showing the claims started in the last hour. To look further "
                f"back, {further}; `manage.py grousset_stats` lists the stale claims of the "
                "whole journal.")  # fmt: skip

    def has_release_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_grousset.release_outcome"))

    def has_forget_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_grousset.forget_outcome"))

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Outcome) -> SafeString:
        fg, bg = _BADGE.get(Status(obj.status), ("#374151", "#f3f4f6"))
        return format_html(
            '<span class="grousset-status grousset-status-{}" style="color:{};background:{};'
            'padding:2px 6px;border-radius:10px;font-weight:600;white-space:nowrap">{}</span>',
            obj.status, fg, bg, obj.get_status_display(),
        )  # fmt: skip

    @admin.display(description=_("task name"), ordering="task_name")
    def task(self, obj: Outcome) -> SafeString:
        """The dotted name, free to wrap after each dot (a long name keeps the list narrow)."""
        *head, last = obj.task_name.split(".")
        return format_html("{}{}", format_html_join("", "{}.<wbr>", ((p,) for p in head)), last)

    @admin.display(description=_("fingerprint"), ordering="fingerprint")
    def short_fingerprint(self, obj: Outcome) -> SafeString:
        fp, label = obj.fingerprint, _("Copy the full fingerprint")
        return format_html(
            '<span class="grousset-fp-cell"><code class="grousset-fp" title="{}" data-copy="{}">'
            '{}</code><button type="button" class="grousset-copy" data-copy="{}" title="{}" '
            'aria-label="{}">{}</button></span>', fp, fp, fp[:12], fp, label, label, COPY_ICON,
        )  # fmt: skip

    # Headers that may hyphenate (a soft hyphen): the numbers below them are short.
    @admin.display(description=_("deliv\u00aderies"), ordering="deliveries")
    def delivery_count(self, obj: Outcome) -> int:
        return obj.deliveries

    @admin.display(description=_("take\u00adovers"), ordering="takeovers")
    def takeover_count(self, obj: Outcome) -> int:
        return obj.takeovers

    @admin.display(description=_("started"), ordering="started_at")
    def started(self, obj: Outcome) -> SafeString | None:
        return when_html(obj.started_at)

    @admin.display(description=_("completed"), ordering="completed_at")
    def completed(self, obj: Outcome) -> SafeString | None:
        return when_html(obj.completed_at)

    @admin.display(description=_("age"), ordering=F("started_at").desc())
    def age(self, obj: Outcome) -> str:
        return humanize(getattr(obj, "grousset_age", None))

    @admin.display(description=_("memo"))
    def memo(self, obj: Outcome) -> SafeString:
        ok, text = memo_text(obj, journal.now(obj._state.db or journal_alias()))
        html = '<pre class="grousset-memo">{}</pre>' if ok else "<p><em>{}</em></p>"
        return format_html(html, visible(text))

    @admin.display(description=_("error"))
    def error_shown(self, obj: Outcome) -> str:
        return visible(obj.error)  # (bidirectional overrides: escaped, not obeyed)

    @admin.display(description=_("args repr"))
    def args_shown(self, obj: Outcome) -> str:
        return visible(obj.args_repr)

    @admin.display(description=_("timeline"))
    def timeline(self, obj: Outcome) -> SafeString:
        now, start = journal.now(obj._state.db or journal_alias()), obj.started_at
        first, rows = obj.first_claimed_at or start, list[tuple[Any, str]]()
        if first != start:  # taken over or claimed again since its first claim
            rows.append((_("first claim"), f"{shown_time(first)} ({humanize(now - first)} ago)"))
        rows.append((_("started"), f"{shown_time(start)} ({humanize(now - start)} ago)"))
        end = obj.completed_at
        done = f"{shown_time(end)} (after {humanize(end - start)})" if end is not None else None
        if done is None:
            stale = "stale" if journal.is_stale(obj, now) else "fresh"
            done = f"not yet: in flight for {humanize(now - start)} ({stale})"
        rows.append((_("finished"), done))
        left = obj.expires_on - now
        when = f"in {humanize(left)}" if left > timedelta(0) else f"{humanize(-left)} ago"
        rows.append((_("expires"), f"{shown_time(obj.expires_on)} ({when})"))
        claims = f"fence {obj.fence}, {obj.takeovers} takeover(s), {obj.deliveries} delivery(ies)"
        rows.append((_("claims"), claims))
        again = max(obj.deliveries - 1 - obj.duplicates, 0)
        rows.append((_("deliveries"), f"{obj.duplicates} duplicate(s), {again} redelivery(ies) "
                     "or requeue(s); each other delivery's task id finds this record (the "
                     "search above, grousset_inspect <task id>)"))  # fmt: skip
        body = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
        return format_html('<table class="grousset-timeline">{}</table>', body)

    @admin.action(description=_("Release stale claims"), permissions=["release"])
    def release_stale_claims(self, request: HttpRequest, queryset: QuerySet[Outcome]) -> _Response:
        def release(obj: Outcome) -> str | None:
            # With the token seen here, while stale: one taken over or renewed since stays.
            if not journal.release(obj, queryset.db, token=obj.claim_token, stale=True):
                return None
            started = shown_time(obj.started_at)
            return f"Released the claim of fence {obj.fence} (started {started})."

        warning = _("Each released claim is marked failed; the next delivery of its message "
                    "runs the task again.")  # fmt: skip
        return self._run_action(request, queryset, "release_stale_claims", journal.release_plan,
                                release, warning, "Released {} claim(s)")  # fmt: skip

    @admin.action(description=_("Forget (allow re-run)"), permissions=["forget"])
    def forget_outcomes(self, request: HttpRequest, queryset: QuerySet[Outcome]) -> _Response:
        def forget(obj: Outcome) -> str | None:
            now = journal.forget(obj, queryset.db)
            if now is None:
                return None
            was = shown_time(obj.expires_on)
            return f"Forgotten: expires_on set to {shown_time(now)} (was {was})."

        warning = _("The next delivery of each forgotten message runs the task again: its "
                    "side effect happens again.")  # fmt: skip
        return self._run_action(request, queryset, "forget_outcomes", journal.forget_plan, forget,
                                warning, "Forgot {} outcome(s)")  # fmt: skip

    def _run_action(
        self, request: HttpRequest, queryset: QuerySet[Outcome], name: str,
        planner: Callable[[Outcome, datetime], tuple[bool, str]],
        apply: Callable[[Outcome], str | None], warning: Any, summary: str,
    ) -> _Response:  # fmt: skip
        """List the rows on a confirmation page; once confirmed, apply and log each of the
        rows it listed as to change, as it showed them: the page posts back the primary keys
        it listed (not "select all", which a new row would join) and the state of each row
        to change (one claimed, taken over or settled since is left as it is)."""
        rows = list(queryset.order_by("-started_at", "-pk")[: MAX_ACTION_ROWS + 1])
        if len(rows) > MAX_ACTION_ROWS:
            text = f"Select at most {MAX_ACTION_ROWS} rows for this action."
            self.message_user(request, text, messages.ERROR)
            return None
        now = journal.now(queryset.db)
        plan: Plan = [(obj, *planner(obj, now)) for obj in rows]
        if "post" not in request.POST:
            context = {
                **self.admin_site.each_context(request),
                "title": getattr(getattr(self, name), "short_description", name), "action": name,
                "plan": plan, "warning": warning, "eligible": sum(1 for p in plan if p[1]),
                "opts": self.model._meta, "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "selected": [obj.pk for obj, _, _ in plan],
                "seen": [_seen(obj) for obj, eligible, _ in plan if eligible], "media": self.media,
            }  # fmt: skip
            template = "celery_grousset/admin/confirm_action.html"
            return TemplateResponse(request, template, context)
        done, moved, seen = 0, 0, set(request.POST.getlist("grousset_seen"))
        on = f" (journal database {queryset.db!r})" if len(journal_databases_shown()) > 1 else ""
        for obj, eligible, _note in plan:
            if eligible and _seen(obj) not in seen:
                moved += 1
            elif eligible and (message := apply(obj)) is not None:
                self.log_change(request, obj, message + on)  # (on: a pk is per database)
                done += 1
        text = summary.format(done) + f"; {len(plan) - done} left as they were."
        if moved:
            text += f" {moved} had changed since the confirmation page (or were not on it)."
        self.message_user(request, text, messages.SUCCESS if done else messages.WARNING)
        return None


def _seen(obj: Outcome) -> str:
    """A row's state as a confirmation page showed it (a claim or a settling changes it)."""
    return f"{obj.pk}:{obj.fence}:{obj.status}:{obj.expires_on.isoformat()}"


from celery_grousset import outbox_admin  # noqa: E402,F401
