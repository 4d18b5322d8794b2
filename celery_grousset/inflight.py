"""A delivery that finds its call's claim in flight and waits for it
(``on_in_flight="wait"``, and ``protect()``, eager and direct calls)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.store import ClaimResult, Store, turns


def wait_until_settled(
    store: Store,
    req: ClaimRequest,
    res: ClaimResult,
    decide: Callable[[ClaimRequest], ClaimResult],
    within: float | None = None,
) -> ClaimResult:
    """``on_in_flight="wait"``: poll with capped backoff until the holder finishes or its
    claim turns stale, then claim again (``decide``), bounded by the holder's ``stale_at``
    and by ``within`` seconds (a task's time limit would kill it waiting: it defers). The
    claim again is a delivery already counted (its first claim was the duplicate)."""
    delay, give_up = 0.005, None if within is None else time.monotonic() + within
    again = dataclasses.replace(req, bounce=True)  # (counted: a redelivery, not a duplicate)
    while res.kind is Kind.IN_FLIGHT:
        until = time.monotonic() + res.retry_in
        stop = until if give_up is None else min(until, give_up)
        # Read-only polls (not counted as deliveries) until the record changes hands or
        # the claim turns stale (or the wait's time is up); then one claim decides.
        while time.monotonic() < stop:
            time.sleep(min(delay, max(stop - time.monotonic(), 0.001)))
            delay = min(delay * 2, 0.5)
            if not still_held(store, req, res):
                break
        res = decide(again)
        if give_up is not None and time.monotonic() >= give_up:
            break
    return res


def still_held(store: Store, req: ClaimRequest, res: ClaimResult) -> bool:
    """The wait's read-only look: the claim ``res`` saw still holds ``req``'s key (in
    flight at the same fence), so claiming again would only be counted and answered
    "in flight" again."""
    held = turns.claiming(store.holder, req.processor_id, req.fingerprint)  # (bounded turn)
    return held == ("in_flight", res.fence)
