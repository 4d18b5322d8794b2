"""A task revoked with ``terminate=True`` mid-run gives up its claim at once
(docs/how-it-works.md): the handler is connected when :mod:`celery_grousset.task`
is imported."""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import task_revoked

from celery_grousset import events


@task_revoked.connect(weak=False, dispatch_uid="celery_grousset.release_revoked")
def release_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, **kwargs: Any
) -> None:
    """A revoked task that was terminated mid-run gives up its claim at once, so the next
    delivery does not wait for ``max_processing_time``. (Revoking without terminate does
    not stop a running task: its claim stays.)"""
    if not terminated or request is None or not hasattr(sender, "grousset_options"):
        return  # not a guarded task (GroussetTaskMixin, which imports this module)
    from celery_grousset import journal

    opts = sender.grousset_options()
    for processor_id, fp in journal.release_held_by(opts.database, str(request.id)):
        events.emit(logging.WARNING, "grousset.released_revoked", {
            "fingerprint": fp, "task": sender.name, "task_id": request.id,
            "processor": processor_id,
        })  # fmt: skip
