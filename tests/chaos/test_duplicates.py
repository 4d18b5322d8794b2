"""Scenarios 1-4 and 24: duplicates, claim races, takeover races, purge under load."""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

import pytest

import tests.chaos_tasks as ct
from celery_grousset import journal
from tests.chaos.conftest import ALIASES, need
from tests.chaos.harness import (
    ARTIFACTS,
    effects,
    fp_of,
    log_count,
    new_key,
    record_of,
    workers,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

BACKENDS = list(ALIASES)


def _two_hundred(alias: str, queue: str, key: str, n: int = 200) -> Any:
    # Given n deliveries of the same call (distinct task ids)
    results = [ct.slow.apply_async((key,), {"sleep": 0.2}, queue=queue) for _ in range(n)]
    # When they are all processed
    values = [r.get(timeout=180) for r in results]
    # Then the effect ran once and every delivery returned the same value
    assert effects(alias, key) == 1
    assert len({repr(v) for v in values}) == 1 and values[0]["key"] == key
    rec = record_of(alias, ct.slow, (key,), {"sleep": 0.2})
    assert rec.status == "completed" and rec.takeovers == 0
    assert values[0]["fence"] == rec.fence and rec.deliveries >= n
    return rec


@pytest.mark.quick
@pytest.mark.parametrize("backend", BACKENDS)
def test_01_200_duplicates_two_workers(broker: str, queue: str, tally: Any, backend: str) -> None:
    alias = need(ALIASES[backend])
    t = tally("01 200 duplicates / 2 workers", backend)
    key = new_key("s01")
    with workers(queue, 2, database=alias, concurrency=2) as ws:
        rec = _two_hundred(alias, queue, key)
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    assert rec.status == "completed" and rec.deliveries >= 200


def _barrier() -> str:
    return f"{ARTIFACTS / 'barriers' / uuid.uuid4().hex}:2"


# The barrier holds each delivery in its pool child, just before the child's claim. With
# WORKER_CLAIM on, the claim is made earlier, in the worker's main process: one delivery
# owns the key before any barrier and the other never reaches a child, so the scenario no
# longer races two claims. The main process's race is covered by
# tests/test_store_batch.py (processes racing batches of the same keys) and scenario 33.
_CHILD_CLAIMS = pytest.mark.skipif(
    os.environ.get("GROUSSET_TEST_WORKER_CLAIM") == "1",
    reason="a barrier before the pool child's claim: with WORKER_CLAIM the main process claims",
)


@pytest.mark.quick
@_CHILD_CLAIMS
@pytest.mark.parametrize("backend", BACKENDS)
def test_02_first_insert_race(broker: str, queue: str, tally: Any, backend: str) -> None:
    alias = need(ALIASES[backend])
    t = tally("02 first-insert race (barrier)", backend)
    with workers(queue, 2, database=alias, concurrency=1) as ws:
        for _ in range(8):
            key, spec = new_key("s02"), _barrier()
            # Given two deliveries of a new call held at a barrier before their claims
            pair = [ct.effect.apply_async((key,), {"barrier": spec}, queue=queue) for _ in "ab"]
            # When the barrier opens and both claim the same new fingerprint at once
            values = [r.get(timeout=60) for r in pair]
            # Then one insert won, the other got the memo: one effect, one claim
            rec = record_of(alias, ct.effect, (key,), {"barrier": spec})
            t.add_key(alias, key, rec)
            assert effects(alias, key) == 1
            assert values[0] == values[1]
            assert values[0]["fence"] == rec.fence and rec.takeovers == 0
            assert rec.status == "completed" and rec.deliveries >= 2
    t.add_logs(ws)


@_CHILD_CLAIMS
@pytest.mark.parametrize("backend", BACKENDS)
def test_04_two_simultaneous_takeovers(broker: str, queue: str, tally: Any, backend: str) -> None:
    from celery_grousset import guard
    from celery_grousset.store import get_store

    alias = need(ALIASES[backend])
    t = tally("04 two simultaneous takeovers", backend)
    opts = ct.effect.grousset_options()
    with workers(queue, 2, database=alias, concurrency=1) as ws:
        for _ in range(3):
            key, spec = new_key("s04"), _barrier()
            # Given a stale claim of a dead attempt (claimed, never completed, > 3 s old)
            fp = fp_of(ct.effect, (key,), {"barrier": spec})
            dead = guard.request(opts, fp, ct.effect.name, "dead", "chaos")
            died = get_store(alias).claim(dead)
            assert died.owned
            time.sleep(3.3)
            # When two deliveries reach the claim at the same moment
            pair = [ct.effect.apply_async((key,), {"barrier": spec}, queue=queue) for _ in "ab"]
            values = [r.get(timeout=60) for r in pair]
            # Then exactly one took over (a higher fence), the other got its memo
            rec = record_of(alias, ct.effect, (key,), {"barrier": spec})
            t.add_key(alias, key, rec)
            assert effects(alias, key) == 1
            assert values[0] == values[1] and values[0]["fence"] == rec.fence > died.fence
            assert rec.status == "completed" and rec.takeovers == 1
    assert log_count(ws, "grousset.claim_taken_over") == 3
    t.add_logs(ws)


def test_03_claim_inside_callers_transaction(pg: str, tally: Any) -> None:
    import psycopg
    from django.db import connections, transaction

    from celery_grousset import protect
    from celery_grousset.models import Outcome
    from tests.ledger.models import Effect

    t = tally("03 claim inside caller's atomic()", "postgresql")
    key = new_key("s03")
    seen: list[str] = []
    dsn = connections[pg].get_connection_params()

    def body() -> str:
        Effect.objects.using(pg).create(key=key, value="in-caller-txn")
        with psycopg.connect(host=dsn["host"], port=dsn["port"], user=dsn["user"],
                             dbname=dsn["dbname"], autocommit=True) as other:  # fmt: skip
            row = other.execute("SELECT status FROM celery_grousset_outcome WHERE args_repr = %s",
                                (f"key={key!r}",)).fetchone()  # fmt: skip
        seen.append(row[0] if row else "invisible")
        return "done"

    class Rollback(Exception):
        pass

    # Given a caller inside an open transaction that later rolls back
    with pytest.raises(Rollback), transaction.atomic(using=pg):
        # When protect(transactional=True) claims and runs inside it
        assert protect(key, body, max_processing_time=2, transactional=True,
                       database=pg, processor_id="chaos") == "done"  # fmt: skip
        raise Rollback
    # Then the claim had committed on its own (another session saw it in flight)...
    assert seen == ["in_flight"]
    # ...the effect and the completion rolled back with the caller...
    rec = Outcome.objects.using(pg).get(args_repr=f"key={key!r}")
    assert rec.status == "in_flight" and effects(pg, key) == 0
    # ...and the next caller takes the stale claim over and runs the effect once
    assert protect(key, body, max_processing_time=2, transactional=True,
                   database=pg, processor_id="chaos") == "done"  # fmt: skip
    assert protect(key, body, max_processing_time=2, database=pg, processor_id="chaos") == "done"
    held = rec.fence
    rec.refresh_from_db()
    t.add_key(pg, key, rec)
    assert rec.status == "completed" and rec.fence > held and rec.takeovers == 1
    assert effects(pg, key) == 1


def test_24_purge_loop_during_duplicates(broker: str, pg: str, queue: str, tally: Any) -> None:

    t = tally("24 purge looping during 200 duplicates", "postgresql")
    stop = threading.Event()
    purged: list[int] = []

    def purge_loop() -> None:
        from django.db import connections

        while not stop.is_set():
            purged.append(journal.purge_expired(pg, batch_size=50))
            time.sleep(0.02)
        connections[pg].close()

    key = new_key("s24")
    with workers(queue, 2, database=pg, concurrency=2) as ws:
        # Given expired records of other calls, and grousset_purge running in a loop
        for _ in range(20):
            ct.brief.apply_async((new_key("s24-old"),), queue=queue).get(timeout=60)
        # (expires_after=1 s, database clock: wait until they are expired, so that the
        # purge has rows to delete however fast the duplicates are processed)
        deadline = time.monotonic() + 30
        while journal.expired(pg).count() < 20:
            assert time.monotonic() < deadline, "the brief records never expired"
            time.sleep(0.05)
        looper = threading.Thread(target=purge_loop, daemon=True)
        looper.start()
        try:
            # When 200 duplicates of one call are processed / Then one effect
            rec = _two_hundred(pg, queue, key)
        finally:
            stop.set()
            looper.join(30)
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    assert sum(purged) >= 1 and len(purged) > 10  # the purge really ran, and removed rows
