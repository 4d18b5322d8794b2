import pytest
from django.core import mail

from shop.models import Booking
from shop.tasks import book, send_receipt

# The claim commits on the journal's own connection: tests that run guarded
# tasks need real commits, so use pytest-django's transactional database.
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_duplicate_delivery_sends_no_second_receipt(grousset_eager, grousset_journal):
    # Given a receipt sent for order 42
    first = send_receipt.apply((42, "ann@example.com")).get()
    # When the same call is delivered again
    second = send_receipt.apply((42, "ann@example.com")).get()
    # Then one email went out and the duplicate got the memoized Message-ID
    assert len(mail.outbox) == 1
    assert second == first
    record = grousset_journal.get(send_receipt, 42, "ann@example.com")
    assert record.status == "completed"
    assert record.deliveries == 2


def test_a_booking_is_written_once(grousset_eager, grousset_journal):
    # Given / When the booking task is delivered three times
    ids = {book.apply((7,)).get() for _ in range(3)}
    # Then one row exists and every delivery returned its id
    assert Booking.objects.filter(order_id=7).count() == 1
    assert ids == {Booking.objects.get(order_id=7).pk}
    assert grousset_journal.deliveries(book, 7) == 3
