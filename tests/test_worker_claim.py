"""Claims in the worker's main process (``--grousset-batch`` / ``WORKER_CLAIM``), with
real ``celery worker`` processes on a Redis broker; effects counted in the ledger."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_grousset.models import Delivery, Outcome
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
        assert rec.status == "completed" and rec.takeovers == 0
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


def test_eta_and_rate_limited_requests_are_claimed_by_the_main_process_when_due(
    batch_worker: tuple[str, str, Worker],
) -> None:
    from tests.tasks import effect, limited

    alias, queue, worker = batch_worker
    key = f"eta-{uuid.uuid4().hex[:8]}"
    keys = [f"limited-{uuid.uuid4().hex[:8]}-{i}" for i in range(4)]
    # Given a call with a 1 s countdown and four calls of a rate-limited task (both reach
    # the pool through Celery's timer, not through the strategy's immediate hand-over)
    sent = time.time()
    eta = effect.apply_async((key,), countdown=1, queue=queue)
    values = [limited.apply_async((k,), queue=queue) for k in keys]
    first = eta.get(timeout=60)
    assert [v.get(timeout=60)["key"] for v in values] == keys
    # Then each ran once, claimed by the worker's main process, not by a pool child
    for task, k in [(effect, key)] + [(limited, k) for k in keys]:
        assert Effect.objects.using(alias).filter(key=k).count() == 1
        rec = records(alias, task, k)
        assert rec.status == "completed" and rec.worker.endswith(f":{worker.proc.pid}"), rec.worker
    # and the ETA call was claimed when due, not at receipt
    assert records(alias, effect, key).started_at.timestamp() >= sent + 0.9
    # When a duplicate of the completed ETA call arrives, with a countdown of its own
    dup = effect.apply_async((key,), countdown=1, queue=queue)
    # Then the main process answers it with the memo, no pool child running it
    assert dup.get(timeout=30) == first
    text = wait_for(
        lambda: (t := worker.text()).count(f"task_id={dup.id}") and t, 10, "the duplicate's log"
    )
    line = next(ln for ln in text.splitlines() if "grousset.duplicate" in ln and dup.id in ln)
    assert "/MainProcess]" in line, line
    assert not re.search(rf"Task tests\.tasks\.effect\[{dup.id}\] succeeded", text)
    assert Effect.objects.using(alias).filter(key=key).count() == 1


@pytest.mark.parametrize("policy", ["retry", "wait"])
@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_duplicates_of_a_key_in_flight_elsewhere_hold_no_pool_child(
    redis_url: str, backend: str, policy: str
) -> None:
    from tests.tasks import effect, effect_wait

    task = effect_wait if policy == "wait" else effect
    alias = BACKENDS[backend]
    services.require_database(alias)
    q1, q2 = (f"q-{uuid.uuid4().hex[:10]}" for _ in range(2))
    key, other = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("held", "other"))
    one = ["-c", "1"]
    with (
        workers(q1, 1, database=alias, broker=redis_url, extra=one),
        workers(q2, 1, database=alias, broker=redis_url, extra=["--grousset-batch", *one]) as [w2],
    ):
        # Given a call running for 12 s on worker 1
        held = task.apply_async((key, 12.0), queue=q1)
        wait_for(lambda: Effect.objects.using(alias).filter(key=key).exists(), 30, "the holder")
        # When 5 duplicates of it reach worker 2 (one pool child), then another call
        dups = [task.apply_async((key, 12.0), queue=q2) for _ in range(5)]
        wait_for(lambda: w2.text().count("grousset.in_flight") >= 5, 30, "the duplicates")
        assert task.apply_async((other,), queue=q2).get(timeout=30)["key"] == other
        # Then that call ran at once: no duplicate held worker 2's child for the holder
        assert not held.ready()
        first = held.get(timeout=60)
        assert [d.get(timeout=60) for d in dups] == [first] * 5
        text = w2.text()
    # each duplicate was decided in worker 2's main process, not by its pool child (a
    # re-queued copy that shares a claim pass with another copy of its key goes to a
    # child, to be counted: only a delivery's first decision is the main process's)
    for dup in dups:
        lines = [ln for ln in text.splitlines() if dup.id in ln and "grousset.in_flight" in ln]
        assert lines and f"action={policy}" in lines[0], lines
        assert "MainProcess" in lines[0], lines
    assert Effect.objects.using(alias).filter(key=key).count() == 1
    assert Effect.objects.using(alias).filter(key=other).count() == 1


def test_the_flush_delay_gathers_a_burst_into_few_passes(redis_url: str) -> None:
    from tests.tasks import effect

    queue = f"q-{uuid.uuid4().hex[:10]}"
    keys = [f"flush-{uuid.uuid4().hex[:8]}-{i}" for i in range(40)]
    extra = ["--grousset-batch", "--prefetch-multiplier", "50"]
    env = {"GROUSSET_TEST_WORKER_CLAIM_FLUSH_DELAY": "0.5"}
    # Given a worker whose claim thread waits up to 0.5 s for company before a pass
    with workers(queue, 1, database="postgresql", broker=redis_url, extra=extra, env=env) as [w]:
        # When 40 calls arrive over 0.8 s (one every 20 ms: without the delay, each would
        # find the thread idle and make a pass of its own)
        results = []
        for k in keys:
            results.append(effect.apply_async((k,), queue=queue))
            time.sleep(0.02)
        assert [r.get(timeout=60)["key"] for r in results] == keys
        w.stop(timeout=60)
    # Then they were claimed in a few big passes, not one pass per request
    stats = re.search(r"grousset\.worker_claim_stats passes=(\d+) requests=(\d+)", w.text())
    assert stats, w.text()[-2000:]
    passes, requests = int(stats[1]), int(stats[2])
    assert requests == 40 and passes <= 12, (passes, requests)  # (not one per request)
    assert Effect.objects.using("postgresql").filter(key__in=keys).count() == 40


def test_copies_in_the_pass_that_claims_their_key_count_as_duplicates(redis_url: str) -> None:
    from tests.tasks import effect

    queue, key = f"q-{uuid.uuid4().hex[:10]}", f"pass-{uuid.uuid4().hex[:8]}"
    extra = ["--grousset-batch", "--prefetch-multiplier", "50"]
    env = {"GROUSSET_TEST_WORKER_CLAIM_FLUSH_DELAY": "0.5"}
    with workers(queue, 1, database="postgresql", broker=redis_url, extra=extra, env=env):
        # Given 10 copies of one call gathered into one claim pass (the first owns the key)
        results = [effect.apply_async((key,), {"sleep": 0.5}, queue=queue) for _ in range(10)]
        values = [r.get(timeout=60) for r in results]
    # Then the effect ran once, and every other copy counted as one duplicate (the copies
    # of the owning pass sent no claim: requeued as counted, they were never counted)
    assert len({repr(v) for v in values}) == 1
    assert Effect.objects.using("postgresql").filter(key=key).count() == 1
    rec = record_of("postgresql", effect, (key,), {"sleep": 0.5})
    assert rec.status == "completed" and rec.duplicates == 9


def test_copies_of_a_completed_key_in_one_pass_each_count_as_a_duplicate(
    redis_url: str,
) -> None:
    from tests.tasks import effect

    queue, key = f"q-{uuid.uuid4().hex[:10]}", f"done-{uuid.uuid4().hex[:8]}"
    extra = ["--grousset-batch", "--prefetch-multiplier", "50"]
    env = {"GROUSSET_TEST_WORKER_CLAIM_FLUSH_DELAY": "0.5"}
    with workers(queue, 1, database="postgresql", broker=redis_url, extra=extra, env=env) as ws:
        first = effect.apply_async((key,), queue=queue).get(timeout=30)
        # Given 8 copies of the completed call gathered into one claim pass
        results = [effect.apply_async((key,), queue=queue) for _ in range(8)]
        # When they are answered
        assert [r.get(timeout=30) for r in results] == [first] * 8
    text = ws[0].text()  # (its claim statistics: logged at shutdown)
    assert "requests=9" in text and re.search(r"worker_claim_stats passes=[2-4] ", text), text
    # Then each is one duplicate in the journal, found by its task id (grousset_inspect)
    assert record_of("postgresql", effect, (key,)).duplicates == 8
    found = Delivery.objects.using("postgresql").filter(task_id__in=[r.id for r in results])
    assert sorted(found.values_list("task_id", flat=True)) == sorted(r.id for r in results)
    assert Effect.objects.using("postgresql").filter(key=key).count() == 1


def test_copies_that_wait_in_the_main_process_count_once_each(
    batch_worker: tuple[str, str, Worker],
) -> None:
    from tests.tasks import effect_wait

    alias, queue, _ = batch_worker
    key = f"waits-{uuid.uuid4().hex[:8]}"
    # Given a call in flight for 3 s, and 3 copies that wait for it (on_in_flight="wait":
    # the main process claims each again from its timer, 50 ms doubling to 1 s)
    first = effect_wait.apply_async((key,), {"sleep": 3.0}, queue=queue)
    wait_for(lambda: Effect.objects.using(alias).filter(key=key).exists(), 30, "the body")
    copies = [effect_wait.apply_async((key,), {"sleep": 3.0}, queue=queue) for _ in range(3)]
    # When the holder completes / Then every copy gets its value, the effect ran once
    values = [r.get(timeout=60) for r in [first, *copies]]
    assert len({repr(v) for v in values}) == 1
    assert Effect.objects.using(alias).filter(key=key).count() == 1
    # And each copy is one duplicate, however long it waited
    rec = record_of(alias, effect_wait, (key,), {"sleep": 3.0})
    assert rec.duplicates == 3, (rec.duplicates, rec.deliveries)
    # and it claimed twice at most (on arrival, once the holder was done), with
    # read-only looks in between: each poll was a counted claim and a deliveries row
    assert rec.deliveries <= 1 + 2 * 3, rec.deliveries
    rows = Delivery.objects.using(alias).filter(task_id__in=[c.id for c in copies])
    assert rows.count() <= 2 * 3, list(rows.values_list("task_id", "decision"))


def test_an_expired_copy_of_a_completed_call_is_revoked_not_answered(
    batch_worker: tuple[str, str, Worker],
) -> None:
    from celery.exceptions import TaskRevokedError

    from tests.tasks import effect

    alias, queue, _ = batch_worker
    key = f"expired-{uuid.uuid4().hex[:8]}"
    effect.apply_async((key,), queue=queue).get(timeout=60)
    assert Effect.objects.using(alias).filter(key=key).count() == 1
    # Given a copy of the completed call due in 3 s that expires in 1 s
    late = effect.apply_async((key,), queue=queue, countdown=3, expires=1)
    # Then Celery expires it, as without the main process's claim: not a memo's SUCCESS
    with pytest.raises(TaskRevokedError):
        late.get(timeout=60)
    assert late.state == "REVOKED"
    assert Effect.objects.using(alias).filter(key=key).count() == 1


def test_copies_gathered_in_one_pass_while_their_key_runs_each_count(redis_url: str) -> None:
    from tests.tasks import effect

    queue, key = f"q-{uuid.uuid4().hex[:10]}", f"held-{uuid.uuid4().hex[:8]}"
    extra = ["--grousset-batch", "--prefetch-multiplier", "50"]
    env = {"GROUSSET_TEST_WORKER_CLAIM_FLUSH_DELAY": "0.5"}
    with workers(queue, 1, database="postgresql", broker=redis_url, extra=extra, env=env):
        # Given a call whose body runs for 3 s
        first = effect.apply_async((key,), {"sleep": 3.0}, queue=queue)
        wait_for(lambda: Effect.objects.using("postgresql").filter(key=key).exists(), 30,
                 "the body")  # fmt: skip
        # When 10 copies arrive together (one claim pass: one claim sent for the key)
        copies = [effect.apply_async((key,), {"sleep": 3.0}, queue=queue) for _ in range(10)]
        values = [r.get(timeout=60) for r in [first, *copies]]
    # Then the effect ran once and each copy counted as one duplicate (the copies whose
    # claim was not sent were requeued as already counted: never counted)
    assert len({repr(v) for v in values}) == 1
    assert Effect.objects.using("postgresql").filter(key=key).count() == 1
    rec = record_of("postgresql", effect, (key,), {"sleep": 3.0})
    assert rec.duplicates == 10, (rec.duplicates, rec.deliveries)


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
    assert rec.status == "completed" and rec.takeovers == 1
    assert value["fence"] == rec.fence and value["pid"] != pid
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
    assert rec.status == "completed" and rec.takeovers == 0
    assert rec.worker.endswith(f":{worker.proc.pid}")
    # And each other delivery is one duplicate, however often it was requeued in flight
    # (a copy in the pass that claimed the key included)
    assert rec.duplicates == 19


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


#: one pool child and a prefetch of four: requests claimed by the main process wait for it
BEHIND_ONE_CHILD = ["--grousset-batch", "-c", "1", "--prefetch-multiplier", "4"]


def three_held_behind_a_busy_child(alias: str, queue: str, keys: list[str],
                                   sleep: float) -> list[Any]:  # fmt: skip
    """One child busy with a ``sleep`` s body (``keys[0]``) and three more requests
    (``keys[1:]``) prefetched behind it, each claimed by the main process: their results."""
    from tests.tasks import effect

    first = effect.apply_async((keys[0],), {"sleep": sleep}, queue=queue)
    wait_for(lambda: Effect.objects.using(alias).filter(key=keys[0]).exists(), 30, "a body")
    rest = [effect.apply_async((k,), queue=queue) for k in keys[1:]]

    def held() -> bool:
        rows = [record_of(alias, effect, (k,)) for k in keys[1:] if exists(alias, k)]
        return len(rows) == 3 and all(r.status == "in_flight" for r in rows)

    wait_for(held, 30, "the prefetched requests' claims")
    return [first, *rest]


@pytest.mark.parametrize(
    ("backend", "pool"),
    [("sqlite", "prefork"), ("postgresql", "prefork"), ("postgresql", "threads")],
)
def test_warm_shutdown_releases_the_claims_of_requests_no_child_started(
    redis_url: str, backend: str, pool: str
) -> None:
    """(A threads pool's left in flight until stale: only a stopped prefork pool was
    known to start nothing more.)"""
    from tests.tasks import effect

    alias = BACKENDS[backend]
    services.require_database(alias)
    queue = f"q-{uuid.uuid4().hex[:10]}"
    keys = [f"stop-{uuid.uuid4().hex[:8]}-{i}" for i in range(4)]
    # Given one child busy with an 8 s body and three more requests prefetched behind it,
    # each claimed by the main process and handed to the pool
    with workers(queue, 1, database=alias, broker=redis_url,
                 extra=["-P", pool, *BEHIND_ONE_CHILD]) as [worker]:  # fmt: skip
        results = three_held_behind_a_busy_child(alias, queue, keys, 8.0)
        assert not any(Effect.objects.using(alias).filter(key__in=keys[1:]))
        # When the worker shuts down warm (it finishes the running body first)
        worker.stop(timeout=60)
        assert worker.proc.returncode == 0, worker.text()[-2000:]
    # Then the claims of the three it never started were released, not left to go stale
    for key in keys[1:]:
        rec = record_of(alias, effect, (key,))
        assert rec.status != "in_flight", (key, rec.status)
    assert record_of(alias, effect, (keys[0], 8.0)).status == "completed"
    # and a new worker runs them at once (max_processing_time is 30 s), each once
    with workers(queue, 1, database=alias, broker=redis_url, extra=["--grousset-batch"]):
        t0 = time.monotonic()
        for r in results:
            r.get(timeout=60)
        assert time.monotonic() - t0 < 20
    for key in keys:
        assert Effect.objects.using(alias).filter(key=key).count() == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_cold_shutdown_releases_the_claims_of_requests_never_passed_to_the_pool(
    redis_url: str, backend: str
) -> None:
    """A cold shutdown (SIGQUIT; also the end of Celery 5.5's soft shutdown) kills the
    running body and sends no ``worker_shutdown``: the claims of the requests prefetched
    behind it stayed in flight, and each redelivery waited max_processing_time (30 s)
    and counted a takeover although no attempt had started."""
    from tests.tasks import effect

    alias = BACKENDS[backend]
    services.require_database(alias)
    queue = f"q-{uuid.uuid4().hex[:10]}"
    keys = [f"cold-{uuid.uuid4().hex[:8]}-{i}" for i in range(4)]
    # Given one child busy with a long body and three more requests prefetched behind it,
    # each claimed by the main process, waiting for the child
    with workers(queue, 1, database=alias, broker=redis_url,
                 extra=BEHIND_ONE_CHILD) as [worker]:  # fmt: skip
        results = three_held_behind_a_busy_child(alias, queue, keys, 20.0)[1:]
        # When the worker shuts down cold (the running body is killed)
        worker.proc.send_signal(signal.SIGQUIT)
        worker.proc.wait(60)
    # Then the claims of the three no child could start were released
    for key in keys[1:]:
        rec = record_of(alias, effect, (key,))
        assert rec.status != "in_flight", (key, rec.status, worker.text()[-3000:])
    # and the killed body's claim stays in flight: its effect may have happened
    assert record_of(alias, effect, (keys[0], 20.0)).status == "in_flight"
    # and a new worker runs the three at once, each once, with no takeover
    with workers(queue, 1, database=alias, broker=redis_url, extra=["--grousset-batch"]):
        t0 = time.monotonic()
        for r in results:
            r.get(timeout=60)
        assert time.monotonic() - t0 < 20
    for key in keys[1:]:
        assert Effect.objects.using(alias).filter(key=key).count() == 1
        assert record_of(alias, effect, (key,)).takeovers == 0


def test_a_request_revoked_before_a_child_starts_it_gives_its_claim_back(
    redis_url: str,
) -> None:
    """A request the main process had claimed and handed to the pool, revoked (without
    terminate) before a child started it, was dropped by Celery with its claim left in
    flight: a new delivery of the call waited max_processing_time and took it over."""
    from tests.celeryapp import app
    from tests.tasks import effect

    alias = "postgresql"
    services.require_database(alias)
    queue = f"q-{uuid.uuid4().hex[:10]}"
    extra = ["--grousset-batch", "-c", "1", "--prefetch-multiplier", "4"]
    busy, dropped = (f"revoked-{uuid.uuid4().hex[:8]}-{i}" for i in range(2))
    with workers(queue, 1, database=alias, broker=redis_url, extra=extra):
        # Given the only child busy, and a request claimed by the main process behind it
        effect.apply_async((busy,), {"sleep": 8.0}, queue=queue)
        wait_for(lambda: Effect.objects.using(alias).filter(key=busy).exists(), 30, "a body")
        result = effect.apply_async((dropped,), queue=queue)
        wait_for(lambda: exists(alias, dropped)
                 and record_of(alias, effect, (dropped,)).status == "in_flight",
                 30, "its claim")  # fmt: skip
        # When it is revoked before the child is free to start it
        app.control.revoke(result.id)
        # Then Celery drops it, and its claim is given back
        wait_for(lambda: record_of(alias, effect, (dropped,)).status != "in_flight", 20,
                 "the dropped request's claim given back")  # fmt: skip
        assert not Effect.objects.using(alias).filter(key=dropped).exists()
        # And a new delivery of the call runs at once (max_processing_time is 30 s), once
        started = time.monotonic()
        effect.apply_async((dropped,), queue=queue).get(timeout=60)
        assert time.monotonic() - started < 20
    assert Effect.objects.using(alias).filter(key=dropped).count() == 1


def test_a_broker_connection_lost_gives_back_the_claims_of_requests_waiting_for_a_child(
    redis_url: str,
) -> None:
    """Celery drops the requests that wait for a free child when its broker connection
    is lost (the broker delivers them again). Their claims, made by the main process,
    were left in flight: each redelivery waited max_processing_time and took it over."""
    from tests.tasks import effect

    alias = "postgresql"
    services.require_database(alias)
    queue = f"q-{uuid.uuid4().hex[:10]}"
    extra = ["--grousset-batch", "-c", "1", "--prefetch-multiplier", "4"]
    keys = [f"lost-{uuid.uuid4().hex[:8]}-{i}" for i in range(4)]
    with workers(queue, 1, database=alias, broker=redis_url, extra=extra) as [worker]:
        # Given the only child busy with an 8 s body, three requests claimed behind it
        results = [effect.apply_async((keys[0],), {"sleep": 8.0}, queue=queue)]
        wait_for(lambda: Effect.objects.using(alias).filter(key=keys[0]).exists(), 30, "a body")
        results += [effect.apply_async((k,), queue=queue) for k in keys[1:]]
        wait_for(lambda: all(exists(alias, k) for k in keys[1:]), 30, "their claims")
        assert not Effect.objects.using(alias).filter(key__in=keys[1:]).exists()
        # When the worker's broker connection is lost
        started = time.monotonic()
        services.cut_broker_clients(redis_url, worker.proc.pid)
        # Then every call completes soon (max_processing_time is 30 s), each effect once,
        # none of them taken over
        for r in results:
            r.get(timeout=90)
        assert time.monotonic() - started < 28
    for key in keys:
        assert Effect.objects.using(alias).filter(key=key).count() == 1
    assert [record_of(alias, effect, (k,)).takeovers for k in keys[1:]] == [0, 0, 0]


def exists(alias: str, key: str) -> bool:
    from tests.tasks import effect

    fp = effect.grousset_fingerprint((key,), {})
    return Outcome.objects.using(alias).filter(fingerprint=fp).exists()


def test_a_broker_connection_cut_loses_and_doubles_nothing(
    batch_worker: tuple[str, str, Worker], redis_url: str
) -> None:
    from tests.tasks import effect

    alias, queue, worker = batch_worker
    keys = [f"cut-{uuid.uuid4().hex[:8]}-{i}" for i in range(6)]
    results = [effect.apply_async((k,), {"sleep": 0.5}, queue=queue) for k in keys]
    wait_for(lambda: Effect.objects.using(alias).filter(key__in=keys).exists(), 30, "a body")
    # When the worker's broker connections are cut mid-stream (its consumer restarts,
    # rebuilding the strategies; requests in flight come back from the broker)
    services.cut_broker_clients(redis_url, worker.proc.pid)
    # Then every call completes, each effect once, each claimed by the main process
    values = [r.get(timeout=120) for r in results]
    assert [v["key"] for v in values] == keys
    for key in keys:
        assert Effect.objects.using(alias).filter(key=key).count() == 1
        assert record_of(alias, effect, (key,), {"sleep": 0.5}).status == "completed"
    assert any(
        record_of(alias, effect, (k,), {"sleep": 0.5}).worker.endswith(f":{worker.proc.pid}")
        for k in keys
    )


def test_a_transaction_the_database_rolls_back_runs_again_once(
    batch_worker: tuple[str, str, Worker],
) -> None:
    from tests.tasks import conflicted

    alias, queue, _ = batch_worker
    if alias == "default":
        pytest.skip("SQLite has no conflict that rolls a transaction back")
    key = f"conflict-{uuid.uuid4().hex[:8]}"
    # Given a transactional task whose first delivery's transaction the database rolls
    # back (TransactionLost: the claim is released and the delivery requeued), under a
    # claim made by the worker's main process
    result = conflicted.apply_async((key,), queue=queue)
    # When the requeued delivery runs
    value = result.get(timeout=60)
    # Then it claimed again and committed its effect once; the record is completed
    rec = records(alias, conflicted, key)
    assert rec.status == "completed" and value["fence"] == rec.fence
    assert Effect.objects.using(alias).filter(key=key).count() == 1


def test_runs_of_a_periodic_task_are_claimed_by_their_slot(
    batch_worker: tuple[str, str, Worker],
) -> None:
    from celery_grousset.periodic import SLOT_HEADER
    from tests.tasks import periodic_effect

    alias, queue, worker = batch_worker
    key = f"slot-{uuid.uuid4().hex[:8]}"
    slots = [f"2026-12-04T06:0{i}:00+00:00" for i in range(3)]
    # Given three slots of one schedule, each published twice (two beats), same arguments
    results = [periodic_effect.apply_async((key,), queue=queue, headers={SLOT_HEADER: s})
               for s in slots for _ in range(2)]  # fmt: skip
    for r in results:
        r.get(timeout=60)
    # Then each slot ran once, at once (the main process claimed each slot's own key,
    # not one slot-less key that every run then waited for)
    ran = sorted(Effect.objects.using(alias).filter(key=key).values_list("value", flat=True))
    assert ran == slots
    assert "grousset.claim_not_adopted" not in worker.text()
    rows = Outcome.objects.using(alias).filter(task_id__in=[r.id for r in results])
    assert sorted(rows.values_list("status", flat=True)) == ["completed"] * 3


def test_a_worker_without_an_event_loop_says_the_switch_does_nothing() -> None:
    # Given the switch on, on a broker transport without an event loop (kombu's memory
    # transport here; a gevent or eventlet pool has none either)
    queue = f"q-{uuid.uuid4().hex[:10]}"
    flags = ["--grousset-batch"]
    with workers(queue, 1, database="default", broker="memory://", extra=flags) as [w]:
        text = w.text()
    # Then the worker says every request is claimed in the pool, not that its main
    # process claims them
    assert "WORKER_CLAIM is on, but this worker has no event loop" in text, text[-3000:]
    assert "claims in the main process for" not in text


def test_the_main_process_forgets_the_requests_its_pool_has_started(redis_url: str) -> None:
    """The main process kept every request it handed to the pool, message and arguments,
    until 1,000 had piled up (a review: 291 MB against 85 MB after 1,500 calls of 100 KB
    arguments); only the ones no child has started are needed (shutdown, revoke)."""
    from tests.tasks import effect, handed_requests

    services.require_database("postgresql")
    queue = f"q-{uuid.uuid4().hex[:10]}"
    # Given a threads-pool worker that claims in its main process (tasks run there too)
    with workers(queue, 1, database="postgresql", broker=redis_url, concurrency=4,
                 extra=["--grousset-batch", "-P", "threads"]):  # fmt: skip
        # When 400 guarded calls have all run
        keys = [f"handed-{uuid.uuid4().hex}" for _ in range(400)]
        for r in [effect.apply_async((key,), queue=queue) for key in keys]:
            r.get(timeout=120)
        kept = handed_requests.apply_async(queue=queue).get(timeout=30)
    # Then the main process keeps a bounded handful of them, not every one handed over
    assert len(kept) == 1 and kept[0] <= 128, kept
