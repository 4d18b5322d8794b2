"""Configuration page: project-wide options on a GroussetTask subclass."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from celery_grousset import GroussetTask

REFUNDED: list[int] = []


# --8<-- [start:base]
class ShopTask(GroussetTask):
    max_processing_time = 120
    expires_after = 30 * 24 * 3600
    acks_late = True


@shared_task(base=ShopTask, bind=True)
def refund(self: Any, order_id: int) -> str:
    REFUNDED.append(order_id)
    return f"refunded {order_id}"
# --8<-- [end:base]
