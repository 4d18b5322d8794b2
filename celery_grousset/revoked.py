"""A task revoked with ``terminate=True`` mid-run gives up its claim at once
(docs/how-it-works.md): the handler is connected when :mod:`celery_grousset.task`
is imported."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

from celery.signals import task_revoked

from celery_grousset import events

logger = logging.getLogger("celery_grousset")

#: the signals that end a pool process; another (``SIGUSR1``: a soft time limit the body
#: may catch) lets the attempt go on under its claim
ENDING = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGQUIT})


@task_revoked.connect(weak=False, dispatch_uid="celery_grousset.release_revoked")
def release_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, signum: Any = None,
    **kwargs: Any,
) -> None:
    """A revoked task that was terminated mid-run gives up its claim at once, so the next
    delivery does not wait for ``max_processing_time``; so does a request Celery drops
    before a child started it (revoked, expired) whose claim the worker's main process
    made (``WORKER_CLAIM``). (Revoking without terminate does not stop a running task,
    nor does a signal that does not end its process: its claim stays.)"""
    if request is None or not hasattr(sender, "grousset_options"):
        return  # not a guarded task (GroussetTaskMixin, which imports this module)
    if not terminated:  # dropped before it ran (revoked, expired)
        write_carried(sender, request)
        claimed = sys.modules.get("celery_grousset.batch_dropped")  # WORKER_CLAIM
        if claimed is not None:  # a claim the main process made for it: given back
            claimed.dropped(str(request.id))
        return
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
        from celery_grousset.store import get_store

        store = get_store(opts.database)
        try:
            complete(store, claim, completion, 0, None)
        except Exception as exc:  # the journal still away: the claim turns stale
            logger.warning("celery-grousset: the outcome a revoked delivery of %s carried "
                           "was not written: %s", sender.name, exc)  # fmt: skip
        finally:
            store.close()

    threading.Thread(target=write, name="grousset-revoked-outcome", daemon=True).start()
