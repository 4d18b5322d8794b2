"""The transactional outbox in the Django admin, read from ``GROUSSET["DATABASE"]``.

One list with a status filter (pending / sent / dead), read-only, newest first.
Arguments are shown redacted (a pending or dead row still holds them; a sent row
no longer does). One action, behind the ``requeue_outboxmessage`` permission:
*Requeue* puts dead rows back to pending with their attempts reset, for the next
relay pass.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from celery_grousset.admin_base import ReadOnlyAdmin
from celery_grousset.conf import grousset_settings
from celery_grousset.models import OutboxMessage, OutboxStatus
from celery_grousset.redact import DEFAULT_REDACT_KEYS, safe_repr

_BADGE = {OutboxStatus.PENDING: ("#92400e", "#fde68a"), OutboxStatus.SENT: ("#166534", "#dcfce7"),
          OutboxStatus.DEAD: ("#991b1b", "#fee2e2")}  # fmt: skip


class OutboxStatusFilter(admin.SimpleListFilter):
    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return list(OutboxStatus.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(status=value) if value in OutboxStatus.values else queryset


def arguments_text(obj: OutboxMessage) -> str:
    """The row's arguments, redacted like the journal's ``args_repr``."""
    if obj.status == OutboxStatus.SENT:
        return "(dropped when the message was sent)"
    extra = grousset_settings.REDACT_KEYS
    keys = DEFAULT_REDACT_KEYS | frozenset(extra) if extra else DEFAULT_REDACT_KEYS
    return safe_repr(
        list(obj.args or []),
        dict(obj.kwargs or {}),
        redact_keys=keys,
        max_length=int(grousset_settings.ARGS_REPR_MAX_LENGTH),
    )


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    """Outbox rows: pending (not yet published), sent, dead (gave up: requeue them)."""

    list_display = ("id", "status_badge", "task_name", "attempts", "created_at",
                    "available_at", "sent_at", "short_error")  # fmt: skip
    list_display_links = ("id", "status_badge")
    list_filter = (OutboxStatusFilter,)
    search_fields = ("=task_id", "=task_name")
    search_help_text = _("An exact task id or task name.")
    ordering = ("-id",)
    show_full_result_count = False
    list_per_page = 50
    actions = ("requeue",)
    readonly_fields = ("id", "status_badge", "task_name", "task_id", "arguments", "options",
                       "attempts", "last_error", "created_at", "available_at",
                       "sent_at")  # fmt: skip
    fields = readonly_fields

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("celery_grousset.requeue_outboxmessage"))

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: OutboxMessage) -> SafeString:
        fg, bg = _BADGE.get(OutboxStatus(obj.status), ("#374151", "#f3f4f6"))
        return format_html(
            '<span class="grousset-outbox-status grousset-outbox-{}" style="color:{};'
            'background:{};padding:2px 8px;border-radius:10px;font-weight:600">{}</span>',
            obj.status, fg, bg, obj.get_status_display(),
        )  # fmt: skip

    @admin.display(description=_("last error"))
    def short_error(self, obj: OutboxMessage) -> str:
        text = obj.last_error or ""
        return text if len(text) <= 80 else text[:79] + "…"

    @admin.display(description=_("arguments"))
    def arguments(self, obj: OutboxMessage) -> str:
        return arguments_text(obj)

    @admin.action(description=_("Requeue (publish again)"), permissions=["requeue"])
    def requeue(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        from celery_grousset.outbox import clock

        alias = queryset.db
        dead = queryset.filter(status=OutboxStatus.DEAD)
        ids = list(dead.values_list("pk", flat=True))
        done = (
            OutboxMessage.objects.using(alias)
            .filter(pk__in=ids, status=OutboxStatus.DEAD)
            .update(status=OutboxStatus.PENDING, attempts=0, available_at=clock(alias))
        )
        for obj in OutboxMessage.objects.using(alias).filter(pk__in=ids):
            self.log_change(request, obj, "Requeued: pending again, attempts reset.")
        left = queryset.count() - done
        text = f"Requeued {done} dead message(s); {left} left as they were (only dead rows)."
        self.message_user(request, text, messages.SUCCESS if done else messages.WARNING)
