"""Scenarios 13-17 and 26: what the broker does to deliveries — short visibility
timeouts, killed connections, Celery retries, chords — and poison messages."""

from __future__ import annotations

import contextlib
import math
import re
import subprocess
import time
from typing import Any

import pytest

import tests.chaos_tasks as ct
from tests.chaos.harness import (
    BROKER,
    effects,
    holder_pid,
    log_count,
    new_key,
    record_of,
    workers,
)
from tests.chaos.test_kills import arm, fault_env

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_13_visibility_timeout_shorter_than_countdown(broker: str, pg: str, queue: str,
                                                      tally: Any) -> None:  # fmt: skip
    t = tally("13 visibility_timeout < countdown", "postgresql")
    key = new_key("s13")
    with workers(queue, 2, database=pg, env={"GROUSSET_TEST_VISIBILITY": "1"}) as ws:
        # Given a countdown (4 s) longer than the Redis visibility_timeout (1 s)
        result = ct.effect.apply_async((key,), queue=queue, countdown=4)
        # When copies of the message are restored and arrive at the ETA
        value = result.get(timeout=60)
        time.sleep(2)
    received = log_count(ws, f"[{result.id}] received")
    t.add_key(pg, key, record_of(pg, ct.effect, (key,)))
    t.add_logs(ws)
    t.notes.append(f"{received} copies received")
    # Then the broker really delivered copies, and the effect ran once
    assert received >= 2 and effects(pg, key) == 1 and value["key"] == key


def test_14_visibility_timeout_shorter_than_run(broker: str, pg: str, queue: str,
                                                tally: Any) -> None:  # fmt: skip
    t = tally("14 visibility_timeout < run time", "postgresql")
    key = new_key("s14")
    with workers(queue, 2, database=pg, env={"GROUSSET_TEST_VISIBILITY": "1"}) as ws:
        # Given a task that runs 4 s while the visibility_timeout is 1 s
        value = ct.slow.apply_async((key, 4.0), queue=queue).get(timeout=90)
        waits = log_count(ws, "grousset.in_flight")
        # When the copies keep arriving for a while after completion
        time.sleep(4)
        later = log_count(ws, "grousset.in_flight")
    rec = record_of(pg, ct.slow, (key, 4.0))
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    t.notes.append(f"{later} in-flight requeues")
    # Then the copies waited (bounded requeues), no takeover, and the effect ran once
    assert effects(pg, key) == 1 and value["key"] == key and rec.takeovers == 0
    assert later <= 40, f"retry storm: {later} in-flight requeues"
    assert later - waits <= 4, f"requeues continued after completion: {waits} -> {later}"


def _worker_redis_ports(pids: list[int]) -> list[int]:
    out = subprocess.run(["ss", "-Htnp", "state", "established", "( dport = :6379 )"],
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    ports = []
    for line in out.splitlines():
        if any(f"pid={p}," in line for p in pids):
            ports.append(int(line.split()[2].rsplit(":", 1)[1]))
    return ports


def test_15_broker_connections_killed_mid_task(broker: str, pg: str, queue: str,
                                               tally: Any) -> None:  # fmt: skip
    import redis

    t = tally("15 broker connections killed mid-task", "postgresql")
    key = new_key("s15")
    r = redis.Redis.from_url(BROKER)
    with workers(queue, 1, database=pg, concurrency=1) as ws:
        # Given a task in the middle of its effect
        result = ct.slow.apply_async((key, 3.0), queue=queue)
        holder_pid(pg, ct.slow, (key, 3.0))
        w = ws[0]
        ports = set(_worker_redis_ports([w.proc.pid, *w.children()]))
        # When the worker's broker connections (db 10) are killed
        killed = 0
        for client in r.client_list():
            port = int(client["addr"].rsplit(":", 1)[1])
            if port in ports and client["db"] == str(r.connection_pool.connection_kwargs["db"]):
                with contextlib.suppress(redis.ResponseError):  # gone with a sibling
                    killed += bool(r.client_kill(client["addr"]))
        assert killed >= 1
        value = result.get(timeout=60)
        time.sleep(3)
        dup = ct.slow.apply_async((key, 3.0), queue=queue).get(timeout=60)
    rec = record_of(pg, ct.slow, (key, 3.0))
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    t.notes.append(f"{killed} connections killed; {log_count(ws, 'received')} received")
    # Then the task completed once, the worker recovered, and a duplicate got the memo
    assert value == dup and effects(pg, key) == 1 and rec.status == "completed"


@pytest.mark.quick
@pytest.mark.parametrize("task", [ct.flaky_retry, ct.flaky_auto], ids=["retry", "autoretry"])
def test_16_retry_and_autoretry(broker: str, pg: str, queue: str, tally: Any, task: Any) -> None:
    t = tally(f"16 {task.name.split('.')[1]} with a duplicate copy", "postgresql")
    key = new_key("s16")
    with workers(queue, 1, database=pg, concurrency=2) as ws:
        # Given a task that fails twice then succeeds, delivered twice
        results = [task.apply_async((key, 2), queue=queue) for _ in "ab"]
        # When Celery retries it (same task id: the failed attempt released the claim)
        values = [r.get(timeout=60) for r in results]
    rec = record_of(pg, task, (key, 2))
    t.add_key(pg, key, rec, "done")
    t.add_logs(ws)
    # Then three attempts in all, one success, one memo for both copies
    assert values == ["done after 3", "done after 3"]
    assert effects(pg, key, "attempt") == 3 and effects(pg, key, "done") == 1
    assert rec.status == "completed" and rec.takeovers == 0


def test_17_chord_header_redelivered(broker: str, pg: str, queue: str, tally: Any) -> None:
    from celery import chord

    t = tally("17 chord with a redelivered header task", "postgresql")
    env, armfile = fault_env("after_complete:kill")
    keys = [new_key("s17h") for _ in range(2)]
    body_key = new_key("s17b")
    with workers(queue, 1, database=pg, concurrency=1, env=env) as ws:
        arm(armfile)
        # Given a chord whose first header task dies after completing (before its ack)
        header = [ct.effect.s(k).set(queue=queue) for k in keys]
        result = chord(header)(ct.collect.s(key=body_key).set(queue=queue))
        # When the header task is redelivered and returns its memo
        assert result.get(timeout=90) == 2
        time.sleep(2)
    for k in keys:
        t.add_key(pg, k, record_of(pg, ct.effect, (k,)))
    t.effects += effects(pg, body_key)
    t.add_logs(ws)
    # Then the body ran once, each header effect once
    assert log_count(ws, "WorkerLostError") >= 1
    assert [effects(pg, k) for k in keys] == [1, 1]
    assert effects(pg, body_key, "body") == 1


@pytest.mark.quick
def test_26_poison_arguments(broker: str, pg: str, queue: str, tally: Any) -> None:
    from celery_grousset.exceptions import FingerprintError
    from tests.celeryapp import app

    t = tally("26 kombu marker dict and poison arguments", "postgresql")
    marker = {"__type__": "x", "__value__": 1}
    # Given a marker dict: rejected at publish time
    with pytest.raises(FingerprintError):
        ct.effect.apply_async((marker,), queue=queue)
    poisons = {"marker": marker, "nan": math.nan, "bytes": {"__type__": "bytes",
                                                            "__value__": "aGk="}}  # fmt: skip
    with workers(queue, 1, database=pg, concurrency=1) as ws:
        # When messages bypassing the check (send_task) reach a worker
        sent = {name: app.send_task(ct.effect.name, args=[v], queue=queue)
                for name, v in poisons.items()}  # fmt: skip
        outcomes = {}
        for name, res in sent.items():
            try:
                outcomes[name] = f"ok {res.get(timeout=15)!r}"
            except Exception as exc:
                outcomes[name] = f"{type(exc).__name__}: {str(exc)[:80]}"
        time.sleep(4)
        seen = {name: log_count(ws, res.id) for name, res in sent.items()}
        time.sleep(4)
        again = {name: log_count(ws, res.id) for name, res in sent.items()}
    t.notes.append("; ".join(f"{k}: {v}" for k, v in outcomes.items()))
    t.deliveries = sum(len(re.findall(r"\] received", w.text())) for w in ws)
    t.add_logs(ws)
    # Then each fails once with a clear error, and is never delivered again
    assert again == seen, f"redelivered: {seen} -> {again}"
    assert "FingerprintError" in outcomes["nan"]
    # the undecodable marker never reaches the task: kombu logs it once and drops it
    # (the caller's result never arrives)
    assert log_count(ws, "Can't decode message body") == 1
    assert t.deliveries <= len(poisons)
