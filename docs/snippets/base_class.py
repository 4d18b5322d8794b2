"""Configuration page: project-wide options on a GroussetTask subclass."""

from __future__ import annotations

# --8<-- [start:base]
from celery import shared_task

from celery_grousset import GroussetTask

REFUNDED: list[int] = []  # stands in for your refunds


class ShopTask(GroussetTask):
    max_processing_time = 120
    expires_after = 30 * 24 * 3600
    acks_late = True


@shared_task(base=ShopTask, bind=True)
def refund(self, order_id: int) -> str:
    REFUNDED.append(order_id)
    return f"refunded {order_id}"
# --8<-- [end:base]
