"""System checks (``manage.py check``) with stable ids, each with the fix as hint.

Each check's id, level, cause and fix are listed in docs/configuration.md, "System
checks" (one table; a check added here is added there).

No check function raises: a configuration error becomes the message above, and any
other exception becomes ``E014`` (``manage.py check`` never ends in a traceback). When
``GROUSSET`` itself is invalid only its errors are reported: the other checks read it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured


def _apps() -> list[Any]:
    """The active Celery apps, but Celery's fallback ``Celery("default", fixups=[])`` beside
    a real one (gevent's monkey-patching makes it): its shared tasks have no configuration."""
    from celery import _state

    apps = list(_state._get_active_apps())  # type: ignore[attr-defined]
    return [a for a in apps if a.main != "default" or a.fixups or len(apps) == 1]


def guarded_tasks(failed: list[checks.CheckMessage] | None = None) -> Iterator[tuple[Any, Any]]:
    """(app, task) for every guarded task registered in the active Celery apps: each
    GroussetTask, and each task ``GROUSSET["TASKS"]`` names. An app whose task modules
    do not import is skipped, and said in ``failed`` (W016)."""
    from celery_grousset.install import install_app
    from celery_grousset.task import GroussetTaskMixin

    seen: set[int] = set()
    for app in _apps():
        try:
            app.loader.import_default_modules()
        except Exception as exc:
            if failed is not None:  # its tasks go unchecked: say so (a warning: a web
                failed.append(checks.Warning(  # process may lack a worker's dependencies)
                    f"The task modules of Celery app {app.main!r} do not import "
                    f"({type(exc).__qualname__}: {exc}): its tasks were not checked.",
                    hint="Where its worker runs, fix the import (a worker would not start).",
                    id="celery_grousset.W016",
                ))  # fmt: skip
            continue
        install_app(app)
        for task in list(app.tasks.values()):
            if isinstance(task, GroussetTaskMixin) and id(task) not in seen:
                seen.add(id(task))
                yield app, task


_running = threading.local()

_Check = Callable[..., list[checks.CheckMessage]]


def _never_raises(check: _Check) -> _Check:
    """A check that reports its own failure as ``E014`` instead of raising."""

    @functools.wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> list[checks.CheckMessage]:
        try:
            return check(*args, **kwargs)
        except Exception as exc:
            return [
                checks.Error(
                    f"The celery-grousset check {check.__name__} could not run: "
                    f"{type(exc).__qualname__}: {exc}",
                    hint="Fix the cause above and run `manage.py check` again; if it is not "
                    "a configuration problem, please report it.",
                    id="celery_grousset.E014",
                )
            ]

    return wrapper


def settings_messages() -> list[checks.CheckMessage]:
    """``settings.GROUSSET`` checked value by value (E004, E010, E011), and a setting
    whose name reads like a misspelt GROUSSET (E018)."""
    from django.conf import settings

    from celery_grousset.conf import validate
    from celery_grousset.options import flat_setting_key, reads_like

    _, problems = validate(getattr(settings, "GROUSSET", None))
    found: list[checks.CheckMessage] = [
        checks.Error(p.message, hint=p.hint, id=p.id,
                     obj=None if p.setting == "GROUSSET" else f"GROUSSET[{p.setting!r}]")
        for p in problems
    ]  # fmt: skip
    for name in dir(settings):
        if not name.isupper() or name.startswith("_"):  # (_GROUSSET: a module's own alias)
            continue
        if reads_like(name, ("GROUSSET",)) or name.endswith("_GROUSSET"):
            found.append(checks.Error(
                f"settings.{name} is not read: celery-grousset's settings are "
                "settings.GROUSSET, so its values are ignored.",
                hint="Rename it to GROUSSET.", obj=name, id="celery_grousset.E018"))
        elif key := flat_setting_key(name):
            found.append(checks.Error(
                f"settings.{name} is not read: celery-grousset reads its settings from the "
                f"one dict settings.GROUSSET, so this value is ignored.",
                hint=f"Move it to GROUSSET[{key!r}].", obj=name, id="celery_grousset.E018"))
    return found


@checks.register("celery_grousset")
@_never_raises
def check_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    # Celery's Django fixup runs the system checks whenever an app imports its task
    # modules (import_modules signal), which guarded_tasks() does: do not re-enter.
    if getattr(_running, "active", False):
        return []
    _running.active = True
    try:
        return _check_tasks()
    finally:
        _running.active = False


def _task_options(task: Any) -> tuple[Any, list[checks.CheckMessage]]:
    """The task's resolved options, or the check errors that say why they cannot be."""
    from celery_grousset.conf import GroussetSettingsError
    from celery_grousset.exceptions import NotAwaited

    errors: list[checks.CheckMessage] = []
    try:
        opts = task.grousset_options()
    except NotAwaited as exc:  # an async def body: every call is refused
        return None, [checks.Error(str(exc), obj=task.name, id="celery_grousset.E019")]
    except GroussetSettingsError as exc:  # a task option with a bad type or range
        errors.append(
            checks.Error(
                f"Task {task.name!r}: " + "; ".join(p.message for p in exc.problems),
                hint=" ".join(p.hint for p in exc.problems),
                obj=task.name,
                id="celery_grousset.E013",
            )
        )
        return None, errors
    except ImproperlyConfigured:
        from celery_grousset.install import from_settings

        where = ("its GROUSSET['TASKS'] entry ({'max_processing_time': <seconds>})" if
                 from_settings(task) else "the task decorator (max_processing_time=<seconds>)")
        errors.append(
            checks.Error(
                f"The task {task.name!r} has no max_processing_time: how long an attempt may "
                "hold its claim before another delivery takes it over (no default, on purpose).",
                hint=f"Set it in {where}, or GROUSSET['MAX_PROCESSING_TIME'] in settings. A "
                "worker's --grousset-max-processing-time sets it only inside that worker: "
                "these checks, migrate and calls outside it (eager, a web process) never see it.",
                obj=task.name,
                id="celery_grousset.E001",
            )
        )
        return None, errors
    except Exception as exc:  # e.g. int("abc") for an integer option
        errors.append(checks.Error(
            f"Task {task.name!r}: its options cannot be resolved: {type(exc).__qualname__}: {exc}",
            hint="Give each option the type docs/configuration.md lists.",
            obj=task.name, id="celery_grousset.E013",
        ))  # fmt: skip
        return None, errors
    return opts, errors


def _task_conflicts(app: Any, task: Any, opts: Any) -> list[checks.CheckMessage]:
    """A guarded task's settings that fight its max_processing_time."""
    from celery_grousset.delivery import visibility_timeout

    errors: list[checks.CheckMessage] = []
    mpt = opts.max_processing_time
    hard = task.time_limit if task.time_limit is not None else app.conf.task_time_limit
    if hard is not None and hard >= mpt:
        errors.append(
            checks.Error(
                f"Task {task.name!r}: hard time_limit {hard}s is not below "
                f"max_processing_time {mpt:g}s, so a live attempt can be taken over.",
                hint=f"Raise max_processing_time above {hard}s or lower time_limit.",
                obj=task.name,
                id="celery_grousset.E002",
            )
        )
    errors.extend(_short_window(task, opts))
    vt = visibility_timeout(app)
    if vt is not None and vt < mpt and task.acks_late:  # (acked at start: never redelivered)
        errors.append(
            checks.Warning(
                f"Task {task.name!r}: the broker's visibility_timeout ({vt:g}s) is shorter "
                "than "
                f"max_processing_time ({mpt:g}s): the broker will redeliver running tasks "
                "(they wait as in-flight duplicates instead of running twice).",
                hint="Set CELERY_BROKER_TRANSPORT_OPTIONS = {'visibility_timeout': N} with N "
                "above every max_processing_time.",
                obj=task.name,
                id="celery_grousset.W001",
            )
        )
    if not task.acks_late:
        errors.append(
            checks.Warning(
                f"Task {task.name!r} acknowledges its message before it runs (acks_late off): "
                "a worker that dies mid-task loses the message, and the claim is taken over "
                "only if another delivery arrives.",
                hint=_acks_late_hint(app),
                obj=task.name,
                id="celery_grousset.W002",
            )
        )
    if task.acks_late and not task.reject_on_worker_lost:
        errors.append(
            checks.Warning(
                f"Task {task.name!r}: reject_on_worker_lost is off, so a killed worker child's "
                "message is acknowledged as failed instead of redelivered.",
                hint="Set reject_on_worker_lost=True or "
                "CELERY_TASK_REJECT_ON_WORKER_LOST = True.",
                obj=task.name,
                id="celery_grousset.W003",
            )
        )
    return errors


def _short_window(task: Any, opts: Any) -> list[checks.CheckMessage]:
    """W014: a record's window (from its claim) no longer than an attempt may run."""
    mpt = opts.max_processing_time
    if opts.expires_after > mpt:
        return []
    return [checks.Warning(
        f"Task {task.name!r}: expires_after ({opts.expires_after:g}s) is not above "
        f"max_processing_time ({mpt:g}s): an attempt that runs longer than expires_after "
        "completes into a record already expired, and a duplicate after it runs again.",
        hint="Keep expires_after (in seconds, or a timedelta; default 7 days) above "
        "max_processing_time, unless duplicates should wait only while a call runs.",
        obj=task.name, id="celery_grousset.W014",
    )]  # fmt: skip


def _check_tasks() -> list[checks.CheckMessage]:
    from celery_grousset import coverage_check, faults, journal_check, unguarded_check
    from celery_grousset.conf import grousset_settings
    from celery_grousset.periodic_check import beat_schedule_messages

    grousset_settings.reload()
    errors = settings_messages()
    if errors:  # every other check reads GROUSSET: report only this
        return errors
    errors.extend(journal_check.time_zone_messages())
    resolved = _resolved_tasks(errors)
    for app, task, opts in resolved:
        errors.extend(_task_conflicts(app, task, opts))
    errors.extend(_check_database(resolved))  # once, not once per task
    errors.extend(coverage_check.messages(resolved))
    errors.extend(beat_schedule_messages(resolved))
    errors.extend(unguarded_check.unguarded_messages(_apps()))
    errors.extend(unguarded_check.misspelt_messages(_apps()))
    if not any(e.id == "celery_grousset.W016" for e in errors):  # every task imported
        errors.extend(unguarded_check.unmatched_messages(_apps()))
    errors.extend(faults.messages())
    return errors


def _resolved_tasks(errors: list[checks.CheckMessage]) -> list[tuple[Any, Any, Any]]:
    """(app, task, options) of each guarded task whose options resolve; the errors of
    those that do not go to ``errors``."""
    resolved = []
    for app, task in guarded_tasks(errors):
        opts, problems = _task_options(task)
        errors.extend(problems)
        if opts is not None:
            resolved.append((app, task, opts))
    return resolved


def _check_database(resolved: list[tuple[Any, Any, Any]]) -> list[checks.CheckMessage]:
    from django.db import connections

    from celery_grousset.conf import grousset_settings
    from celery_grousset.journal_check import alias_errors
    from celery_grousset.store import store_class

    alias = grousset_settings.DATABASE
    found = alias_errors(alias, "GROUSSET['DATABASE']")
    if found:
        return found
    vendor = store_class(connections.settings[alias]["ENGINE"]).vendor
    for _, task, opts in resolved:  # a task's own journal database
        if opts.database != alias:
            found += alias_errors(opts.database, f"Task {task.name!r}'s database", task.name)
    if grousset_settings.CLAIM_COMMIT == "async" and vendor != "postgresql":
        found.append(
            checks.Warning(
                f"GROUSSET['CLAIM_COMMIT'] is 'async', but the journal database {alias!r} is "
                "not PostgreSQL: the setting has no effect there (every claim commits "
                "durably).",
                hint="Remove CLAIM_COMMIT, or point GROUSSET['DATABASE'] at PostgreSQL.",
                id="celery_grousset.W006",
            )
        )
    if grousset_settings.JOURNAL_LAYOUT == "partitioned" and vendor != "postgresql":
        why = f"the journal database {alias!r} is not PostgreSQL (the only one partitioned)."
        fix = "Set it to 'table' (the default), or use PostgreSQL + `grousset_partition convert`."
        found.append(checks.Error(f"GROUSSET['JOURNAL_LAYOUT'] is 'partitioned', but {why}", hint=fix, id="celery_grousset.E015"))  # noqa: E501  # fmt: skip
    from celery_grousset.journal_check import journal_aliases, repeatable_read

    routed = journal_aliases(alias, [opts.database for _, _, opts in resolved])
    return found + [w for db in routed for w in repeatable_read(db)]


def journal_databases() -> list[str]:
    """The journal databases: ``GROUSSET["DATABASE"]`` and each guarded task's own
    ``database`` (one rule for the checks, the metrics and the purge task)."""
    from celery_grousset.conf import grousset_settings
    from celery_grousset.journal_check import journal_aliases

    routed = [opts.database for _, _, opts in _resolved_tasks([])]
    return journal_aliases(str(grousset_settings.DATABASE), routed)


@checks.register(checks.Tags.database)
@_never_raises
def check_journal_databases(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W005, W007, W009, W010, W012 and W013 on each journal database (``check --database``)."""
    from django.db import connections

    from celery_grousset.conf import GroussetSettingsError, grousset_settings
    from celery_grousset.journal_check import journal_messages

    if not databases:
        return []
    try:
        layout, aliases = grousset_settings.JOURNAL_LAYOUT, journal_databases()
    except GroussetSettingsError:  # reported by check_tasks (E004/E010/E011)
        return []
    return [
        message
        for alias in aliases
        if alias in databases and alias in connections.settings
        for message in journal_messages(alias, layout)
    ]


@checks.register(checks.Tags.database)
@_never_raises
def check_periodic_tasks(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W008 for django-celery-beat's enabled ``PeriodicTask`` rows (``check --database``)."""
    from celery_grousset.conf import GroussetSettingsError, grousset_settings
    from celery_grousset.periodic_check import periodic_task_messages

    if not databases or getattr(_running, "active", False):
        return []
    try:
        grousset_settings.DATABASE  # noqa: B018  (GROUSSET invalid: check_tasks says so)
    except GroussetSettingsError:
        return []
    _running.active = True
    try:
        return periodic_task_messages(lambda: _resolved_tasks([]), databases)
    finally:
        _running.active = False


def _acks_late_hint(app: Any) -> str:
    """W002's fix; when the settings say acks_late but the app did not read them, that
    (a ``config_from_object`` namespace other than ``CELERY``: every ``CELERY_…`` setting
    is ignored)."""
    from django.conf import settings

    if getattr(settings, "CELERY_TASK_ACKS_LATE", None) is True and not app.conf.task_acks_late:
        return (
            "settings.CELERY_TASK_ACKS_LATE is True, but this Celery app does not read it (its "
            f"config_from_object namespace is {getattr(app, 'namespace', None)!r}): call "
            "app.config_from_object('django.conf:settings', namespace='CELERY')"
        )
    return "Set acks_late=True on the task or CELERY_TASK_ACKS_LATE = True."
