"""Scenarios 20-23: the journal database goes away, restarts, holds a lock, or
drops a connection while the claim commits. PostgreSQL (and MariaDB) sit behind a
TCP proxy the test controls; the shared servers are never touched."""

from __future__ import annotations

import time
from typing import Any

import pytest

import tests.chaos_tasks as ct
from tests.chaos.conftest import ALIASES, PORT_ENV
from tests.chaos.harness import (
    cont,
    effects,
    holder_pid,
    log_count,
    new_key,
    record_of,
    stopped,
    wait_for,
    workers,
)
from tests.chaos.proxy import TcpProxy
from tests.chaos.test_kills import arm, fault_env

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

def _env(backend: str, proxy: TcpProxy, **extra: str) -> dict[str, str]:
    return {PORT_ENV[backend]: str(proxy.port), "GROUSSET_TEST_STORE_TIMEOUT": "2", **extra}


@pytest.mark.quick
@pytest.mark.parametrize("db_proxy", ["postgresql", "mariadb"], indirect=True)
def test_20_database_down_before_claim(broker: str, queue: str, tally: Any,
                                       db_proxy: tuple[str, TcpProxy]) -> None:  # fmt: skip
    backend, proxy = db_proxy
    alias = ALIASES[backend]
    t = tally("20 database stopped before the claim", backend)
    keys = [new_key("s20") for _ in range(3)]
    with workers(queue, 1, database=alias, concurrency=1, env=_env(backend, proxy)) as ws:
        proxy.stop()
        try:
            # Given the database is unreachable while tasks are delivered
            results = [ct.effect.apply_async((k,), queue=queue) for k in keys]
            # Then every delivery fails closed (no effect, requeued)
            wait_for(lambda: log_count(ws, "grousset.store_unavailable") >= 3, 60,
                     "every delivery to fail closed")  # fmt: skip
            assert [effects(alias, k) for k in keys] == [0, 0, 0]
        finally:
            proxy.start()
        # When it comes back / Then each task runs exactly once
        values = [r.get(timeout=90) for r in results]
    assert [v["key"] for v in values] == keys
    for k in keys:
        t.add_key(alias, k, record_of(alias, ct.effect, (k,)))
    t.add_logs(ws)
    assert [effects(alias, k) for k in keys] == [1, 1, 1]


def test_21_database_restarted_before_completion(broker: str, queue: str, tally: Any,
                                                 pg_proxy: TcpProxy, pg: str) -> None:  # fmt: skip
    t = tally("21 database restarted after effect, before completion", "postgresql")
    env, armfile = fault_env("after_effect:stop")
    key = new_key("s21")
    with workers(queue, 1, database=pg, concurrency=1,
                 env=_env("postgresql", pg_proxy, **env)) as ws:  # fmt: skip
        arm(armfile)
        # Given an attempt paused after its effect, before its completion
        result = ct.effect.apply_async((key,), queue=queue)
        pid = holder_pid(pg, ct.effect, (key,))
        wait_for(lambda: stopped(pid), 20, "the attempt to pause")
        # When PostgreSQL "restarts" (every connection dropped, refused for a moment)
        pg_proxy.stop()
        time.sleep(0.5)
        pg_proxy.start()
        cont(pid)
        value = result.get(timeout=60)
    rec = record_of(pg, ct.effect, (key,))
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    # Then the completion was written on a fresh connection: one effect, no takeover
    assert value["fence"] == rec.fence
    assert rec.status == "completed" and rec.deliveries == 1 and rec.takeovers == 0
    assert effects(pg, key) == 1


def test_22_row_lock_bounds_the_claim(broker: str, pg: str, queue: str, tally: Any) -> None:
    import psycopg
    from django.db import connections

    t = tally("22 row lock held by another session", "postgresql")
    key = new_key("s22")
    p = connections[pg].get_connection_params()
    env = {"GROUSSET_TEST_STORE_TIMEOUT": "2"}
    with workers(queue, 1, database=pg, concurrency=1, env=env) as ws:
        first = ct.effect.apply_async((key,), queue=queue).get(timeout=60)
        rec = record_of(pg, ct.effect, (key,))
        with psycopg.connect(host=p["host"], port=p["port"], user=p["user"],
                             dbname=p["dbname"]) as locker:  # fmt: skip
            # Given another session holding the record's row lock
            locker.execute("SELECT 1 FROM celery_grousset_outcome WHERE id = %s FOR UPDATE",
                           (rec.pk,))  # fmt: skip
            t0 = time.monotonic()
            # When a duplicate is delivered
            dup = ct.effect.apply_async((key,), queue=queue)
            wait_for(lambda: log_count(ws, "grousset.store_unavailable") >= 1, 30,
                     "the claim to give up")  # fmt: skip
            waited = time.monotonic() - t0
            locker.rollback()
        value = dup.get(timeout=60)
    rec.refresh_from_db()
    t.add_key(pg, key, rec)
    t.notes.append(f"failed closed after {waited:.1f}s")
    # Then the claim failed closed within STORE_TIMEOUT (2 s), far below the broker's
    # visibility timeout, and the requeued delivery got the memo afterwards
    assert waited < 6
    assert value == first and effects(pg, key) == 1


@pytest.mark.quick
def test_23_connection_lost_during_claim_commit(broker: str, pg: str, queue: str, tally: Any,
                                                pg_proxy: TcpProxy) -> None:  # fmt: skip
    t = tally("23 connection lost during the claim's commit", "postgresql")
    key = new_key("s23")
    with workers(queue, 1, database=pg, concurrency=1, env=_env("postgresql", pg_proxy)) as ws:
        ct.effect.apply_async((new_key("s23-warm"),), queue=queue).get(timeout=60)
        # Given the next answer on the journal connection will be lost (the claim
        # commits on the server, the worker sees a dropped connection)
        pg_proxy.cut_next_answer()
        # When a task is delivered
        value = ct.effect.apply_async((key,), queue=queue).get(timeout=60)
    rec = record_of(pg, ct.effect, (key,))
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    # Then the store re-sent the claim on a fresh connection and recognised its own
    # token (RESUMED): one delivery counted, one effect, no takeover
    assert pg_proxy.cuts == 1 and not pg_proxy.cut_armed
    assert value["fence"] == rec.fence
    assert rec.status == "completed" and rec.deliveries == 1 and rec.takeovers == 0
    assert effects(pg, key) == 1
