"""System check ``celery_grousset.W011``: a task that is given celery-grousset options
(``@shared_task(max_processing_time=30, transactional=True)``) but is not guarded — no
``base=GroussetTask`` and no ``GROUSSET["TASKS"]`` entry. Celery keeps unknown decorator
keywords as class attributes and nothing reads them: every delivery runs the effect.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks

from celery_grousset.conf import TASK_OPTIONS

ID = "celery_grousset.W011"

#: options a plain Celery task never has (``on_failure`` is Celery's own handler)
OWN_OPTIONS = tuple(name for name in (*TASK_OPTIONS, "grousset_key") if name != "on_failure")


def unguarded_messages(apps: Iterable[Any]) -> list[checks.CheckMessage]:
    """W011 for each task of ``apps`` that has celery-grousset options and no guard."""
    from celery_grousset.task import GroussetTaskMixin

    found = []
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
