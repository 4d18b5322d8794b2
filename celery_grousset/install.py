"""Guard tasks named in ``GROUSSET["TASKS"]`` without touching their code.

``GROUSSET["TASKS"]`` maps task names or fnmatch patterns to task options
(docs/configuration.md). A matching task gets the guard by a change of class: a plain
task's class becomes ``type(name, (GroussetTaskMixin, cls), options)``; a task that is
already guarded gets a subclass that fills only the options it leaves unset. The
instance stays the one registered, so every reference to it (module attributes,
proxies, the worker's registry) sees the guarded task.

When (:func:`connect`, called by the app config's ``ready()``):

* every active Celery app, and every app finalized later
  (``celery._state.connect_on_app_finalize``): its tasks so far, and each task
  registered on it afterwards (its task registry calls :func:`guard_task` on every
  registration — lazily imported task modules included);
* ``worker_init``: the worker's app again, before the worker builds its tracers and
  forks its pool (Celery's tracer calls ``task.__call__`` only when the class overrides
  it: a tracer built for the plain class would call ``run`` and skip the guard). A
  tracer that already exists is rebuilt when the class changes. Once the worker's
  logging is set up (``celeryd_after_setup``) it logs the tasks guarded from settings
  and warns about each entry that matches no task;
* ``guarded_tasks()`` (the system checks) and every change of ``GROUSSET`` (tests).

While ``GROUSSET`` is invalid the entries' names still select the tasks, which then
fail closed like any guarded task (:class:`GroussetSettingsError` on each call; a worker
does not start: :func:`celery_grousset.worker.refuse_configuration_errors`) instead of
running unguarded. A pattern never matches Celery's own tasks (``celery.*``) nor this
package's (``celery_grousset.*``): name them exactly to guard them.
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
import weakref
from collections.abc import Collection, Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from celery_grousset.conf import TASK_OPTIONS, GroussetSettingsError, grousset_settings, on_reload
from celery_grousset.task import GroussetTaskMixin

logger = logging.getLogger("celery_grousset")

#: task names that patterns never match
OWN_PREFIXES = ("celery.", "celery_grousset.")
_WILDCARDS = frozenset("*?[")
#: the mixin's attribute for each option of a GROUSSET["TASKS"] entry
_ATTRS = {name: "grousset_on_failure" if name == "on_failure" else name for name in TASK_OPTIONS}
#: attributes the mixin caches on the instance (dropped when the class changes)
_CACHES = ("_grousset_opts", "_grousset_bypass", "_grousset_sig")

_apps: weakref.WeakSet[Any] = weakref.WeakSet()  # apps whose registry calls guard_task
_HOOKED: dict[type, type] = {}


def matches(entry: str, name: str) -> bool:
    """Whether the ``GROUSSET["TASKS"]`` key ``entry`` selects the task ``name``."""
    if entry == name:
        return True
    wildcard = not _WILDCARDS.isdisjoint(entry)
    return wildcard and not name.startswith(OWN_PREFIXES) and fnmatch.fnmatchcase(name, entry)


def options_for(name: str, table: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The options ``GROUSSET["TASKS"]`` gives task ``name``, or None if no entry matches.

    Its exact entry first, then each matching pattern in the order written; for each
    option the first entry that sets it wins.
    """
    entries = [table[name]] if name in table else []
    entries += [opts for key, opts in table.items() if key != name and matches(key, name)]
    if not entries:
        return None
    merged: dict[str, Any] = {}
    for options in entries:
        for option, value in options.items():
            merged.setdefault(option, value)
    return merged


def _table() -> Mapping[str, Mapping[str, Any]]:
    """``GROUSSET["TASKS"]`` as validated; while GROUSSET is invalid, its entries' names
    (without options: the guard then refuses every call). Raises ImproperlyConfigured
    when Django settings are not configured."""
    try:
        return grousset_settings.TASKS  # type: ignore[no-any-return]
    except GroussetSettingsError:
        from django.conf import settings

        raw = getattr(settings, "GROUSSET", None)
        tasks = raw.get("TASKS") if isinstance(raw, Mapping) else None
        if isinstance(tasks, (list, tuple, set, frozenset)):  # names, or (name, options)
            tasks = [t[0] if isinstance(t, (list, tuple)) and t else t for t in tasks]
        elif not isinstance(tasks, Mapping):
            return {}
        return {key: {} for key in tasks if isinstance(key, str) and key}


def _own(cls: type, option: str) -> Any:
    """The value a plain task class gives ``option`` itself (a decorator keyword)."""
    if option == "on_failure":  # a str here would shadow Celery's on_failure() handler
        value = getattr(cls, "on_failure", None)
        return value if isinstance(value, str) else None
    return getattr(cls, option, None)


def _guarded_class(base: type, options: dict[str, Any]) -> type:
    attrs: dict[str, Any] = {
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "_grousset_original": base,
        "_grousset_tasks_options": options,
    }
    if issubclass(base, GroussetTaskMixin):  # the task's own options win
        bases: tuple[type, ...] = (base,)
        for option, value in options.items():
            if getattr(base, _ATTRS[option], None) is None:
                attrs[_ATTRS[option]] = value
    else:  # the mixin's unset defaults come first in the MRO: repeat the task's own
        bases = (GroussetTaskMixin, base)
        for option in TASK_OPTIONS:
            own = _own(base, option)
            value = own if own is not None else options.get(option)
            if value is not None:
                attrs[_ATTRS[option]] = value
    return type(base.__name__, bases, attrs)


def _set_class(task: Any, cls: type) -> None:
    # Celery binds the class a task has when it is registered (after the registry
    # called guard_task): the original class is then unbound; bind it before it is
    # used again (alone, or as the base of other options).
    app = getattr(type(task), "_app", None)
    base = vars(cls).get("_grousset_original", cls)
    if app is not None and not getattr(base, "__bound__", True):
        base.bind(app)
    task.__class__ = cls
    for attr in _CACHES:
        vars(task).pop(attr, None)
    if vars(task).get("__trace__") is not None:  # a worker built its tracer already
        from celery.app.trace import build_tracer

        task.__trace__ = build_tracer(task.name, task, app=task.app)


def guard_task(task: Any, options: dict[str, Any] | None) -> bool:
    """Give ``task`` the guard with ``options`` (None: take back a guard this module gave
    it). Return whether it is guarded from settings now."""
    cls = type(task)
    original = vars(cls).get("_grousset_original")
    if original is not None and vars(cls).get("_grousset_tasks_options") == options:
        return True
    base = original if original is not None else cls
    if options is None:
        if original is not None:
            _set_class(task, base)
        return False
    _set_class(task, _guarded_class(base, options))
    return True


def install_app(app: Any) -> list[str]:
    """Hook ``app``'s registry and guard its matching tasks; return their names. Does
    nothing (but hook) while Django settings are not configured."""
    registry = app._tasks
    if not isinstance(registry, _Hooked):
        hooked = _HOOKED.get(type(registry))
        if hooked is None:
            hooked = type(f"Grousset{type(registry).__name__}", (_Hooked, type(registry)), {})
            _HOOKED[type(registry)] = hooked
        try:
            registry.__class__ = hooked
        except TypeError:  # a registry class of its own that cannot be extended
            logger.warning(
                "celery-grousset: the task registry of %r cannot be hooked; tasks registered "
                "later are guarded from GROUSSET['TASKS'] only when the worker starts",
                app,
            )
    _apps.add(app)
    try:
        table = _table()
    except ImproperlyConfigured:
        return []
    return sorted(
        task.name
        for task in list(registry.values())
        if guard_task(task, options_for(task.name, table))
    )


class _Hooked(dict):  # type: ignore[type-arg]
    """Mixed into an app's task registry: guard each task as it is registered."""

    def __setitem__(self, name: Any, task: Any) -> None:
        super().__setitem__(name, task)
        try:
            table = _table()
        except ImproperlyConfigured:  # settings not configured yet: worker_init does it
            return
        guard_task(task, options_for(str(name), table))


def _worker_init(sender: Any = None, **kwargs: Any) -> None:
    """The worker's app, before the worker builds its tracers and forks its pool."""
    app = getattr(sender, "app", None)
    if app is not None:
        app.finalize()
        install_app(app)


def _report(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    """Once the worker's logging is set up: which tasks GROUSSET["TASKS"] guards (an entry
    that matches no task is the worker's check W017, logged with the others)."""
    app = getattr(instance, "app", None)
    if app is None:
        return
    try:
        _table()  # (settings that cannot be read: the checks say so)
    except ImproperlyConfigured:
        return
    names = sorted(name for name, task in app.tasks.items() if from_settings(task))
    if names:
        logger.info("celery-grousset guards from GROUSSET['TASKS']: %s", ", ".join(names))


def unmatched(table: Mapping[str, Any], names: Collection[str]) -> list[tuple[str, str | None]]:
    """Each ``GROUSSET["TASKS"]`` entry of ``table`` that selects none of the task
    ``names``, with the name it reads like (None: none; a pattern: never)."""
    found = []
    for entry in table:
        if not any(matches(entry, name) for name in names):
            plain = _WILDCARDS.isdisjoint(entry)
            close = difflib.get_close_matches(entry, list(names), 1, 0.8) if plain else []
            found.append((entry, close[0] if close else None))
    return found


def unmatched_text(entry: str, meant: str | None) -> str:
    """What an entry that selects no task means, and the name it reads like."""
    if entry.startswith(OWN_PREFIXES) and not _WILDCARDS.isdisjoint(entry):
        return (
            f"GROUSSET['TASKS'][{entry!r}] guards nothing: a pattern never selects Celery's "
            "or celery-grousset's own tasks. Name such a task exactly to guard it."
        )
    guess = f" Did you mean {meant!r}?" if meant else ""
    return (
        f"GROUSSET['TASKS'][{entry!r}] matches no registered task: it guards nothing, and "
        f"the task it was meant for runs unguarded (a typo in the name?).{guess}"
    )


def from_settings(task: Any) -> bool:
    """Whether ``task`` has its guard (or some options) from ``GROUSSET["TASKS"]``."""
    return "_grousset_original" in vars(type(task))


def _refresh() -> None:
    """GROUSSET changed: the tasks of every app follow its new entries."""
    for app in {*_apps, *_active_apps()}:
        install_app(app)


def _active_apps() -> list[Any]:
    from celery import _state

    return list(_state._get_active_apps())  # type: ignore[attr-defined]


def connect() -> None:
    """Install the signal handlers (idempotent); guard the tasks of the active apps."""
    from celery import _state, signals

    for app in _active_apps():
        install_app(app)
    _state.connect_on_app_finalize(install_app)
    signals.worker_init.connect(_worker_init, weak=False, dispatch_uid="celery_grousset.tasks")
    signals.celeryd_after_setup.connect(
        _report, weak=False, dispatch_uid="celery_grousset.tasks_report"
    )


on_reload(_refresh)


def _registered(app: Any) -> list[Any]:
    """The tasks of ``app`` (finalized for it, unless it may not be: ``autofinalize=False``)."""
    return list((app.tasks if app.finalized or app.autofinalize else app._tasks).values())


def app_missing(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``celery_grousset.E020`` when ``settings.GROUSSET`` is set, or a guarded task is
    registered in the Celery apps, and ``celery_grousset`` is not in ``INSTALLED_APPS``:
    without the app, ``GROUSSET["TASKS"]`` guards nothing and none of its system checks
    runs; its guarded tasks cannot claim. A Django system check (``install(app)``
    registers it, so ``manage.py check`` reports it too) and the worker's start."""
    from django.apps import apps
    from django.conf import settings
    from django.core import checks

    from celery_grousset.task import GroussetTaskMixin

    if not apps.ready or apps.is_installed("celery_grousset"):
        return []
    guarded = any(isinstance(t, GroussetTaskMixin) for a in _active_apps()
                  for t in _registered(a))  # fmt: skip
    if getattr(settings, "GROUSSET", None) is None and not guarded:
        return []
    return [checks.Error(
        "celery-grousset is used (settings.GROUSSET, or a GroussetTask) but 'celery_grousset' "
        "is not in INSTALLED_APPS: GROUSSET['TASKS'] guards nothing (every delivery runs "
        "its effect), and a GroussetTask's claims fail unless its tables were migrated "
        "before the app was removed.",
        hint="Add 'celery_grousset' to INSTALLED_APPS, then run "
        "`manage.py migrate celery_grousset`.", id="celery_grousset.E020",
    )]  # fmt: skip
