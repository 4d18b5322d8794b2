"""System checks on the options a task's decorator gives it. Celery keeps unknown
decorator keywords as class attributes, and nothing reads them:

* ``celery_grousset.W011``: a task that is given celery-grousset options
  (``@shared_task(max_processing_time=30, transactional=True)``) but is not guarded — no
  ``base=GroussetTask`` and no ``GROUSSET["TASKS"]`` entry: every delivery runs the effect;
* ``celery_grousset.E022``: a guarded task's decorator keyword that reads like a misspelt
  option (``max_procesing_time=60``, ``grousset_keys=…``, ``transactonal=True``): the
  task would run with the setting's value or the default instead (a shorter
  ``max_processing_time`` lets a duplicate take over a running attempt; a lost
  ``grousset_key`` keys every argument; a lost ``transactional`` runs the body outside
  the claim's transaction). Only the values the task's own class holds (where Celery
  puts decorator keywords) are read, not methods or base classes. An error, so the
  worker does not start with a weaker guard than the task asks for; a name of your own
  that looks like one is silenced in ``SILENCED_SYSTEM_CHECKS``;
* ``celery_grousset.W017``: a ``GROUSSET["TASKS"]`` entry that selects no registered task
  (a typo leaves the task it meant unguarded), with the task name it reads like;
* ``celery_grousset.E023``: an app whose own tasks (``celery.chord_unlock``,
  ``celery.backend_cleanup``…) are guarded, because its task class (``task_cls``,
  ``app.Task``) is a guarded class: a chord fails to publish (its unlock task cannot be
  fingerprinted), and Celery's internal tasks take claims and journal records.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks

from celery_grousset.conf import TASK_OPTIONS
from celery_grousset.options import reads_like

ID = "celery_grousset.W011"
MISSPELT_ID = "celery_grousset.E022"
BUILTIN_ID = "celery_grousset.E023"

#: options a plain Celery task never has (``on_failure`` is Celery's own handler)
OWN_OPTIONS = tuple(name for name in (*TASK_OPTIONS, "grousset_key") if name != "on_failure")


def unguarded_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """W011 for each task of ``apps`` that has celery-grousset options and no guard; E023
    for each app whose own tasks are guarded."""
    from celery_grousset.task import GroussetTaskMixin

    apps = list(apps)
    found: list[checks.CheckMessage] = builtin_messages(apps)
    seen: set[int] = set()
    for app in apps:
        for name, task in list(app.tasks.items()):
            if isinstance(task, GroussetTaskMixin) or id(task) in seen:
                continue
            seen.add(id(task))
            given = [opt for opt in OWN_OPTIONS if getattr(type(task), opt, None) is not None]
            if given and not name.startswith("celery."):
                found.append(_warning(name, given))
    return found


def builtin_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """E023 for each app whose own tasks (named ``celery.…``) are guarded."""
    from celery_grousset.install import OWN_PREFIXES
    from celery_grousset.task import GroussetTaskMixin

    found: list[checks.CheckMessage] = []
    for app in apps:
        own = sorted(name for name, task in list(app.tasks.items())
                     if name.startswith(OWN_PREFIXES)
                     and isinstance(task, GroussetTaskMixin))  # fmt: skip
        if own:
            found.append(checks.Error(
                f"Celery app {app.main!r} guards its own tasks ({', '.join(own[:3])}"
                f"{', …' if len(own) > 3 else ''}): its task class (task_cls, app.Task) is "
                "a guarded class. A chord fails to publish (its unlock task cannot be "
                "fingerprinted), and Celery's internal tasks take claims and journal "
                "records.",
                hint="Leave the app's task class Celery's and guard your own tasks: "
                "base=GroussetTask on their decorators, or GROUSSET['TASKS'] "
                "({'yourapp.tasks.*': {...}}: patterns never select Celery's own tasks).",
                id=BUILTIN_ID,
            ))  # fmt: skip
    return found


def _warning(name: str, given: list[str]) -> checks.CheckMessage:
    return checks.Warning(
        f"Task {name!r} is given celery-grousset options ({', '.join(given)}) but is not "
        "guarded: nothing reads them, and every delivery runs its effect.",
        hint="Add base=GroussetTask to its decorator (@shared_task(base=GroussetTask, ...)), "
        f"or name it in GROUSSET['TASKS'] ({{{name!r}: {{...}}}}) to guard a task you do "
        "not own.",
        obj=name,
        id=ID,
    )


#: the names a task's decorator may give for celery-grousset
KNOWN = frozenset((*OWN_OPTIONS, "on_failure", "grousset_on_failure"))


def misspelt_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """E022 for each guarded task's decorator keyword that reads like a misspelt option."""
    from celery import Task

    from celery_grousset.task import GroussetTaskMixin

    celery_names = {name for klass in Task.__mro__ for name in vars(klass)}  # no descriptor run
    found: list[checks.CheckMessage] = []
    seen: set[int] = set()
    for app in apps:
        for name, task in list(app.tasks.items()):
            if id(task) in seen or not isinstance(task, GroussetTaskMixin):
                continue
            seen.add(id(task))
            for attr, meant in _misspelt(type(task), celery_names):
                found.append(_misspelt_error(name, type(task), attr, meant))
    return found


#: the task options of the libraries a project moves from (docs/migrating.md) -> ours
FOREIGN = {
    "once": "grousset_key (its keys) and max_processing_time (its timeout)",  # celery-once
    "unique_on": "grousset_key",  # celery-singleton
    "lock_expiry": "max_processing_time",
    "raise_on_duplicate": "nothing",
}
#: what a task left with that option does here
_FOREIGN_EFFECT = {
    "lock_expiry": "how long an attempt may hold its claim is max_processing_time",
    "raise_on_duplicate": "a publish is never refused here; a duplicate's delivery gets "
    "the first call's result instead of running",
}


def _foreign_effect(cls: type, attr: str) -> str:
    if attr in _FOREIGN_EFFECT:
        return _FOREIGN_EFFECT[attr]
    if getattr(cls, "grousset_key", None):
        return "a call is keyed by the task's grousset_key, not by what it names"
    return "a call is keyed by all its arguments, not by the ones it names"


def _misspelt_error(name: str, cls: type, attr: str, meant: str) -> checks.CheckMessage:
    if attr in FOREIGN:
        text = (f"Task {name!r} is given {attr!r}, an option of celery-once / "
                f"celery-singleton that nothing reads here: {_foreign_effect(cls, attr)}.")
        fix = (f"Replace {attr!r} with {meant}" if meant != "nothing" else
               f"Remove {attr!r}: nothing replaces it") + " (docs/migrating.md)."  # fmt: skip
    else:
        runs = (f"the task's own {meant!r}" if meant in vars(cls)
                else f"{meant!r} from GROUSSET or its default")  # fmt: skip
        text = (f"Task {name!r} is given {attr!r}, which is no option: did you mean "
                f"{meant!r}? Nothing reads {attr!r}: the task would run with {runs}.")
        fix = f"Rename it to {meant!r} in the task's decorator"
        fix += " (or remove it)." if meant in vars(cls) else "."
    return checks.Error(text, obj=name, id=MISSPELT_ID, hint=(
        f"{fix} A name of your own: silence celery_grousset.E022 in SILENCED_SYSTEM_CHECKS."))


def _misspelt(cls: type, celery_names: set[str]) -> Iterable[tuple[str, str]]:
    """(attribute, the option it reads like) for the plain values of the task's own class
    (where Celery puts the decorator's keywords) that no Celery task has."""
    for attr, value in vars(cls).items():
        if attr in KNOWN or attr.startswith("_") or attr in celery_names or callable(value):
            continue
        if isinstance(value, (property, staticmethod, classmethod)):
            continue
        meant = FOREIGN.get(attr) or reads_like(attr, KNOWN)
        if meant is not None:
            yield attr, meant


def unmatched_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """W017 for each ``GROUSSET["TASKS"]`` entry that selects no task of ``apps``."""
    from celery_grousset.install import _table, unmatched, unmatched_text

    names = {name for app in apps for name in app.tasks}
    if not names:  # no Celery app in this process: nothing to match
        return []
    return [
        checks.Warning(
            unmatched_text(entry, meant),
            hint="Name the task as Celery registers it (its name= or module.function: "
            "`celery -A proj inspect registered`), or write a pattern ('shop.tasks.*').",
            obj=f"GROUSSET['TASKS'][{entry!r}]",
            id="celery_grousset.W017",
        )
        for entry, meant in unmatched(_table(), names)
    ]
