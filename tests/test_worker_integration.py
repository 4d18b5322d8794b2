"""GroussetTask with real ``celery worker`` processes on a real broker.

Each test starts its own workers on a queue of its own; effects are counted in
the effect ledger (no unique constraint), never inferred.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction

from celery_grousset.models import Outcome
from tests import services
from tests.ledger.models import Effect
from tests.locks import lock_waiters
from tests.workers import Worker, logged, workers

pytestmark = pytest.mark.slow

REPEAT = int(os.environ.get("GROUSSET_TEST_REPEAT", "20"))


@pytest.fixture(scope="module")
def redis_url() -> str:
    return services.require_redis()


@pytest.fixture
def queue() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def pg() -> str:
    services.require_database("postgresql")
    return "postgresql"


def effects(alias: str, key: str, value: str | None = None) -> int:
    qs = Effect.objects.using(alias).filter(key=key)
    return (qs.filter(value=value) if value is not None else qs).count()


def record_of(
    alias: str, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> Outcome:
    fp = task.grousset_fingerprint(args, kwargs or {})
    return Outcome.objects.using(alias).get(task_name=task.name, fingerprint=fp)


def inspect(alias: str, needle: str) -> str:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("grousset_inspect", needle, database=alias, stdout=out)
    return out.getvalue()


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def holder_pid(alias: str, task: Any, args: tuple[Any, ...]) -> int:
    """The pid of the worker child holding the claim (from the journal's ``worker``)."""

    def find() -> int | None:
        try:
            rec = record_of(alias, task, args)
        except Outcome.DoesNotExist:
            return None
        return int(rec.worker.rsplit(":", 1)[1]) if rec.status == "in_flight" else None

    return int(wait_for(find, 30, "a claim to be held"))


def revoke_terminate(queue: str, task_id: str, signame: str) -> None:
    """``revoke(terminate=True)``, sent again until a worker of ``queue`` logs that it
    terminates the task (a broadcast can be lost; one sent twice signals twice)."""
    from tests.celeryapp import app

    for _ in range(3):
        app.control.revoke(task_id, terminate=True, signal=signame)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if logged(queue, f"Terminating {task_id}"):
                return
            time.sleep(0.1)
    raise AssertionError(f"no worker of {queue} terminated {task_id}")


@pytest.fixture(scope="module")
def pg_workers(redis_url: str, pg: str) -> Iterator[tuple[str, list[Worker]]]:
    q = f"q-{uuid.uuid4().hex[:10]}"
    with workers(q, 2, database=pg, broker=redis_url, concurrency=2) as ws:
        yield q, ws


@pytest.fixture(scope="module")
def mysql_queue(redis_url: str) -> Iterator[str]:
    """The queue of a worker whose journal is on MariaDB."""
    services.require_database("mysql")
    q = f"q-{uuid.uuid4().hex[:10]}"
    with workers(q, 1, database="mysql", broker=redis_url, concurrency=2):
        yield q


def _two_hundred(alias: str, queue: str, key: str) -> int:
    """Publish 200 copies of one call, check one effect and one memo; return the effects."""
    from tests.tasks import effect

    # Given 200 deliveries of the same call (distinct task ids) to 2 workers x 2 processes
    results = [effect.apply_async((key,), {"sleep": 0.2}, queue=queue) for _ in range(200)]
    # When they are all processed
    values = [r.get(timeout=120) for r in results]
    # Then the effect ran exactly once and every delivery returned the same value
    assert effects(alias, key) == 1
    assert len({repr(v) for v in values}) == 1 and values[0]["key"] == key
    rec = record_of(alias, effect, (key,), {"sleep": 0.2})
    assert rec.status == "completed" and rec.takeovers == 0
    assert values[0]["fence"] == rec.fence and rec.deliveries >= 200
    # every other publish is one duplicate, however often its in-flight requeues bounced
    assert rec.duplicates == 199, (rec.deliveries, rec.duplicates)
    return effects(alias, key)


@pytest.mark.parametrize("rep", range(REPEAT))
def test_200_duplicates_one_effect_postgresql(
    pg_workers: tuple[str, list[Worker]], rep: int
) -> None:
    queue, _ = pg_workers
    assert _two_hundred("postgresql", queue, f"dup-pg-{rep}-{uuid.uuid4().hex[:8]}") == 1


def test_an_in_flight_duplicate_is_retried_with_its_reason(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    from tests.tasks import effect

    queue, ws = pg_workers
    key = f"why-{uuid.uuid4().hex[:8]}"
    # Given a call running (6 s) and a duplicate of it delivered meanwhile
    first = effect.apply_async((key,), {"sleep": 6.0}, queue=queue)
    deadline = time.monotonic() + 20
    fp = effect.grousset_fingerprint((key,), {"sleep": 6.0})
    while not Outcome.objects.using(pg).filter(fingerprint=fp, status="in_flight").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = effect.apply_async((key,), {"sleep": 6.0}, queue=queue)
    # Then both get the one run's value
    assert first.get(timeout=30) == second.get(timeout=30) and effects(pg, key) == 1
    # And the duplicate's re-queue is a Celery retry that says why (its log line, and the
    # exc that on_retry and task_retry receive), not a bare "Retry in 0.2s"
    text = "".join(w.text() for w in ws)
    assert f"[{second.id}] retry: Retry in" in text, text[-3000:]
    line = next(ln for ln in text.splitlines() if f"[{second.id}] retry:" in ln)
    assert "ClaimInFlight" in line and "another attempt holds the claim" in line, line


@pytest.mark.parametrize("backend", ["default", "mysql"], ids=["sqlite", "mariadb"])
def test_200_duplicates_one_effect_other_backends(redis_url: str, queue: str, backend: str) -> None:
    services.require_database(backend)
    with workers(queue, 2, database=backend, broker=redis_url, concurrency=2):
        for rep in range(3):
            assert _two_hundred(backend, queue, f"dup-{backend}-{rep}-{uuid.uuid4().hex[:8]}") == 1


@pytest.mark.parametrize("pool", ["threads", "gevent"])
@pytest.mark.parametrize("backend", ["default", "mysql", "postgresql"],
                         ids=["sqlite", "mariadb", "postgresql"])  # fmt: skip
def test_a_threads_or_gevent_pool_worker_runs_each_call_once(
    redis_url: str, queue: str, backend: str, pool: str
) -> None:
    """A worker's threads shared one store (and connection) per process: on SQLite two
    claims interleaved on it undid each other's transactions and a call ran twice; on
    MariaDB and psycopg2 claims failed with "already in use" errors; on PostgreSQL every
    claim queued behind the one connection. A gevent worker's greenlets share their
    thread's store, taking turns on it."""
    services.require_database(backend)
    if pool == "gevent":
        pytest.importorskip("gevent")  # a dev dependency (pyproject.toml)
    from tests.tasks import effect

    run = uuid.uuid4().hex[:8]
    keys = [f"{pool}-{backend}-{run}-{i}" for i in range(30)]
    # (gevent with a prefetch of 1 polls Redis in pauses, plain Celery too: 8 keeps it quick)
    prefetch = ["--prefetch-multiplier", "8"] if pool == "gevent" else []
    with workers(queue, 1, database=backend, broker=redis_url, concurrency=4,
                 extra=["-P", pool, *prefetch]) as started:  # fmt: skip
        # Given 30 calls, each published 6 times, to a worker running 4 threads / greenlets
        results = [effect.apply_async((k,), queue=queue) for k in keys for _ in range(6)]
        values = [r.get(timeout=120) for r in results]
        log = started[0].text()
    # Then each call's effect ran once, and each duplicate got its memo
    assert [effects(backend, k) for k in keys] == [1] * 30
    assert len({repr(v) for v in values}) == 30
    # ... and no claim failed on a connection another thread or greenlet was using
    assert "grousset.store_unavailable" not in log, log[-3000:]
    assert "FencedOut" not in log
    # ... and a threads worker said that its pool enforces no time limit (gevent's does),
    # a gevent worker that it enforces no soft time limit, naming the task that sets one
    assert ("the threads pool enforces no time limit" in log) == (pool == "threads")
    soft = [ln for ln in log.splitlines() if "the gevent pool enforces no soft_time_limit" in ln]
    assert bool(soft) == (pool == "gevent") and all("tests.tasks.soft_limited" in ln for ln in soft)


def test_guarded_tasks_behind_a_claim_on_a_locked_row_are_not_lost_on_a_gevent_worker(
    redis_url: str, queue: str, pg: str
) -> None:
    """The greenlets of a gevent worker share their thread's store, one operation at a
    time: behind copies of a call whose journal row another session held, each taking
    STORE_TIMEOUT (5 s) in turn, other guarded tasks waited past their hard time limit:
    gevent killed them before their claim was made, their messages were acknowledged,
    and the calls never ran (a review: 20 of 20 lost). A turn is waited for at most
    STORE_TIMEOUT, then the delivery is sent again."""
    pytest.importorskip("gevent")
    from tests.tasks import effect, hard_limited

    run = uuid.uuid4().hex[:8]
    hot, keys = f"hot-{run}", [f"lim-{run}-{i}" for i in range(10)]
    release, locked = threading.Event(), threading.Event()
    with workers(queue, 1, database=pg, broker=redis_url, concurrency=20,
                 extra=["-P", "gevent", "--prefetch-multiplier", "8"]):  # fmt: skip
        effect.apply_async((hot,), queue=queue).get(timeout=60)
        row = record_of(pg, effect, (hot,))

        def hold() -> None:  # another session holds the call's journal row for 25 s
            try:
                with transaction.atomic(using=pg):
                    list(Outcome.objects.using(pg).select_for_update().filter(pk=row.pk))
                    locked.set()
                    release.wait(25)
            finally:
                connections.close_all()

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert locked.wait(10)
            # Given 6 copies of the held call, each waiting up to STORE_TIMEOUT in turn
            copies = [effect.apply_async((hot,), queue=queue) for _ in range(6)]
            time.sleep(0.5)
            # When 10 other guarded calls, with a hard time limit of 12 s, come behind
            limited = [hard_limited.apply_async((k,), queue=queue) for k in keys]
            values = [r.get(timeout=150, propagate=False) for r in limited]
        finally:
            release.set()
            holder.join(30)
        for r in copies:
            r.get(timeout=150)
    # Then every one of them ran, once: none was killed waiting for its turn
    assert values == keys, values
    assert [effects(pg, k) for k in keys] == [1] * 10
    assert effects(pg, hot) == 1


def test_200_duplicates_rabbitmq(pg: str, queue: str) -> None:
    amqp = services.require_rabbitmq()
    with workers(queue, 2, database=pg, broker=amqp, concurrency=2):
        from tests.celeryapp import app

        # the producer publishes through RabbitMQ too
        with app.connection_for_write(amqp) as conn:
            from tests.tasks import effect

            key = f"dup-amqp-{uuid.uuid4().hex[:8]}"
            results = [
                effect.apply_async((key,), {"sleep": 0.2}, queue=queue, connection=conn)
                for _ in range(200)
            ]
            values = [r.get(timeout=120) for r in results]
    assert effects(pg, key) == 1
    assert len({repr(v) for v in values}) == 1
    assert record_of(pg, effect, (key,), {"sleep": 0.2}).deliveries >= 200


def test_in_flight_duplicates_on_a_rabbitmq_quorum_queue(pg: str, queue: str) -> None:
    """Celery delays a message to a quorum queue on a topic exchange in the broker, in
    whole seconds, and refuses a countdown under one second: an in-flight requeue sooner
    than that was handed back to the broker at once, over and over, until the queue's
    delivery limit dropped it (its caller never got the memo)."""
    amqp = services.require_rabbitmq()
    from tests.celeryapp import app, quorum_queue
    from tests.tasks import effect

    target = quorum_queue(queue)
    with workers(queue, 1, database=pg, broker=amqp, concurrency=2,
                 env={"GROUSSET_TEST_QUORUM": "1"}) as started:  # fmt: skip
        with app.connection_for_write(amqp) as conn:
            key = f"quorum-{uuid.uuid4().hex[:8]}"
            # Given a call in flight for 3 s and two duplicates of it on the quorum queue
            results = [effect.apply_async((key,), {"sleep": 3.0}, queue=target, connection=conn)
                       for _ in range(3)]  # fmt: skip
            # When they are delivered (each duplicate requeued while the call runs)
            values = [r.get(timeout=60) for r in results]
        log = started[0].text()
    # Then each got the one outcome: the effect ran once, no requeue was refused
    assert effects(pg, key) == 1 and len({repr(v) for v in values}) == 1
    assert "countdown must be a positive number" not in log
    assert record_of(pg, effect, (key,), {"sleep": 3.0}).duplicates == 2


def test_a_duplicate_requeued_through_the_delay_queues_comes_back_on_rabbitmq(
    pg: str, queue: str
) -> None:
    """A copy sent again kept the dead-letter history (``x-death``) RabbitMQ wrote on the
    delivery, which Celery's own retry drops: delayed through a delay queue it had passed
    before, the copy was a dead-letter cycle, stuck in the broker (a review: the
    duplicate never answered)."""
    amqp = services.require_rabbitmq()
    from tests.celeryapp import app, quorum_queue
    from tests.tasks import effect

    target = quorum_queue(queue)
    with (
        workers(queue, 1, database=pg, broker=amqp, concurrency=2,
                env={"GROUSSET_TEST_QUORUM": "1"}),
        app.connection_for_write(amqp) as conn,
    ):  # fmt: skip
        key = f"xdeath-{uuid.uuid4().hex[:8]}"
        # Given a call in flight for 14 s, and a duplicate requeued meanwhile with
        # growing delays (1, 1, 1, 2, 4, 8 s: through the delay queues, twice)
        first = effect.apply_async((key,), {"sleep": 14.0}, queue=target, connection=conn)
        fp = effect.grousset_fingerprint((key,), {"sleep": 14.0})
        claimed = Outcome.objects.using(pg).filter(fingerprint=fp, status="in_flight")
        wait_for(claimed.exists, 20, "the call to be claimed")
        dup = effect.apply_async((key,), {"sleep": 14.0}, queue=target, connection=conn)
        # When the call completes / Then the duplicate comes back and gets its memo
        values = [first.get(timeout=60), dup.get(timeout=60)]
    assert effects(pg, key) == 1 and values[0] == values[1]
    assert record_of(pg, effect, (key,), {"sleep": 14.0}).duplicates == 1


def test_a_requeue_the_broker_refuses_waits_before_its_delivery_goes_back(
    pg: str, queue: str, redis_url: str
) -> None:
    """A requeue whose republish kept failing handed its delivery back to the broker at
    once, which delivered it again at once: a hot loop of claims for as long as the call
    stayed in flight."""
    from tests.tasks import unrequeuable

    key, kwargs = f"refused-{uuid.uuid4().hex[:8]}", {"sleep": 6.0}
    with workers(queue, 1, database=pg, broker=redis_url, concurrency=2) as started:
        # Given a call in flight for 6 s
        first = unrequeuable.apply_async((key,), kwargs, queue=queue)
        wait_for(lambda: effects(pg, key), 30, "the first call's effect")
        # When a duplicate arrives, whose in-flight requeue the broker refuses every time
        dup = unrequeuable.apply_async((key,), kwargs, queue=queue)
        values = [first.get(timeout=60), dup.get(timeout=60)]
        log = started[0].text()
    # Then the duplicate still got the memo once the call completed, the effect ran once
    assert effects(pg, key) == 1 and values[0] == values[1]
    # ... and its delivery went back to the broker after growing waits: a few claims in
    # 6 s, not one every few milliseconds
    rec = record_of(pg, unrequeuable, (key,), kwargs)
    assert 2 <= rec.deliveries <= 12, rec.deliveries
    assert "grousset.requeue_failed" in log and "SerializerNotInstalled" in log
    assert "enforces no time limit" not in log  # (a prefork worker)


def test_sigkill_mid_effect_is_taken_over_after_max_processing_time(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    from tests.tasks import booking, short_claim

    queue, _ = pg_workers
    for task in (short_claim, booking):
        key = f"kill-{task.name}-{uuid.uuid4().hex[:8]}"
        # Given a task in the middle of its effect (max_processing_time 3 s)
        result = task.apply_async((key, 5.0), queue=queue)
        pid = holder_pid(pg, task, (key, 5.0))
        if task is short_claim:  # (its effect done: the claim alone was killed before it)
            wait_for(lambda: effects(pg, key) == 1, 30, "the effect")  # noqa: B023
        killed, stale_at = (lambda r: (r.fence, r.stale_at))(record_of(pg, task, (key, 5.0)))
        # When its worker child is SIGKILLed (acks_late + reject_on_worker_lost: redelivered)
        os.kill(pid, signal.SIGKILL)
        value = result.get(timeout=60)
        # Then the redelivery waited for the claim to turn stale, then took over
        rec = record_of(pg, task, (key, 5.0))
        assert rec.status == "completed" and rec.takeovers == 1 and rec.fence > killed
        assert value["fence"] == rec.fence and value["pid"] != pid
        # And one publish shows no duplicate: its redelivery, requeues and takeover are
        # counted as redeliveries, and the first claim's time is kept beside the takeover's
        assert rec.duplicates == 0 and rec.deliveries >= 2
        assert rec.first_claimed_at is not None and rec.first_claimed_at < rec.started_at
        story = inspect(pg, result.id)
        again = rec.deliveries - 1
        assert f"{rec.deliveries} deliveries (0 duplicates, {again} redeliver" in story, story
        assert "first claim" in story
        assert rec.started_at >= stale_at  # it did not run at once: it waited for staleness
        if task is booking:
            # transactional: the killed attempt's write never committed
            assert effects(pg, key) == 1
        else:
            # the documented window: the killed attempt's effect happened, counted as a takeover
            assert effects(pg, key) == 2


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
def test_zombie_cannot_overwrite_result(
    pg_workers: tuple[str, list[Worker]], pg: str, transactional: bool
) -> None:
    from tests.tasks import booking, short_claim

    task = booking if transactional else short_claim
    queue, _ = pg_workers
    key = f"zombie-{uuid.uuid4().hex[:8]}"
    # Given an attempt frozen (SIGSTOP) mid-effect (10 s: frozen before it ends, however
    # late the signal comes) past max_processing_time (3 s)
    first = task.apply_async((key, 10.0), queue=queue)
    pid = holder_pid(pg, task, (key, 10.0))
    frozen = record_of(pg, task, (key, 10.0)).fence
    os.kill(pid, signal.SIGSTOP)
    try:
        # When a duplicate delivery takes over and completes
        second = task.apply_async((key, 10.0), queue=queue)
        value = second.get(timeout=60)
        assert value["fence"] > frozen
    finally:
        os.kill(pid, signal.SIGCONT)
    # Then the resumed zombie is fenced out: its completion is refused
    with pytest.raises(Exception) as err:
        first.get(timeout=60)
    assert "FencedOut" in type(err.value).__name__ or "FencedOut" in str(err.value)
    rec = record_of(pg, task, (key, 10.0))
    assert rec.status == "completed" and rec.fence == value["fence"] and rec.takeovers == 1
    from celery_grousset import memo

    memoized = memo.decode(bytes(rec.result), rec.result_encoding, rec.error, rec.fingerprint)
    assert memoized == value
    assert effects(pg, key) == (1 if transactional else 2)


@pytest.mark.parametrize("task_name", ["flaky_retry", "flaky_auto"])
def test_retries_reclaim_at_once(
    pg_workers: tuple[str, list[Worker]], pg: str, task_name: str
) -> None:
    from tests import tasks

    task = getattr(tasks, task_name)
    queue, _ = pg_workers
    key = f"{task_name}-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    # Given a task that fails once, then succeeds on Celery's own retry (same task id)
    value = task.apply_async((key, 1), queue=queue).get(timeout=25)
    # Then the retry re-claimed at once (max_processing_time is 30 s)
    assert value == "done after 2"
    assert time.monotonic() - t0 < 20
    assert effects(pg, key, "attempt") == 2 and effects(pg, key, "done") == 1
    rec = record_of(pg, task, (key, 1))
    assert rec.status == "completed" and rec.deliveries == 2 and rec.takeovers == 0


def test_a_retry_with_other_arguments_is_the_same_call(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    from celery_grousset.exceptions import PayloadMismatch
    from tests.tasks import capture

    queue, _ = pg_workers
    order = f"o-{uuid.uuid4().hex[:8]}"
    # Given a task keyed by order_id whose first attempt retries on a backup gateway,
    # with other arguments (self.retry(kwargs=...): the same task id)
    value = capture.apply_async((order, "3.00"), queue=queue).get(timeout=25)
    # Then the retry is not refused as another call: it runs, once
    assert value == f"captured {order} via backup"
    assert effects(pg, f"capture-{order}", "backup") == 1
    # And another call of the key with other arguments than the record's is refused
    with pytest.raises(PayloadMismatch):
        capture.apply_async((order, "9.99"), queue=queue).get(timeout=25)
    assert effects(pg, f"capture-{order}") == 1


def test_an_unkeyed_retry_with_other_arguments_stays_its_call(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    """An unkeyed task retried with other arguments (the backup gateway) ran under a
    fingerprint of its own and released the call's: a producer's retry of the call (its
    first arguments, another task id) then claimed it and charged again."""
    from tests.tasks import capture_unkeyed

    queue, _ = pg_workers
    order = f"o-{uuid.uuid4().hex[:8]}"
    # Given a call whose first attempt retries on the backup gateway, other arguments
    first = capture_unkeyed.apply_async((order, "3.00"), queue=queue).get(timeout=25)
    assert first == f"captured {order} via backup"
    # When the producer sends the call again (its first arguments, another task id)
    again = capture_unkeyed.apply_async((order, "3.00"), queue=queue).get(timeout=25)
    # Then it is the same call: answered with the retry's value, charged once
    assert again == first
    assert effects(pg, f"capture-{order}", "backup") == 1
    assert effects(pg, f"capture-{order}", "primary") == 0
    rec = record_of(pg, capture_unkeyed, (order, "3.00"))
    assert rec.status == "completed" and rec.deliveries == 3


def test_a_retry_sent_with_throw_false_is_a_call_of_its_own(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    """retry(throw=False) lets the attempt go on and complete: its retry, marked as the
    same call, was answered from that attempt's memo and never ran (0 effects)."""
    from tests.tasks import notify_fallback

    queue, _ = pg_workers
    order = f"o-{uuid.uuid4().hex[:8]}"
    # When the attempt sends its retry with other arguments, throw=False, and returns
    assert notify_fallback.apply_async((order,), queue=queue).get(timeout=25) == "sms down"
    # Then the retry runs too, once
    deadline = time.monotonic() + 20
    while effects(pg, f"notify-{order}", "email") == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    assert effects(pg, f"notify-{order}", "email") == 1


def test_short_visibility_timeout_copies_run_once(redis_url: str, pg: str, queue: str) -> None:
    from tests.tasks import effect

    env = {"GROUSSET_TEST_VISIBILITY": "1"}
    with workers(queue, 2, database=pg, broker=redis_url, env=env) as ws:
        key = f"vt-{uuid.uuid4().hex[:8]}"
        # Given a countdown longer than the Redis visibility_timeout (1 s); the workers
        # restore unacked messages every second, so copies exist by the ETA
        result = effect.apply_async((key,), queue=queue, countdown=4)
        # When copies of the message are restored and arrive at the ETA
        value = result.get(timeout=60)
        time.sleep(1.5)
    received = sum(w.text().count(f"[{result.id}] received") for w in ws)
    # Then the broker really delivered copies, and the effect ran once
    assert received >= 2, f"expected redelivered copies, saw {received}"
    assert effects(pg, key) == 1
    assert value["key"] == key


def _pg_ctl(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.serial  # stops the machine's PostgreSQL
def test_postgresql_down_fails_closed_then_runs_once(redis_url: str, pg: str, queue: str) -> None:
    if not os.path.isdir("/etc/postgresql") or os.geteuid() != 0:
        services.unavailable("pg_ctlcluster", "needs root and a local PostgreSQL cluster")
    from tests.tasks import effect

    env = {"GROUSSET_TEST_STORE_TIMEOUT": "2"}
    with workers(queue, 1, database=pg, broker=redis_url, env=env) as ws:
        keys = [f"down-{i}-{uuid.uuid4().hex[:6]}" for i in range(5)]
        _pg_ctl("stop")
        try:
            # Given PostgreSQL is stopped while tasks are queued
            results = [effect.apply_async((k,), queue=queue) for k in keys]
            wait_for(
                lambda: ws[0].text().count("grousset.store_unavailable") >= 5,
                60,
                "every delivery to fail closed",
            )
        finally:
            _pg_ctl("start")
        # When it comes back / Then each task runs exactly once
        values = [r.get(timeout=90) for r in results]
    assert [v["key"] for v in values] == keys
    from django.db import connections

    connections[pg].close()
    assert [effects(pg, k) for k in keys] == [1] * 5


@pytest.mark.parametrize("env, said", [
    # GROUSSET has an error
    ({"GROUSSET_TEST_LAYOUT": "bogus"}, ("JOURNAL_LAYOUT", "this worker does not start")),
    # the project forgot 'celery_grousset' in INSTALLED_APPS (its celery.py calls
    # install(app); GROUSSET is set): GROUSSET["TASKS"] would guard nothing
    ({"GROUSSET_TEST_WITHOUT_APP": "1"},
     ("celery_grousset.E020", "not in INSTALLED_APPS", "Add 'celery_grousset' to INSTALLED_APPS")),
], ids=["grousset-error", "app-not-installed"])  # fmt: skip
def test_a_worker_with_a_configuration_error_refuses_to_start_and_loses_nothing(
    redis_url: str, pg: str, queue: str, env: dict[str, str], said: tuple[str, ...]
) -> None:
    from tests.tasks import effect
    from tests.workers import start_worker

    key = f"refused-{uuid.uuid4().hex[:8]}"
    # Given a guarded task's message waiting in the broker
    result = effect.apply_async((key,), queue=queue)
    # When a worker with the configuration error starts on its queue
    with pytest.raises(RuntimeError, match="worker exited with 1") as refused:
        start_worker(queue, database=pg, broker=redis_url, env=env).kill()
    # Then it does not start: it names the problem and the fix, and ran nothing
    text = str(refused.value)
    assert all(part in text for part in said), text
    assert effects(pg, key) == 0
    # And the message waited: a worker started after the fix runs it, once
    with workers(queue, 1, database=pg, broker=redis_url):
        assert result.get(timeout=60)["key"] == key
    assert effects(pg, key) == 1


def test_a_worker_whose_time_limit_is_not_below_max_processing_time_refuses_to_start(
    redis_url: str, pg: str, queue: str
) -> None:
    from tests.workers import start_worker

    # When a worker starts with a hard --time-limit (its tasks' default, not in app.conf)
    # above the guarded tasks' max_processing_time (30 s)
    with pytest.raises(RuntimeError, match="worker exited with 1") as refused:
        start_worker(queue, database=pg, broker=redis_url, extra=["--time-limit", "40"]).kill()
    # Then it does not start: a live attempt could be taken over before the limit kills it
    text = str(refused.value)
    assert "celery_grousset.E002" in text and "hard time_limit 40" in text, text


def test_a_worker_on_an_unmigrated_journal_says_so_when_it_starts(
    redis_url: str, queue: str, tmp_path: Any
) -> None:
    from tests.workers import start_worker

    # Given a journal database where `migrate` has not run yet (a new SQLite file)
    env = {"GROUSSET_TEST_SQLITE": str(tmp_path / "never-migrated.sqlite3")}
    # When a worker starts on it (a deploy may start workers before its migrations)
    worker = start_worker(queue, database="default", broker=redis_url, env=env)
    try:
        deadline = time.monotonic() + 30
        while "journal database 'default'" not in (text := worker.text()):
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
    finally:
        worker.stop()
    # Then it starts, and its log names the database, the problem and the fix at once
    # (not only in every delivery's retry)
    assert "celery-grousset: journal database 'default': the journal's tables do not " \
        "exist" in text, text
    assert "run `manage.py migrate celery_grousset`" in text, text
    assert "retried, never run, until then" in text, text


def test_a_worker_on_a_journal_of_the_other_layout_says_so_when_it_starts(
    redis_url: str, queue: str
) -> None:
    from tests import services
    from tests.workers import start_worker

    # Given a partitioned journal, and a worker whose JOURNAL_LAYOUT is the single table
    part = services.require_partitioned()
    worker = start_worker(queue, database=part, broker=redis_url,
                          env={"GROUSSET_TEST_LAYOUT": "table"})  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "JOURNAL_LAYOUT'] is 'table'" not in (text := worker.text()):
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
    finally:
        worker.stop()
    # Then its log names the mismatch and the fix at once (every claim there would fail)
    assert "GROUSSET['JOURNAL_LAYOUT'] is 'table', but the journal in database" in text, text
    assert "retried, never run, until then" in text, text


def test_bypass_runs_tasks_when_the_configuration_has_an_error(
    redis_url: str, pg: str, queue: str
) -> None:
    from tests.tasks import effect
    from tests.workers import start_worker

    key = f"bypassed-{uuid.uuid4().hex[:8]}"
    # Given a worker whose GROUSSET has an error, started with the emergency switch
    env = {"GROUSSET_TEST_LAYOUT": "bogus"}
    flag = ["--grousset-bypass"]
    worker = start_worker(queue, database=pg, broker=redis_url, env=env, extra=flag)
    try:
        # When a guarded task is sent twice
        results = [effect.apply_async((key,), queue=queue) for _ in range(2)]
        # Then both deliveries run, unguarded, as the switch promises: none fails
        assert [r.get(timeout=60)["key"] for r in results] == [key, key]
    finally:
        worker.kill()
    assert effects(pg, key) == 2
    assert not Outcome.objects.using(pg).filter(task_name=effect.name).filter(
        args_repr__contains=key
    ).exists()


def test_a_plain_producers_reprs_never_reach_the_journal(
    redis_url: str, pg: str, queue: str
) -> None:
    from celery import current_app

    from tests.tasks import login

    with workers(queue, 1, database=pg, broker=redis_url):
        # Given producers that are not GroussetTask: send_task by name, one with its own
        # argsrepr and Celery's unredacted kwargsrepr, one with a positional secret
        sent = [
            current_app.send_task(login.name, ("bob",), {"password": "kw-hunter2"},
                                  argsrepr="(user)", queue=queue),
            current_app.send_task(login.name, ("eve", "pos-hunter2"), queue=queue),
        ]  # fmt: skip
        assert [r.get(timeout=30) for r in sent] == ["logged in bob", "logged in eve"]
    # Then the journal holds only the package's own redaction, bound by name
    for user, password in (("bob", "kw-hunter2"), ("eve", "pos-hunter2")):
        rec = record_of(pg, login, (user,), {"password": password})
        assert password not in rec.args_repr and "(user)" not in rec.args_repr
        assert rec.args_repr == f"user='{user}', password='***'"


def test_which_header_names_read_like_the_key() -> None:
    from celery_grousset.delivery import misspelt_key

    # A key under another spelling is refused; a flag or a header of another meaning is not
    for name in ("idempotency_key", "Idempotency-Key", "idempotencyKey", "x-idempotency-key",
                 "idempotency_keys", "grousset-key", "Grousset_Key", "grousset_keys"):
        assert misspelt_key(name), name
    for name in ("grousset_key", "idempotent", "is_idempotent", "idempotency",
                 "x-idempotency-checked", "grousset_slot", "grousset_outcome", "key",
                 "routing_key", "grousset_retry_of", "grousset_requeues"):  # fmt: skip
        assert not misspelt_key(name), name


@pytest.mark.parametrize("batch", [False, True], ids=["per-task", "worker-claim"])
def test_a_misspelt_key_header_from_send_task_is_refused_not_keyed_by_arguments(
    redis_url: str, pg: str, queue: str, batch: bool
) -> None:
    from celery import current_app

    from celery_grousset.exceptions import FingerprintError
    from tests.tasks import effect

    key = f"misspelt-{uuid.uuid4().hex[:8]}"
    extra = ["--grousset-batch"] if batch else []
    with workers(queue, 1, database=pg, broker=redis_url, extra=extra):
        # Given a producer that is not GroussetTask naming the call's key under a header
        # nothing reads (two spellings), and one under the header that is read
        wrong = [
            current_app.send_task(effect.name, (f"{key}-{i}",), headers={name: key},
                                  queue=queue)
            for i, name in enumerate(("idempotency_key", "grousset-key"))
        ]  # fmt: skip
        right = [
            current_app.send_task(effect.name, (f"{key}-r",),
                                  headers={"grousset_key": f"{key}-k"}, queue=queue)
            for _ in range(2)
        ]  # fmt: skip
        # Then the misspelt ones fail, naming the header and the one that works
        for result, name in zip(wrong, ("idempotency_key", "grousset-key"), strict=True):
            with pytest.raises(FingerprintError, match=f"'{name}' is not read.*'grousset_key'"):
                result.get(timeout=30)
        # and the keyed call runs once for its key
        assert [r.get(timeout=30)["key"] for r in right] == [f"{key}-r", f"{key}-r"]
    # Nothing ran for a misspelt key; one effect for the key that is read
    assert [effects(pg, f"{key}-{i}") for i in range(2)] == [0, 0]
    assert effects(pg, f"{key}-r") == 1


def test_password_never_stored_or_logged(redis_url: str, pg: str, queue: str) -> None:
    import redis

    from tests.tasks import login

    with workers(queue, 1, database=pg, broker=redis_url) as ws:
        # Given a task called with a secret
        result = login.apply_async(("bob",), {"password": "hunter2"}, queue=queue)
        assert result.get(timeout=30) == "logged in bob"
        # and a duplicate, so the duplicate's log line is written too
        login.apply_async(("bob",), {"password": "hunter2"}, queue=queue).get(timeout=30)
        log = ws[0].text()
    # Then neither the journal, the worker log nor the result backend holds it
    rec = record_of(pg, login, ("bob",), {"password": "hunter2"})
    assert "***" in rec.args_repr and "bob" in rec.args_repr
    from django.db import connections

    assert "hunter2" not in log
    backend = redis.Redis.from_url(
        os.environ.get("GROUSSET_TEST_BACKEND", "redis://127.0.0.1:6379/15")
    )
    for k in backend.scan_iter(f"*{result.id}*"):
        assert b"hunter2" not in (backend.get(k) or b"")
    with connections[pg].cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM celery_grousset_outcome o "
            "WHERE position('hunter2' in o::text) > 0"
        )
        assert cur.fetchone()[0] == 0


def test_a_pool_child_stopped_by_sigterm_mid_effect_keeps_its_claim(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    from tests.tasks import effect

    queue, _ = pg_workers
    key = f"sigterm-{uuid.uuid4().hex[:8]}"
    # Given a task that has run its effect and holds its claim (max_processing_time 30 s)
    effect.apply_async((key, 20.0), queue=queue)
    pid = holder_pid(pg, effect, (key, 20.0))
    wait_for(lambda: effects(pg, key) == 1, 20, "the effect")
    # When its pool child is stopped with SIGTERM (a hard time limit, a group-wide stop:
    # the child sees SystemExit in the middle of the body)
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 20, "the child to exit")
    # And a duplicate of the call is delivered
    effect.apply_async((key, 20.0), queue=queue)
    wait_for(lambda: record_of(pg, effect, (key, 20.0)).deliveries >= 2, 20, "the duplicate")
    # Then the claim was not given up: the duplicate found it in flight and did not run
    # the effect again (a re-run waits for max_processing_time, as a takeover)
    rec = record_of(pg, effect, (key, 20.0))
    assert (rec.status, rec.takeovers) == ("in_flight", 0), (rec.status, rec.error)
    assert effects(pg, key) == 1


def test_revoke_terminate_with_a_signal_that_does_not_end_the_process_keeps_the_claim(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    from tests.tasks import graceful

    queue, _ = pg_workers
    key = f"usr1-{uuid.uuid4().hex[:8]}"
    # Given a running task that ends gracefully on SIGUSR1 (a soft time limit)
    first = graceful.apply_async((key,), queue=queue)
    holder_pid(pg, graceful, (key,))
    # (in its sleep: a signal that came while it wrote its effect was not caught)
    wait_for(lambda: effects(pg, key), 20, "the body's effect")
    # When it is revoked with terminate=True and SIGUSR1 (sent again only while no worker
    # logs it: a second signal would cut the clean-up), and a duplicate arrives once the
    # signal has reached the body
    revoke_terminate(queue, first.id, "SIGUSR1")
    wait_for(lambda: effects(pg, f"{key}:signalled"), 20, "the signal to reach the body")
    assert effects(pg, f"{key}:signalled") == 1
    dup = graceful.apply_async((key,), queue=queue)
    # Then the attempt went on under its claim and completed (Celery marks the revoked
    # task's own result REVOKED); the duplicate got its memo, not a second run
    value = dup.get(timeout=30)
    assert value["key"] == key and value["partial"] is True, value
    rec = record_of(pg, graceful, (key,))
    assert rec.status == "completed" and rec.takeovers == 0 and rec.fence == value["fence"]
    assert effects(pg, key) == 1


def test_revoke_terminate_releases_the_claim(pg_workers: tuple[str, list[Worker]], pg: str) -> None:
    from tests.celeryapp import app
    from tests.tasks import effect

    queue, _ = pg_workers
    key = f"revoke-{uuid.uuid4().hex[:8]}"
    # Given a long task holding its claim (max_processing_time 30 s)
    first = effect.apply_async((key, 20.0), queue=queue)
    holder_pid(pg, effect, (key, 20.0))
    # When it is revoked with terminate=True
    app.control.revoke(first.id, terminate=True)
    rec = wait_for(
        lambda: (r := record_of(pg, effect, (key, 20.0))).status != "in_flight" and r,
        20,
        "the claim to be released",
    )
    # Then the claim is released at once (by the task_revoked handler in the worker's
    # main process), and the next delivery runs without waiting 30 s
    assert rec.status == "failed" and rec.result_encoding == ""
    t0 = time.monotonic()
    value = effect.apply_async((key, 0.0), queue=queue, idempotency_key=None).get(timeout=20)
    assert value["key"] == key
    second = effect.apply_async((key, 20.0), queue=queue)
    assert second.get(timeout=40)["fence"] > rec.fence
    assert time.monotonic() - t0 < 40  # (20 s of body; a stale-claim wait: 50 s and more)


def test_revoke_terminate_of_a_body_that_goes_on_keeps_its_claim(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    """The claim was released when the revoke's signal was sent, not once the process
    had exited: a body that caught the SystemExit went on, and a duplicate delivered
    meanwhile ran the effect beside it (a review: 2 effects)."""
    from tests.tasks import stubborn

    queue, _ = pg_workers
    key = f"stubborn-{uuid.uuid4().hex[:8]}"
    # Given a running task whose body swallows the SystemExit of a SIGTERM
    first = stubborn.apply_async((key,), queue=queue)
    holder_pid(pg, stubborn, (key,))
    # (in its loop: a signal that came while it wrote ``started`` was not swallowed)
    wait_for(lambda: effects(pg, f"{key}:started"), 20, "the body to start")
    # When it is revoked with terminate=True (sent again while no worker logs it)
    revoke_terminate(queue, first.id, "SIGTERM")
    wait_for(lambda: effects(pg, f"{key}:signalled"), 20, "the signal to reach the body")
    # And a duplicate is delivered while the body goes on
    value = stubborn.apply_async((key,), queue=queue).get(timeout=40)
    # Then the body kept its claim and completed; the duplicate got its memo
    rec = record_of(pg, stubborn, (key,))
    assert (rec.status, rec.takeovers) == ("completed", 0), (rec.status, rec.error)
    assert value["fence"] == rec.fence
    assert effects(pg, key) == 1


def test_revoke_terminate_while_the_outcome_is_written_keeps_the_outcome(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    """A revoke's SIGTERM that came while the outcome of an effect that ran was being
    written (a row lock) dropped that outcome; the claim was released once the process
    had gone, and a duplicate ran the effect again (a review: 2 effects)."""
    from django.db import transaction

    from tests.celeryapp import app
    from tests.tasks import effect

    queue, _ = pg_workers
    key = f"revokewrite-{uuid.uuid4().hex[:8]}"
    first = effect.apply_async((key, 1.0), queue=queue)
    holder_pid(pg, effect, (key, 1.0))
    # Given an attempt whose outcome waits on the row's lock after its effect ran
    with transaction.atomic(using=pg):
        locked = Outcome.objects.using(pg).select_for_update()
        locked.get(fingerprint=effect.grousset_fingerprint((key, 1.0), {}))
        wait_for(lambda: effects(pg, key), 20, "the effect")
        wait_for(lambda: lock_waiters(pg), 20, "the completion to wait on the lock")
        # When it is revoked with terminate=True while it waits
        app.control.revoke(first.id, terminate=True)
        wait_for(lambda: logged(queue, f"Terminating {first.id}"), 20, "the revoke")
        time.sleep(1.0)  # (the signal handled while the lock is held)
    # Then its outcome is written before the process goes: a duplicate gets the memo
    rec = wait_for(lambda: (r := record_of(pg, effect, (key, 1.0))).status != "in_flight" and r,
                   20, "the record to settle")  # fmt: skip
    assert rec.status == "completed", (rec.status, rec.error)
    value = effect.apply_async((key, 1.0), queue=queue).get(timeout=20)
    assert value["fence"] == rec.fence and effects(pg, key) == 1


def test_a_chord_member_with_no_memo_fails_its_chord_instead_of_reporting_none(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    """A duplicate of a ``memoize=False`` call in a chord's header reported ``None`` as
    its part, and the chord's body ran on it (a review: ``body([value, None])``)."""
    from celery import chord

    from celery_grousset.exceptions import ResultNotStored
    from tests.tasks import gathered, unmemoized

    queue, _ = pg_workers
    key = f"nomemochord-{uuid.uuid4().hex[:8]}"
    # Given a chord whose header holds one not-memoized call twice (two task ids)
    header = [unmemoized.s(key).set(queue=queue) for _ in range(2)]
    result = chord(header, gathered.s(key).set(queue=queue)).apply_async()
    # When it runs: the call's second member is a duplicate, with no value to report
    with pytest.raises(ResultNotStored, match="no value to report to its chord"):
        result.get(timeout=40)
    # Then the effect ran once, and the chord failed instead of running its body
    assert effects(pg, key) == 1
    assert effects(pg, f"{key}:body") == 0


def test_a_chain_in_a_chord_led_by_a_call_with_no_memo_fails_the_chord(
    pg_workers: tuple[str, list[Worker]], pg: str
) -> None:
    """In a chord's header, Celery gives the chord to a chain's last step: a duplicate
    leading such a chain, with no memo, stopped the chain, so its part never reached the
    chord and the chord's body never ran: the chord hung (a review)."""
    from celery import chain, chord

    from celery_grousset.exceptions import ResultNotStored
    from tests.tasks import gathered, unmemoized

    queue, _ = pg_workers
    key = f"nomemochain-{uuid.uuid4().hex[:8]}"
    # Given a chord whose header holds two chains led by one not-memoized call
    header = [chain(unmemoized.s(key).set(queue=queue), gathered.s(f"{key}-{i}").set(queue=queue))
              for i in range(2)]  # fmt: skip
    result = chord(header, gathered.s(key).set(queue=queue)).apply_async()
    # When it runs / Then the chord fails instead of waiting for ever
    with pytest.raises(ResultNotStored, match="no value to report to its chord"):
        result.get(timeout=40)
    assert effects(pg, key) == 1 and effects(pg, f"{key}:body") == 0


@pytest.fixture(params=["postgresql", "mysql"])
def journal_queue(request: pytest.FixtureRequest) -> tuple[str, str]:
    """A journal alias and the queue of workers whose journal it is (PostgreSQL's client
    cancels a waiting statement; MariaDB's cannot, and it returns once the lock is let go)."""
    if request.param == "postgresql":
        return "postgresql", request.getfixturevalue("pg_workers")[0]
    return "mysql", request.getfixturevalue("mysql_queue")


def test_a_soft_time_limit_during_the_claim_leaves_no_claim_behind(
    journal_queue: tuple[str, str],
) -> None:
    """A soft time limit that fired while the claim statement waited (a row lock) failed
    the delivery, and the statement committed after: a claim no attempt held, in flight
    until stale, then counted as a takeover (a review: the next delivery waited 60 s)."""
    from django.db import transaction

    from tests.tasks import fails_first

    alias, queue = journal_queue
    key = f"softclaim-{uuid.uuid4().hex[:8]}"
    # Given a key whose first attempt failed (its row stays, its claim released)
    with pytest.raises(RuntimeError):
        fails_first.apply_async((key,), queue=queue).get(timeout=20)
    # When a delivery's claim waits on the row's lock past its soft time limit (1 s)
    with transaction.atomic(using=alias):
        locked = Outcome.objects.using(alias).select_for_update()
        locked.get(fingerprint=fails_first.grousset_fingerprint((key,), {}))
        result = fails_first.apply_async((key,), queue=queue, soft_time_limit=1, time_limit=30)
        wait_for(lambda: lock_waiters(alias), 20, "the claim to wait on the row's lock")
        # (the lock is let go once the limit has fired, well before the requeued delivery
        # comes, STORE_RETRY_BACKOFF later: a lock let go at a fixed time could land just
        # before a requeued delivery's own limit, which then cut its body)
        fired = f"Soft time limit (1s) exceeded for {fails_first.name}[{result.id}]"
        wait_for(lambda: logged(queue, fired), 20, "the soft time limit")  # (then signalled)
        if alias == "postgresql":  # the limit cancels the statement; MariaDB's returns
            wait_for(lambda: not lock_waiters(alias), 10, "the claim to be cancelled")
    # Then the delivery is sent again, settles its claim and runs the body: one effect,
    # no takeover, well within max_processing_time (30 s)
    t0 = time.monotonic()
    value = result.get(timeout=25)
    rec = record_of(alias, fails_first, (key,))
    assert (rec.status, rec.takeovers) == ("completed", 0), (rec.status, rec.error)
    assert value["fence"] == rec.fence and effects(alias, key) == 1
    assert time.monotonic() - t0 < 20


def test_a_soft_time_limit_during_the_failure_write_raises_the_bodys_own_error(
    journal_queue: tuple[str, str],
) -> None:
    """A soft time limit that fired while a failed attempt's release waited (a row lock)
    escaped the failure path, which never raises: the caller saw SoftTimeLimitExceeded
    instead of the body's own error (a review, suspected; confirmed here). And the
    release was not sent again: the claim stayed in flight until stale, and the next
    delivery counted a takeover (a review, on all three journals)."""
    from django.db import transaction

    from tests.tasks import fails_slowly

    alias, queue = journal_queue
    key = f"softfail-{uuid.uuid4().hex[:8]}"
    call = {"sleep": 2.0}
    # Given a body that fails after 2 s, under a soft time limit of 3 s
    result = fails_slowly.apply_async((key,), call, queue=queue, soft_time_limit=3,
                                      time_limit=30)  # fmt: skip
    wait_for(lambda: effects(alias, f"{key}:started") == 1, 20, "the body to start")
    # When its release waits on the row's lock past the soft time limit
    with transaction.atomic(using=alias):
        locked = Outcome.objects.using(alias).select_for_update()
        locked.get(fingerprint=fails_slowly.grousset_fingerprint((key,), call))
        wait_for(lambda: lock_waiters(alias), 20, "the release to wait on the row's lock")
        fired = f"Soft time limit (3s) exceeded for {fails_slowly.name}[{result.id}]"
        wait_for(lambda: logged(queue, fired), 20, "the soft time limit")  # (then let go)
        if alias == "postgresql":  # the limit cancels the statement; MariaDB's returns
            wait_for(lambda: not lock_waiters(alias), 10, "the release to be cancelled")
    # Then the caller sees the body's own error
    with pytest.raises(RuntimeError, match="the body's own error"):
        result.get(timeout=20)
    # And the release, sent again once the limit had cut it, freed the claim: the next
    # delivery runs at once (max_processing_time is 30 s), with no takeover
    rec = record_of(alias, fails_slowly, (key,), call)
    assert (rec.status, rec.takeovers) == ("failed", 0), (rec.status, rec.error)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="the body's own error"):
        fails_slowly.apply_async((key,), call, queue=queue).get(timeout=20)
    assert time.monotonic() - t0 < 15
    assert record_of(alias, fails_slowly, (key,), call).takeovers == 0
    assert effects(alias, f"{key}:started") == 2


def test_a_worker_whose_journal_database_cannot_be_reached_says_so_when_it_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's start-up check said nothing of a journal database it could not reach
    (a review: a wrong port): only each delivery's retry did, once tasks came."""
    import logging
    import socket
    import threading

    from django.conf import settings
    from django.test import override_settings

    from celery_grousset.startcheck import log_schema_problems

    services.require_database("postgresql")
    with socket.socket() as sock:  # a port nothing listens on: the connect is refused
        sock.bind(("127.0.0.1", 0))
        closed = str(sock.getsockname()[1])
    pg = {**settings.DATABASES["postgresql"], "PORT": closed}
    with services.extra_database("unreachable", **pg), \
            override_settings(GROUSSET={"DATABASE": "unreachable"}), \
            caplog.at_level(logging.ERROR, logger="celery_grousset"):  # fmt: skip
        # When a worker's start-up check runs (in a thread of its own, as at the start)
        thread = threading.Thread(target=log_schema_problems)
        thread.start()
        thread.join(30)
    # Then it logs an error naming the database, the reason and what becomes of the tasks
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("journal database 'unreachable'" in m and "could not be inspected" in m
               and "retried, never run, until then" in m for m in logged), logged  # fmt: skip


def test_a_journal_database_that_never_answers_holds_up_only_its_own_start_up_check(
    caplog: pytest.LogCaptureFixture, temp_task: Any
) -> None:
    """The start-up check went through the journal databases one after another on
    Django's connections (no connect timeout): one that never answered held up the check
    of every database after it, whose problems the worker then never said (a review, two
    journal databases: a broken one never reported)."""
    import logging
    import socket
    import threading

    from django.conf import settings
    from django.test import override_settings

    from celery_grousset.startcheck import log_schema_problems
    from tests.blackhole import blackhole

    services.require_database("postgresql")
    pg = settings.DATABASES["postgresql"]
    with socket.socket() as sock:  # a port nothing listens on: the connect is refused
        sock.bind(("127.0.0.1", 0))
        closed = str(sock.getsockname()[1])

    def errors() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]

    # Given two journal databases: "silent" accepts connections and never answers (first
    # in order), "unreachable" refuses them
    with blackhole((pg["HOST"] or "127.0.0.1", int(pg["PORT"]))) as proxy:
        proxy.deaf.set()
        silent = {**pg, "HOST": "127.0.0.1", "PORT": str(proxy.port),
                  "OPTIONS": {"sslmode": "disable"}}  # fmt: skip
        with services.extra_database("silent", **silent), \
                services.extra_database("unreachable", **{**pg, "PORT": closed}), \
                override_settings(GROUSSET={"DATABASE": "silent"}), \
                caplog.at_level(logging.ERROR, logger="celery_grousset"):  # fmt: skip

            def routed(self: Any) -> None:
                """A task journaled on the other database."""

            temp_task(routed, max_processing_time=30, database="unreachable")
            # When the worker's start-up check runs
            thread = threading.Thread(target=log_schema_problems, daemon=True)
            thread.start()
            # Then the refusing database's error is logged while the silent one waits
            wait_for(lambda: any("journal database 'unreachable'" in m for m in errors()),
                     20, "the start-up check of the second journal database")  # fmt: skip
            assert thread.is_alive() and not any("'silent'" in m for m in errors())
    thread.join(30)  # (the silent database's connection closed with its proxy)


def test_the_start_up_check_connects_once_to_a_journal_database_it_cannot_reach(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a host that drops packets every connect waits its timeout: the start-up check
    connected twice before its error (a review), doubling the wait."""
    import logging
    import socket
    import threading

    from django.conf import settings
    from django.test import override_settings

    from celery_grousset.startcheck import log_schema_problems

    services.require_database("postgresql")
    # Given a "database" that accepts each connection and closes it at once, counting them
    accepted: list[object] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)

    def serve() -> None:
        while not stopped.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn)
            conn.close()

    stopped = threading.Event()
    threading.Thread(target=serve, daemon=True).start()
    pg = {**settings.DATABASES["postgresql"], "PORT": str(server.getsockname()[1]),
          "OPTIONS": {"sslmode": "disable"}}  # fmt: skip  (no second, non-SSL, attempt)
    try:
        with services.extra_database("closing", **pg), \
                override_settings(GROUSSET={"DATABASE": "closing"}), \
                caplog.at_level(logging.ERROR, logger="celery_grousset"):  # fmt: skip
            # When a worker's start-up check runs
            thread = threading.Thread(target=log_schema_problems)
            thread.start()
            thread.join(30)
    finally:
        stopped.set()
        server.close()
    # Then it said so, having connected once
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("journal database 'closing'" in m and "could not be inspected" in m
               for m in logged), logged  # fmt: skip
    assert len(accepted) == 1, accepted
