"""A Celery app with one guarded task per task-level system check.

Loaded only by ``tests.checks_settings`` (``manage.py check`` in a subprocess):
importing it anywhere else would make the checks of that process fail.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_grousset import GroussetTask

# fixups=[]: no Django fixup, whose import_modules hook would re-run the checks.
app = Celery("grousset_badapp", set_as_current=False, fixups=[])
app.conf.update(
    broker_url="redis://127.0.0.1:6379/13",
    broker_transport_options={"visibility_timeout": 10},
    task_acks_late=True,
    task_reject_on_worker_lost=True,
)


@app.task(base=GroussetTask, shared=False, name="badapp.no_max_processing_time")
def no_max_processing_time() -> None:
    """E001: no max_processing_time."""


@app.task(
    base=GroussetTask, shared=False, name="badapp.hard_limit", max_processing_time=5, time_limit=5
)
def hard_limit() -> None:
    """E002: time_limit is not below max_processing_time."""


@app.task(
    base=GroussetTask, shared=False, name="badapp.longer_than_visibility", max_processing_time=60
)
def longer_than_visibility() -> None:
    """W001: the broker redelivers after 10 s, the claim lasts 60 s."""


@app.task(
    base=GroussetTask, shared=False, name="badapp.early_ack", max_processing_time=5, acks_late=False
)
def early_ack() -> None:
    """W002: acks_late off."""


@app.task(
    base=GroussetTask,
    shared=False,
    name="badapp.lost_on_kill",
    max_processing_time=5,
    reject_on_worker_lost=False,
)
def lost_on_kill(*args: Any) -> None:
    """W003: reject_on_worker_lost off."""
