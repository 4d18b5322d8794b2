"""System check ``celery_grousset.W008``: a guarded task that celery beat runs on a
schedule, whose key cannot vary from one run to the next, so every run after the first
is answered from the first one's memo for ``EXPIRES_AFTER`` (docs/periodic.md).

A run's key varies when beat sends its slot (the task's ``periodic_slot`` option is on,
the default, and the schedule gives a due time) or when its arguments are evaluated at
each run (``celery.beat.BeatLazyFunc``). Entries come from ``beat_schedule``
(``CELERY_BEAT_SCHEDULE``) and, when django-celery-beat is installed and migrated, from
its enabled ``PeriodicTask`` rows (a database check: ``check --database``).

And ``celery_grousset.E022`` for a ``beat_schedule`` entry that sends a guarded task
with celery-once's ``once`` option, which its publish refuses (docs/migrating.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.core import checks

from celery_grousset.periodic import slot_time
from celery_grousset.unguarded_check import MISSPELT_ID

#: (Celery app, guarded task, its resolved options)
Guarded = tuple[Any, Any, Any]

ID = "celery_grousset.W008"


def _lazy(args: Any, kwargs: Any) -> bool:
    """Whether beat evaluates any argument anew at each run."""
    try:
        from celery.beat import BeatLazyFunc
    except ImportError:  # pragma: no cover - Celery without lazy beat arguments
        return False
    values = [*(args or ()), *dict(kwargs or {}).values()]
    return any(isinstance(value, BeatLazyFunc) for value in values)


def _why_fixed(opts: Any, schedule: Any, args: Any, kwargs: Any) -> str | None:
    """Why every run of an entry has the same key; None if it can vary."""
    if _lazy(args, kwargs):
        return None
    if not opts.periodic_slot:
        return "its periodic_slot option is off, so a run is keyed by its arguments alone"
    if schedule is not None and slot_time(schedule, schedule.now()) is None:
        return (
            f"its schedule {schedule!r} gives no due time (no remaining_estimate), so its "
            "runs carry no slot and are keyed by their arguments alone"
        )
    return None


def _warning(task: Any, entry: str, where: str, why: str, expires_after: float) -> Any:
    return checks.Warning(
        f"Task {task.name!r} is run by the {where} entry {entry!r}, but {why}: every run "
        f"after the first is answered from the first run's memo for {expires_after:g}s "
        "(EXPIRES_AFTER) instead of running.",
        hint="Leave periodic_slot on (the default) with a schedule celery beat computes "
        "(a number of seconds, timedelta, crontab or solar), so each scheduled slot is "
        "its own key; or, if runs with the same arguments really are one operation, "
        "silence this warning with SILENCED_SYSTEM_CHECKS.",
        obj=task.name,
        id=ID,
    )


def _once_left(task: Any, entry: str) -> Any:
    return checks.Error(
        f"The CELERY_BEAT_SCHEDULE entry {entry!r} sends the guarded task {task.name!r} "
        "with options once=…, celery-once's per-call option, which a guarded task's "
        "publish refuses: every run of the entry would fail to be sent.",
        hint="Remove 'once' from the entry's options (docs/migrating.md).",
        obj=task.name,
        id=MISSPELT_ID,
    )


def beat_schedule_messages(guarded: Iterable[Guarded]) -> list[Any]:
    """W008 for each ``beat_schedule`` entry of an active app that runs a guarded task
    whose key cannot vary per run; E022 for one that sends it with celery-once's
    ``once`` option."""
    from celery.schedules import maybe_schedule

    apps: dict[int, tuple[Any, dict[str, Guarded]]] = {}
    for app, task, opts in guarded:
        apps.setdefault(id(app), (app, {}))[1][task.name] = (app, task, opts)
    found = []
    for app, by_name in apps.values():
        schedule: Mapping[str, Any] = app.conf.beat_schedule or {}
        for name, entry in schedule.items():
            hit = by_name.get(str(entry.get("task"))) if isinstance(entry, Mapping) else None
            if hit is None:
                continue
            _, task, opts = hit
            if "once" in (entry.get("options") or {}):
                found.append(_once_left(task, name))
            try:
                every = maybe_schedule(entry.get("schedule"), entry.get("relative", False),
                                       app=app)  # fmt: skip
            except Exception:  # not a schedule: beat refuses the entry itself, naming it
                continue
            why = _why_fixed(opts, every, entry.get("args"), entry.get("kwargs"))
            if why is not None:
                found.append(_warning(task, name, "CELERY_BEAT_SCHEDULE", why, opts.expires_after))
    return found


def periodic_task_messages(guarded: Callable[[], Iterable[Guarded]], databases: Any) -> list[Any]:
    """W008 for each enabled django-celery-beat ``PeriodicTask`` row that runs a guarded
    task whose key cannot vary per run. Nothing when django-celery-beat is not installed
    or its table does not exist (not migrated) in a database the check may query."""
    from django.apps import apps
    from django.db import connections, router

    if not databases or not apps.is_installed("django_celery_beat"):
        return []
    registry: Any = apps  # an optional app: not known to the type checker
    model = registry.get_model("django_celery_beat", "PeriodicTask")
    alias = router.db_for_read(model)
    if alias not in databases:
        return []
    if model._meta.db_table not in connections[alias].introspection.table_names():
        return []
    by_name = {task.name: (task, opts) for _, task, opts in guarded()}
    found = []
    rows = model.objects.using(alias).filter(enabled=True, task__in=list(by_name))
    for row in rows.only("name", "task"):
        task, opts = by_name[row.task]
        # every django-celery-beat schedule (interval, crontab, solar, clocked) gives a
        # due time; its JSON arguments cannot be lazy
        why = _why_fixed(opts, None, (), {})
        if why is not None:
            found.append(_warning(task, row.name, "django-celery-beat", why, opts.expires_after))
    return found
