import pytest
from celery.contrib import pytest as celery_fixtures
from django.core import mail

from shop.tasks import send_receipt

# pytest-celery 1.x names its Docker worker `celery_worker` too: in this module,
# Celery's in-process worker takes its place.
celery_worker = celery_fixtures.celery_worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_answers_the_duplicate_from_the_memo(
    celery_app, celery_worker, grousset_journal
):
    # Given a worker (a thread of this process, on an in-memory broker)
    # When the receipt task is published twice for the same order
    first = send_receipt.delay(42, "ann@example.com").get(timeout=10)
    second = send_receipt.delay(42, "ann@example.com").get(timeout=10)
    # Then the worker sent one email and answered the duplicate from the memo
    assert second == first
    assert len(mail.outbox) == 1
    assert grousset_journal.deliveries(send_receipt, 42, "ann@example.com") == 2
