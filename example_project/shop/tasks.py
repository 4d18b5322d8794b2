"""The shop's Celery tasks, each guarded by celery-grousset.

The docs include these functions (the ``--8<--`` markers are mkdocs snippet
regions): keep them short.
"""

from __future__ import annotations

import time

from celery import shared_task

from celery_grousset import GroussetTask
from shop.models import Booking
from shop.providers import mailer, payments


# --8<-- [start:send_receipt]
@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def send_receipt(self: GroussetTask, order_id: str, email: str) -> str:
    """Mail the receipt once; every duplicate delivery gets the same message id."""
    return mailer.send(to=email, subject=f"Receipt for order {order_id}")
# --8<-- [end:send_receipt]


# --8<-- [start:book]
@shared_task(base=GroussetTask, bind=True, max_processing_time=30, transactional=True)
def book(self: GroussetTask, order_id: str, seat: str) -> int:
    """Book a seat: the row commits in one transaction with the completion, or not at all."""
    return Booking.objects.create(order_id=order_id, seat=seat).pk
# --8<-- [end:book]


# --8<-- [start:charge]
@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def charge(self: GroussetTask, order_id: str, amount_cents: int) -> str:
    """Charge the card; the provider deduplicates by our fingerprint, takeovers included."""
    return payments.charge(
        amount_cents=amount_cents, reference=order_id, idempotency_key=self.grousset.fingerprint
    )
# --8<-- [end:charge]


# --8<-- [start:slow_receipt]
@shared_task(base=GroussetTask, bind=True, max_processing_time=5)
def slow_receipt(self: GroussetTask, order_id: str, email: str, render_seconds: float) -> str:
    """Render a PDF receipt (slow), then mail it. The demo kills a worker mid-render:
    the redelivery waits until the claim is 5 s old, then takes it over."""
    time.sleep(render_seconds)  # stands for the rendering; must stay below 5 s
    return mailer.send(to=email, subject=f"PDF receipt for order {order_id}")
# --8<-- [end:slow_receipt]
