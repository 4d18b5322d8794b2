"""Scenarios 5-10 and 12: a worker process dies (or is told to stop) at a named
point of the task lifecycle (``GROUSSET_FAULT=<point>:<action>``, one-shot arm file)."""

from __future__ import annotations

import signal
import time
import uuid
from typing import Any

import pytest

import tests.chaos_tasks as ct
from tests.chaos.conftest import ALIASES, need
from tests.chaos.harness import (
    ARTIFACTS,
    effects,
    holder_pid,
    log_count,
    memo_of,
    new_key,
    record_of,
    start_worker,
    workers,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def fault_env(spec: str, armed: bool = True) -> tuple[dict[str, str], str]:
    """Worker env for a one-shot fault; returns (env, arm file path)."""
    arm = str(ARTIFACTS / f"arm-{uuid.uuid4().hex}")
    env = {"GROUSSET_FAULT": spec}
    if armed:
        env["GROUSSET_FAULT_ARM"] = arm
    return env, arm


def arm(path: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    open(path, "w").close()


def _killed_once(alias: str, queue: str, point: str, task: Any, t: Any,
                 action: str = "kill") -> tuple[Any, Any]:  # fmt: skip
    env, armfile = fault_env(f"{point}:{action}")
    key = new_key(f"kill-{point}")
    with workers(queue, 1, database=alias, concurrency=1, env=env) as ws:
        arm(armfile)
        # Given an attempt SIGKILLed at `point` (acks_late + reject_on_worker_lost)
        result = task.apply_async((key,), queue=queue)
        # When the message is redelivered
        value = result.get(timeout=90)
    rec = record_of(alias, task, (key,))
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    assert log_count(ws, "WorkerLostError") + log_count(ws, "SIGKILL") >= 1, "no kill seen"
    return value, rec


@pytest.mark.parametrize("task", [ct.effect, ct.booking], ids=["plain", "transactional"])
def test_06_sigterm_mid_effect(broker: str, pg: str, queue: str, tally: Any, task: Any) -> None:
    t = tally(f"06 SIGTERM to the child mid-effect ({task.name.split('.')[1]})", "postgresql")
    # Given an attempt whose pool child gets SIGTERM mid-effect (a hard time limit, a
    # stop signalled to the worker's process group): SystemExit in the body
    value, rec = _killed_once(pg, queue, "mid_effect", task, t, action="term")
    # Then the plain claim stayed in flight and was taken over once stale: the effect
    # ran again only then, counted; the transactional effect was rolled back, its claim
    # released, and ran once
    assert rec.status == "completed" and rec.fence == value["fence"]
    if task is ct.booking:
        assert rec.takeovers == 0 and effects(pg, value["key"]) == 1
    else:
        assert rec.takeovers == 1 and effects(pg, value["key"]) == 2


@pytest.mark.quick
def test_05_sigkill_after_claim(broker: str, pg: str, queue: str, tally: Any) -> None:
    t = tally("05 SIGKILL after claim", "postgresql")
    value, rec = _killed_once(pg, queue, "after_claim", ct.effect, t)
    # Then the stale claim was taken over after max_processing_time and ran once
    assert rec.status == "completed" and rec.takeovers == 1
    assert value["fence"] == rec.fence and effects(pg, value["key"]) == 1


@pytest.mark.parametrize("backend", list(ALIASES))
@pytest.mark.parametrize("task", [ct.effect, ct.booking], ids=["plain", "transactional"])
def test_06_sigkill_mid_effect(broker: str, queue: str, tally: Any, backend: str,
                              task: Any) -> None:  # fmt: skip
    alias = need(ALIASES[backend])
    t = tally(f"06 SIGKILL mid-effect ({task.name.split('.')[1]})", backend)
    value, rec = _killed_once(alias, queue, "mid_effect", task, t)
    # Then: taken over once; the plain effect ran twice (the documented window, counted),
    # the transactional one once (the killed transaction never committed)
    assert rec.status == "completed" and rec.takeovers == 1 and rec.fence == value["fence"]
    assert effects(alias, value["key"]) == (1 if task is ct.booking else 2)


@pytest.mark.parametrize("task", [ct.effect, ct.booking], ids=["plain", "transactional"])
def test_07_sigkill_after_effect(broker: str, pg: str, queue: str, tally: Any, task: Any) -> None:
    t = tally(f"07 SIGKILL after effect ({task.name.split('.')[1]})", "postgresql")
    value, rec = _killed_once(pg, queue, "after_effect", task, t)
    # Then: at most one extra effect, counted as a takeover and logged
    assert rec.status == "completed" and rec.takeovers == 1 and rec.fence == value["fence"]
    assert effects(pg, value["key"]) == (1 if task is ct.booking else 2)


@pytest.mark.quick
def test_08_sigkill_after_completion(broker: str, pg: str, queue: str, tally: Any) -> None:
    t = tally("08 SIGKILL after completion, before ack", "postgresql")
    value, rec = _killed_once(pg, queue, "after_complete", ct.effect, t)
    # Then the redelivery returned the memo: no second effect, no takeover
    assert rec.status == "completed" and rec.takeovers == 0 and rec.fence == value["fence"]
    assert rec.deliveries == 2 and memo_of(rec) == value
    assert effects(pg, value["key"]) == 1


def test_09_task_kills_worker_every_time(broker: str, pg: str, queue: str, tally: Any) -> None:
    t = tally("09 kills its worker on every attempt", "postgresql")
    env, _ = fault_env("after_claim:kill", armed=False)
    key = new_key("s09")
    with workers(queue, 1, database=pg, concurrency=1, env=env) as ws:
        # Given a task that kills its worker process on every attempt
        result = ct.effect.apply_async((key,), queue=queue)
        # When it is redelivered and taken over until max_takeovers (3)
        with pytest.raises(Exception) as err:
            result.get(timeout=120)
        rec = record_of(pg, ct.effect, (key,))
        seen = (rec.deliveries, log_count(ws, "received"))
        time.sleep(8)  # longer than max_processing_time and any requeue countdown
        rec.refresh_from_db()
        after = (rec.deliveries, log_count(ws, "received"))
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    # Then the record is failed with a clear error, and nothing is delivered any more
    assert "GaveUp" in type(err.value).__name__ or "GaveUp" in str(err.value)
    assert rec.status == "failed" and rec.result_encoding == "grousset/gave-up"
    assert "max_takeovers" in rec.error and rec.takeovers == 3
    assert after == seen, f"still redelivered: {seen} -> {after}"
    assert effects(pg, key) == 0


def test_10_hard_time_limit(broker: str, pg: str, queue: str, tally: Any) -> None:
    t = tally("10 hard time limit shorter than the task", "postgresql")
    key = new_key("s10")
    with workers(queue, 1, database=pg, concurrency=1) as ws:
        # Given a task whose hard time_limit (1.5 s) is shorter than its run (5 s)
        result = ct.overrun.apply_async((key,), queue=queue)
        # When the pool kills it at the limit
        with pytest.raises(Exception) as err:
            result.get(timeout=60)
        time.sleep(4)  # past max_processing_time (3 s)
        received = log_count(ws, "received")
    rec = record_of(pg, ct.overrun, (key,))
    t.add_key(pg, key, rec)
    # Then it failed once and was not requeued; its claim is left to turn stale (the
    # child's SIGTERM is a stopped process, not the body's failure: the effect may have
    # happened)
    assert "TimeLimitExceeded" in repr(err.value)
    assert received == 1
    assert rec.takeovers == 0 and effects(pg, key) == 1
    assert rec.status == "in_flight"
    t.notes.append(f"record left {rec.status}")


def test_12_warm_shutdown_mid_task(broker: str, pg: str, queue: str, tally: Any) -> None:
    t = tally("12 warm shutdown (SIGTERM) mid-task", "postgresql")
    key = new_key("s12")
    w = start_worker(queue, database=pg, concurrency=1)
    try:
        # Given a task in the middle of its effect
        result = ct.slow.apply_async((key, 3.0), queue=queue)
        holder_pid(pg, ct.slow, (key, 3.0))
        # When the worker gets SIGTERM (warm shutdown)
        w.proc.send_signal(signal.SIGTERM)
        w.proc.wait(60)
    finally:
        w.kill()
    # Then the task finished and completed before the worker exited
    rec = record_of(pg, ct.slow, (key, 3.0))
    assert rec.status == "completed" and result.get(timeout=10)["key"] == key
    # and a duplicate on a new worker gets the memo
    with workers(queue, 1, database=pg, concurrency=1) as ws:
        dup = ct.slow.apply_async((key, 3.0), queue=queue).get(timeout=60)
    rec.refresh_from_db()
    t.add_key(pg, key, rec)
    t.add_logs([w, *ws])
    assert dup == memo_of(rec) and effects(pg, key) == 1 and rec.takeovers == 0




def test_11_soft_time_limit_during_completion(broker: str, pg: str, queue: str,
                                              tally: Any) -> None:  # fmt: skip
    import psycopg
    from django.db import connections

    t = tally("11 soft time limit during the completion write", "postgresql")
    key = new_key("s11")
    p = connections[pg].get_connection_params()
    env = {"GROUSSET_TEST_STORE_TIMEOUT": "10"}
    with workers(queue, 1, database=pg, concurrency=1, env=env) as ws:
        # Given an attempt whose completion write waits on a row lock held elsewhere
        result = ct.soft.apply_async((key,), queue=queue)
        holder_pid(pg, ct.soft, (key,))
        rec = record_of(pg, ct.soft, (key,))
        with psycopg.connect(host=p["host"], port=p["port"], user=p["user"],
                             dbname=p["dbname"]) as locker:  # fmt: skip
            locker.execute("SELECT 1 FROM celery_grousset_outcome WHERE id = %s FOR UPDATE",
                           (rec.pk,))  # fmt: skip
            # When the soft time limit (1.5 s) fires during that write
            time.sleep(3.5)
            locker.rollback()
        try:
            outcome = repr(result.get(timeout=30))
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        # and the same worker process runs the next task
        follow_key = new_key("s11-next")
        follow = ct.effect.apply_async((follow_key,), queue=queue).get(timeout=30)
        time.sleep(1)
    rec.refresh_from_db()
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    t.notes.append(f"caller got {outcome[:90]}; record {rec.status}")
    # Then the interrupted completion was re-sent on a fresh connection (same token:
    # idempotent), the record and the caller agree, and the worker's connection recovered
    assert effects(pg, key) == 1
    assert follow["fence"] == record_of(pg, ct.effect, (follow_key,)).fence  # its own claim
    assert rec.status == "completed" and memo_of(rec)["key"] == key
    assert key in outcome, outcome
