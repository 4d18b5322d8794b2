"""Migrating page, after: the same task on celery-grousset."""

# --8<-- [start:after]
from typing import Any

from celery import shared_task

from celery_grousset import GroussetTask


@shared_task(base=GroussetTask, bind=True, max_processing_time=600, time_limit=540,
             grousset_key=("order_id",))
def send_receipt(self: Any, order_id: int, email: str) -> str:
    # send_mail: your mailer (import it), returning the provider's message id
    return send_mail(order_id, email)  # memoized: duplicates get the same message id
# --8<-- [end:after]


SENT: list[tuple[int, str]] = []


def send_mail(order_id: int, email: str) -> str:
    """Stands in for the mailer; returns the provider's message id."""
    SENT.append((order_id, email))
    return f"msg-{order_id}-{len(SENT)}"
