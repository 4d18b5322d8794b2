"""Producer-side samples for docs/producer.md: ``publish_unique`` and the outbox."""

from __future__ import annotations


# --8<-- [start:publish_unique]
def send_todays_receipts(send_receipt, orders):
    """``send_receipt(order_id, email)`` is a GroussetTask; ``orders`` may be a generator."""
    report = send_receipt.publish_unique(((o.id, o.email), {}) for o in orders)
    print(report.published, report.skipped_in_batch,
          report.skipped_completed, report.skipped_in_flight)
    return report.results  # the AsyncResult of each published call
# --8<-- [end:publish_unique]


# --8<-- [start:outbox]
from django.db import transaction

from celery_grousset import outbox


def place_order(Order, send_receipt, **fields):
    with transaction.atomic():
        order = Order.objects.create(**fields)
        outbox.enqueue(send_receipt, args=(order.id, order.email), countdown=10)
    # rolled back: no row, nothing is ever published
    # committed:   a pending row, published by the relay even if this process dies now
    return order
# --8<-- [end:outbox]
