"""Claims in the worker's main process (``--grousset-batch`` / ``WORKER_CLAIM``), with
real ``celery worker`` processes on a Redis broker; effects counted in the ledger."""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_grousset.models import Outcome
from tests import services
from tests.ledger.models import Effect
from tests.test_worker_integration import record_of, wait_for
from tests.workers import Worker, workers

pytestmark = pytest.mark.slow

BACKENDS = {"sqlite": "default", "postgresql": "postgresql", "mariadb": "mysql"}


@pytest.fixture(scope="module")
def redis_url() -> str:
    return services.require_redis()


@pytest.fixture(scope="module", params=list(BACKENDS))
def batch_worker(
    request: pytest.FixtureRequest, redis_url: str
) -> Iterator[tuple[str, str, Worker]]:
    """One worker (2 children) with the switch on: (database alias, queue, worker)."""
    alias = BACKENDS[request.param]
    services.require_database(alias)
    queue = f"q-{uuid.uuid4().hex[:10]}"
    with workers(queue, 1, database=alias, broker=redis_url, extra=["--grousset-batch"]) as ws:
        yield alias, queue, ws[0]


def records(alias: str, task: Any, key: str, *args: Any) -> Outcome:
    return record_of(alias, task, (key, *args))


def test_n_publishes_of_k_keys_run_k_effects_claimed_by_the_main_process(
    batch_worker: tuple[str, str, Worker],
) -> None:
    from tests.tasks import effect

    alias, queue, worker = batch_worker
    keys = [f"batch-{uuid.uuid4().hex[:8]}-{i}" for i in range(6)]
    # Given 5 deliveries of each of 6 calls, published together
    results = [effect.apply_async((k,), queue=queue) for _ in range(5) for k in keys]
    # When the worker has answered them all
    values = [r.get(timeout=60) for r in results]
    # Then each call's effect ran once, and every delivery of a call got the same value
    for key in keys:
        assert Effect.objects.using(alias).filter(key=key).count() == 1
        assert len({repr(v) for v in values if v["key"] == key}) == 1
        rec = records(alias, effect, key)
        assert rec.status == "completed" and rec.fence == 1
        # and the claim was made by the worker's main process, not by a pool child
        assert rec.worker.endswith(f":{worker.proc.pid}")
    # while the bodies ran in the pool children
    assert {v["pid"] for v in values} <= set(worker.children())


def test_duplicates_of_a_completed_key_are_answered_by_the_main_process(
    batch_worker: tuple[str, str, Worker],
) -> None:
    from tests.tasks import effect

    alias, queue, worker = batch_worker
    key = f"dup-{uuid.uuid4().hex[:8]}"
    first = effect.apply_async((key,), queue=queue).get(timeout=30)
    # When 5 more deliveries of the completed call arrive
    results = [effect.apply_async((key,), queue=queue) for _ in range(5)]
    # Then AsyncResult.get() returns the memo of the first run
    assert [r.get(timeout=30) for r in results] == [first] * 5
    assert Effect.objects.using(alias).filter(key=key).count() == 1
    # and each was answered in the worker's main process (its log lines name the process)
    text = wait_for(
        lambda: (t := worker.text()).count(f"task_id={results[-1].id}") and t,
        10,
        "the duplicate's log line",
    )
    for r in results:
        line = next(
            ln for ln in text.splitlines() if "grousset.duplicate" in ln and f"task_id={r.id}" in ln
        )
        assert "/MainProcess]" in line, line
        # and no pool child ran it (a child's run logs "succeeded in")
        assert not re.search(rf"Task tests\.tasks\.effect\[{r.id}\] succeeded", text)


def test_sigkill_of_a_child_mid_task_is_taken_over(batch_worker: tuple[str, str, Worker]) -> None:
    from tests.tasks import short_claim

    alias, queue, worker = batch_worker
    key = f"kill-{uuid.uuid4().hex[:8]}"
    # Given a body in progress (max_processing_time 3 s) under the main process's claim
    result = short_claim.apply_async((key, 5.0), queue=queue)
    pid = wait_for(
        lambda: Effect.objects.using(alias).filter(key=key).values_list("pid", flat=True).first(),
        30,
        "the body to start",
    )
    assert records(alias, short_claim, key, 5.0).worker.endswith(f":{worker.proc.pid}")
    # When its pool child is SIGKILLed (acks_late + reject_on_worker_lost: redelivered)
    os.kill(pid, signal.SIGKILL)
    value = result.get(timeout=60)
    # Then the redelivery took the stale claim over and completed it
    rec = records(alias, short_claim, key, 5.0)
    assert rec.status == "completed" and rec.takeovers == 1 and rec.fence == 2
    assert value["fence"] == 2 and value["pid"] != pid
    # the documented window: the killed attempt's effect happened
    assert Effect.objects.using(alias).filter(key=key).count() == 2


def test_copies_of_one_new_key_published_together_run_once(
    batch_worker: tuple[str, str, Worker],
) -> None:
    from tests.tasks import effect

    alias, queue, worker = batch_worker
    key = f"burst-{uuid.uuid4().hex[:8]}"
    # Given 20 deliveries of one call published at once (in flight while the first runs)
    results = [effect.apply_async((key,), {"sleep": 0.3}, queue=queue) for _ in range(20)]
    # When they are all answered
    values = [r.get(timeout=120) for r in results]
    # Then the effect ran once and every delivery got its value
    assert Effect.objects.using(alias).filter(key=key).count() == 1
    assert len({repr(v) for v in values}) == 1
    rec = record_of(alias, effect, (key,), {"sleep": 0.3})
    assert rec.status == "completed" and rec.fence == 1
    assert rec.worker.endswith(f":{worker.proc.pid}")


@pytest.mark.parametrize(
    ("setting", "flag", "bypass", "on"),
    [
        (False, None, False, False),  # the default: off
        (True, None, False, True),  # the setting
        (True, False, False, False),  # --no-grousset-batch wins over the setting
        (False, True, False, True),  # --grousset-batch wins over the setting
        (True, True, True, False),  # bypass: nothing is claimed at all
    ],
)
def test_the_switch_gives_guarded_tasks_the_main_process_strategy(
    setting: bool, flag: bool | None, bypass: bool, on: bool
) -> None:
    from celery import Celery, _state
    from django.test import override_settings

    from celery_grousset import GroussetTask
    from celery_grousset.batch_claim import STRATEGY
    from celery_grousset.worker import _worker_claim

    app = Celery("grousset-switch", set_as_current=False, fixups=[])

    suffix = uuid.uuid4().hex[:8]

    @app.task(base=GroussetTask, max_processing_time=5, name=f"switch.guarded.{suffix}")
    def guarded() -> None: ...

    @app.task(name=f"switch.plain.{suffix}")
    def plain() -> None: ...

    with override_settings(GROUSSET={"WORKER_CLAIM": setting, "BYPASS": bypass}):
        names = _worker_claim(app, flag)
    assert (guarded.name in names) is on and (names == []) is not on
    assert plain.name not in names
    assert (app.tasks[guarded.name].Strategy == STRATEGY) is on
    assert app.tasks[plain.name].Strategy != STRATEGY
    _state._apps.discard(app)  # type: ignore[attr-defined]  # not seen by other tests' checks
