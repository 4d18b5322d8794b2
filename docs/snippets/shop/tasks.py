from email.utils import make_msgid

from celery import shared_task
from django.core.mail import EmailMessage

from celery_grousset import GroussetTask

from .models import Booking


# --8<-- [start:receipt]
@shared_task(base=GroussetTask, bind=True, max_processing_time=60)
def send_receipt(self, order_id: int, email: str) -> str:
    """Email the receipt of an order once; return its Message-ID (memoized)."""
    message_id = make_msgid(domain="shop.example")
    EmailMessage(
        subject=f"Your receipt for order {order_id}",
        body="Thank you for your order.",
        to=[email],
        headers={"Message-ID": message_id},
    ).send()
    return message_id
# --8<-- [end:receipt]


# --8<-- [start:booking]
@shared_task(base=GroussetTask, bind=True, max_processing_time=30, transactional=True)
def book(self, order_id: int) -> int:
    """The booking row and the completion commit in one transaction: exactly once."""
    booking = Booking.objects.create(order_id=order_id)
    return booking.pk
# --8<-- [end:booking]
