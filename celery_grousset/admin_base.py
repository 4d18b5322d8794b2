"""What the journal's and the outbox's admins share: read-only pages on the journal's
database (``GROUSSET["DATABASE"]``, or another journal database picked by ``?db=``), a
paginator that never counts a large table, and the helpers that clean and show values."""

from __future__ import annotations

import copy
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import SafeString

from celery_grousset.conf import grousset_settings
from celery_grousset.shown import shown_time
from celery_grousset.store import get_store
from celery_grousset.store.budget import BudgetExceeded, statement_budget

logger = logging.getLogger("celery_grousset")

#: Rows one action may touch (the confirmation page lists them all).
MAX_ACTION_ROWS = 500
#: Longest search term or filter value that reaches the database.
MAX_TERM = 255
#: Below this planner estimate the real count is cheap enough to run.
ESTIMATE_THRESHOLD = 10_000
#: Where a filtered list stops counting (``ReadOnlyAdmin.count_cap``): "10,000+" beyond.
COUNT_CAP = 10_000
#: Seconds a statement of a list page may take (``ReadOnlyAdmin.query_budget``).
QUERY_BUDGET = 0.25

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:
    _ModelAdmin = admin.ModelAdmin


#: the query-string parameter that picks which journal database the journal's pages show
DATABASE_PARAM = "db"


def journal_alias(request: HttpRequest | None = None) -> str:
    """The database alias whose journal a page shows: ``GROUSSET["DATABASE"]``, or the one
    its ``?db=`` names among the journal databases (each guarded task's ``database``); a
    detail page reads it from the list's preserved filters. Any other name: the default."""
    if request is None:
        return str(grousset_settings.DATABASE)
    asked = request.GET.get(DATABASE_PARAM)
    if asked is None:
        asked = QueryDict(request.GET.get("_changelist_filters", "")).get(DATABASE_PARAM)
    return picked_alias(asked)


def picked_alias(asked: str | None) -> str:
    """``asked`` if it names a journal database, else ``GROUSSET["DATABASE"]``."""
    default = str(grousset_settings.DATABASE)
    return asked if asked and asked in journal_databases_shown() else default


def journal_databases_shown() -> list[str]:
    """The journal databases (:func:`celery_grousset.checks.journal_databases`); only
    ``GROUSSET["DATABASE"]`` when the tasks' options cannot be read (the checks say why)."""
    from celery_grousset.checks import journal_databases

    try:
        return journal_databases()
    except Exception:
        return [str(grousset_settings.DATABASE)]


def clean_term(value: str | None, alias: str | None = None) -> str:
    """A query-string value made safe for every backend: no NUL, bounded, stripped; for
    the journal on ``alias``, written as its store writes text (a utf8mb3 MySQL journal:
    a character outside the BMP as its escape, which such a connection can compare)."""
    text = (value or "").replace("\x00", "")[: MAX_TERM * 4].strip()[:MAX_TERM]
    if alias is None or text.isascii():
        return text
    from celery_grousset.store import get_store

    return get_store(alias).stored_text(text)


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


def when_html(value: datetime | None) -> SafeString | None:
    """A time as two short lines, date over time (the current time zone), the full value
    in the tooltip: the list keeps its width (None: the admin's empty value)."""
    if value is None:
        return None
    local = timezone.localtime(value) if timezone.is_aware(value) else value  # USE_TZ=False
    html = '<time class="grousset-when" datetime="{}" title="{}">{}<br>{}</time>'
    return format_html(html, value.isoformat(), shown_time(value), f"{local:%Y-%m-%d}",
                       f"{local:%H:%M:%S}")  # fmt: skip


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator that does not ``COUNT(*)`` a large journal: the store's estimate
    (PostgreSQL's planner statistics) stands in for an unfiltered count above 10,000
    rows, and with a ``cap`` a filtered count stops at ``cap`` matching rows (it counts a
    subquery limited to ``cap + 1`` rows): :attr:`capped` then says "cap+"."""

    def __init__(self, *args: Any, cap: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ImproperlyConfigured(
                f"count_cap must be a whole number above 0, or None to count exactly; got {cap!r}"
            )
        self.cap = cap
        self.capped = False

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        if not qs.query.where and qs.model._meta.db_table == "celery_grousset_outcome":
            estimate = get_store(qs.db).estimated_count()
            if estimate is not None and estimate > ESTIMATE_THRESHOLD:
                return estimate
        if self.cap is None:
            return int(qs.count())
        # No ORDER BY: the scan stops at the (cap + 1)-th match in any order.
        found = int(qs.order_by()[: self.cap + 1].count())
        self.capped = found > self.cap
        return min(found, self.cap)

    @property
    def count_label(self) -> str:
        """The cap with thousands separators (the list shows it followed by "+")."""
        return f"{self.cap or 0:,}"


class ReadOnlyAdmin(_ModelAdmin):
    """A read-only list and detail page on the journal's database."""

    paginator = EstimatedCountPaginator
    #: A filtered list counts its rows up to here, then shows "10,000+" (pages stop there).
    count_cap = COUNT_CAP
    show_full_result_count = False  # (an unfiltered count of the whole table)
    if hasattr(admin, "ShowFacets"):  # Django >= 5.0 (4.2 has no facets): their counts
        show_facets = admin.ShowFacets.NEVER  # are of the whole table, with no cap

    def get_paginator(
        self, request: HttpRequest, queryset: QuerySet[Any], per_page: int,
        orphans: int = 0, allow_empty_first_page: bool = True,
    ) -> EstimatedCountPaginator:  # fmt: skip
        return EstimatedCountPaginator(queryset, per_page, orphans, allow_empty_first_page,
                                       cap=self.count_cap)  # fmt: skip

    #: Whether ``?db=`` picks the database (the journal's pages; the outbox has one).
    database_param = False

    def alias(self, request: HttpRequest | None) -> str:
        """The database this admin's page reads (:func:`journal_alias`)."""
        return journal_alias(request if self.database_param else None)

    #: Seconds each statement of the list page may take on PostgreSQL and MariaDB (None:
    #: no limit). A page past it is shown again narrowed (:meth:`narrowed`), with a note.
    query_budget: float | None = QUERY_BUDGET

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(self.alias(request))

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Only the list's own filters filter it: no ad-hoc ``?field=value`` lookup, with
        which a view-only user could confirm a guessed argument, header or error."""
        return lookup in {getattr(f, "parameter_name", None) for f in self.list_filter}

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The list (:meth:`budgeted_list`); a page that says so, with status 503, when
        the journal's database cannot be read (down, refused, a wrong password, no
        tables). Only a GET: an action's error is Django's to show, as it may have
        changed rows already."""
        if request.method != "GET":
            return self.budgeted_list(request, extra_context)
        return self._readable(request, lambda: self.budgeted_list(request, extra_context),
                              others=self.database_param)  # fmt: skip

    def changeform_view(self, request: HttpRequest, object_id: str | None = None,
                        form_url: str = "", extra_context: dict[str, Any] | None = None,
                        ) -> HttpResponse:  # fmt: skip
        """A row's page, or the 503 page (a bare server error, from an alert's link)."""
        view = super().changeform_view
        return self._readable(request, lambda: view(request, object_id, form_url, extra_context))

    def history_view(self, request: HttpRequest, object_id: str,
                     extra_context: dict[str, Any] | None = None) -> HttpResponse:  # fmt: skip
        view = super().history_view
        return self._readable(request, lambda: view(request, object_id, extra_context))

    def _readable(self, request: HttpRequest, view: Any, others: bool = False) -> HttpResponse:
        """``view()``, or a page that says the database cannot be read (status 503)."""
        from django.db import InterfaceError, OperationalError

        try:
            return view()  # type: ignore[no-any-return]
        except (OperationalError, InterfaceError) as exc:
            from celery_grousset.events import error_text

            alias = self.alias(request)
            logger.warning("celery-grousset admin: the journal database %r cannot be read",
                           alias, exc_info=True)  # fmt: skip
            context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                       "title": f"{self.model._meta.verbose_name_plural} — unavailable",
                       "database": alias,  # (the driver's text, naming hosts and users:
                       "error": error_text(exc) if request.user.is_superuser else "",  # logged)
                       "databases": journal_databases_shown() if others else [],
                       "param": DATABASE_PARAM}  # fmt: skip
            return TemplateResponse(request, "admin/celery_grousset/unavailable.html",
                                    context, status=503)  # fmt: skip

    def budgeted_list(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The list, its statements within :attr:`query_budget`; a list that needs more
        (a filter the indexes cannot serve, on a large journal) is shown narrowed. Only
        a GET: an action (POST) runs as Django runs it, once."""
        if request.method != "GET" or self.query_budget is None:
            return super().changelist_view(request, extra_context)
        for attempt in [request, *self.narrowed(request)]:
            note = (
                {}
                if attempt is request
                else {
                    "grousset_note": self.narrowed_note(attempt),
                    "grousset_note_level": "warning",
                }
            )
            try:
                with statement_budget(self.alias(request), self.query_budget):
                    response = super().changelist_view(attempt, {**(extra_context or {}), **note})
                    if isinstance(response, TemplateResponse):
                        response.render()  # the list's queries run here, inside the budget
                return response
            except BudgetExceeded:
                continue
        plain = copy.copy(request)
        plain.GET = QueryDict(mutable=True)  # type: ignore[assignment]
        note = {"grousset_note": self.narrowed_note(None), "grousset_note_level": "error"}
        return super().changelist_view(plain, {**(extra_context or {}), **note})

    def narrowed(self, request: HttpRequest) -> list[HttpRequest]:
        """Narrower versions of a list request to try when it runs past the budget
        (none here; the journal's admin narrows by when the claim was taken)."""
        return []

    def narrowed_note(self, shown: HttpRequest | None) -> str:
        """What the page says when it shows a narrowed list (None: the unfiltered one)."""
        if shown is None:
            return (
                f"This list needs more than {self.query_budget} s per query on a journal this "
                "size, even narrowed: the unfiltered list is shown. Add a narrower filter "
                "(task, processor, a shorter 'started' window)."
            )
        return f"This list needs more than {self.query_budget} s per query on a journal this size."

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
