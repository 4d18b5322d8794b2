"""A task revoked with ``terminate=True`` mid-run gives up its claim at once
(docs/how-it-works.md): the handler is connected when :mod:`celery_grousset.task`
is imported."""

from __future__ import annotations

import logging
import signal
from typing import Any

from celery.signals import task_revoked

from celery_grousset import events

#: the signals that end a pool process; another (``SIGUSR1``: a soft time limit the body
#: may catch) lets the attempt go on under its claim
ENDING = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGQUIT})


@task_revoked.connect(weak=False, dispatch_uid="celery_grousset.release_revoked")
def release_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, signum: Any = None,
    **kwargs: Any,
) -> None:
    """A revoked task that was terminated mid-run gives up its claim at once, so the next
    delivery does not wait for ``max_processing_time``. (Revoking without terminate does
    not stop a running task, nor does a signal that does not end its process: its claim
    stays.)"""
    if not terminated or request is None or not hasattr(sender, "grousset_options"):
        return  # not a guarded task (GroussetTaskMixin, which imports this module)
    if signum is not None and _signal(signum) not in ENDING:
        return
    from celery_grousset import journal

    opts = sender.grousset_options()
    for processor_id, fp in journal.release_held_by(opts.database, str(request.id)):
        events.emit(logging.WARNING, "grousset.released_revoked", {
            "fingerprint": fp, "task": sender.name, "task_id": request.id,
            "processor": processor_id,
        })  # fmt: skip


def _signal(signum: Any) -> Any:
    """``signum`` as Celery passes it (a number, or a name such as ``"SIGUSR1"``)."""
    if isinstance(signum, str):
        name = signum.upper()
        return getattr(signal, name if name.startswith("SIG") else f"SIG{name}", signum)
    return signum
