# ruff: noqa: F821
"""Migrating page, before: celery-singleton (compiled by tests/test_docs.py, not
imported: celery-singleton is not a dependency)."""

# --8<-- [start:before]
from celery import shared_task
from celery_singleton import Singleton


@shared_task(base=Singleton, unique_on=["order_id"], lock_expiry=600)
def send_receipt(order_id: int, email: str) -> None:
    mailer.send(order_id, email)
# --8<-- [end:before]
