"""What a task's request says about its delivery: the broker's delivery info (for the
duplicate log line) and whether it is an in-flight requeue of a delivery the journal has
already counted (docs/operations.md, "Deliveries, duplicates and redeliveries")."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import re
import time
from typing import Any

from celery_grousset.claim import ENC_NOT_MEMOIZED
from celery_grousset.exceptions import PoisonDelivery, PoisonRejected, ResultNotStored

logger = logging.getLogger("celery_grousset")

#: the header that carries a call's idempotency key (``apply_async(idempotency_key=…)``)
KEY_HEADER = "grousset_key"
#: the header every requeue carries: how many times this delivery was requeued
REQUEUES_HEADER = "grousset_requeues"
#: the header an in-flight requeue adds: the journal counted this delivery (its claim
#: committed); a requeue after a store outage does not add it (nothing was counted)
COUNTED_HEADER = "grousset_counted"
#: the header a Celery retry's message carries (``self.retry(kwargs=…)``): ``[task id,
#: the fingerprint of the call it retries, its own arguments' fingerprint]``: it stays
#: that call (:func:`retry_of`)
RETRY_OF_HEADER = "grousset_retry_of"
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")


def header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        headers = getattr(request, "headers", None) or {}
        value = headers.get(name)
    return value


#: a delivery field's name -> whether it reads like :data:`KEY_HEADER` without being it
_JUDGED: dict[str, bool] = {}


def misspelt_key(name: object) -> bool:
    """Whether a header ``name`` reads like the key's (``idempotency_key``, a
    ``grousset-key``) without being :data:`KEY_HEADER`: nothing reads it."""
    judged = _JUDGED.get(name) if isinstance(name, str) else None
    if judged is None:
        from celery_grousset.options import reads_like

        norm = str(name).lower().replace("-", "_")
        close = norm.replace("_", "") in ("idempotencykey", "groussetkey") or reads_like(
            norm, (KEY_HEADER, "idempotency_key"))  # not an `idempotent` flag  # fmt: skip
        judged = name != KEY_HEADER and bool(close)
        if isinstance(name, str) and len(_JUDGED) < 4096:  # a bound: names are few
            _JUDGED[name] = judged
    return judged


def key_of(request: Any) -> Any:
    """The idempotency key a delivery carries (its :data:`KEY_HEADER`); None: none. A
    delivery without one whose headers hold a name that reads like it (a producer's
    ``app.send_task(headers={"idempotency_key": …})``) is refused with a
    ``FingerprintError``: keyed by all its arguments instead, it would run again for
    every other argument. Its body does not run; the task fails, naming the header."""
    value = header(request, KEY_HEADER)
    if value is not None or request is None:
        return value
    fields = getattr(request, "headers", None)  # Celery's Context: the custom ones only
    if fields is None and not hasattr(type(request), "_get_custom_headers"):
        fields = getattr(request, "__dict__", None)  # a Celery without that split
    if not isinstance(fields, dict):
        return None
    for name, value in fields.items():
        if misspelt_key(name) and isinstance(value, str):
            from celery_grousset.exceptions import FingerprintError

            raise FingerprintError(
                f"the delivery's header {str(name)[:100]!r} is not read: the key of a call "
                f"travels in the header {KEY_HEADER!r} (app.send_task(headers={{"
                f"{KEY_HEADER!r}: …}}), or idempotency_key=… to apply_async()). Refused "
                "rather than keyed by its arguments: it did not run."
            )
    return None


def retry_of(request: Any) -> tuple[str, str] | None:
    """``(the fingerprint of the call a Celery retry retries, the fingerprint the retry's
    own arguments give)`` when ``request`` carries a retry's mark for its own task id
    (a header copied onto another task's message is ignored); None otherwise. The guard
    takes the first only when its arguments give the second: a message of the same task
    id with other arguments (user code re-sending through ``signature_from_request``) is
    not that retry."""
    value = header(request, RETRY_OF_HEADER)
    if not (isinstance(value, (list, tuple)) and len(value) == 3):
        return None
    task_id, retried, own = value
    same = request is not None and str(task_id) == str(getattr(request, "id", None))
    ok = same and all(_FINGERPRINT.fullmatch(str(fp)) for fp in (retried, own))
    return (str(retried), str(own)) if ok else None


#: headers the broker wrote on the message delivered, never carried by a copy sent again:
#: RabbitMQ's dead-letter history (as Celery's own retry drops it) — with it, a copy
#: delayed through a delay queue it had passed before was a dead-letter cycle, stuck in
#: the broker — and a quorum queue's delivery count of the message it was
_BROKER_HEADERS = ("x-death", "x-first-death-", "x-last-death-", "x-delivery-count")


def carried_headers(request: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """The headers a delivery sent again carries: its own (not the broker's), the
    package's, then ``extra``."""
    from celery_grousset.periodic import SLOT_HEADER

    headers = {name: value for name, value in (getattr(request, "headers", None) or {}).items()
               if not (isinstance(name, str) and name.lower().startswith(_BROKER_HEADERS))}
    for name in (KEY_HEADER, SLOT_HEADER, COUNTED_HEADER, RETRY_OF_HEADER):
        if (value := header(request, name)) is not None:
            headers[name] = value
    return {**headers, **extra}


def delivery_fields(request: Any) -> dict[str, Any]:
    """``guard.Call``'s ``delivery``, ``bounce`` and ``retry_of`` for ``request`` (None:
    no request)."""
    if request is None:
        return {}
    info = getattr(request, "delivery_info", None) or {}
    text = ",".join(
        f"{k}:{info[k]}" for k in ("exchange", "routing_key", "redelivered")
        if info.get(k) not in (None, "")
    )  # fmt: skip
    return {"delivery": text, "bounce": bool(header(request, COUNTED_HEADER)),
            "retry_of": retry_of(request)}


def rejected(task: Any, request: Any, exc: PoisonDelivery) -> PoisonRejected:
    """What a task raises for a poison delivery: a Reject without requeue that is also
    the PoisonDelivery, stored as the task's failure first (Celery before 5.7 stores no
    result for a Reject: the caller's ``get()`` would wait forever)."""
    reject = PoisonRejected(str(exc))
    with contextlib.suppress(Exception):  # a backend that cannot store it: Celery logs
        task.backend.mark_as_failure(
            request.id, reject, request=request,
            store_result=task.store_errors_even_if_ignored or not task.ignore_result,
        )  # fmt: skip
    return reject


#: the longest an in-flight requeue waits: a message a worker holds unacknowledged (an
#: ETA) for longer than RabbitMQ's consumer_timeout (30 min) closes its channel
IN_FLIGHT_BACKOFF_MAX = 60.0


def in_flight_countdown(request: Any, retry_in: float) -> float:
    """An in-flight requeue's delay: 0.25 s, 0.5 s, 1 s… by the delivery's requeues, up to
    :data:`IN_FLIGHT_BACKOFF_MAX`, jittered (times 0.5 to 1), never past the moment the
    claim turns stale (``retry_in``, on the database clock): a redelivery arrives in time
    to take over."""
    n = min(int(header(request, REQUEUES_HEADER) or 0), 16)
    backoff = min(0.25 * 2.0**n, IN_FLIGHT_BACKOFF_MAX) * random.uniform(0.5, 1.0)
    return max(0.0, min(backoff, retry_in))


def wait_within(task: Any, request: Any) -> float | None:
    """Seconds a delivery may wait for another attempt (``on_in_flight="wait"``): half of
    its shortest time limit (its own, the task's or the app's), so that a wait that
    outlasts it requeues instead of being killed waiting (nothing would then take the
    claim over when it turns stale). None: no time limit."""
    conf = task.app.conf
    limits = [*(getattr(request, "timelimit", None) or ()), getattr(task, "time_limit", None),
              getattr(task, "soft_time_limit", None), conf.task_time_limit,
              conf.task_soft_time_limit]  # fmt: skip
    positive = [float(v) for v in limits if isinstance(v, (int, float)) and v > 0]
    return min(positive) / 2 if positive else None


def store_countdown(request: Any) -> float:
    """A requeue's delay after a journal outage: ``STORE_RETRY_BACKOFF`` doubling by the
    delivery's requeues up to ``STORE_RETRY_BACKOFF_MAX``, jittered (times 0.5 to 1)."""
    from celery_grousset.conf import grousset_settings

    n = min(int(header(request, REQUEUES_HEADER) or 0), 64)  # 2.0**1024 overflows
    base = float(grousset_settings.STORE_RETRY_BACKOFF)
    cap = float(grousset_settings.STORE_RETRY_BACKOFF_MAX)
    return min(base * 2.0**n, cap) * random.uniform(0.5, 1.0)


def broker_countdown(app: Any, countdown: float, latest: float | None = None) -> float:
    """``countdown`` as the broker can delay it. Celery (5.5+) delays a message sent to a
    RabbitMQ quorum queue on a topic or fanout exchange in the broker, in whole seconds,
    and refuses a countdown under one second there ("countdown must be a positive
    number"): a requeue sooner than that would never leave. There, it is rounded up to
    whole seconds, or down (0: at once) where rounding up would pass ``latest``, the
    seconds the requeue must arrive within (a carried outcome, before its claim turns
    stale); anywhere else it is kept as it is."""
    if countdown <= 0 or countdown == int(countdown):
        return countdown
    try:
        from celery.utils.quorum_queues import detect_quorum_queues

        driver = app.producer_pool.connections.connection.transport.driver_type
        quorum = bool(detect_quorum_queues(app, driver)[0])
    except Exception:  # Celery < 5.5 (no native delayed delivery), or no broker yet
        return countdown
    if not quorum:
        return countdown
    up = float(math.ceil(countdown))
    return float(math.floor(countdown)) if latest is not None and up > latest else up


#: the longest a worker waits before it hands back a delivery it could not republish
#: (short: the wait runs inside the task, against its time limits)
REPUBLISH_FAILED_WAIT_MAX = 5.0
_republish_failures = [0]  # consecutive failed republishes in this process


def republish_failed(
    task_name: str, countdown: float, exc: BaseException, latest: float | None = None
) -> float:
    """A requeue's republish failed (the broker takes no message: Redis out of memory, a
    refused option): the delivery goes back to the broker (``Reject(requeue=True)``) and
    comes back at once, with the same headers. Wait first, so a broker that keeps
    refusing is not met with a hot loop: 0.5 s doubling while republishes keep failing
    in this process (jittered), at least the requeue's own ``countdown``, at most
    :data:`REPUBLISH_FAILED_WAIT_MAX` and half of ``latest`` (a carried outcome's time
    before its claim turns stale). A soft time limit ends the wait, not the hand-back.
    Returns the wait."""
    from celery.exceptions import SoftTimeLimitExceeded

    n = min(_republish_failures[0], 16)
    _republish_failures[0] += 1
    wait = max(countdown, 0.5 * 2.0**n * random.uniform(0.5, 1.0))
    wait = min(wait, REPUBLISH_FAILED_WAIT_MAX, latest / 2 if latest else math.inf)
    from celery_grousset import events

    events.emit(logging.WARNING, "grousset.requeue_failed", {
        "task": task_name, "error": events.error_text(exc), "retry_in": round(wait, 1),
        "failures": n + 1,
    }, note="could not requeue the delivery: it goes back to the broker after retry_in "
            "(failures: failed requeues in a row in this process)")  # fmt: skip
    with contextlib.suppress(SoftTimeLimitExceeded):
        time.sleep(wait)
    return wait


def republished() -> None:
    """A requeue's republish went through: the next failure waits the least again."""
    _republish_failures[0] = 0


def stop_canvas(request: Any, req: Any, encoding: str, first: str | None) -> None:
    """A duplicate of a call whose value is not memoized (``memoize=False``) returns
    ``None``: Celery would send its chain's next step and its ``link`` callbacks with
    that ``None`` — other calls, whose guarded effects would run again. They are not
    sent (docs/faq.md): a copy of the first delivery's message (its task id, ``first``)
    leads the canvas the first delivery sent on; another publish's canvas stops here
    (``first`` None: a delivery that carried its outcome, whose canvas nobody sent). A
    chord's header member raises instead: the chord fails, its body never runs on a
    ``None`` that stands for no value."""
    if encoding != ENC_NOT_MEMOIZED:
        return
    from celery_grousset import events

    chain = getattr(request, "chain", None) or ()
    if getattr(request, "chord", None) or any(  # (in a chain, the chord is its last step's)
        isinstance(step, dict) and (step.get("options") or {}).get("chord") for step in chain
    ):
        raise ResultNotStored(
            f"{req.task_name}: this call ran once, and its value is not memoized "
            f"(memoize=False): this delivery ({req.task_id}) has no value to report to its "
            "chord, which fails instead of running its body with None. Keep memoize on for "
            "a task in a chord's header (docs/faq.md, \"What about chords?\")."
        )

    steps = len(chain)
    callbacks = len(getattr(request, "callbacks", None) or ())
    if steps or callbacks:
        request.chain = request.callbacks = None
        events.canvas_stopped(req, steps, callbacks, first)


#: kombu's visibility_timeout when the transport options leave it unset
_VISIBILITY_DEFAULTS = {"redis": 3600.0, "rediss": 3600.0, "sentinel": 3600.0, "sqs": 1800.0}


def visibility_timeout(app: Any) -> float | None:
    """The broker's redelivery timeout for an unacknowledged message (Redis, SQS), else
    None."""
    url = app.conf.broker_url or ""
    if isinstance(url, (list, tuple)):  # failover URLs: the first is used first
        url = url[0] if url else ""
    scheme = str(url).split(";")[0].strip().split(":", 1)[0].split("+")[0].lower()
    if scheme not in _VISIBILITY_DEFAULTS:
        return None
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", _VISIBILITY_DEFAULTS[scheme]))
