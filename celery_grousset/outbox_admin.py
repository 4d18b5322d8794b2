"""The transactional outbox in the Django admin, read from ``GROUSSET["DATABASE"]``.

One list with a status filter (pending / sent / dead), read-only, newest first.
Arguments are shown redacted as the journal's ``args_repr`` is (a pending or dead row
still holds them; a sent row no longer does): bound by name to the task's signature
when the task is registered in Celery's current app, so a positional ``password`` is
redacted too; a task no module of this process registers has its positional arguments
hidden. The options are shown with the value under every sensitive name
(``Authorization`` and other headers included) redacted. One action, behind the
``requeue_outboxmessage`` permission: *Requeue* puts dead rows back to pending with
their attempts reset, for the next relay pass.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from celery_grousset.admin_base import MAX_ACTION_ROWS, ReadOnlyAdmin
from celery_grousset.binding import bind_arguments
from celery_grousset.conf import redact_keys
from celery_grousset.guard import redacted
from celery_grousset.models import OutboxMessage, OutboxStatus
from celery_grousset.published import SIGNATURE_OPTIONS
from celery_grousset.shown import shown_json, visible
from celery_grousset.textcut import encodable

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


_discovered: list[bool] = []  # Celery's task modules imported once in this process


def _bound(task_name: str, args: list[Any], kwargs: dict[str, Any]) -> dict[str, object] | None:
    """The arguments bound by name to the task's signature, or None when the task is not
    registered in Celery's current app or the arguments do not fit it. A web process
    has not imported the task modules (only a worker and beat run Celery's
    autodiscovery): the first miss imports them (:func:`_import_task_modules`)."""
    from celery import current_app

    try:
        task = current_app.tasks.get(task_name)
        if task is None and not _discovered:
            _discovered.append(True)
            _import_task_modules(current_app)
            task = current_app.tasks.get(task_name)
        if task is None:
            return None
        return bind_arguments(inspect.signature(task.run), args, kwargs)
    except Exception:  # display only: fall back to the unbound rendering
        return None


def _import_task_modules(app: Any) -> None:
    """What a worker imports to register the tasks: each installed app's ``tasks`` module
    (``app.autodiscover_tasks()``'s default) and the app's ``imports`` / ``include``.
    Not Celery's ``import_default_modules()``: its Django fixup runs ``django.setup()``
    again, which re-applies LOGGING (silencing the web process's loggers) and the
    script prefix, and runs the system checks."""
    import importlib

    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    for name in [*(app.conf.imports or ()), *(app.conf.include or ())]:
        importlib.import_module(name)


def arguments_text(obj: OutboxMessage) -> str:
    """The row's arguments, redacted like the journal's ``args_repr`` (bound by name).
    Unbound, a positional argument has no name to judge it by: none is shown."""
    if obj.status == OutboxStatus.SENT:
        return "(dropped when the message was sent)"
    from celery_grousset.published import arguments

    args, kwargs = arguments(obj)
    return _call_text(obj.task_name, args, kwargs)


def _call_text(task_name: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    bound = _bound(task_name, args, kwargs)
    if bound is None and args:
        return redacted(["***"] * len(args), kwargs, None) + (
            " (positional arguments not shown: the task is not registered in this "
            "process, so their names are unknown)"
        )
    return redacted(args, kwargs, bound)




def options_text(obj: OutboxMessage) -> str:
    """The row's ``apply_async`` options as JSON, headers included, redacted by name; a
    linked signature's arguments shown as the row's are (bound to its task by name)."""
    options = dict(obj.options) if isinstance(obj.options, dict) else {}
    for name in SIGNATURE_OPTIONS:
        if name in options:
            options[name] = _linked(options[name], 0)
    shown = shown_json(options, redact_keys())
    return encodable(json.dumps(shown, ensure_ascii=False, sort_keys=True, default=str))


def _linked(value: Any, depth: int) -> Any:
    """A signature (a list of them) with its ``args`` and ``kwargs`` replaced by their
    redacted text: a positional secret has no name in JSON to be judged by."""
    if isinstance(value, list):
        return [_linked(item, depth) for item in value]
    if not isinstance(value, dict) or ("args" not in value and "kwargs" not in value):
        return value
    args, kwargs = value.get("args") or [], value.get("kwargs") or {}
    shown = {k: v for k, v in value.items() if k not in ("args", "kwargs")}
    task = value.get("task")
    if isinstance(task, str) and task.startswith("celery.") and isinstance(kwargs, dict):
        # a chain, group or chord: the signatures it holds, each shown the same way
        shown["kwargs"] = {k: _linked(v, depth + 1) if depth < 8 else "(not shown)"
                           for k, v in kwargs.items()}  # fmt: skip
    elif isinstance(task, str) and isinstance(args, list) and isinstance(kwargs, dict):
        shown["arguments"] = _call_text(task, args, kwargs)
    else:
        shown["arguments"] = "(not shown)"
    nested = shown.get("options")
    if isinstance(nested, dict) and depth < 8:
        shown["options"] = {k: _linked(v, depth + 1) if k in SIGNATURE_OPTIONS else v
                            for k, v in nested.items()}  # fmt: skip
    return shown


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
    list_per_page = 50
    actions = ("requeue",)
    readonly_fields = ("id", "message_id", "status_badge", "task_name", "task_id", "arguments",
                       "options_shown", "attempts", "error_shown", "created_at", "available_at",
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
        text = visible(obj.last_error or "", lines=False)
        return text if len(text) <= 80 else text[:79] + "…"

    @admin.display(description=_("last error"))
    def error_shown(self, obj: OutboxMessage) -> str:
        return visible(obj.last_error or "")

    @admin.display(description=_("arguments"))
    def arguments(self, obj: OutboxMessage) -> str:
        return visible(arguments_text(obj))

    @admin.display(description=_("options"))
    def options_shown(self, obj: OutboxMessage) -> str:
        return visible(options_text(obj))

    @admin.action(description=_("Requeue (publish again)"), permissions=["requeue"])
    def requeue(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage]
    ) -> TemplateResponse | None:
        """List the rows on a confirmation page (at most ``MAX_ACTION_ROWS``, as the
        journal's actions); once confirmed, put the dead ones among them back to pending:
        each is published again (a misclick on "select all" republished every dead row)."""
        from celery_grousset.outbox import clock

        alias = queryset.db
        rows = list(queryset.order_by("-id")[: MAX_ACTION_ROWS + 1])
        if len(rows) > MAX_ACTION_ROWS:
            text = f"Select at most {MAX_ACTION_ROWS} rows for this action."
            self.message_user(request, text, messages.ERROR)
            return None
        ids = [obj.pk for obj in rows if obj.status == OutboxStatus.DEAD]
        if "post" not in request.POST:
            context = {
                **self.admin_site.each_context(request), "title": _("Requeue (publish again)"),
                "action": "requeue", "rows": rows, "eligible": len(ids), "opts": self.model._meta,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME, "media": self.media,
                "selected": [obj.pk for obj in rows], "dead": OutboxStatus.DEAD.value,
            }  # fmt: skip
            template = "celery_grousset/admin/confirm_requeue.html"
            return TemplateResponse(request, template, context)
        done = (
            OutboxMessage.objects.using(alias)
            .filter(pk__in=ids, status=OutboxStatus.DEAD)
            .update(status=OutboxStatus.PENDING, attempts=0, available_at=clock(alias))
        )
        for obj in OutboxMessage.objects.using(alias).filter(pk__in=ids):
            self.log_change(request, obj, "Requeued: pending again, attempts reset.")
        left = len(rows) - done
        text = f"Requeued {done} dead message(s); {left} left as they were (only dead rows)."
        self.message_user(request, text, messages.SUCCESS if done else messages.WARNING)
        return None
