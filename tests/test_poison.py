"""Poison deliveries: a call whose task id (or task name, or processor id) the journal can
never store is refused at once with PoisonDelivery — checked before the claim, and mapped
from the databases' data errors — never classified as StoreUnavailable and re-queued
forever. A worker rejects such a delivery without requeue. Real databases."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from celery.app.task import Context
from celery.exceptions import Reject

from celery_grousset import guard, protect
from celery_grousset.exceptions import PoisonDelivery, StoreUnavailable
from celery_grousset.models import Outcome
from celery_grousset.store.base import ID_LIMITS
from celery_grousset.task import _TaskCaller
from tests import services
from tests.ledger.models import Effect

POISON_IDS = {"over 255 characters": "t" * 300, "a NUL": "task-\x00-id"}


def ledger(alias: str, key: str) -> int:
    return Effect.objects.using(alias).filter(key=key).count()


@pytest.mark.parametrize("task_id", list(POISON_IDS.values()), ids=list(POISON_IDS))
def test_eager_call_with_a_poison_task_id_raises_poison_delivery(
    journal: str, task_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.tasks import effect

    key = f"poison-{uuid.uuid4().hex[:8]}"
    # Given a task id the journal cannot hold / When the task is applied eagerly
    with caplog.at_level(logging.ERROR, logger="celery_grousset"):
        result = effect.apply((key,), task_id=task_id)
    # Then it fails with the permanent error, not StoreUnavailable; the body did not run
    # and nothing was claimed
    assert isinstance(result.result, PoisonDelivery), repr(result.result)
    assert not isinstance(result.result, StoreUnavailable)
    assert ledger(journal, key) == 0
    assert not Outcome.objects.using(journal).filter(task_name=effect.name, args_repr__contains=key)
    # And one clear log line says why, with the id bounded and without its NUL
    lines = [r.getMessage() for r in caplog.records if "grousset.poison_delivery" in r.getMessage()]
    assert len(lines) == 1 and "not retried" in lines[0] and "\x00" not in lines[0]
    assert len(lines[0]) < 1000


@pytest.mark.parametrize("task_id", list(POISON_IDS.values()), ids=list(POISON_IDS))
def test_worker_delivery_with_a_poison_task_id_is_rejected_without_requeue(
    journal: str, task_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.tasks import effect

    key = f"poison-{uuid.uuid4().hex[:8]}"
    requeued: list[float] = []

    def requeue(countdown: float, exc: BaseException | None) -> None:
        requeued.append(countdown)
        raise AssertionError("a poison delivery was re-queued")

    monkeypatch.setattr(effect, "_requeue", requeue)
    # Given a delivery as a worker runs it (not eager, not called directly)
    request = Context(id=task_id, is_eager=False, called_directly=False, headers={})
    call = effect.grousset_call((key,), {}, None, request)
    caller = _TaskCaller(effect, request, lambda: effect.run(key))
    # When the guarded flow runs it
    with pytest.raises(Reject) as rejected:
        guard.guarded(caller, call)
    # Then the message is rejected without requeue, for the permanent reason
    assert rejected.value.requeue is False
    assert isinstance(rejected.value, PoisonDelivery) and "task id" in str(rejected.value)
    assert requeued == [] and ledger(journal, key) == 0


def test_protect_with_a_poison_processor_id_raises_poison_delivery(alias: str) -> None:
    from celery_grousset.conf import GroussetSettingsError

    ran: list[int] = []
    # Given a processor id the journal cannot hold / Then protect() refuses at once:
    # too long is the option's own range (a configuration error), a NUL a poison call
    for processor, refused in (("p" * 129, GroussetSettingsError),
                               ("proc\x00essor", PoisonDelivery)):  # fmt: skip
        with pytest.raises(refused, match="processor"):
            protect("k", lambda: ran.append(1), processor_id=processor,
                    max_processing_time=30, database=alias)  # fmt: skip
    assert ran == []


def test_a_poison_id_at_the_limit_is_still_claimable(journal: str) -> None:
    from tests.tasks import effect

    key = f"limit-{uuid.uuid4().hex[:8]}"
    # Given a task id of exactly 255 characters (non-ASCII too) / Then it runs normally
    task_id = ("é" + uuid.uuid4().hex) * 8
    task_id = (task_id * 2)[:255]
    assert effect.apply((key,), task_id=task_id).get()["key"] == key
    assert Outcome.objects.using(journal).get(task_id=task_id).status == "completed"


def test_the_limits_are_the_journal_columns() -> None:
    for field, limit in ID_LIMITS.items():
        assert Outcome._meta.get_field(field).max_length == limit


@pytest.mark.slow
def test_a_worker_rejects_a_poison_delivery_once() -> None:
    from tests.tasks import effect
    from tests.workers import workers

    broker = services.require_redis()
    services.require_database("postgresql")
    queue, key = f"q-poison-{uuid.uuid4().hex[:8]}", f"poison-{uuid.uuid4().hex[:8]}"
    with workers(queue, 1, database="postgresql", broker=broker, concurrency=1) as ws:
        # Given a message whose task id is 300 characters long, published to a real worker
        sent = effect.apply_async((key,), queue=queue, task_id=key.ljust(300, "t"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "poison_delivery" not in ws[0].text():
            time.sleep(0.2)
        time.sleep(3)  # any requeued copy would come back within this (backoff 1 s, 2 s)
        log = ws[0].text()
    # Then it was rejected once, without requeue; never taken for a store outage
    assert log.count("grousset.poison_delivery") == 1, log[-3000:]
    assert "grousset.store_unavailable" not in log
    assert ledger("postgresql", key) == 0
    # And its caller is told why (not left waiting on a result that never comes)
    with pytest.raises(PoisonDelivery, match="task id"):
        sent.get(timeout=5)
