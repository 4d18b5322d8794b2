"""The guarantee page: a payment passes its fingerprint to the provider."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from celery_grousset import GroussetTask


class FakeProvider:
    """Stands in for a payment API that deduplicates on an idempotency key."""

    def __init__(self) -> None:
        self.charges: dict[str, str] = {}
        self.calls = 0

    def charge(self, amount_cents: int, *, idempotency_key: str) -> str:
        self.calls += 1
        if idempotency_key not in self.charges:
            self.charges[idempotency_key] = f"ch_{len(self.charges) + 1}"
        return self.charges[idempotency_key]


provider = FakeProvider()


# --8<-- [start:charge]
@shared_task(base=GroussetTask, bind=True, max_processing_time=120, grousset_key=("order_id",))
def charge(self: Any, order_id: int, amount_cents: int) -> str:
    # If this worker dies after the provider charged but before the completion
    # commits, the call runs again after max_processing_time: the provider sees
    # the same key and returns the first charge instead of charging twice.
    return provider.charge(amount_cents, idempotency_key=self.grousset.fingerprint)
# --8<-- [end:charge]
