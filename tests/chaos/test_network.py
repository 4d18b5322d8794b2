"""Scenarios 27-30: network faults between a worker and the journal database, through
the TCP proxy of tests/chaos/proxy.py (the shared servers are never touched):

* 27 the completion write fails after the effect (the database unreachable through
  every retry): the delivery is requeued carrying its outcome, the next delivery
  writes the memo without running the effect;
* 28 the completion's answer is lost (the connection cut after the server committed
  it): the same-token re-send is recognised, one effect;
* 29 the claim's answer is lost on the warm connection and again on the fresh one
  (the claim committed, the worker cannot tell): the requeued delivery finds out by
  its token, never guesses, and runs at once — no wait for the claim to turn stale;
* 30 a half-open connection (the proxy stops forwarding without closing): the claim
  is bounded by the store's timeouts and fails closed, then runs once.

Each counts effects in the ledger.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

import tests.chaos_tasks as ct
from tests.chaos.conftest import ALIASES
from tests.chaos.harness import (
    cont,
    effects,
    fp_of,
    holder_pid,
    log_count,
    memo_of,
    new_key,
    record_of,
    stopped,
    wait_for,
    workers,
)
from tests.chaos.proxy import TcpProxy
from tests.chaos.test_database import _env
from tests.chaos.test_kills import arm, fault_env

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

BACKENDS = ["postgresql", "mariadb"]


@dataclass
class Paused:
    """A worker on the proxied journal whose first attempt paused after its effect."""

    alias: str
    key: str
    ws: list[Any]
    result: Any
    pid: int


@contextmanager
def paused_after_effect(queue: str, backend: str, proxy: TcpProxy, task: Any, prefix: str,
                        extra: list[str] | None = None,
                        **publish: Any) -> Iterator[Paused]:  # fmt: skip
    alias = ALIASES[backend]
    env, armfile = fault_env("after_effect:stop")
    key = new_key(prefix)
    with workers(queue, 1, database=alias, concurrency=1,
                 env=_env(backend, proxy, **env), extra=extra) as ws:  # fmt: skip
        arm(armfile)
        result = task.apply_async((key,), queue=queue, **publish)
        pid = holder_pid(alias, task, (key,))
        wait_for(lambda: stopped(pid), 20, "the attempt to pause after its effect")
        yield Paused(alias, key, ws, result, pid)


@pytest.mark.quick
@pytest.mark.parametrize("claims", ["child", "main-process"])
@pytest.mark.parametrize("db_proxy", BACKENDS, indirect=True)
def test_27_completion_unwritable_is_carried(broker: str, queue: str, tally: Any,
                                            db_proxy: tuple[str, TcpProxy],
                                            claims: str) -> None:  # fmt: skip
    backend, proxy = db_proxy
    # main-process: the worker claims in its main process (WORKER_CLAIM), which must leave
    # the requeued delivery that carries the outcome to the child, unclaimed
    main = claims == "main-process"
    t = tally("27 completion write fails after the effect, then recovers"
              + (" (WORKER_CLAIM)" if main else ""), backend)  # fmt: skip
    # Given an attempt paused after its effect, before its completion
    with paused_after_effect(queue, backend, proxy, ct.effect, "s27",
                             ["--grousset-batch"] if main else None) as p:  # fmt: skip
        alias, key, ws, result, pid = p.alias, p.key, p.ws, p.result, p.pid
        # When the database becomes unreachable and the attempt resumes: every try of
        # its completion fails
        proxy.stop()
        try:
            cont(pid)
            # (until the attempt gives up on its completion, and while its requeued
            # delivery finds the database still away)
            wait_for(lambda: log_count(ws, "grousset.outcome_carried") or result.ready(), 60,
                     "the attempt to give up on its completion")  # fmt: skip
            wait_for(lambda: log_count(ws, "operation=complete") >= 8 or result.ready(), 60,
                     "the requeued delivery to try the completion too")  # fmt: skip
        finally:
            proxy.start()
        # Then, once the database is back, the requeued delivery writes the memo
        value = result.get(timeout=60)
        rec = record_of(alias, ct.effect, (key,))
        # And a later duplicate is answered from it
        dup = ct.effect.apply_async((key,), queue=queue).get(timeout=60)
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    assert value["key"] == key and value["fence"] == rec.fence  # the one claim's fence
    assert rec.status == "completed" and rec.takeovers == 0
    assert memo_of(rec) == value and dup == value
    assert effects(alias, key) == 1


@pytest.mark.quick
@pytest.mark.parametrize("db_proxy", ["postgresql"], indirect=True)
def test_27c_a_carried_outcome_outlives_the_messages_expires(
    broker: str, queue: str, tally: Any, db_proxy: tuple[str, TcpProxy]
) -> None:
    backend, proxy = db_proxy
    t = tally("27c completion unwritable until past the message's expires", backend)
    expires = 4.0
    # Given an attempt of a call published with expires=, paused after its effect
    with paused_after_effect(queue, backend, proxy, ct.effect, "s27c",
                             expires=expires) as p:  # fmt: skip
        published = time.time()  # (after the publish: its expires is not yet past)
        alias, key, ws, result, pid = p.alias, p.key, p.ws, p.result, p.pid
        # When the database is unreachable from before its completion until the
        # message's expires has passed
        proxy.stop()
        try:
            cont(pid)
            wait_for(lambda: log_count(ws, "grousset.outcome_carried") or result.ready(), 60,
                     "the attempt to give up on its completion")  # fmt: skip
            wait_for(lambda: time.time() > published + expires + 1.0, 30, "expires to pass")
        finally:
            proxy.start()
        # Then the requeued delivery that carries the outcome is not dropped as expired:
        # it writes the memo and the caller gets the value
        value = result.get(timeout=60)
        rec = record_of(alias, ct.effect, (key,))
        # And a later duplicate is answered from it, not run
        dup = ct.effect.apply_async((key,), queue=queue).get(timeout=60)
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    assert value["key"] == key and rec.status == "completed" and rec.takeovers == 0
    assert memo_of(rec) == value and dup == value
    assert effects(alias, key) == 1


@pytest.mark.quick
@pytest.mark.parametrize("db_proxy", ["postgresql"], indirect=True)
def test_27d_the_carried_outcome_of_a_revoked_task_is_written(
    broker: str, queue: str, tally: Any, db_proxy: tuple[str, TcpProxy]
) -> None:
    from tests.celeryapp import app

    backend, proxy = db_proxy
    t = tally("27d completion unwritable, the task revoked meanwhile", backend)
    # Given an attempt paused after its effect, revoked meanwhile (without terminate: it
    # goes on; Celery drops every later delivery of its task id)
    with paused_after_effect(queue, backend, proxy, ct.effect, "s27d") as p:
        alias, key, ws, result, pid = p.alias, p.key, p.ws, p.result, p.pid
        app.control.revoke(result.id)
        # When the database is unreachable at its completion
        proxy.stop()
        try:
            cont(pid)
            wait_for(lambda: log_count(ws, "grousset.outcome_carried"), 60,
                     "the attempt to requeue its delivery with the outcome")  # fmt: skip
        finally:
            proxy.start()
        # Then the requeued delivery, dropped as revoked, still has its outcome written
        rec = wait_for(lambda: (r := record_of(alias, ct.effect, (key,))).status
                       == "completed" and r, 30, "the carried outcome to be written")  # fmt: skip
        # And a later duplicate is answered from it, not run
        dup = ct.effect.apply_async((key,), queue=queue).get(timeout=60)
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    assert rec.takeovers == 0 and memo_of(rec) == dup and dup["key"] == key
    assert effects(alias, key) == 1


@pytest.mark.quick
@pytest.mark.parametrize("db_proxy", BACKENDS, indirect=True)
def test_27b_transactional_completion_is_never_carried(broker: str, queue: str, tally: Any,
                                                       db_proxy: tuple[str, TcpProxy]
                                                       ) -> None:  # fmt: skip
    backend, proxy = db_proxy
    t = tally("27b transactional: database lost before the completion", backend)
    # Given a transactional attempt paused after its effect, inside its transaction
    with paused_after_effect(queue, backend, proxy, ct.booking, "s27b") as p:
        alias, key, ws, result, pid = p.alias, p.key, p.ws, p.result, p.pid
        # When the database drops every connection and the attempt resumes
        proxy.kill_connections()
        cont(pid)
        # Then the effect and the completion were lost together, and the delivery is
        # not lost with them: it is requeued (nothing carried but its claim's token),
        # and the SAME call, with no one publishing it again, runs once
        value = result.get(timeout=60)
        assert log_count(ws, "grousset.outcome_carried") == 0
        assert log_count(ws, "TransactionLost") >= 1
    rec = record_of(alias, ct.booking, (key,))
    t.add_key(alias, key, rec, "booking")
    t.add_logs(ws)
    # (claimed again after the release: a second claim, not a takeover)
    assert rec.status == "completed" and rec.takeovers == 0
    assert rec.first_claimed_at is not None and rec.first_claimed_at < rec.started_at
    assert memo_of(rec) == value
    assert effects(alias, key, "booking") == 1


@pytest.mark.parametrize("db_proxy", BACKENDS, indirect=True)
def test_28_completion_answer_lost(broker: str, queue: str, tally: Any,
                                   db_proxy: tuple[str, TcpProxy]) -> None:  # fmt: skip
    backend, proxy = db_proxy
    t = tally("28 connection cut during the completion (answer lost)", backend)
    # Given an attempt paused after its effect
    with paused_after_effect(queue, backend, proxy, ct.effect, "s28") as p:
        alias, key, ws, result, pid = p.alias, p.key, p.ws, p.result, p.pid
        # When the answer to its completion is lost (the server commits it; PostgreSQL:
        # the statement naming the key, in autocommit; MariaDB: the COMMIT)
        proxy.cut_answers_to(fp_of(ct.effect, (key,)).encode() if backend == "postgresql"
                             else b"COMMIT")  # fmt: skip
        cont(pid)
        value = result.get(timeout=60)
    rec = record_of(alias, ct.effect, (key,))
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    # Then the completion was re-sent with the same token and recognised: one effect,
    # the memo, no takeover
    assert proxy.cuts == 1 and not proxy.cut_armed
    assert rec.status == "completed" and rec.takeovers == 0 and value["fence"] == rec.fence
    assert memo_of(rec) == value
    assert effects(alias, key) == 1


@pytest.mark.quick
@pytest.mark.parametrize("db_proxy", BACKENDS, indirect=True)
def test_29_claim_answer_lost_twice(broker: str, queue: str, tally: Any,
                                    db_proxy: tuple[str, TcpProxy]) -> None:  # fmt: skip
    backend, proxy = db_proxy
    alias = ALIASES[backend]
    t = tally("29 claim committed, its answer lost on the warm and the fresh connection",
              backend)  # fmt: skip
    key = new_key("s29")
    with workers(queue, 1, database=alias, concurrency=1, env=_env(backend, proxy)) as ws:
        ct.slow.apply_async((new_key("s29-warm"),), queue=queue).get(timeout=60)
        # Given the next two answers to the claim are lost: on the warm connection, then
        # on the fresh one the store re-sends it on (PostgreSQL: the statement naming the
        # key; MariaDB: the claim's COMMIT, then the new connection's first COMMIT)
        pattern = fp_of(ct.slow, (key,)).encode() if backend == "postgresql" else b"COMMIT"
        proxy.cut_answers_to(pattern, times=2)
        t0 = time.monotonic()
        # When a task (max_processing_time 30 s) is delivered
        value = ct.slow.apply_async((key,), queue=queue).get(timeout=25)
        took = time.monotonic() - t0
    rec = record_of(alias, ct.slow, (key,))
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    t.notes.append(f"ran after {took:.1f}s")
    # Then the attempt failed closed, its requeued delivery found out whether the lost
    # claim had committed (by its token) and freed it: it ran at once, not after the
    # claim's 30 s, with no takeover, and exactly once
    assert proxy.cuts == 2 and not proxy.cut_armed
    assert log_count(ws, "grousset.lost_claim") == 1
    assert rec.status == "completed" and rec.takeovers == 0 and took < 25
    assert value["key"] == key and memo_of(rec) == value
    assert effects(alias, key) == 1


@pytest.mark.quick
@pytest.mark.parametrize("db_proxy", BACKENDS, indirect=True)
def test_30_half_open_connection_is_bounded(broker: str, queue: str, tally: Any,
                                            db_proxy: tuple[str, TcpProxy]) -> None:  # fmt: skip
    backend, proxy = db_proxy
    alias = ALIASES[backend]
    t = tally("30 half-open connection: the proxy stops forwarding, nothing closes", backend)
    key = new_key("s30")
    with workers(queue, 1, database=alias, concurrency=1, env=_env(backend, proxy)) as ws:
        ct.effect.apply_async((new_key("s30-warm"),), queue=queue).get(timeout=60)
        # Given every connection to the database stops forwarding, in both directions,
        # without closing (STORE_TIMEOUT 2 s)
        proxy.stall()
        try:
            t0 = time.monotonic()
            # When a task is delivered
            result = ct.effect.apply_async((key,), queue=queue)
            # Then its claim gives up within its bounds and fails closed: no effect
            wait_for(lambda: log_count(ws, "grousset.store_unavailable") >= 1, 60,
                     "the claim to fail closed")  # fmt: skip
            waited = time.monotonic() - t0
            assert effects(alias, key) == 0
        finally:
            proxy.unstall()
        # And once the connections forward again, the requeued delivery runs it once
        value = result.get(timeout=60)
    rec = record_of(alias, ct.effect, (key,))
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    t.notes.append(f"failed closed after {waited:.1f}s")
    # PostgreSQL: the answer is awaited STORE_TIMEOUT + 1 s, then the reconnect's
    # connect_timeout (2 s); MariaDB: read_timeout STORE_TIMEOUT + 5 s, then its
    # connect_timeout (2 s) — each well under the 15 s asserted
    assert waited < 15
    assert value["key"] == key and rec.status == "completed" and memo_of(rec) == value
    assert effects(alias, key) == 1
