"""What the journal's and the outbox's admins share: read-only pages on the journal's
database (``GROUSSET["DATABASE"]``), a paginator that never counts a large table, and
the helpers that clean and show values."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from celery_grousset.conf import grousset_settings
from celery_grousset.store import get_store

#: Longest search term or filter value that reaches the database.
MAX_TERM = 255
#: Below this planner estimate the real count is cheap enough to run.
ESTIMATE_THRESHOLD = 10_000

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:
    _ModelAdmin = admin.ModelAdmin


def journal_alias() -> str:
    """The database alias that holds the journal (``GROUSSET["DATABASE"]``)."""
    return str(grousset_settings.DATABASE)


def clean_term(value: str | None) -> str:
    """A query-string value made safe for every backend: no NUL, bounded, stripped."""
    return (value or "").replace("\x00", "")[: MAX_TERM * 4].strip()[:MAX_TERM]


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


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator that does not ``COUNT(*)`` an unfiltered, large journal: the store's
    estimate (PostgreSQL's planner statistics) stands in above 10,000 rows."""

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        if not qs.query.where and qs.model._meta.db_table == "celery_grousset_outcome":
            estimate = get_store(qs.db).estimated_count()
            if estimate is not None and estimate > ESTIMATE_THRESHOLD:
                return estimate
        return int(qs.count())


class ReadOnlyAdmin(_ModelAdmin):
    """A read-only list and detail page on the journal's database."""

    paginator = EstimatedCountPaginator

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(journal_alias())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
