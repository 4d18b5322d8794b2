"""Requests the worker's main process claimed (``WORKER_CLAIM``) that Celery drops
before a pool child starts them: their claims are given back, so that their next
delivery runs at once instead of waiting ``max_processing_time`` to take them over.

* a request revoked or expired behind a busy child (:func:`dropped`, from Celery's
  ``task_revoked``);
* the requests waiting for a free child when the broker connection is lost
  (:func:`connection_lost`, after Celery's ``Consumer.on_close``): Celery clears its
  semaphore's waiters, and the broker delivers their messages again. Those already
  passed to the pool are left alone: a child may still start one written to it, and it
  runs under its claim.
* the requests waiting for a free child at a cold shutdown (:func:`at_exit`: SIGQUIT,
  a second Ctrl-C, the end of a soft shutdown), which sends no ``worker_shutdown``:
  Celery gives their messages back to the broker and kills its pool.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

#: the claimers of this process (one per consumer; :class:`batch_claim.Claimer`)
_CLAIMERS: weakref.WeakSet[Any] = weakref.WeakSet()


def at_exit() -> None:
    """The process exits with a claimer not stopped: its worker shut down cold (a warm
    shutdown stops it first). The event loop has stopped, so a handed request never
    passed to the pool can no longer start: its claim is given back. One passed to the
    pool is left to go stale: its child may have started it before it was killed."""
    from celery.bootsteps import RUN  # type: ignore[attr-defined]  # (not in the stubs)

    for claimer in list(_CLAIMERS):
        if claimer.stopping or not claimer.thread.is_alive():  # (or a forked copy)
            continue
        worker = getattr(getattr(claimer, "consumer", None), "controller", None)
        if getattr(getattr(worker, "blueprint", None), "state", RUN) == RUN:
            continue  # a worker still running (in a thread of this process): left alone
        with claimer.cv:
            for task_id, job in list(claimer.handed.items()):
                if job.req.worker_pid is None and not_in_the_pool(job.req):
                    _give_back(claimer, task_id, job)
        claimer.stop(pool_stopped=False, timeout=3.0)


atexit.register(at_exit)


def dropped(task_id: str) -> None:
    """Celery dropped the request ``task_id`` (revoked, expired) before a pool child
    started it: the claim a claimer made for it is given back, not left to go stale."""
    for claimer in list(_CLAIMERS):
        with claimer.cv:
            job = claimer.handed.get(task_id)
            # that very request (not another delivery with its id, dropped at receipt)
            if job is not None and job.req.worker_pid is None and getattr(
                    job.req, "_already_revoked", False):
                _give_back(claimer, task_id, job)


def connection_lost(claimer: Any) -> None:
    """After Celery's ``on_close`` (the broker connection lost): give back the claims
    of the handed requests that never reached the pool (they waited for a free child in
    Celery's semaphore, which it has cleared: none of them can start now)."""
    if not _cleared(claimer.consumer):
        return  # (a Celery whose on_close keeps them: they may still start)
    with claimer.cv:
        for task_id, job in list(claimer.handed.items()):
            if job.req.worker_pid is None and not_in_the_pool(job.req):
                _give_back(claimer, task_id, job)


def _give_back(claimer: Any, task_id: str, job: Any) -> None:
    """Forget a handed request and have the claim thread release its claim (called
    under ``claimer.cv``, which is reentrant)."""
    del claimer.handed[task_id]
    claimer._release(job)


def of_a_lost_connection(claimer: Any, job: Any) -> bool:
    """Whether ``job`` came on a broker connection since lost (Celery has dropped its
    request; the broker delivers it again)."""
    return bool(job.epoch != claimer.epoch)


def not_in_the_pool(req: Any) -> bool:
    """Whether Celery never passed ``req`` to its pool: ``execute_using_pool`` sets the
    request's ``_apply_result`` (a Celery without that attribute: unknown, so no)."""
    return hasattr(type(req), "_apply_result") and req._apply_result is None


def _cleared(consumer: Any) -> bool:
    """Whether the consumer's semaphore holds no waiting request (Celery's ``on_close``
    clears it)."""
    semaphore = getattr(getattr(consumer, "controller", None), "semaphore", None)
    return semaphore is not None and not getattr(semaphore, "_waiting", True)
