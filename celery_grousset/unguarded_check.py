"""System checks on the options a task's decorator gives it. Celery keeps unknown
decorator keywords as class attributes, and nothing reads them:

* ``celery_grousset.W011``: a task that is given celery-grousset options
  (``@shared_task(max_processing_time=30, transactional=True)``) but is not guarded — no
  ``base=GroussetTask`` and no ``GROUSSET["TASKS"]`` entry: every delivery runs the effect;
* ``celery_grousset.E017``: a task attribute that is a misspelt option
  (``max_procesing_time=60``, ``grousset_keys=…``): the task runs with the setting's value
  or the default instead (a shorter ``max_processing_time`` lets a duplicate take over a
  running attempt; a lost ``grousset_key`` keys every argument).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks

from celery_grousset.conf import TASK_OPTIONS
from celery_grousset.options import reads_like

ID = "celery_grousset.W011"
MISSPELT_ID = "celery_grousset.E017"

#: options a plain Celery task never has (``on_failure`` is Celery's own handler)
OWN_OPTIONS = tuple(name for name in (*TASK_OPTIONS, "grousset_key") if name != "on_failure")


def unguarded_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """W011 for each task of ``apps`` that has celery-grousset options and no guard."""
    from celery_grousset.task import GroussetTaskMixin

    found: list[checks.CheckMessage] = []
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
    """E017 for each attribute of a task's own classes that is not an option but reads
    like one (a typo nothing reads)."""
    found: list[checks.CheckMessage] = []
    seen: set[int] = set()
    for app in apps:
        for name, task in list(app.tasks.items()):
            if id(task) in seen or name.startswith("celery."):
                continue
            seen.add(id(task))
            for attr, meant in _misspelt(type(task)):
                found.append(checks.Error(
                    f"Task {name!r} has the attribute {attr!r}, which is no option: did you "
                    f"mean {meant!r}? Nothing reads {attr!r}, so the task runs with "
                    f"{meant!r} from GROUSSET or its default.",
                    hint=f"Rename it to {meant!r} in the task's decorator or class.",
                    obj=name, id=MISSPELT_ID,
                ))  # fmt: skip
    return found


def _misspelt(cls: type) -> Iterable[tuple[str, str]]:
    """(attribute, the option it reads like) for the attributes of ``cls`` and its own
    bases (not Celery's, not this package's) that no Celery task has and that read like
    a misspelt option."""
    from celery import Task

    celery_names = {name for klass in Task.__mro__ for name in vars(klass)}  # no descriptor run
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in ("celery", "celery_grousset", "builtins"):
            continue
        for attr in vars(klass):
            if attr in KNOWN or attr.startswith("__") or attr in celery_names:
                continue
            meant = reads_like(attr, KNOWN)
            if meant is not None:
                yield attr, meant
