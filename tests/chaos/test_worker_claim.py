"""Scenarios 31-37: the chaos suite with the main-process claim on (``--grousset-batch``,
docs/performance.md "Claiming in the worker's main process")."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import tests.chaos_tasks as ct
from tests.chaos.conftest import need
from tests.chaos.harness import effects, new_key, record_of, wait_for, workers
from tests.chaos.test_duplicates import _two_hundred
from tests.locks import lock_waiters
from tests.services import cut_broker_clients

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

#: backend id -> Django alias
BACKENDS = {"postgresql": "postgresql", "mariadb": "mysql", "sqlite": "default"}
BATCH = ["--grousset-batch"]
#: one pool child with requests prefetched behind it: claimed by the main process, not started
DEEP = [*BATCH, "--prefetch-multiplier", "4"]


def claimed_by(alias: str, task: Any, args: tuple[Any, ...], pid: int) -> bool:
    """The call's claim is in flight, made by the process ``pid`` (the journal's worker)."""
    rec = record_of(alias, task, args)
    return rec is not None and rec.status == "in_flight" and rec.worker.endswith(f":{pid}")


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_31_sigkill_of_the_main_process_after_its_claims(
    broker: str, queue: str, tally: Any, backend: str
) -> None:
    alias = need(BACKENDS[backend])
    t = tally("31 WORKER_CLAIM: SIGKILL of the main process after its claims", backend)
    busy, keys = new_key("s31-busy"), [new_key(f"s31-{i}") for i in range(3)]
    with workers(queue, 1, database=alias, extra=DEEP) as [w1]:
        # Given a worker whose only child runs a 2 s body and whose main process has
        # claimed three more calls prefetched behind it (max_processing_time 3 s)
        results = [ct.effect.apply_async((busy, 2.0), queue=queue)]
        wait_for(lambda: effects(alias, busy), 30, "the busy body")
        results += [ct.effect.apply_async((k,), queue=queue) for k in keys]
        for k in keys:
            wait_for(lambda k=k: claimed_by(alias, ct.effect, (k,), w1.proc.pid), 30, "claims")
        # When the main process is SIGKILLed (its orphaned child too: the machine is gone)
        children = w1.children()
        os.kill(w1.proc.pid, signal.SIGKILL)
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        w1.proc.wait(10)
    # Then a second worker gets the messages back (visibility timeout 2 s), takes the
    # stale claims over and runs each call once
    with workers(queue, 1, database=alias, extra=BATCH, env={"GROUSSET_TEST_VISIBILITY": "2"}):
        values = [r.get(timeout=120) for r in results]
    assert [v["key"] for v in values] == [busy, *keys]
    for k in keys:
        rec = record_of(alias, ct.effect, (k,))
        t.add_key(alias, k, rec)
        assert effects(alias, k) == 1 and rec.status == "completed" and rec.takeovers == 1
    rec = record_of(alias, ct.effect, (busy, 2.0))
    t.add_key(alias, busy, rec)
    # the call killed mid-body: the documented window (its effect may happen twice)
    assert rec.status == "completed" and rec.takeovers == 1 and effects(alias, busy) <= 2
    t.notes.append("the body killed mid-run is the documented window (<= 2 effects)")


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_32_revoked_request_in_a_claimed_batch(
    broker: str, queue: str, tally: Any, backend: str
) -> None:
    from tests.celeryapp import app

    alias = need(BACKENDS[backend])
    t = tally("32 WORKER_CLAIM: revoked request in a claimed batch", backend)
    keys = [new_key(f"s32-{i}") for i in range(4)]
    with workers(queue, 1, database=alias, concurrency=2, extra=DEEP) as [w]:
        # Given four calls due together in 3 s (claimed in one pass when Celery's timer
        # hands them over), one of them revoked while it waits for its ETA
        results = [ct.slow.apply_async((k,), countdown=3, queue=queue) for k in keys]
        # (revoked once the worker holds it: a revoke that reaches the worker before the
        # message makes Celery drop it at receipt, unclaimed, which is not this scenario)
        wait_for(lambda: f"[{results[1].id}] received" in w.text(), 30, "its receipt")
        app.control.revoke(results[1].id)
        # When they come due
        for i in (0, 2, 3):
            assert results[i].get(timeout=60)["key"] == keys[i]
        revoked = wait_for(lambda: record_of(alias, ct.slow, (keys[1],)), 30, "its claim")
        wait_for(lambda: record_of(alias, ct.slow, (keys[1],)).status != "in_flight", 30, "rel")
        main = w.proc.pid
    # Then the revoked one was claimed by the main process and released, never run
    assert revoked.worker.endswith(f":{main}")
    assert effects(alias, keys[1]) == 0
    assert record_of(alias, ct.slow, (keys[1],)).status != "in_flight"
    for i in (0, 2, 3):
        rec = record_of(alias, ct.slow, (keys[i],))
        t.add_key(alias, keys[i], rec)
        assert effects(alias, keys[i]) == 1 and rec.worker.endswith(f":{main}")
    t.add_key(alias, keys[1], record_of(alias, ct.slow, (keys[1],)))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_33_200_duplicates_two_workers_with_the_switch_on(
    broker: str, queue: str, tally: Any, backend: str
) -> None:
    alias = need(BACKENDS[backend])
    t = tally("33 WORKER_CLAIM: 200 duplicates / 2 workers", backend)
    key = new_key("s33")
    with workers(queue, 2, database=alias, concurrency=2, extra=BATCH) as ws:
        rec = _two_hundred(alias, queue, key)
        pids = [w.proc.pid for w in ws]
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    # one effect, and the claim that ran it was a main process's
    assert effects(alias, key) == 1 and int(rec.worker.rsplit(":", 1)[1]) in pids


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_34_queue_wait_longer_than_renew_after(
    broker: str, queue: str, tally: Any, backend: str
) -> None:
    alias = need(BACKENDS[backend])
    t = tally("34 WORKER_CLAIM: queue wait > WORKER_CLAIM_RENEW_AFTER", backend)
    busy, key = new_key("s34-busy"), new_key("s34")
    env = {"GROUSSET_TEST_WORKER_CLAIM_RENEW_AFTER": "0.5"}
    with workers(queue, 1, database=alias, extra=DEEP, env=env) as [w]:
        # Given a call claimed by the main process while the only child runs a 2 s body
        # (max_processing_time 30 s, WORKER_CLAIM_RENEW_AFTER 0.5 s)
        first = ct.slow.apply_async((busy, 2.0), queue=queue)
        wait_for(lambda: effects(alias, busy), 30, "the busy body")
        result = ct.slow.apply_async((key, 1.0), queue=queue)
        wait_for(lambda: claimed_by(alias, ct.slow, (key, 1.0), w.proc.pid), 30, "its claim")
        # When the child starts it, about 1.5 s later
        wait_for(lambda: effects(alias, key), 30, "its body")
        running = record_of(alias, ct.slow, (key, 1.0))
        value = result.get(timeout=60)
        first.get(timeout=60)
    # Then the child renewed the claim (stale_at pushed to its start + 30 s) and ran once
    assert running.status == "in_flight"
    assert (running.stale_at - running.started_at).total_seconds() > 30 + 1.0
    rec = record_of(alias, ct.slow, (key, 1.0))
    t.add_key(alias, key, rec)
    assert effects(alias, key) == 1 and rec.status == "completed" and rec.takeovers == 0
    assert value["fence"] == rec.fence


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_36_a_late_start_is_aged_from_its_claim_not_its_hand_over(
    broker: str, queue: str, tally: Any, backend: str
) -> None:
    alias = need(BACKENDS[backend])
    t = tally("36 WORKER_CLAIM: solo pool, a claimed request started after it turned stale",
              backend)  # fmt: skip
    keys, other = [new_key(f"s36-{i}") for i in range(3)], f"{queue}-other"
    with workers(other, 1, database=alias) as [w2], workers(
        queue, 1, database=alias, extra=[*DEEP, "--pool", "solo"]
    ) as [w1]:
        # Given a solo worker: its main process claims three 2.5 s calls (max_processing_time
        # 3 s) and runs them itself, one after another: the third starts ~5 s after its claim
        results = [ct.effect.apply_async((k, 2.5), queue=queue) for k in keys]
        wait_for(lambda: claimed_by(alias, ct.effect, (keys[2], 2.5), w1.proc.pid), 30,
                 "the third call's claim")  # fmt: skip
        # When its claim has turned stale (3 s) and a duplicate on another worker takes it
        # over, before the solo worker gets to the call
        time.sleep(3.3)
        dup = ct.effect.apply_async((keys[2], 2.5), queue=other)
        values = [r.get(timeout=120) for r in [*results, dup]]
    t.add_logs([w1, w2])
    # Then the solo worker, starting the call, renews first, fails, and does not run it:
    # every call ran once (before, it took its claim for fresh and ran beside the taker)
    assert [v["key"] for v in values] == [*keys, keys[2]]
    for k in keys:
        rec = record_of(alias, ct.effect, (k, 2.5))
        t.add_key(alias, k, rec)
        assert effects(alias, k) == 1 and rec.status == "completed", (k, rec)
    assert record_of(alias, ct.effect, (keys[2], 2.5)).takeovers == 1


@contextmanager
def row_locked(alias: str, pk: int) -> Iterator[None]:
    """Another session holds the journal row's lock (a journal slow for seconds)."""
    from django.db import connections, transaction

    with transaction.atomic(using=alias), connections[alias].cursor() as cur:
        cur.execute("SELECT 1 FROM celery_grousset_outcome WHERE id = %s FOR UPDATE", [pk])
        yield


def lock_waiter_pids(alias: str) -> list[int]:
    """The local processes whose journal sessions wait on a row lock (``ss`` maps each
    session's client port to its process); asked on the lock holder's own session."""
    ports = [int(address.rsplit(":", 1)[-1]) for address in lock_waiters(alias)]
    pids = []
    for port in ports:
        out = subprocess.run(["ss", "-tnpH", f"sport = :{port}"], capture_output=True,
                             text=True, check=False).stdout  # fmt: skip
        pids += [int(p) for p in re.findall(r"pid=(\d+)", out)]
    return pids


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_37_broker_connections_killed_with_requests_prefetched(
    broker: str, queue: str, tally: Any, backend: str
) -> None:
    alias = need(BACKENDS[backend])
    t = tally("37 WORKER_CLAIM: broker connections killed, requests prefetched", backend)
    keys = [new_key(f"s37-{i}") for i in range(12)]
    with workers(queue, 1, database=alias, concurrency=2, extra=DEEP) as [w]:
        # Given 12 calls of 1 s (max_processing_time 30 s) on 2 children, 8 prefetched:
        # two bodies running, the others claimed by the main process behind them
        results = [ct.slow.apply_async((k, 1.0), queue=queue) for k in keys]
        wait_for(lambda: sum(effects(alias, k) for k in keys) >= 2, 30, "two bodies")
        # When the broker connections are killed (the worker's and this process's)
        started = time.monotonic()
        cut = cut_broker_clients(broker)
        values = [r.get(timeout=120) for r in results]
        elapsed = time.monotonic() - started
    recs = [record_of(alias, ct.slow, (k, 1.0)) for k in keys]
    for k, rec in zip(keys, recs, strict=True):
        t.add_key(alias, k, rec)
    t.add_logs([w])
    takeovers = sum(rec.takeovers for rec in recs)
    t.notes.append(f"{cut} connections killed; all done {elapsed:.1f} s after; "
                   f"{takeovers} takeovers")  # fmt: skip
    # Then every call ran once; the claims of the requests Celery dropped were given
    # back, so their redeliveries ran at once instead of waiting 30 s to take them over
    # (at most one dropped while being passed to a child keeps its claim)
    assert cut and [v["key"] for v in values] == keys
    assert [effects(alias, k) for k in keys] == [1] * 12
    assert all(rec.status == "completed" for rec in recs)
    assert takeovers <= 1, [rec.takeovers for rec in recs]


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_35_a_slow_journal_does_not_stop_the_event_loop(
    broker: str, queue: str, tally: Any, backend: str
) -> None:
    from tests.celeryapp import app

    alias = need(BACKENDS[backend])
    t = tally("35 WORKER_CLAIM: journal slow for seconds, the event loop keeps serving", backend)
    key = new_key("s35")
    env = {"GROUSSET_TEST_STORE_TIMEOUT": "8"}
    with workers(queue, 1, database=alias, extra=BATCH, env=env) as [w]:
        first = ct.effect.apply_async((key,), queue=queue).get(timeout=60)
        rec = record_of(alias, ct.effect, (key,))
        node = f"{w.name}@{socket.gethostname()}"
        with row_locked(alias, rec.pk):
            # Given the journal slow for seconds: another session holds the record's row
            # lock (STORE_TIMEOUT 8 s), and a duplicate's claim waits on it in the main
            # process's claim thread
            dup = ct.effect.apply_async((key,), queue=queue)
            waiters = wait_for(lambda: lock_waiter_pids(alias), 10, "the claim to wait")
            # When the worker is pinged five times while the claim waits
            pings = []
            for _ in range(5):
                t0 = time.monotonic()
                # (to this worker only, returning on its reply: the time is its latency)
                replies = app.control.ping([node], timeout=1.0, limit=1)
                names = [name for reply in replies for name in reply]
                pings.append((node in names, time.monotonic() - t0))
                time.sleep(0.3)
            still = lock_waiter_pids(alias)
        value = dup.get(timeout=60)
    rec.refresh_from_db(using=alias)
    t.add_key(alias, key, rec)
    t.notes.append("pings answered in " + ", ".join(f"{s:.2f}s" for _, s in pings))
    # Then the claim that waited was the main process's, it waited through every ping,
    # and the event loop (the same process) answered each ping within its 1 s timeout
    assert waiters == [w.proc.pid] and still == [w.proc.pid]
    assert all(ok for ok, _ in pings), pings
    # and once the lock went, the duplicate got the memo: one effect
    assert value == first and effects(alias, key) == 1
