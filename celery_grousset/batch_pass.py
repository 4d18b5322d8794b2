"""One pass of the worker's claim thread (:mod:`celery_grousset.batch_claim`): the
requests queued since the last pass claimed together, and what the event loop does
with each (``Job.action``).

Decided here, on the claim thread, never on the event loop:

* ``OWNED``: the claim travels with the request to the pool;
* ``ANSWERED``: a completed key's memo is stored as this delivery's result;
* ``DEFERRED``: a key in flight elsewhere (or owned by another delivery of the same
  pass), ``on_in_flight="retry"``: the delivery was published again with the per-task
  path's countdown (:func:`celery_grousset.delivery.in_flight_countdown`, same header count,
  same max_retries semantics, same ``grousset.in_flight`` line) and is acked;
* ``WAITING``: the same with ``on_in_flight="wait"``: claimed again later from the
  event loop's timer, holding no pool child;
* ``PER_TASK``: anything else goes to the pool unclaimed (the child decides).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_grousset import carry, events, guard, memo, preclaim
from celery_grousset.claim import ClaimRequest, Kind, payload_differs
from celery_grousset.delivery import key_of
from celery_grousset.exceptions import StoreUnavailable
from celery_grousset.inflight import still_held
from celery_grousset.store import ClaimResult, Store, check_claimable
from celery_grousset.task import GroussetTaskMixin, worker_caller

#: what the event loop does with a request once the claimer is done with it
OWNED, ANSWERED, PER_TASK = "owned", "answered", "per-task"
DEFERRED, WAITING = "deferred", "waiting"
#: request fields that make a duplicate's answer more than a stored result (callbacks,
#: chains, chords): such duplicates take the per-task path, where Celery's tracer runs them
_EMBEDDED = ("callbacks", "errbacks", "chain", "chord")
#: seconds a journal database the pass found unavailable is left to the pool children (the
#: per-task path): its timeout is not waited again by every pass, ahead of the others
RESTING = 5.0
_resting: dict[str, float] = {}  # alias -> until (time.monotonic())


@dataclass(slots=True)
class Job:
    """One request waiting for, or done with, its claim."""

    req: Any  #: celery.worker.request.Request
    handle: Callable[[Any], Any]  #: the consumer's hand-over to the pool
    claim: ClaimRequest
    database: str
    delivery: str
    action: str = PER_TASK
    result: ClaimResult | None = None
    value: Any = None
    waits: int = 0  #: passes this request waited through (``on_in_flight="wait"``)
    #: waiting: the holder's claim as last seen, and when (monotonic) it turns stale
    holder: tuple[ClaimResult, float] | None = None
    sent: bool = False  #: its own claim was sent (counted); else another of its pass's was
    #: when its claim was sent (``time.monotonic()``, this host): a pool child ages the
    #: claim from here, not from its hand-over, which may come long after (a solo pool runs
    #: a pass's bodies one by one, a busy event loop)
    claimed_at: float = 0.0
    epoch: int = 0  #: the claimer's epoch at its receipt (broker connections lost before)


class _Read:
    """A worker's ``Request`` as the guard reads a task's request: its headers are the
    keys of its ``request_dict`` (a pool child's request has them as attributes), so a
    run's slot and a requeue's marks count here as they do in the child."""

    __slots__ = ("delivery_info", "headers", "id")

    def __init__(self, req: Any) -> None:
        self.id, self.delivery_info, self.headers = req.id, req.delivery_info, req.request_dict


def job_of(req: Any, handle: Callable[[Any], Any]) -> Job | None:
    """The claim of a request, computed on the event loop (no I/O); None: per-task path."""
    task = req.task
    if not isinstance(task, GroussetTaskMixin):
        return None
    if req.request_dict.get(carry.HEADER) is not None:
        # A requeued delivery carrying an outcome or a lost claim (celery_grousset.carry):
        # the child writes or settles it under its own token first. A claim made here
        # would take the key over from that token and fence its carried outcome out.
        return None
    if req.expires:  # the per-task path, where Celery expires it before anything else
        return None
    opts = task.grousset_options()
    read = _Read(req)
    call = task.grousset_call(req.args, req.kwargs, key_of(read), read)
    fp, args_repr, payload = guard.identity(call, opts.validate_payload)
    creq = guard.request(opts, fp, call.name, call.task_id, args_repr, payload_hash=payload,
                         bounce=call.bounce)  # fmt: skip
    check_claimable(creq)
    return Job(req, handle, creq, opts.database, call.delivery)


def claim_pass(store_of: Callable[[str], Store], batch: list[Job]) -> None:
    """Claim a batch: one claim per key and database (``claim_all``) a round; each job's
    ``action`` says what the event loop does with it. The other copies of a completed key
    in the pass send their own claims in the next round: each is a duplicate the journal
    counts and records (``grousset_inspect <task id>``), as it would be alone."""
    batch = _unchanged(store_of, batch)
    while batch:
        batch = _claim_round(store_of, batch)


def _unchanged(store_of: Callable[[str], Store], batch: list[Job]) -> list[Job]:
    """``on_in_flight="wait"``: a waiting request whose holder still holds the key (its
    fence, not yet stale) waits on after a read-only look, as the per-task wait polls;
    only a change of hands, or the claim turning stale, is claimed (and counted)."""
    claim: list[Job] = []
    for job in batch:
        seen, now = job.holder, time.monotonic()
        if job.waits and seen is not None and now < seen[1] and not _rests(job.database):
            try:
                held = still_held(store_of(job.database), job.claim, seen[0])
            except Exception:  # (the claim reports it)
                held = False
            if held:
                job.action = WAITING
                job.result = dataclasses.replace(seen[0], retry_in=seen[1] - now)
                continue
        claim.append(job)
    return claim


def _claim_round(store_of: Callable[[str], Store], batch: list[Job]) -> list[Job]:
    """One round of :func:`claim_pass`; returns the jobs whose own claim is still due."""
    again: list[Job] = []
    keys: dict[tuple[str, str, str], list[Job]] = {}
    for job in batch:
        c = job.claim
        keys.setdefault((job.database, c.processor_id, c.fingerprint), []).append(job)
    for alias in {database for database, _, _ in keys}:
        groups = [jobs for (database, _, _), jobs in keys.items() if database == alias]
        try:
            store = store_of(alias)
        except Exception:  # not configured: the per-task path reports it
            continue
        if _rests(alias):  # found down a moment ago: the children claim, each on its own
            continue
        sent_at = time.monotonic()  # before the statement: the claim is no older than this
        try:  # (reported below only where acted on here: else the child claims, reports)
            results = guard.claim(store, [jobs[0].claim for jobs in groups], report=False)
        except StoreUnavailable:  # down, or the answer lost: the per-task path decides
            _resting[alias] = time.monotonic() + RESTING
            if store.remote:  # the claims may have committed: the children find out
                for jobs in groups:
                    lost(jobs[0])
            continue
        except Exception:  # refused: the per-task path fails closed
            continue
        seconds = (time.monotonic() - sent_at) / len(groups)
        for jobs, res in zip(groups, results, strict=True):
            jobs[0].sent = True
            if res.owned:  # the others of the pass are in flight under this claim
                jobs[0].action, jobs[0].result, jobs[0].claimed_at = OWNED, res, sent_at
                held = dataclasses.replace(
                    res, kind=Kind.IN_FLIGHT, retry_in=jobs[0].claim.max_processing_time
                )
                for job in jobs[1:]:  # (sent no claim: not counted yet)
                    in_flight(job, held, counted=False)
            elif res.kind is Kind.COMPLETED:  # (the others: their own claims, next round)
                answer(jobs[0], res)
                again += jobs[1:]
                jobs = jobs[:1]
            elif res.kind is Kind.IN_FLIGHT:  # only the first one's claim was sent
                for i, job in enumerate(jobs):
                    in_flight(job, res, counted=i == 0)
            acted = [job for job in jobs if job.action != PER_TASK]
            if acted and not (res.kind is Kind.IN_FLIGHT and acted[0].waits):  # (once)
                events.decided(jobs[0].claim, res, seconds)
            first = jobs[0]  # (the one whose claim was sent: not to be counted again)
            if first.action == PER_TASK and res.kind in preclaim.SETTLED:  # the child acts on it
                reported = None if acted else seconds  # (reported here: not again there)
                preclaim.carry_decided(first.req.request_dict, first.claim, res, reported)
    return again


def lost(job: Job) -> None:
    """The claim sent for ``job`` may have committed without its answer reaching us: the
    request carries the claim's token to the pool (as a requeued delivery would,
    :func:`celery_grousset.carry.lost_claim`), and the child releases exactly that claim
    before it claims, instead of waiting for it to turn stale."""
    job.req.request_dict.setdefault(carry.HEADER, carry.lost_claim(job.claim))


def answer(job: Job, res: ClaimResult) -> None:
    """Store a completed key's memo as this delivery's result (else: per-task path)."""
    req, creq = job.req, job.claim
    if payload_differs(res.payload_hash, creq.payload_hash):
        return  # the per-task path raises PayloadMismatch
    _, _, embed = req._payload
    if any((embed or {}).get(name) for name in _EMBEDDED):
        return
    try:
        accept = memo.app_accept(req.task.app)
        value = memo.decode(
            res.result, res.result_encoding, res.error, creq.fingerprint, accept=accept
        )
        if not req.task.ignore_result:
            req.task.backend.mark_as_done(req.id, value, request=req._context)
    except Exception:  # a memoized error, a memo not stored, the backend down
        return
    events.duplicate(creq, res, job.delivery)
    job.action, job.value = ANSWERED, value


def in_flight(job: Job, res: ClaimResult, counted: bool = True) -> None:
    """A key held by another attempt: follow the task's ``on_in_flight`` here, as the
    per-task path would in a child (else: per-task path). A delivery whose claim was not
    sent (``counted`` False: another of its pass sent the key's) is not requeued here:
    the requeue would mark it counted, and it would never count as a duplicate."""
    from celery.exceptions import Retry

    creq = job.claim
    if payload_differs(res.payload_hash, creq.payload_hash):
        return  # the per-task path raises PayloadMismatch
    caller = worker_caller(job.req.task, job.req._context)
    policy = caller.in_flight_policy(job.req.task.grousset_options())
    if not counted and policy != "wait":  # the child claims it (counted), then requeues it
        return
    if job.waits == 0:  # logged once per delivery, as the per-task path's wait does
        events.in_flight(creq, res, policy)
    if policy == "wait":
        job.action, job.result = WAITING, res
        job.holder = (res, time.monotonic() + res.retry_in)
        return
    try:
        caller.defer(creq, res)  # publishes the delivery again, then raises Retry
    except Retry:
        job.action = DEFERRED
    except Exception:  # could not publish it: the child's per-task path decides
        return


def _rests(alias: str) -> bool:
    """``alias`` was found unavailable less than :data:`RESTING` seconds ago."""
    return _resting.get(alias, 0.0) > time.monotonic()
