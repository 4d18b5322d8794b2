"""What a task's request says about its delivery: the broker's delivery info (for the
duplicate log line) and whether it is an in-flight requeue of a delivery the journal has
already counted (docs/operations.md, "Deliveries, duplicates and redeliveries")."""

from __future__ import annotations

import contextlib
from typing import Any

from celery_grousset.exceptions import PoisonDelivery, PoisonRejected

#: the header every requeue carries: how many times this delivery was requeued
REQUEUES_HEADER = "grousset_requeues"
#: the header an in-flight requeue adds: the journal counted this delivery (its claim
#: committed); a requeue after a store outage does not add it (nothing was counted)
COUNTED_HEADER = "grousset_counted"


def header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        headers = getattr(request, "headers", None) or {}
        value = headers.get(name)
    return value


def delivery_fields(request: Any) -> dict[str, Any]:
    """``guard.Call``'s ``delivery`` and ``bounce`` for ``request`` (None: no request)."""
    if request is None:
        return {}
    info = getattr(request, "delivery_info", None) or {}
    text = ",".join(
        f"{k}:{info[k]}" for k in ("exchange", "routing_key", "redelivered")
        if info.get(k) not in (None, "")
    )  # fmt: skip
    return {"delivery": text, "bounce": bool(header(request, COUNTED_HEADER))}


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
