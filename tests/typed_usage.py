"""What a typed project's ``mypy --strict`` sees of the public API: checked by
``tests/test_packaging.py::test_a_typed_project_gets_the_public_apis_types`` (each
``assert_type`` fails mypy when the type is another, ``Any`` included)."""

from __future__ import annotations

from typing import Any, assert_type

from celery import shared_task
from celery.result import AsyncResult, EagerResult

from celery_grousset import GroussetTask, fingerprint, protect
from celery_grousset.exceptions import ClaimInFlight
from celery_grousset.publish import PublishReport


@shared_task(base=GroussetTask, bind=True, max_processing_time=60)
def send_receipt(self: GroussetTask, order_id: int, email: str) -> str:
    assert_type(self.grousset.fingerprint, str)
    assert_type(self.grousset.fence, int)
    return f"{order_id}:{email}"


def producer() -> None:
    assert_type(send_receipt.apply_async((1, "a@example.com")), AsyncResult[Any])
    assert_type(send_receipt.apply((1, "a@example.com")), EagerResult[Any])
    report = send_receipt.publish_unique([((1, "a@example.com"), {})], window=100,
                                         keep_results=False)  # fmt: skip
    assert_type(report, PublishReport)
    assert_type(protect("order-1", len, "abc", processor_id="p", max_processing_time=5), int)
    assert_type(fingerprint("shop.send_receipt", (1,), {}), str)
    try:
        pass
    except ClaimInFlight as exc:
        assert_type(exc.retry_in, float)
