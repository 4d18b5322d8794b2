"""celery-grousset: make each Celery task's side effect happen once.

Public API: :class:`GroussetTask` (the Celery base class; :class:`GroussetTaskMixin`
for a task class of your own), :func:`protect` (any code path) and :func:`fingerprint`.
The task classes are imported lazily (they import Celery); nothing here touches Django
settings at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

__all__ = ["GroussetDjangoTask", "GroussetTask", "GroussetTaskMixin", "fingerprint", "protect"]

# Imported eagerly: the functions share their modules' names, and a lazily imported
# submodule would shadow them as package attributes.
from celery_grousset.fingerprint import fingerprint
from celery_grousset.protect import protect

if TYPE_CHECKING:
    from celery_grousset.task import GroussetDjangoTask, GroussetTask, GroussetTaskMixin

_LAZY = {
    "GroussetTask": "celery_grousset.task",
    "GroussetDjangoTask": "celery_grousset.task",
    "GroussetTaskMixin": "celery_grousset.task",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_grousset' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
