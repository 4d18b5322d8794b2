"""A claim made for a delivery by the worker's main process, as the pool child sees it
(``WORKER_CLAIM``, docs/performance.md "Claiming in the worker's main process").

The main process claims a guarded request before handing it to the pool and puts the
claim in the request (:func:`carry`: ``request_dict[FIELD]``, read back in the child as
``self.request.grousset_claim``). The child then skips its own claim
(:func:`adopt`): it runs the body under that claim's token and fence and writes the
fenced completion as on the per-task path. A child that starts more than
``WORKER_CLAIM_RENEW_AFTER`` after the claim renews it first, by a compare-and-set on
its token; when the renewal fails another attempt owns the key (or settled it), and the
delivery is decided by an ordinary claim with the same token instead: the body runs
only if that claim owns the key.

Without the field (the switch is off, the main process could not claim it) the child
claims as before.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from celery_grousset import events
from celery_grousset.claim import ClaimRequest, Kind, Status
from celery_grousset.conf import grousset_settings
from celery_grousset.store import ClaimResult, Store

#: the request field (``request_dict`` key) that carries a main-process claim
FIELD = "grousset_claim"
#: the share of ``max_processing_time`` after which a pre-made claim is renewed, when
#: ``WORKER_CLAIM_RENEW_AFTER`` is not set
RENEW_SHARE = 0.1
#: the most of ``max_processing_time`` a pre-made claim may age unrenewed: a larger
#: ``WORKER_CLAIM_RENEW_AFTER`` is taken as this (a child starting later would run under
#: a claim another delivery may have taken over already)
MAX_RENEW_SHARE = 0.5


def carry(
    request_dict: dict[str, Any], req: ClaimRequest, res: ClaimResult, claimed_at: float
) -> None:
    """Put an owned claim in a request before the pool gets it (plain values only: the
    request is pickled to the child), stamped with the delivery it is for, and with when
    the claim was sent (``claimed_at``) on the monotonic clock the child on this host
    shares (a wall clock's step back, by NTP or a restored VM, would make a late start
    look early and skip its renewal)."""
    request_dict[FIELD] = [
        req.token, res.fence, res.kind.value, res.deliveries, res.takeovers,
        req.processor_id, req.fingerprint, claimed_at, _stamp(request_dict),
    ]  # fmt: skip


def _stamp(request: Any) -> str:
    """Which delivery of a message this is: its ``retries`` and requeues. A copy sent
    again (``retry()``, a requeue) has other counts, so a claim it carries in its headers
    from the delivery before (released, or lost) is never taken for its own."""
    from celery_grousset.delivery import REQUEUES_HEADER

    return f"{_field(request, 'retries') or 0}:{_field(request, REQUEUES_HEADER) or 0}"


def _field(request: Any, name: str) -> Any:
    """A field of the main process's ``request_dict`` or of the child's request."""
    from celery_grousset.delivery import header

    if not isinstance(request, dict):
        return header(request, name)
    value = request.get(name)
    return value if value is not None else (request.get("headers") or {}).get(name)


def carried(request: Any) -> Sequence[Any] | None:
    """The claim made for this delivery of ``request`` (None: none, or one that came in
    the headers of a copy sent again)."""
    value = getattr(request, FIELD, None) if request is not None else None
    if not (isinstance(value, (list, tuple)) and len(value) == 9):
        return None
    return value[:8] if value[8] == _stamp(request) else None


#: the request field that carries a settled key's decision, made by the main process's
#: claim and not acted on there (:func:`carry_decided`)
DECIDED = "grousset_decided"
#: the decisions a child may take from the main process: a settled key (a memo the main
#: process did not answer itself, a memoized failure, a give-up, another call's record)
SETTLED = frozenset({Kind.COMPLETED, Kind.FAILED, Kind.GAVE_UP, Kind.MISMATCH})


def carry_decided(
    request_dict: dict[str, Any], req: ClaimRequest, res: ClaimResult, seconds: float | None
) -> None:
    """Put a settled key's decision in a request the main process hands to the pool
    unanswered (a memoized failure is replayed in the child, under Celery's own failure
    path): the child acts on it instead of claiming again, which would count the
    delivery twice in the journal. ``seconds``: the claim's time, for the child to report
    the decision (None: the main process reported it, acting on another delivery)."""
    request_dict[DECIDED] = [
        req.processor_id, req.fingerprint, seconds, _stamp(request_dict), time.monotonic(),
        *dataclasses.astuple(res),
    ]  # fmt: skip


def decided(caller: Any, req: ClaimRequest) -> ClaimResult | None:
    """The decision the main process carried for this delivery of ``req``'s key (None:
    none, one that came with a copy sent again, or one older than :func:`renew_after`,
    as an owned claim is: the key may have been released since, and the child claims it
    itself); reported here, where it is acted on."""
    request = getattr(caller, "request", None)
    value = getattr(request, DECIDED, None) if request is not None else None
    if not (isinstance(value, (list, tuple)) and len(value) > 5):
        return None
    processor_id, fingerprint, seconds, stamp, at, *fields = value
    if (processor_id, fingerprint, stamp) != (req.processor_id, req.fingerprint, _stamp(request)):
        return None
    if not _fresh(time.monotonic() - float(at), req):
        return None
    res = ClaimResult(*fields)
    if seconds is not None:
        events.decided(req, res, float(seconds))
    return res


def renew_after(req: ClaimRequest) -> float:
    """Seconds after its claim from which a child renews a pre-made claim: the setting
    (default: a tenth of ``max_processing_time``), at most half of it."""
    bound = grousset_settings.WORKER_CLAIM_RENEW_AFTER
    mpt = req.max_processing_time
    return min(float(bound), mpt * MAX_RENEW_SHARE) if bound is not None else mpt * RENEW_SHARE


def _fresh(age: float, req: ClaimRequest) -> bool:
    """Whether the main process's word on a delivery, ``age`` seconds old, still holds
    in the child (a negative age: not this host's monotonic clock)."""
    return 0 <= age <= renew_after(req)


def own(caller: Any, req: ClaimRequest) -> tuple[ClaimRequest, Sequence[Any] | None]:
    """``req`` with the token of the claim the worker's main process made for this
    delivery, and that claim as carried — or ``(req, None)``: none, or not this call's
    key. A requeue before the claim is adopted (its renewal interrupted or unanswered)
    must settle the claim of that token, not of one that never claimed."""
    value = carried(getattr(caller, "request", None))
    if value is None:
        return req, None
    token, processor_id, fingerprint = value[0], value[5], value[6]
    if (processor_id, fingerprint) != (req.processor_id, req.fingerprint):
        # Not this call's key (options resolved differently in the two processes): the
        # main process's claim turns stale on its own; this call claims for itself.
        events.emit(logging.WARNING, "grousset.claim_not_adopted", {
            "fingerprint": req.fingerprint, "carried": fingerprint, "task": req.task_name,
            "task_id": req.task_id,
        })  # fmt: skip
        return req, None
    return dataclasses.replace(req, token=str(token)), value


def adopt(
    caller: Any, store: Store, req: ClaimRequest, value: Sequence[Any] | None
) -> ClaimResult | None:
    """The result of the claim this delivery carries (``value``, ``req`` holding its
    token: :func:`own`), or the settled decision it carries (:func:`decided`) — or None:
    no usable claim, or its renewal found it gone (the caller claims with ``req``'s
    token, and the decision table decides)."""
    if value is None:
        return decided(caller, req)
    _token, fence, kind, deliveries, takeovers, _p, _f, at = value
    age = time.monotonic() - float(at)
    left = req.max_processing_time - age  # until it turns stale
    if not _fresh(age, req):
        if not renew(store, req):
            return None  # taken over or settled meanwhile: the claim with its token decides
        left = req.max_processing_time
    return _result(req, Kind(kind), int(fence), int(deliveries), int(takeovers), left)


def renew(store: Store, req: ClaimRequest) -> bool:
    """Push an in-flight claim's ``stale_at`` to now + ``max_processing_time`` (database
    clock) if ``req.token`` still holds it: the compare-and-set of a late start."""
    return store.renew(req)


def _result(
    req: ClaimRequest, kind: Kind, fence: int, deliveries: int, takeovers: int, left: float
) -> ClaimResult:
    return ClaimResult(
        kind=kind, fence=fence, status=Status.IN_FLIGHT.value, deliveries=deliveries,
        takeovers=takeovers, result=None, result_encoding="", error="", task_id=req.task_id,
        started_at=None, completed_at=None, retry_in=max(0.0, left), payload_hash=req.payload_hash,
    )  # fmt: skip
