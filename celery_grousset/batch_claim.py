"""Claims in the worker's main process (``GROUSSET["WORKER_CLAIM"]`` or
``celery worker --grousset-batch``; off by default; docs/performance.md).

With the switch on, each guarded task gets :func:`strategy` as its Celery ``Strategy``:
the default strategy, whose hand-over to the pool (``consumer.on_task_request``) goes
through a :class:`Claimer` first. The claimer computes the call's fingerprint in the
main process and queues the request; a thread of its own, on a journal connection of
its own (never used by a pool child), claims what has queued up since its last pass —
one ``claim_all`` per database, deliveries of one key in a pass collapsed to one claim —
and hands the results back to the event loop through a pipe the hub watches. The event
loop never waits on the database. Then, on the event loop:

* an owned claim travels with the request to the pool (:mod:`celery_grousset.preclaim`):
  the child runs the body under it and writes the fenced completion;
* a completed key is answered here: its memo is stored through the task's result
  backend (``AsyncResult.get()`` returns it), the message is acked, and the duplicate
  log line, signal and metric fire (and a ``task-succeeded`` event, when the worker
  sends events) — no pool child is used;
* a key in flight elsewhere follows the task's ``on_in_flight`` here, holding no pool
  child: ``"retry"`` publishes the delivery again with the per-task countdown and acks
  it; ``"wait"`` claims it again later from the hub's timer (:meth:`Claimer._wait`);
* a settled key not answered here (a memoized failure, a memo with callbacks) goes to
  the pool with its claim's decision (:func:`preclaim.carry_decided`): the child acts on
  it without claiming again;
* anything else (the store down, a call whose arguments cannot be fingerprinted, a full
  queue) goes to the pool unclaimed, and the child takes the per-task path.

The claimer sits on the consumer's ``on_task_request``, the one hand-over every request
takes: ETA and rate-limited requests, which reach it later through Celery's timer, are
claimed when they are handed over (an ETA claim is never made hours early to go stale).
Workers whose transport has no event loop (no hub) take the per-task path. On warm
shutdown, claims made for requests no pool child started are released once the pool
has stopped; on a cold one, those never passed to the pool (:mod:`.batch_dropped`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from celery_grousset import events, preclaim
from celery_grousset.batch_dropped import _CLAIMERS, connection_lost, of_a_lost_connection
from celery_grousset.batch_pass import (
    ANSWERED,
    DEFERRED,
    OWNED,
    PER_TASK,
    WAITING,
    Job,
    claim_pass,
    job_of,
)  # fmt: skip
from celery_grousset.delivery import COUNTED_HEADER
from celery_grousset.store import Store
from celery_grousset.task import GroussetTaskMixin

#: the ``Strategy`` of a guarded task on a worker with the switch on
STRATEGY = "celery_grousset.batch_claim:strategy"
#: requests waiting for a claim at most; past it a request takes the per-task path
QUEUE_LIMIT = 1000
#: handed requests kept at least before those a child has started are forgotten (then
#: twice as many as remain: amortized O(1), memory bounded by the requests not started)
PRUNE_AT = 64
#: ``on_in_flight="wait"`` in the main process: first delay before a waiting request is
#: claimed again, doubling up to the cap (never past the holder's claim turning stale)
WAIT_FIRST, WAIT_CAP = 0.05, 1.0


def enable(app: Any) -> list[str]:
    """Give every guarded task of ``app`` the main-process claim; return their names."""
    names = []
    for name, task in app.tasks.items():
        if isinstance(task, GroussetTaskMixin):
            task.Strategy = STRATEGY  # type: ignore[attr-defined]  # read at consumer start
            names.append(name)
    if names:
        from celery.signals import worker_shutdown

        worker_shutdown.connect(stop, weak=False, dispatch_uid="celery_grousset.batch_claim")
    return sorted(names)


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Any:
    """Celery's default strategy, on a consumer whose hand-over to the pool goes
    through a :class:`Claimer` (see :meth:`Claimer.of`)."""
    from celery.worker.strategy import default

    Claimer.of(consumer)  # None: no event loop to hand results back to (per-task path)
    return default(task, app, consumer, **kwargs)


class Claimer:
    """The claim thread of one consumer and its hand-back to the event loop."""

    def __init__(self, batch_size: int, flush_delay: float = 0.0) -> None:
        self.batch_size, self.flush_delay = batch_size, flush_delay
        self.passes = self.claimed = 0  #: claim passes made, requests claimed in them
        self.jobs: deque[Job] = deque()
        self.releases: deque[Job] = deque()
        self.done: deque[Job] = deque()
        #: owned requests handed to the pool, by task id (pruned once started)
        self.handed: dict[str, Job] = {}
        self.prune_at = PRUNE_AT
        #: the consumer's own hand-over to the pool (set by :meth:`of`)
        self.handle: Callable[[Any], Any] = _no_pool
        self.hub: Any = None  #: the consumer's event loop (set by :meth:`of`)
        self.consumer: Any = None
        self.cv = threading.Condition()
        self.stopping = False
        self.epoch = 0  #: the consumer's broker connections lost so far (on_close)
        self.close: Callable[[], Any] = _no_close  #: the consumer's own on_close
        self.stores: dict[str, Store] = {}
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self.thread = threading.Thread(target=self._run, name="grousset-claimer", daemon=True)
        self.thread.start()
        _CLAIMERS.add(self)

    @classmethod
    def of(cls, consumer: Any) -> Claimer | None:
        """The consumer's claimer (made on first use), watched by its hub; None: no hub."""
        hub = getattr(consumer, "hub", None)
        if hub is None:
            return None
        claimer: Claimer | None = getattr(consumer, "_grousset_claimer", None)
        if claimer is None:
            from celery_grousset.conf import grousset_settings

            claimer = cls(
                int(grousset_settings.WORKER_CLAIM_BATCH_SIZE),
                float(grousset_settings.WORKER_CLAIM_FLUSH_DELAY),
            )
            consumer._grousset_claimer = claimer
        claimer.route(consumer)
        claimer.hub, claimer.consumer = hub, consumer
        with contextlib.suppress(Exception):  # registered again after a consumer restart
            hub.remove_reader(claimer.read_fd)
        hub.add_reader(claimer.read_fd, claimer.on_readable)
        return claimer

    def route(self, consumer: Any) -> None:
        """Put this claimer on the consumer's hand-over to the pool (once).

        ``on_task_request`` is the one seam every request of the consumer reaches the
        pool through: the strategy's immediate path, the ETA timer (``apply_eta_task``)
        and the rate-limit buckets (``_limit_move_to_pool``) all call it, at hand-over
        time — an ETA request is claimed when it is due, not at receipt."""
        handle = consumer.on_task_request
        if getattr(handle, "__self__", None) is not self:
            self.handle = handle
            consumer.on_task_request = self.on_task_request
        close = consumer.on_close  # (after a connection loss: see on_close)
        if getattr(close, "__self__", None) is not self:
            self.close, consumer.on_close = close, self.on_close

    # -- the event loop's side ---------------------------------------------------------------

    def on_task_request(self, req: Any) -> Any:
        """The consumer's hand-over to the pool, through this claimer."""
        return self.submit(req, self.handle)

    def on_close(self) -> None:
        """The broker connection is lost: Celery drops the requests it holds (the broker
        delivers them again); the claims of those that can no longer start are given
        back (:func:`~celery_grousset.batch_dropped.connection_lost`), and a request the
        thread or the event loop still holds from that connection is let go as it comes
        (:meth:`_dispatch`)."""
        self.close()
        self.epoch += 1
        connection_lost(self)

    def submit(self, req: Any, handle: Callable[[Any], Any]) -> Any:
        """Queue a request for its claim (the per-task path when it cannot be queued)."""
        job = None
        if len(self.jobs) < QUEUE_LIMIT and not self.stopping and self.thread.is_alive():
            try:
                job = job_of(req, handle)
                if job is not None:
                    job.epoch = self.epoch
            except Exception:  # reported by the per-task path, in the child, as without us
                job = None
        if job is None:
            return handle(req)
        with self.cv:
            self.jobs.append(job)
            self.cv.notify()
        return None

    def on_readable(self) -> None:
        """The hub's reader: act on every request the thread is done with."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 4096):
                pass
        while self.done:
            job = self.done.popleft()
            try:
                self._dispatch(job)
            except Exception:
                events.emit(logging.ERROR, "grousset.worker_claim", {"task_id": job.req.id},
                            note="dispatch failed", exc_info=True)  # fmt: skip

    def _dispatch(self, job: Job) -> None:
        req = job.req
        if of_a_lost_connection(self, job):
            if job.action == OWNED and job.result is not None:
                self._release(job)
            return
        if job.waits and job.action != WAITING:  # done waiting: counted in the prefetch again
            self.consumer.qos.decrement_eventually()
        if job.action == OWNED and job.result is not None:
            if req.revoked():  # revoked or expired while its claim was made: give it up
                self._release(job)
                return
            preclaim.carry(req.request_dict, job.claim, job.result, job.claimed_at)
            job.handle(req)
            self._hand(job)
        elif job.action in (ANSWERED, DEFERRED):
            from celery.utils.saferepr import saferepr
            from celery.worker.state import task_ready

            req.acknowledge()
            task_ready(req)
            if job.action == ANSWERED:
                req.send_event("task-succeeded", result=saferepr(job.value), runtime=0.0)
        elif job.action == WAITING and job.result is not None:
            self._wait(job, job.result.retry_in)
        else:
            job.handle(req)

    def _wait(self, job: Job, stale_in: float) -> None:
        """``on_in_flight="wait"``: claim the request again later, from the event loop's
        timer, with capped backoff (no pool child held; like an ETA request, it is not
        counted against the prefetch while it waits)."""
        if job.req.revoked():  # revoked meanwhile: Celery has acked it, nothing is held
            if job.waits:
                self.consumer.qos.decrement_eventually()
            return
        if job.waits == 0:
            self.consumer.qos.increment_eventually()
        delay = min(WAIT_FIRST * 2.0**job.waits, WAIT_CAP, max(stale_in, 0.0))
        self.hub.call_later(delay, self._again, job)

    def _again(self, job: Job) -> None:
        """A waiting request's next claim: once its first one counted it, a redelivery
        (``bounce``), as an in-flight requeue is, not one more duplicate."""
        if of_a_lost_connection(self, job):
            return
        job.waits += 1
        job.action, job.result = PER_TASK, None
        if job.sent and not job.claim.bounce:  # (a child that takes it over: the header)
            job.claim = dataclasses.replace(job.claim, bounce=True)
            job.req.request_dict.setdefault(COUNTED_HEADER, 1)
        if len(self.jobs) >= QUEUE_LIMIT or self.stopping or not self.thread.is_alive():
            self.consumer.qos.decrement_eventually()
            job.handle(job.req)
            return
        with self.cv:
            self.jobs.append(job)
            self.cv.notify()

    def _hand(self, job: Job) -> None:
        if len(self.handed) >= self.prune_at:  # forget those a child has started (their
            # message and arguments: only those not started are needed, at stop or revoke)
            self.handed = {k: j for k, j in self.handed.items() if j.req.worker_pid is None}
            self.prune_at = max(PRUNE_AT, 2 * len(self.handed))
        self.handed[job.req.id] = job

    def _release(self, job: Job) -> None:
        with self.cv:
            self.releases.append(job)
            self.cv.notify()

    def stop(self, pool_stopped: bool, timeout: float = 10.0) -> None:
        """Shutdown: finish the pass under way, then release every claim made for a
        request the pool never got (its message comes back from the broker) and — once
        the pool has stopped — for those it got but never started (Celery drops them)."""
        with self.cv:
            if pool_stopped:
                self.releases.extend(j for j in self.handed.values() if j.req.worker_pid is None)
            self.handed.clear()
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout)

    # -- the thread's side -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.cv:
                while not (self.jobs or self.releases or self.stopping):
                    self.cv.wait()
                self._gather()
                stopping = self.stopping
                size = 0 if stopping else min(len(self.jobs), self.batch_size)
                batch = [self.jobs.popleft() for _ in range(size)]
            self._release_all()
            if stopping:
                self._shut()
                return
            if batch:
                self.passes, self.claimed = self.passes + 1, self.claimed + len(batch)
                try:
                    self.claim(batch)
                except Exception:  # never let the thread die: these take the per-task path
                    events.emit(logging.ERROR, "grousset.worker_claim", {"requests": len(batch)},
                                note="pass failed", exc_info=True)  # fmt: skip
                self.done.extend(batch)
                with contextlib.suppress(BlockingIOError):
                    os.write(self.write_fd, b"\0")

    def _gather(self) -> None:
        """``WORKER_CLAIM_FLUSH_DELAY``: wait (holding ``cv``) up to that long from the
        first queued request for more, until a full batch or shutdown."""
        if self.flush_delay <= 0 or not self.jobs:
            return
        deadline = time.monotonic() + self.flush_delay
        while len(self.jobs) < self.batch_size and not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.cv.wait(left)

    def _shut(self) -> None:
        """Release the claims of requests never handed to the pool; close the connections
        (on this thread: an SQLite connection may be used only by the thread that made it)."""
        events.emit(logging.INFO, "grousset.worker_claim_stats", {
            "passes": self.passes, "requests": self.claimed,
            "average_batch": round(self.claimed / max(self.passes, 1), 2),
            "batch_size": self.batch_size, "flush_delay": self.flush_delay,
        })  # fmt: skip
        while self.done:
            job = self.done.popleft()
            if job.action == OWNED:
                self.releases.append(job)
        self._release_all()
        for store in self.stores.values():
            with contextlib.suppress(Exception):
                store.close()

    def _store(self, alias: str) -> Store:
        store = self.stores.get(alias)
        if store is None:
            from celery_grousset.store import private_store

            store = self.stores[alias] = private_store(alias)
        return store

    def claim(self, batch: list[Job]) -> None:
        """Claim a batch (:func:`celery_grousset.batch_pass.claim_pass`)."""
        claim_pass(self._store, batch)

    def _release_all(self) -> None:
        while self.releases:
            job = self.releases.popleft()
            c = job.claim
            try:
                self._store(job.database).release(c.processor_id, c.fingerprint, c.token)
            except Exception as exc:  # it turns stale at its stale_at
                events.store_error(c, "release", exc)


def _no_pool(req: Any) -> Any:  # pragma: no cover - replaced before the first request
    raise RuntimeError("celery-grousset: the claimer has no consumer to hand requests to")


def _no_close() -> None:  # pragma: no cover - replaced before the first request
    """(no consumer yet: nothing to close)"""


def stop(sender: Any = None, **kwargs: Any) -> None:
    """``worker_shutdown`` (sent once the worker's steps, its pool included, have
    stopped): stop the claimer of the worker's consumer, if it has one."""
    claimer = getattr(getattr(sender, "consumer", None), "_grousset_claimer", None)
    if isinstance(claimer, Claimer):
        claimer.stop(pool_stopped=not _children_alive(sender))


def _children_alive(worker: Any) -> bool:
    """Whether a pool process of ``worker`` may still run a request (True when unsure).
    A prefork pool: while a child lives. Another (threads, solo, gevent, eventlet): until
    it has stopped — it waits for the requests it started, and drops those it had not."""
    from celery.concurrency.prefork import TaskPool

    pool = getattr(worker, "pool", None)
    if not isinstance(pool, TaskPool):
        return pool is None or getattr(pool, "_state", None) != getattr(pool, "TERMINATE", 0)
    inner = getattr(pool, "_pool", None)  # None once the pool has stopped
    try:
        return inner is not None and any(p.is_alive() for p in inner._pool)
    except Exception:
        return True
