"""Needs Docker, and a worker image with this project in it (see pytest-celery's docs)."""

from shop.tasks import send_receipt


def test_a_container_worker_answers_the_duplicate_from_the_memo(celery_setup):
    queue = celery_setup.worker.worker_queue
    sig = send_receipt.s(42, "ann@example.com")
    first = sig.apply_async(queue=queue).get(timeout=30)
    second = sig.apply_async(queue=queue).get(timeout=30)
    assert second == first
