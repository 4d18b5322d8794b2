"""One guarded attempt: claim → run → fenced completion (shared by ``protect()``
and :class:`~celery_grousset.task.GroussetTask`).

The data flows one way: the caller builds a :class:`ClaimRequest`, :func:`claim`
asks the store, and for an owned claim :func:`run_owned` runs the effect and
writes the outcome. Duplicates are answered by :func:`answer` from the memo.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from celery_grousset import events, memo
from celery_grousset.claim import ENC_NONE, ClaimRequest, Kind, Status
from celery_grousset.conf import check_choice, grousset_settings, seconds
from celery_grousset.exceptions import FencedOut, StoreUnavailable
from celery_grousset.store.base import ClaimResult, Completion, Store

# -- fault hooks (chaos suite): zero cost unless GROUSSET_FAULT is set ----------------------
_FAULT = os.environ.get("GROUSSET_FAULT", "")


def fault(point: str) -> None:
    """Chaos hook: ``GROUSSET_FAULT=<point>:<action>[:<task-substring>]``."""
    if not _FAULT:
        return
    from celery_grousset import faults

    faults.trigger(_FAULT, point)


@dataclass(frozen=True, slots=True)
class Options:
    """Resolved guard options (DESIGN §6)."""

    max_processing_time: float
    processor_id: str
    expires_after: float = 7 * 24 * 3600.0
    on_in_flight: str = "retry"
    transactional: bool = False
    memoize: bool = True
    on_failure: str = "release"
    max_result_bytes: int = 256 * 1024
    max_takeovers: int = 3
    database: str = "default"

    @classmethod
    def resolve(cls, where: str, explicit: dict[str, Any], default_processor: str) -> Options:
        """Merge ``explicit`` (per call / task; None = unset) over GROUSSET and defaults."""
        s = grousset_settings

        def pick(name: str) -> Any:
            value = explicit.get(name)
            return value if value is not None else getattr(s, name.upper())

        mpt = seconds(pick("max_processing_time"), name="max_processing_time")
        if mpt is None:
            raise ImproperlyConfigured(
                f"celery-grousset: {where} has no max_processing_time. It has no default on "
                "purpose (how long may an attempt hold the claim before another worker takes "
                "it over?). Set it on the task (@app.task(base=GroussetTask, "
                "max_processing_time=60)), pass it to protect(), start the worker with "
                "--grousset-max-processing-time, or set GROUSSET['MAX_PROCESSING_TIME'] in "
                "Django settings."
            )
        return cls(
            max_processing_time=mpt,
            processor_id=str(pick("processor_id") or default_processor),
            expires_after=seconds(pick("expires_after"), name="expires_after") or 0.0,
            on_in_flight=check_choice("ON_IN_FLIGHT", pick("on_in_flight")),
            transactional=bool(pick("transactional")),
            memoize=bool(pick("memoize")),
            on_failure=check_choice("ON_FAILURE", pick("on_failure")),
            max_result_bytes=int(pick("max_result_bytes")),
            max_takeovers=int(pick("max_takeovers")),
            database=str(pick("database")),
        )


_worker_id: tuple[int, str] = (0, "")


def worker_id() -> str:
    """``hostname:pid`` of this process (cached per pid)."""
    global _worker_id
    pid = os.getpid()
    if _worker_id[0] != pid:
        _worker_id = (pid, f"{socket.gethostname()}:{pid}")
    return _worker_id[1]


def new_token() -> str:
    return uuid.uuid4().hex


@dataclass(slots=True)
class Attempt:
    """What a running attempt knows about its claim (``self.grousset`` in a task)."""

    fingerprint: str
    fence: int
    deliveries: int
    takeovers: int
    kind: Kind
    processor_id: str
    token: str = field(repr=False)


def request(
    opts: Options,
    fingerprint: str,
    task_name: str,
    task_id: str,
    args_repr: str,
    token: str | None = None,
) -> ClaimRequest:
    return ClaimRequest(
        processor_id=opts.processor_id,
        fingerprint=fingerprint,
        task_name=task_name,
        task_id=task_id,
        token=token or new_token(),
        worker=worker_id(),
        args_repr=args_repr,
        max_processing_time=opts.max_processing_time,
        expires_after=opts.expires_after,
        max_takeovers=opts.max_takeovers,
    )


def claim(store: Store, req: ClaimRequest) -> ClaimResult:
    """Ask the store; report takeovers and give-ups. Raises StoreUnavailable."""
    t0 = time.perf_counter()
    try:
        res = store.claim(req)
    except StoreUnavailable as exc:
        events.store_error(req, "claim", exc)
        raise
    events.claimed(req, res, time.perf_counter() - t0)
    if res.kind is Kind.TAKEOVER:
        events.taken_over(req, res)
    elif res.kind is Kind.GAVE_UP:
        events.gave_up(req, res)
    return res


def answer(req: ClaimRequest, res: ClaimResult, delivery: str = "") -> Any:
    """The value (or error) a non-owning delivery returns: the memo."""
    if res.kind is Kind.COMPLETED:
        events.duplicate(req, res, delivery)
    return memo.decode(res.result, res.result_encoding, res.error, req.fingerprint)


def wait_until_settled(store: Store, req: ClaimRequest, res: ClaimResult) -> ClaimResult:
    """``on_in_flight="wait"``: poll with capped backoff until the holder finishes or its
    claim turns stale, then claim again (bounded by ``max_processing_time``)."""
    delay = 0.005
    while res.kind is Kind.IN_FLIGHT:
        stale_at = time.monotonic() + res.retry_in
        # Read-only polls (not counted as deliveries) until the record changes hands
        # or the claim turns stale; then one claim decides.
        while time.monotonic() < stale_at:
            time.sleep(min(delay, max(stale_at - time.monotonic(), 0.001)))
            delay = min(delay * 2, 0.5)
            if _settled(store, req, res):
                break
        res = claim(store, req)
    return res


def _settled(store: Store, req: ClaimRequest, res: ClaimResult) -> bool:
    """Whether the in-flight record seen by ``res`` is no longer held by that attempt."""
    from celery_grousset.models import Outcome

    row = (
        Outcome.objects.db_manager(store.alias)
        .by_key(req.processor_id, req.fingerprint)
        .values_list("status", "fence")
        .first()
    )
    return row is None or row != (Status.IN_FLIGHT.value, res.fence)


def control_flow(exc: BaseException) -> bool:
    """Celery's Retry / Ignore / Reject and non-Exception exits never memoize."""
    if not isinstance(exc, Exception):
        return True
    from celery.exceptions import Ignore, Reject, Retry

    return isinstance(exc, (Retry, Ignore, Reject))


def fail(store: Store, opts: Options, req: ClaimRequest, exc: BaseException) -> None:
    """Record a failed attempt: release the claim, or memoize the error."""
    if opts.on_failure == "memoize" and not control_flow(exc):
        result, enc, error = memo.encode_exception(exc)
        completion = Completion(Status.FAILED.value, result, enc, error)
    else:
        completion = Completion(Status.FAILED.value, None, ENC_NONE, memo.error_summary(exc))
    try:
        t0 = time.perf_counter()
        done = store.finish(req.processor_id, req.fingerprint, req.token, completion)
        events.finished(req, "failed" if done else "fenced_out", time.perf_counter() - t0)
        if not done:
            events.fenced(req, 0)
    except StoreUnavailable as store_exc:
        # The claim stays in flight; it turns stale after max_processing_time.
        events.store_error(req, "fail", store_exc)


#: pauses between attempts of a completion write that found the store unavailable
COMPLETION_RETRY_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)


def finish_retrying(store: Store, req: ClaimRequest, completion: Completion) -> bool:
    """Write the completion; when the store is briefly unavailable (a restart, a lost
    connection) try again while the claim is still ours. Re-sending with the same token is
    idempotent. Gives up (raises StoreUnavailable) within half of max_processing_time: the
    claim then stays in flight and a later delivery takes it over."""
    deadline = time.monotonic() + req.max_processing_time / 2
    interrupted = False
    for delay in (*COMPLETION_RETRY_DELAYS, None):
        try:
            return store.finish(req.processor_id, req.fingerprint, req.token, completion)
        except StoreUnavailable as exc:
            events.store_error(req, "complete", exc)
            if delay is None or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
        except Exception as exc:
            # Interrupted while waiting for the answer (e.g. SoftTimeLimitExceeded): the
            # write may or may not have committed. Drop the connection and send it again
            # once on a fresh one; the same token makes the re-send idempotent.
            if interrupted:
                raise
            interrupted = True
            events.store_error(req, "complete (outcome unknown, re-sent)", exc)
            try:
                store.close()
            except Exception:  # the connection is in an unknown state
                store.discard()
    raise AssertionError("unreachable")  # pragma: no cover


def run_owned(
    store: Store,
    opts: Options,
    req: ClaimRequest,
    res: ClaimResult,
    fn: Callable[[], Any],
    serializer: str,
) -> Any:
    """Run the effect of an owned claim and write its fenced outcome."""
    fault("after_claim")
    if opts.transactional:
        return _run_transactional(store, opts, req, res, fn, serializer)
    try:
        value = fn()
    except BaseException as exc:
        fail(store, opts, req, exc)
        raise
    fault("after_effect")
    result, enc, error = memo.encode(
        value, serializer=serializer, memoize=opts.memoize, max_bytes=opts.max_result_bytes
    )
    t0 = time.perf_counter()
    done = finish_retrying(store, req, Completion(Status.COMPLETED.value, result, enc, error))
    events.finished(req, "completed" if done else "fenced_out", time.perf_counter() - t0)
    if not done:
        events.fenced(req, res.fence)
        raise FencedOut(
            f"{req.task_name}: this attempt (fence {res.fence}) lost its claim on "
            f"{req.fingerprint[:16]}… before completing; its result was discarded."
        )
    fault("after_complete")
    return value


def _run_transactional(
    store: Store,
    opts: Options,
    req: ClaimRequest,
    res: ClaimResult,
    fn: Callable[[], Any],
    serializer: str,
) -> Any:
    from django.db import transaction

    from celery_grousset.models import Outcome

    try:
        with transaction.atomic(using=opts.database):
            value = fn()
            fault("after_effect")
            result, enc, error = memo.encode(
                value, serializer=serializer, memoize=opts.memoize, max_bytes=opts.max_result_bytes
            )
            t0 = time.perf_counter()
            done = (
                Outcome.objects.using(opts.database)
                .filter(
                    processor_id=req.processor_id,
                    fingerprint=req.fingerprint,
                    claim_token=req.token,
                    status=Status.IN_FLIGHT.value,
                )
                .update(
                    status=Status.COMPLETED.value,
                    result=result,
                    result_encoding=enc,
                    error=error,
                    completed_at=store.now_expression(),
                )
            )
            if not done:
                events.finished(req, "fenced_out", time.perf_counter() - t0)
                events.fenced(req, res.fence)
                raise FencedOut(
                    f"{req.task_name}: this attempt (fence {res.fence}) lost its claim on "
                    f"{req.fingerprint[:16]}…; its transaction was rolled back."
                )
    except FencedOut:
        raise
    except BaseException as exc:
        fail(store, opts, req, exc)
        raise
    events.finished(req, "completed", time.perf_counter() - t0)  # the update and its commit
    fault("after_complete")
    return value


def kill_self(sig: int = signal.SIGKILL) -> None:  # pragma: no cover - used by chaos hooks
    os.kill(os.getpid(), sig)
