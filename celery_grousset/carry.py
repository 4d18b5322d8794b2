"""An outcome the journal could not take, carried by the requeued delivery
(docs/how-it-works.md, "Completion"; docs/guarantee.md).

The effect ran, and its fenced completion could not be written: the database stayed
unreachable through every try of :func:`~celery_grousset.completion.finish_retrying`.
The outcome is not dropped and the effect never runs again for it: a task requeues
its delivery with the encoded outcome and the claim's token in the message header
:data:`HEADER`. The next delivery of that message writes the carried outcome with the
same token — the same fenced compare-and-set as the first try, idempotent when
re-sent — and answers with it, without claiming and without running the effect.

If the claim was taken over meanwhile (the database stayed away past its
``stale_at`` and another delivery took the row), the write matches nothing: the
carried outcome is dropped and the delivery raises :class:`FencedOut`, exactly like
an attempt fenced out at its completion; the new owner's row is left alone.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import time
from collections.abc import Collection
from typing import Any, NoReturn

from celery_grousset import events, memo
from celery_grousset.claim import ENC_NOT_STORED, ClaimRequest, Status
from celery_grousset.completion import Unwritten, complete
from celery_grousset.exceptions import FencedOut, StoreUnavailable, TransactionLost
from celery_grousset.store import Completion, Store, turns

#: the message header of a requeued delivery that carries its attempt's outcome
HEADER = "grousset_outcome"
#: the shortest countdown of a requeue that carries an outcome (no hot loop near stale)
MIN_COUNTDOWN = 0.5
#: transactions of one delivery whose connection broke before they committed, in a row,
#: after which it fails instead of being sent again (docs/how-it-works.md, "Completion")
MAX_DROPPED = 5
#: the largest memo carried in a header (a header has to fit in one broker frame); a
#: larger one is carried as "result not stored": the effect still never runs again
MAX_CARRIED_BYTES = 64 * 1024


def outcome(
    req: ClaimRequest, completion: Completion, stale_by: float | None = None
) -> dict[str, Any]:
    """The header value that carries ``completion`` of the claim ``req`` (JSON-safe);
    ``stale_by``: when the claim turns stale (Unix time), which the requeue must beat."""
    result, enc, error = completion.result, completion.result_encoding, completion.error
    if result is not None and len(result) > MAX_CARRIED_BYTES:
        error = memo.redacted_text(
            f"result not stored: the completion write failed and the {len(result)}-byte "
            f"memo is larger than the {MAX_CARRIED_BYTES} bytes a requeued delivery carries"
        )
        result, enc = None, ENC_NOT_STORED
    return {
        "fingerprint": req.fingerprint,
        "processor_id": req.processor_id,
        "token": req.token,
        "status": completion.status,
        "result": base64.b64encode(result).decode("ascii") if result is not None else None,
        "encoding": enc,
        "error": error,
        "stale_by": stale_by,
    }


def ran(value: object) -> bool:
    """Whether a carried header value is an outcome (the effect ran), not a lost claim."""
    return isinstance(value, dict) and value.get("status") in (
        Status.COMPLETED.value, Status.FAILED.value)  # fmt: skip


def stale_by(caller: Any) -> float | None:
    """When the claim whose outcome this delivery carries turns stale (Unix time)."""
    value = getattr(caller, "carried", None)
    return _stale_by(value) if isinstance(value, dict) else None


def _stale_by(outcome: dict[str, Any]) -> float | None:
    """The carried outcome's ``stale_by`` header: a Unix time, or None (absent, or not a
    number: an outcome from an earlier version, or a damaged one)."""
    by = outcome.get("stale_by")
    return float(by) if isinstance(by, (int, float)) and not isinstance(by, bool) else None


def countdown(outcome: dict[str, Any], backoff: float) -> float:
    """The requeue's countdown: ``backoff``, but at most half the time left before the
    claim turns stale, so that the carried outcome arrives while the claim is still
    its own — past ``stale_at`` another delivery may take the claim over and run the
    effect again (a journal outage shorter than ``max_processing_time`` must not)."""
    left = time_left(outcome)
    if left is None:  # unknown, or already stale: no race left to win, no reason to hurry
        return backoff
    return min(backoff, max(left / 2, MIN_COUNTDOWN))


def time_left(outcome: dict[str, Any] | None) -> float | None:
    """Seconds until the claim whose outcome is carried turns stale (None: unknown, or
    already stale)."""
    by = _stale_by(outcome) if isinstance(outcome, dict) else None
    left = by - time.time() if by is not None else 0.0
    return left if left > 0 else None


def hook(caller: Any, req: ClaimRequest, stale: float | None = None) -> Unwritten | None:
    """What to do when the completion of ``req`` cannot be written: the caller's
    optional ``carry(outcome, exc)`` (a task requeues its delivery with it, before
    ``stale``: when the claim turns stale, Unix time); None (``protect()``, eager and
    direct calls): StoreUnavailable is raised."""
    requeue = getattr(caller, "carry", None)
    if requeue is None or getattr(caller, "local", False):  # (nothing requeues a local call)
        return None

    def unwritten(completion: Completion, exc: StoreUnavailable) -> NoReturn:
        events.outcome_carried(req, completion.status)
        requeue(outcome(req, completion, stale), exc)
        raise exc  # pragma: no cover - requeue never returns

    return unwritten


def lost_claim(req: ClaimRequest, dropped: int = 0) -> dict[str, Any]:
    """The header value of a claim whose answer was lost (sent, then the connection
    failed): it may or may not have committed, and the next delivery finds out.
    ``dropped``: this call's transactions dropped in a row so far (:func:`dropped`)."""
    value = {
        "fingerprint": req.fingerprint,
        "processor_id": req.processor_id,
        "token": req.token,
        "status": Status.IN_FLIGHT.value,
    }
    return {**value, "dropped": dropped} if dropped else value


def _for(value: object, req: ClaimRequest) -> bool:
    """Whether a carried header value is for ``req``'s key."""
    key = (req.fingerprint, req.processor_id)
    return isinstance(value, dict) and (value.get("fingerprint"), value.get("processor_id")) == key


def dropped(caller: Any, req: ClaimRequest, exc: StoreUnavailable) -> int:
    """How many transactions of this delivery, ``exc``'s included, broke before they
    committed, in a row (0: ``exc`` is no such loss). At :data:`MAX_DROPPED` the
    delivery is not sent again: a server's or proxy's idle timeout shorter than the
    transaction would end every attempt the same way. Raises TransactionLost then."""
    if not getattr(exc, "dropped", False):
        return 0
    value = getattr(caller, "carried", None)
    before = value.get("dropped") if _for(value, req) else 0  # type: ignore[union-attr]
    n = (before if type(before) is int else 0) + 1
    if n < MAX_DROPPED:
        return n
    raise TransactionLost(
        f"{req.task_name}: the connection to the journal database broke inside this call's "
        f"transaction {n} times in a row, before it committed ({exc.__cause__}): the "
        "delivery fails instead of being sent again. The transaction likely outlives an "
        "idle limit of the server or of a proxy in between (MySQL/MariaDB wait_timeout "
        "or idle_transaction_timeout, a pooler's or load balancer's idle timeout): keep "
        "slow work (HTTP calls, sleeps) out of the transaction, or raise that limit. "
        "Nothing of it committed, and the claim is released.", dropped=True
    ) from exc


def pending(
    caller: Any, req: ClaimRequest
) -> tuple[ClaimRequest, Completion | None] | None:
    """What this delivery carries for ``req``'s key (the caller's optional ``carried``):
    the request of the claim it came from, with that claim's outcome (None: the claim's
    answer was lost). None when it carries nothing (or nothing for this key)."""
    value = getattr(caller, "carried", None)
    if not isinstance(value, dict):
        return None
    try:
        token, status = str(value["token"]), str(value["status"])
        if not _for(value, req) or not token:
            return None
        if status == Status.IN_FLIGHT.value:
            return dataclasses.replace(req, token=token), None
        raw = value["result"]
        result = base64.b64decode(raw, validate=True) if raw is not None else None
        enc, error = str(value["encoding"]), str(value["error"])
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None
    if not ran(value):
        return None
    return dataclasses.replace(req, token=token), Completion(status, result, enc, error)


def settle_lost_claim(store: Store, lost: ClaimRequest) -> None:
    """Free the claim whose answer a previous delivery lost, if it committed: nothing
    ran under it (that delivery was requeued without running the effect), and only
    this token's in-flight claim can match, so a claim made since is never touched.
    The delivery then claims as usual, at once, instead of waiting until the lost
    claim turns stale."""
    try:
        released = turns.claiming(store.release, lost.processor_id, lost.fingerprint,
                                  lost.token)  # (before the effect: its turn bounded)
    except StoreUnavailable as exc:  # the journal still away: said and counted as a
        events.store_error(lost, "claim", exc)  # claim's, which this delivery's would be
        raise
    events.lost_claim(lost, released)


def claim_unavailable(
    caller: Any, unsettled: ClaimRequest | None, exc: StoreUnavailable
) -> NoReturn:
    """The claim failed with the store unavailable: it may have committed without its
    answer reaching us (``unsettled``; None: a local database, nothing can be lost). A
    task requeues its delivery carrying the claim's token (:func:`lost_claim`; the next
    delivery settles it); other callers fail closed."""
    requeue = getattr(caller, "carry", None)
    if requeue is not None and unsettled is not None:
        requeue(lost_claim(unsettled, dropped(caller, unsettled, exc)), exc)
    caller.store_unavailable(exc)
    raise exc  # pragma: no cover - store_unavailable never returns


def claim_interrupted(
    caller: Any, store: Store, req: ClaimRequest, unsettled: ClaimRequest | None,
    exc: BaseException,
) -> NoReturn:
    """The claim interrupted by the task's soft time limit before the database answered:
    its statement may commit yet, so it is handled as a lost answer
    (:func:`claim_unavailable`). A caller in this process (``protect()`` in a body) sees
    its own time limit. The store's connection, mid-statement, is never used again."""
    from celery_grousset.store import refusals

    store.discard()
    if getattr(caller, "local", False):
        raise exc
    events.store_error(req, "claim", lost := refusals.interrupted(store.alias, exc))
    claim_unavailable(caller, unsettled, lost)


def deliver(
    caller: Any, store: Store, req: ClaimRequest, carried: ClaimRequest,
    completion: Completion, accept: Collection[str],
) -> Any:
    """Write a carried outcome with its claim's token (``carried``), then answer with it
    (the effect is not run). Still unwritable: requeue again, still carrying it (the
    caller's :func:`hook`). The claim taken over meanwhile: :class:`FencedOut`. With no
    memo, its canvas stops (the caller's ``stop_canvas``: the attempt that ran the
    effect was requeued, and sent none)."""
    if not complete(store, carried, completion, 0, hook(caller, carried, stale_by(caller))):
        raise FencedOut(
            f"{carried.task_name}: the outcome this delivery carried for "
            f"{carried.fingerprint[:16]}… was not written: its claim was taken over while "
            "the journal was unreachable (the new owner's record stands)."
        )
    if hasattr(caller, "stop_canvas"):
        caller.stop_canvas(req, completion.result_encoding, None)
    return memo.decode(
        completion.result, completion.result_encoding, completion.error, carried.fingerprint,
        accept=accept,
    )  # fmt: skip
