"""The owner's side of the guarded flow: run the effect, then write the fenced outcome
(docs/how-it-works.md, "Completion"). A completion that finds the claim taken over
writes nothing: the attempt was fenced out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NoReturn

from celery_grousset import events, memo, txbody
from celery_grousset.binding import not_awaitable
from celery_grousset.claim import ENC_NONE, ENC_NOT_STORED, ClaimRequest, Status
from celery_grousset.exceptions import (
    FencedOut,
    PoisonDelivery,
    StoreUnavailable,
    TransactionLost,
)
from celery_grousset.faults import fault
from celery_grousset.options import Options
from celery_grousset.running import holding
from celery_grousset.store import ClaimResult, Completion, Store, refusals

#: what to do with an outcome the journal would not take (a task requeues its delivery
#: carrying it: celery_grousset.carry); it never returns
Unwritten = Callable[[Completion, StoreUnavailable], NoReturn]
#: pauses between attempts of a completion write that found the store unavailable
COMPLETION_RETRY_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)

def run_owned(
    store: Store, opts: Options, req: ClaimRequest, res: ClaimResult, fn: Callable[[], Any],
    serializer: str, unwritten: Unwritten | None = None,
) -> Any:
    """Run the effect of an owned claim and write its fenced outcome. When the outcome
    cannot be written (the store stayed unavailable through every retry), it is handed
    to ``unwritten`` (a task requeues its delivery carrying it: celery_grousset.carry);
    without one, StoreUnavailable is raised and the claim stays in flight."""
    fn = holding((store.alias, req.processor_id, req.fingerprint), fn)
    fault("after_claim")
    if opts.transactional:
        return _run_transactional(store, opts, req, res, fn, serializer, unwritten)
    started = time.monotonic()
    try:
        value = not_awaitable(fn(), req.task_name)
    except Exception as exc:
        if fail(store, opts, req, exc, res.fence, unwritten):
            overran(req, started)
        raise
    except BaseException as exc:  # the process is being stopped: the effect may have
        events.interrupted(req, exc)  # happened, so its claim is taken over once stale
        raise
    fault("after_effect")
    completion = _completed(opts, value, serializer)
    try:
        done = complete(store, req, completion, res.fence, unwritten)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # stopped while the outcome was being written
            events.interrupted(req, exc, last_write=True)
            store.write_before_exit(req, completion)
        raise
    if not done:
        raise FencedOut(_fenced_text(req, res, started, "its result was discarded; the "
                                     "attempt that holds the claim now runs the effect too"))
    fault("after_complete")
    overran(req, started)
    _said(req, completion)
    return value


def complete(
    store: Store,
    req: ClaimRequest,
    completion: Completion,
    fence: int,
    unwritten: Unwritten | None,
) -> bool:
    """Write the fenced completion of an attempt whose effect ran (retried:
    :func:`finish_retrying`); still unwritable, hand it to ``unwritten`` (without one,
    raise StoreUnavailable). False: the claim was taken over (logged fenced out)."""
    t0, status = time.perf_counter(), completion.status  # (a carried failure: failed)
    try:
        done = finish_retrying(store, req, completion, carried=unwritten is not None,
                               operation="complete" if status == "completed" else "fail")
    except StoreUnavailable as exc:
        if unwritten is None:
            raise
        unwritten(completion, exc)
    events.finished(req, status if done else "fenced_out", time.perf_counter() - t0)
    if not done:
        events.fenced(req, fence)
    return done


def _fenced_text(req: ClaimRequest, res: ClaimResult, started: float, outcome: str) -> str:
    """Why an attempt was fenced out, and the fix (one wording for both paths). Its claim
    turned stale ``res.retry_in`` after the body started: less than max_processing_time
    when the worker's main process made it before (``WORKER_CLAIM``)."""
    elapsed = time.monotonic() - started
    stale_after = res.retry_in if res.retry_in > 0 else req.max_processing_time
    why = (
        "A claim older than max_processing_time is taken over by the next delivery: raise "
        "max_processing_time above the task's longest run, or set a hard time_limit below it."
        if elapsed >= stale_after else
        "It was not stale: it was released (grousset_release --force, a revoke with "
        "terminate=True) and another delivery claimed the call since, which runs its effect."
    )  # fmt: skip
    aged = req.max_processing_time - stale_after  # made by the main process before
    since = f", {elapsed + aged:.1f}s after its claim" if aged >= 0.05 else ""
    return (
        f"{req.task_name}: this attempt (fence {res.fence}) lost its claim on "
        f"{req.fingerprint[:16]}… {elapsed:.1f}s after its body started{since} "
        f"(max_processing_time {req.max_processing_time:g}s): {outcome}. {why}"
    )


def _completed(opts: Options, value: Any, serializer: str) -> Completion:
    result, enc, error = memo.encode(
        value, serializer=serializer, memoize=opts.memoize, max_bytes=opts.max_result_bytes
    )
    return Completion(Status.COMPLETED.value, result, enc, error)


def overran(req: ClaimRequest, started: float) -> None:
    """An attempt whose outcome was written although its body ran longer than
    ``max_processing_time`` (no duplicate came meanwhile) is said: ``grousset.overran``."""
    if (seconds := time.monotonic() - started) > req.max_processing_time:
        events.overran(req, seconds)


def _said(req: ClaimRequest, completion: Completion) -> None:
    """A completion written without its memo is said now (not only to a duplicate days
    later): ``grousset.result_not_stored``."""
    if completion.result_encoding == ENC_NOT_STORED:
        events.result_not_stored(req, completion.error)


def _run_transactional(store: Store, opts: Options, req: ClaimRequest, res: ClaimResult,
                       fn: Callable[[], Any], serializer: str, unwritten: Unwritten | None,
                       ) -> Any:  # fmt: skip
    """The effect and the completion in ONE transaction on the journal's database: a
    fenced-out attempt rolls its effect back."""
    from django.db import connections, transaction

    conn, raw, started, body = connections[store.alias], None, time.monotonic(), txbody.Body(
        store.ends_on_lock_timeout)
    try:
        with transaction.atomic(using=store.alias):
            _begin(store, raw := conn.connection)  # (raw: the connection it runs on)
            value = txbody.run(body, conn, store.alias, req, fn)
            fault("after_effect")
            t0 = time.perf_counter()
            completion = _completed(opts, value, serializer)
            if not _finish_in_transaction(store, req, completion):
                events.finished(req, "fenced_out", time.perf_counter() - t0)
                events.fenced(req, res.fence)
                raise FencedOut(_fenced_text(req, res, started, "its transaction, effect "
                                             "included, was rolled back"))
    except FencedOut:
        raise
    except BaseException as caught:
        if body.committed:  # an on_commit callback the body registered raised
            _committed(req, completion, t0, started)
            events.callback_failed(req, caught)
            raise
        refused = isinstance(caught, _NotTaken)
        exc = caught.__cause__ or caught if refused else caught
        conflict = body.rolled_back(exc) and not memo.control_flow(caught)  # (a retry)
        if conflict or (refused and not txbody.connection_lost(conn, raw, exc)):
            release_lost(store, req, res.fence, exc)  # never the task's failure
            why = ("rolled the transaction back for a conflict with another transaction"
                   if conflict else f"did not take the transaction's "
                   f"{getattr(caught, 'what', '')} (a lock wait timeout, a refusal)")  # fmt: skip
            raise TransactionLost(
                f"{req.task_name}: the journal database {store.alias!r} {why}: "
                f"{str(exc).rstrip('. ')}. "
                "The effect was rolled back with it; the claim is released and the "
                "delivery sent again."
            ) from exc
        if not txbody.connection_lost(conn, raw, exc):
            if fail(store, opts, req, exc, res.fence, unwritten):
                overran(req, started)
            raise
        released = release_lost(store, req, res.fence, exc)
        if released is not None:  # (None: the commit reached the server: completed)
            raise _unconfirmed(req, store.alias, exc, released, started) from exc
    finally:
        store.end_transactional()  # (MariaDB: its session's idle limit put back)
    _committed(req, completion, t0, started)
    return value


def _unconfirmed(
    req: ClaimRequest, alias: str, exc: BaseException, released: bool, started: float
) -> TransactionLost:
    """The error of a transaction whose connection broke before its commit was confirmed,
    and which the journal does not show committed."""
    then = ("nothing of it committed: its claim is released, and it runs when sent (or "
            "called) again" if released else "the next delivery (or call) finds out from "
            "the journal whether it committed")  # fmt: skip
    return TransactionLost(
        f"{req.task_name}: the connection to the journal database {alias!r} broke before "
        f"the transaction's commit was confirmed ({exc}); {then}. (A connection kept across "
        "a database restart fails so at its first use: CONN_HEALTH_CHECKS=True tests it.)",
        dropped=released and time.monotonic() - started >= DROPPED_AFTER,
    )


def _committed(req: ClaimRequest, completion: Completion, t0: float, started: float) -> None:
    events.finished(req, "completed", time.perf_counter() - t0)  # the update and its commit
    fault("after_complete")
    overran(req, started)
    _said(req, completion)


class _NotTaken(Exception):
    """A statement of the journal's own in the body's transaction raised (its trouble: a
    lock wait timeout, a permission refused), as the cause: not the body's failure."""

    def __init__(self, message: str, what: str = "completion") -> None:
        super().__init__(message)
        self.what = what  # the statement's part: "completion", "write lock"


def _begin(store: Store, raw: Any) -> None:
    """The store's first statement in the body's transaction (SQLite: its one write lock,
    so that a body that reads before it writes is not refused its first write for a
    commit made since its read) on ``raw``, the DB-API connection the transaction runs on
    (the caller's, read before: a refusal is not taken for a lost connection). Whatever
    it raises is the journal's trouble."""
    try:
        store.begin_transactional()
    except Exception as exc:
        raise _NotTaken(str(exc).rstrip(". \n"), "write lock") from exc


def _finish_in_transaction(store: Store, req: ClaimRequest, completion: Completion) -> bool:
    try:
        return store.finish_in_transaction(req, completion)
    except Exception as exc:
        if not refusals.not_taken(exc):
            raise
        raise _NotTaken(str(exc).rstrip(". \n")) from exc


#: a transaction whose connection broke sooner than this was not cut by an idle limit
#: (MariaDB's wait_timeout is at least 1 s) but dead before it (kept across a database
#: restart): not a drop counted towards carry.MAX_DROPPED
DROPPED_AFTER = 1.0


def release_lost(store: Store, req: ClaimRequest, fence: int, exc: BaseException) -> bool | None:
    """A transaction's connection broke before its commit was confirmed: not the task's
    failure. Release the claim (never memoize the outage) on the store's own connection:
    True when released (the transaction did not commit). When it is no longer ours to
    release, the commit reached the server (the record is completed at this attempt's
    fence: logged, not fenced out; None) or the claim was taken over meanwhile (fenced
    out; False). Never raises."""
    completion = Completion(Status.FAILED.value, None, ENC_NONE, memo.error_summary(exc))
    try:
        t0 = time.perf_counter()
        if store.finish(req.processor_id, req.fingerprint, req.token, completion):
            events.finished(req, "failed", time.perf_counter() - t0)
            events.transaction_lost(req, committed=False)
            return True
        holder = store.holder(req.processor_id, req.fingerprint)
    except Exception as store_exc:  # unreachable again: the next delivery settles it
        events.store_error(req, "fail", store_exc)
        return False
    if holder == (Status.COMPLETED.value, fence):
        events.transaction_lost(req, committed=True)
        return None
    events.finished(req, "fenced_out", time.perf_counter() - t0)
    events.fenced(req, fence)
    return False


def fail(store: Store, opts: Options, req: ClaimRequest, exc: BaseException, fence: int,
         unwritten: Unwritten | None = None) -> bool:  # fmt: skip
    """Record a failed attempt (of ``fence``): release the claim, or memoize the error,
    retried as a completion is (:func:`finish_retrying`). True when it was written.
    Still unwritable: a memoized failure is handed to ``unwritten`` (requeued carrying
    it, so a duplicate never runs the effect again); a release is left in flight until
    stale. Else never raises (the caller re-raises the task's own exception)."""
    try:
        if opts.on_failure == "memoize" and not memo.never_memoized(exc):
            result, enc, error = memo.encode_exception(exc)
            completion = Completion(Status.FAILED.value, result, enc, error)
        else:
            completion = Completion(Status.FAILED.value, None, ENC_NONE, memo.error_summary(exc))
    except Exception:  # an exception that cannot describe itself: release the claim
        completion = Completion(Status.FAILED.value, None, ENC_NONE, memo.error_summary(None))
    carried = unwritten is not None and completion.result is not None
    try:
        t0 = time.perf_counter()
        done = finish_retrying(store, req, completion, carried, operation="fail",
                               patient=isinstance(exc, Exception))  # (not while stopping)
    except StoreUnavailable as store_exc:  # (each try logged)
        if carried and unwritten is not None:
            unwritten(completion, store_exc)
        return False  # in flight until stale (the task's own error is raised)
    except Exception as store_exc:  # refused for its data; interrupted twice
        events.store_error(req, "fail", store_exc)
        return False
    except BaseException as stopped:  # (SystemExit: a revoke's SIGTERM) as a completion's
        events.interrupted(req, stopped, last_write=True)
        store.write_before_exit(req, completion)
        raise
    events.finished(req, (memo.celery_exit(exc) or "failed") if done else "fenced_out",
                    time.perf_counter() - t0)  # fmt: skip
    if not done:
        events.fenced(req, fence)
    return done


def finish_retrying(store: Store, req: ClaimRequest, completion: Completion,
                    carried: bool = False, operation: str = "complete",
                    patient: bool = True) -> bool:  # fmt: skip
    """Write the completion; when the store is briefly unavailable (a restart, a lost
    connection) try again while the claim is still ours. Re-sending with the same token is
    idempotent. Gives up (raises StoreUnavailable) within half of max_processing_time: the
    claim then stays in flight and a later delivery takes it over. ``carried``: the
    caller hands an unwritten outcome on (a task requeues carrying it), so an interrupt
    (a soft time limit) is raised as StoreUnavailable too; else as itself. Not
    ``patient``: one try (a process being stopped does not wait out the pauses)."""
    deadline = time.monotonic() + (req.max_processing_time / 2 if patient else 0.0)
    interrupted = False
    for delay in (*COMPLETION_RETRY_DELAYS, None):
        try:
            return _finish(store, req, completion)
        except StoreUnavailable as exc:
            last = delay is None or time.monotonic() + delay > deadline
            events.store_error(req, operation, exc, retried=not last)
            if last or delay is None:
                raise
            try:
                time.sleep(delay)
            except Exception as interrupt:  # (a soft time limit): the outcome is not lost
                if not carried:  # but handed on, as when the retries run out
                    raise
                raise exc from interrupt
        except PoisonDelivery:  # refused for its data: sending it again cannot help
            raise
        except Exception as exc:
            # Interrupted while waiting for the answer (e.g. SoftTimeLimitExceeded): the
            # write may or may not have committed. Drop the connection and send it again
            # once on a fresh one; the same token makes the re-send idempotent.
            if interrupted and not carried:
                raise
            if interrupted:  # its outcome handed on (a task carries it), not dropped
                raise StoreUnavailable(f"the completion was interrupted twice ({exc!r}); "
                                       "whether it committed is unknown") from exc  # fmt: skip
            interrupted = True
            events.store_error(req, operation, exc, action="outcome unknown: sent again")
            store.discard()  # the connection is in an unknown state
    raise AssertionError("unreachable")  # pragma: no cover


def _finish(store: Store, req: ClaimRequest, completion: Completion) -> bool:
    """One completion write. When the database refuses the memo itself (a data error,
    e.g. over MariaDB's max_allowed_packet) the same write would fail forever: the outcome
    is recorded without it ("result not stored"), and the effect is never run again."""
    try:
        return store.finish(req.processor_id, req.fingerprint, req.token, completion)
    except PoisonDelivery as exc:
        if completion.result is None:
            raise
        events.store_error(req, "complete", exc, action="memo refused: stored as not stored")
        why = memo.redacted_text(f"result not stored: the journal refused it: {exc}")
    unstored = Completion(completion.status, None, ENC_NOT_STORED, why)
    return store.finish(req.processor_id, req.fingerprint, req.token, unstored)
