"""A task revoked with ``terminate=True`` mid-run gives up its claim once its pool process
has exited (docs/how-it-works.md, "Revoking"): the handler is connected when
:mod:`celery_grousset.task` is imported; the worker gives each guarded task's requests
the hook that learns of the exit (:func:`give_requests`)."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from billiard.exceptions import Terminated
from celery.signals import task_revoked

from celery_grousset import events

logger = logging.getLogger("celery_grousset")

#: the deliveries revoked with terminate=True whose pool process has not yet been seen
#: gone, oldest first (bounded: a process that never exits leaves its entry)
TERMINATING: dict[str, None] = {}
#: entries kept at most (the oldest are forgotten first)
TERMINATING_MAX = 10_000


@task_revoked.connect(weak=False, dispatch_uid="celery_grousset.release_revoked")
def release_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, **kwargs: Any
) -> None:
    """A request Celery drops before a child started it (revoked, expired) gives back the
    claim the worker's main process made for it (``WORKER_CLAIM``); a running task
    revoked with terminate is noted, and gives up its claim once its process has exited
    (:func:`process_gone`). The signal alone releases nothing: it is sent when the
    signal is, and a body that catches it goes on, under its claim."""
    if request is None or not hasattr(sender, "grousset_options"):
        return  # not a guarded task (GroussetTaskMixin, which imports this module)
    if terminated:
        terminating(str(request.id))
        return
    write_carried(sender, request)  # dropped before it ran (revoked, expired)
    claimed = sys.modules.get("celery_grousset.batch_dropped")  # WORKER_CLAIM
    if claimed is not None:  # a claim the main process made for it: given back
        claimed.dropped(str(request.id))


def terminating(task_id: str) -> None:
    """Note a delivery revoked with terminate, before its process may exit."""
    if len(TERMINATING) >= TERMINATING_MAX:
        del TERMINATING[next(iter(TERMINATING))]
    TERMINATING[task_id] = None


def process_gone(task: Any, task_id: str) -> threading.Thread | None:
    """The pool process of a delivery revoked with terminate has exited (the pool
    reported the job terminated): its claims are released, so the next delivery of the
    call runs without waiting for ``max_processing_time`` — in a thread: the worker's
    main process does not wait for the database. Each is released by the token seen,
    so a claim taken over since stays."""
    if task_id not in TERMINATING:
        return None  # not a revoke (a cancel on a lost broker connection: redelivered)
    del TERMINATING[task_id]
    from celery_grousset import journal

    database = task.grousset_options().database

    def release() -> None:
        from django.db import connections

        try:
            held = journal.release_held_by(database, task_id)
        except Exception as exc:  # the journal away: the claim turns stale, taken over then
            logger.warning("celery-grousset: the claim of terminated %s[%s] was not "
                           "released: %s", task.name, task_id, exc)  # fmt: skip
            return
        finally:
            connections.close_all()  # (this thread's own)
        for processor_id, fp in held:
            events.emit(logging.WARNING, "grousset.released_revoked", {
                "fingerprint": fp, "task": task.name, "task_id": task_id,
                "processor": processor_id,
            })  # fmt: skip

    thread = threading.Thread(target=release, name="grousset-revoked-release", daemon=True)
    thread.start()
    return thread


class ReleasedWhenGone:
    """Mixed into a guarded task's worker ``Request`` class: a job the pool reports
    terminated (its process exited after a revoke's signal: billiard's ``Terminated``)
    releases its claims (:func:`process_gone`)."""

    task: Any
    id: str

    def terminate(self, *args: Any, **kwargs: Any) -> Any:
        terminating(str(self.id))  # before the signal: the pool may report the exit first
        return super().terminate(*args, **kwargs)  # type: ignore[misc]

    def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().on_failure(exc_info, *args, **kwargs)  # type: ignore[misc]
        finally:
            exc = getattr(exc_info, "exception", None)
            if isinstance(getattr(exc, "exc", exc), Terminated):  # (ExceptionWithTraceback)
                process_gone(self.task, str(self.id))


def give_requests(app: Any) -> None:
    """Give each guarded task of ``app`` a ``Request`` class with :class:`ReleasedWhenGone`
    over its own (read when the worker's consumer starts)."""
    from celery.utils.imports import symbol_by_name

    for task in list(app.tasks.values()):
        if hasattr(task, "grousset_options"):
            base = symbol_by_name(task.Request)
            if not issubclass(base, ReleasedWhenGone):
                task.Request = type(base.__name__, (ReleasedWhenGone, base), {})


def write_carried(sender: Any, request: Any) -> None:
    """A delivery that carries its attempt's outcome (the journal was unreachable at its
    completion; celery_grousset.carry), dropped by Celery as revoked: the outcome is
    written all the same, with its claim's token — else a later duplicate would take the
    claim over and run the effect again. In a thread: the worker's main process does not
    wait for the database."""
    from types import SimpleNamespace

    from celery_grousset import carry, guard
    from celery_grousset.delivery import header

    value = header(request, carry.HEADER)  # (Celery's Context of the dropped delivery)
    if not (isinstance(value, dict) and carry.ran(value)):
        return
    opts = sender.grousset_options()
    req = guard.request(opts, str(value.get("fingerprint")), sender.name, str(request.id), "")
    held = carry.pending(SimpleNamespace(carried=value), req)
    if held is None:
        return
    claim, completion = held
    if completion is None:
        return

    def write() -> None:
        from celery_grousset.completion import complete
        from celery_grousset.store import private_store

        store = private_store(opts.database)  # (a green thread's would be the worker's)
        try:
            complete(store, claim, completion, 0, None)
        except Exception as exc:  # the journal still away: the claim turns stale
            logger.warning("celery-grousset: the outcome a revoked delivery of %s carried "
                           "was not written: %s", sender.name, exc)  # fmt: skip
        finally:
            store.close()

    threading.Thread(target=write, name="grousset-revoked-outcome", daemon=True).start()
