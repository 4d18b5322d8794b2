"""One worker, two journal databases: the ``database`` task option routes each task's
claims to its own journal (docs/scale.md, "When to split the journal by processor").
A real ``celery worker`` whose ``GROUSSET["DATABASE"]`` is PostgreSQL runs a task
journaled there and one journaled on MariaDB; every key is delivered 5 times."""

from __future__ import annotations

import uuid

import pytest

from celery_grousset.models import Outcome
from tests import services
from tests.ledger.models import Effect
from tests.workers import workers

pytestmark = pytest.mark.slow


def test_one_worker_two_journal_databases() -> None:
    redis = services.require_redis()
    services.require_database("postgresql")
    services.require_database("mysql")
    from tests.tasks import effect, effect_on_mysql

    queue = f"q-{uuid.uuid4().hex[:10]}"
    keys = [f"split-{uuid.uuid4().hex[:8]}-{i}" for i in range(10)]
    with workers(queue, 1, database="postgresql", broker=redis, concurrency=2):
        tasks = (effect, effect_on_mysql)
        results = [
            t.apply_async((key,), queue=queue) for key in keys for t in tasks for _ in range(5)
        ]
        for r in results:
            r.get(timeout=120)
    for key in keys:
        fp = effect.grousset_fingerprint((key,), {})
        fp_my = effect_on_mysql.grousset_fingerprint((key,), {})
        # each task's journal row is in its own database, and only there
        pg_row = Outcome.objects.using("postgresql").get(task_name=effect.name, fingerprint=fp)
        my_row = Outcome.objects.using("mysql").get(task_name=effect_on_mysql.name,
                                                    fingerprint=fp_my)  # fmt: skip
        assert (pg_row.status, my_row.status) == ("completed", "completed")
        # (a duplicate that found the claim in flight retries: more than 5 is possible)
        assert pg_row.deliveries >= 5 and my_row.deliveries >= 5
        assert (
            not Outcome.objects.using("mysql")
            .filter(task_name=effect.name)
            .filter(fingerprint=fp)
            .exists()
        )
        assert (
            not Outcome.objects.using("postgresql")
            .filter(task_name=effect_on_mysql.name, fingerprint=fp_my)
            .exists()
        )
        # and each effect ran once (the ledger is on the worker's GROUSSET["DATABASE"])
        ledger = Effect.objects.using("postgresql").filter(key=key)
        assert ledger.filter(value="").count() == 1
        assert ledger.filter(value="mysql-journal").count() == 1
