"""What the guard tells operators: one structured log line, one Django signal and
the metrics for every notable event (docs/operations.md). The hot path (a new claim that
completes) logs nothing above DEBUG."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from celery_grousset import signals
from celery_grousset.claim import Kind
from celery_grousset.memo import error_summary, redacted_text
from celery_grousset.textcut import encodable

if TYPE_CHECKING:
    from celery_grousset.claim import ClaimRequest
    from celery_grousset.store.base import ClaimResult

logger = logging.getLogger("celery_grousset")

#: Set by :mod:`celery_grousset.metrics` when metrics are enabled in this process.
recorder: Any = None


def _log(level: int, event: str, req: ClaimRequest, **extra: Any) -> None:
    """One structured line: ``event``, the call's identity, then ``extra``.

    The fields are in the message (``key=value``) and on the record, for JSON
    formatters: ``record.grousset`` is a dict of them (with ``event``) and each is also
    an attribute ``record.grousset_<field>``. Nothing is built unless ``level`` is
    enabled (duplicates are a hot path)."""
    if logger.isEnabledFor(level):
        emit(level, event, {
            "fingerprint": req.fingerprint,
            "task": req.task_name,
            "task_id": req.task_id,
            "processor": req.processor_id,
            **extra,
        })  # fmt: skip


def _text(value: Any) -> str:
    """A field's value in the line: as it is, or quoted (JSON) when it holds a space, a
    quote, ``=``, nothing, or a character that does not print (logfmt parsers split
    there)."""
    text = str(value)
    plain = text and text.isprintable() and not any(c in text for c in ' "=')
    return text if plain else encodable(json.dumps(text, ensure_ascii=False))


def emit(
    level: int, event: str, values: dict[str, Any], note: str | None = None, exc_info: bool = False
) -> None:
    """The one shape of the package's log lines: ``event key=value … [note=…]`` (a value
    quoted when it must be; ``note`` last, to the end of the line: the package's own
    text, never a caller's), the fields also on the record (``record.grousset``,
    ``record.grousset_<field>``). Every line the package logs about a call goes through
    here: a value with a newline cannot forge a line."""
    values = {k: v for k, v in values.items() if v is not None}
    fields = " ".join(f"{k}={_text(v)}" for k, v in values.items())
    if note is not None:
        fields += f" note={note}"
    record_extra = {f"grousset_{k}": v for k, v in values.items()}
    record_extra["grousset_event"] = event
    record_extra["grousset"] = {"event": event, **values}
    # the event in the template: tools that group by it (Sentry) keep events apart
    logger.log(level, f"{event} %s", fields, extra=record_extra, exc_info=exc_info)


def error_text(exc: BaseException) -> str:
    """An exception for a line's ``error`` field: its type and redacted text (a driver's
    text may quote a DSN), cut to 300 characters."""
    return error_summary(exc, 300)


def claimed(req: ClaimRequest, res: ClaimResult, seconds: float) -> None:
    if recorder is not None:
        recorder.claim(req.task_name, res.kind.value, seconds)


def decided(req: ClaimRequest, res: ClaimResult, seconds: float) -> None:
    """A claim's decision, acted on: counted, and a takeover or a give-up reported."""
    claimed(req, res, seconds)
    if res.kind is Kind.TAKEOVER:
        taken_over(req, res)
    elif res.kind is Kind.GAVE_UP:
        gave_up(req, res)


#: what a duplicate returned: the memoized value, or the memoized failure raised again
_REPLAYED = {Kind.COMPLETED: "completed", Kind.FAILED: "failed"}


def duplicate(req: ClaimRequest, res: ClaimResult, delivery: str = "") -> None:
    _log(
        logging.INFO,
        "grousset.duplicate_skipped",
        req,
        original_task_id=res.task_id,
        completed_at=res.completed_at.isoformat() if res.completed_at else None,
        deliveries=res.deliveries,
        outcome=_REPLAYED[res.kind],
        delivery=delivery or None,
    )
    signals.duplicate_skipped.send(
        sender=req.task_name,
        fingerprint=req.fingerprint,
        task_id=req.task_id,
        processor_id=req.processor_id,
        original_task_id=res.task_id,
        completed_at=res.completed_at,
        deliveries=res.deliveries,
        outcome=_REPLAYED[res.kind],
    )


def canvas_stopped(req: ClaimRequest, steps: int, callbacks: int, first: str | None) -> None:
    """A duplicate with no memo did not send its chain's next step and callbacks: INFO
    for a copy of the first delivery's message (which sent them), a WARNING for another
    publish of the call (its own canvas stops here)."""
    own = bool(first) and first == req.task_id
    _log(logging.INFO if own else logging.WARNING, "grousset.canvas_stopped", req,
         chain=steps, callbacks=callbacks, first_task_id=first or "",
         reason="memoize=False: no value to pass on")  # fmt: skip


def in_flight(req: ClaimRequest, res: ClaimResult, action: str) -> None:
    _log(
        logging.INFO,
        "grousset.in_flight",
        req,
        holder_task_id=res.task_id,
        stale_in=round(res.retry_in, 3),
        action=action,
    )


def taken_over(req: ClaimRequest, res: ClaimResult) -> None:
    _log(
        logging.WARNING,
        "grousset.claim_taken_over",
        req,
        fence=res.fence,
        takeovers=res.takeovers,
        max_processing_time=req.max_processing_time,
    )
    signals.claim_taken_over.send(
        sender=req.task_name,
        fingerprint=req.fingerprint,
        task_id=req.task_id,
        processor_id=req.processor_id,
        fence=res.fence,
        takeovers=res.takeovers,
    )


def overran(req: ClaimRequest, seconds: float) -> None:
    """An owned attempt's body ran longer than its ``max_processing_time`` and its outcome
    was still written (no delivery came meanwhile to take the claim over): the effect ran
    once, but a duplicate in that window would have run it a second time."""
    if recorder is not None:
        recorder.overran(req.task_name)
    if logger.isEnabledFor(logging.WARNING):
        emit(logging.WARNING, "grousset.overran", {
            "fingerprint": req.fingerprint,
            "task": req.task_name,
            "task_id": req.task_id,
            "processor": req.processor_id,
            "seconds": round(seconds, 3),
            "max_processing_time": req.max_processing_time,
        }, note="a duplicate delivered after max_processing_time would have taken the claim "
           "over and run the effect again: raise max_processing_time above the task's "
           "longest run, or set a hard time_limit below it")  # fmt: skip


def poison_delivery(req: ClaimRequest, reason: str) -> None:
    """A call the journal can never record (``req``'s text already bounded for the line):
    rejected, never re-queued — counted, so an alert can see what no retry will mend."""
    _log(logging.ERROR, "grousset.poison_delivery", req, reason=reason, action="not retried")
    if recorder is not None:
        recorder.counted(req.task_name, "poison")


def interrupted(req: ClaimRequest, exc: BaseException, last_write: bool = False) -> None:
    """The process was stopped (``SystemExit``: a pool child's SIGTERM, a hard time
    limit, ``revoke(terminate=True)``; ``KeyboardInterrupt``; or any other exception that
    is no ``Exception``: ``asyncio.CancelledError``) while the effect ran: the
    claim is left in flight, for a takeover once stale — the effect may have happened.
    ``last_write``: stopped as its outcome was written, which is sent once more before
    the process goes (Store.write_before_exit logs it when that fails)."""
    _log(logging.WARNING, "grousset.interrupted", req, error=type(exc).__name__,
         action="outcome sent once more before exit" if last_write else
         "claim left in flight until max_processing_time")  # fmt: skip


def retry_not_raised(task: str, task_id: object) -> None:
    """A guarded attempt called ``retry(throw=False)``: it goes on and completes, so its
    retry, the same call when its arguments are the same, is answered from its memo."""
    emit(logging.WARNING, "grousset.retry_not_raised", {"task": task, "task_id": task_id}, note=(
        "retry(throw=False) in a guarded task: this attempt completes, and its retry, with "
        "the same arguments the same call, is answered from its memo and does not run the "
        "body again. Raise the retry (raise self.retry(...)) to run the call again"))


def gave_up(req: ClaimRequest, res: ClaimResult) -> None:
    _log(
        logging.ERROR,
        "grousset.gave_up",
        req,
        takeovers=res.takeovers,
    )


def fenced(req: ClaimRequest, fence: int) -> None:
    _log(
        logging.ERROR,
        "grousset.fenced_out",
        req,
        fence=fence,
    )
    if recorder is not None:
        recorder.counted(req.task_name, "fenced_out")
    signals.fenced_out.send(
        sender=req.task_name,
        fingerprint=req.fingerprint,
        task_id=req.task_id,
        processor_id=req.processor_id,
        fence=fence,
    )


def lost_claim(req: ClaimRequest, released: bool) -> None:
    """A delivery settled the claim a previous delivery sent without getting its answer:
    ``released`` True when it had committed (it is freed): WARNING; False when it had
    not (it never reached the database, as in every outage): INFO."""
    _log(logging.WARNING if released else logging.INFO, "grousset.lost_claim", req,
         committed=released, action="released" if released else "none")  # fmt: skip


def transaction_lost(req: ClaimRequest, committed: bool) -> None:
    """A transactional attempt's connection broke before its commit was confirmed.
    ``committed``: the journal shows the commit landed (the call returns its value);
    else the delivery is requeued (the claim released: the next one runs it)."""
    _log(logging.WARNING, "grousset.transaction_lost", req, committed=committed,
         action="completed" if committed else "requeued")  # fmt: skip


def callback_failed(req: ClaimRequest, exc: BaseException) -> None:
    """A transactional attempt committed, then an ``on_commit`` callback its body
    registered raised: the task reports that error, the call stays completed."""
    _log(logging.ERROR, "grousset.on_commit_failed", req, error=error_text(exc),
         committed=True, action="the task fails with the callback's error")  # fmt: skip


def outcome_carried(req: ClaimRequest, status: str) -> None:
    """The completion of an attempt whose effect ran could not be written: its delivery
    is requeued carrying the outcome (``status``), for the next delivery to write."""
    _log(logging.ERROR, "grousset.outcome_carried", req, status=status,
         action="requeued with its outcome")  # fmt: skip


def store_error(
    req: ClaimRequest, operation: str, exc: BaseException, retried: bool = False,
    action: str | None = None,
) -> None:
    """The journal did not take ``operation`` (``claim``, ``complete``, ``fail``,
    ``release``): ERROR, counted; ``retried``: this try of an operation that is tried
    again at once (a completion's), a WARNING only; ``action``: what is done instead."""
    _log(
        logging.WARNING if retried else logging.ERROR,
        "grousset.store_unavailable",
        req,
        operation=operation,
        error=redacted_text(str(exc), 300),  # a driver's text may quote a DSN
        action="tried again" if retried else action,
    )
    if recorder is None or retried:
        return
    if operation == "claim":
        recorder.counted(req.task_name, "store_unavailable")
    else:
        recorder.commit_error(req.task_name)


def bypassed(task_name: str, task_id: str) -> None:
    emit(logging.WARNING, "grousset.BYPASS", {"task": task_name, "task_id": task_id},
         note="GROUSSET BYPASS is on: this task ran UNGUARDED (no dedup, no journal)")  # fmt: skip


def finished(req: ClaimRequest, outcome: str, seconds: float) -> None:
    """An owned attempt's completion write ended: ``outcome`` is one of
    ``metrics.COMPLETION_OUTCOMES``; ``seconds`` is how long the write took."""
    if recorder is not None:
        recorder.finished(req.task_name, outcome, seconds)


def result_not_stored(req: ClaimRequest, why: str) -> None:
    """A completed attempt's return value is not memoized (it cannot be encoded, or is
    over max_result_bytes): the effect ran once; a duplicate gets ``ResultNotStored``."""
    _log(logging.WARNING, "grousset.result_not_stored", req, error=why)


def payload_mismatch(req: ClaimRequest, res: ClaimResult) -> None:
    """A keyed call came with other arguments than the record's: refused, not run."""
    _log(
        logging.ERROR,
        "grousset.payload_mismatch",
        req,
        kind=res.kind.value,
        original_task_id=res.task_id,
        stored_payload=res.payload_hash[:16],
        given_payload=req.payload_hash[:16],
    )


def publish_payload_mismatch(
    task_name: str, processor_id: str, fingerprint: str, stored: str, given: str
) -> None:
    """``publish_unique`` met a keyed call with other arguments than its record's (or an
    earlier call's in the batch): published, not skipped, for the worker to refuse."""
    if logger.isEnabledFor(logging.WARNING):
        emit(logging.WARNING, "grousset.publish_payload_mismatch", {
            "fingerprint": fingerprint,
            "task": task_name,
            "processor": processor_id,
            "stored_payload": stored[:16],
            "given_payload": given[:16],
        })  # fmt: skip
