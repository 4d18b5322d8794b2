"""What a task's request says about its delivery: the broker's delivery info (for the
duplicate log line) and whether it is an in-flight requeue of a delivery the journal has
already counted (docs/operations.md, "Deliveries, duplicates and redeliveries")."""

from __future__ import annotations

from typing import Any

#: the header an in-flight requeue carries: how many times this delivery was requeued
REQUEUES_HEADER = "grousset_requeues"


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
    return {"delivery": text, "bounce": bool(header(request, REQUEUES_HEADER))}
