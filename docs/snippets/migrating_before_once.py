# ruff: noqa: F821
"""Migrating page, before: celery-once (compiled by tests/test_docs.py, not imported:
celery-once is not a dependency)."""

# --8<-- [start:before]
from celery import shared_task
from celery_once import QueueOnce


@shared_task(base=QueueOnce, once={"keys": ["order_id"], "graceful": True, "timeout": 600})
def send_receipt(order_id: int, email: str) -> None:
    mailer.send(order_id, email)
# --8<-- [end:before]
