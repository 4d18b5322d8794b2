"""Scenarios 18-19: a frozen attempt (SIGSTOP past ``max_processing_time``) that
resumes after its claim was taken over — or even completed, purged and claimed
again — is fenced out: it never overwrites the result."""

from __future__ import annotations

from typing import Any

import pytest

import tests.chaos_tasks as ct
from tests.chaos.conftest import ALIASES, need
from tests.chaos.harness import (
    cont,
    effects,
    holder_pid,
    log_count,
    memo_of,
    new_key,
    record_of,
    stopped,
    wait_for,
    workers,
)
from tests.chaos.test_kills import arm, fault_env

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def _fenced(exc: BaseException) -> bool:
    return "FencedOut" in type(exc).__name__ or "FencedOut" in str(exc)


@pytest.mark.parametrize("backend", list(ALIASES))
@pytest.mark.parametrize("task", [ct.effect, ct.booking], ids=["plain", "transactional"])
def test_18_zombie_is_fenced_out(broker: str, queue: str, tally: Any, backend: str,
                                 task: Any) -> None:  # fmt: skip
    alias = need(ALIASES[backend])
    t = tally(f"18 zombie SIGSTOP > max_processing_time ({task.name.split('.')[1]})", backend)
    env, armfile = fault_env("mid_effect:stop")
    key = new_key("s18")
    args = (key, 1.0)
    if backend == "sqlite" and task is ct.booking:
        _sqlite_transactional_zombie(alias, queue, env, armfile, args, t)
        return
    with workers(queue, 1, database=alias, concurrency=2, env=env) as ws:
        arm(armfile)
        # Given an attempt frozen (SIGSTOP) in the middle of its effect
        first = task.apply_async(args, queue=queue)
        pid = holder_pid(alias, task, args)
        wait_for(lambda: stopped(pid), 20, "the attempt to be stopped")
        try:
            # When a duplicate takes the stale claim over (after 3 s) and completes
            value = task.apply_async(args, queue=queue).get(timeout=60)
        finally:
            # and the zombie resumes
            cont(pid)
        with pytest.raises(Exception) as err:
            first.get(timeout=60)
        fenced_logged = log_count(ws, "grousset.fenced_out")
    rec = record_of(alias, task, args)
    t.add_key(alias, key, rec)
    t.add_logs(ws)
    # Then the zombie was fenced out and the result is the taker's
    assert _fenced(err.value) and fenced_logged == 1
    assert rec.status == "completed" and rec.takeovers == 1
    assert value["fence"] == rec.fence and memo_of(rec) == value
    # and its transactional effect rolled back (the plain one is the counted window)
    assert effects(alias, key) == (1 if task is ct.booking else 2)


def _sqlite_transactional_zombie(alias: str, queue: str, env: dict[str, str], armfile: str,
                                 args: tuple[Any, ...], t: Any) -> None:  # fmt: skip
    """SQLite has one writer: a frozen transactional attempt holds the journal's write
    lock, so nobody can take its claim over; every claim fails closed until it resumes."""
    with workers(queue, 1, database=alias, concurrency=2, env=env) as ws:
        arm(armfile)
        # Given a transactional attempt frozen inside its transaction
        first = ct.booking.apply_async(args, queue=queue)
        pid = holder_pid(alias, ct.booking, args)
        wait_for(lambda: stopped(pid), 20, "the attempt to be stopped")
        try:
            # When a duplicate arrives after max_processing_time
            dup = ct.booking.apply_async(args, queue=queue)
            wait_for(lambda: log_count(ws, "grousset.store_unavailable") >= 1, 30,
                     "the duplicate to fail closed on the write lock")  # fmt: skip
        finally:
            cont(pid)
        value = first.get(timeout=60)
        assert dup.get(timeout=60) == value
    rec = record_of(alias, ct.booking, args)
    t.add_key(alias, args[0], rec)
    t.add_logs(ws)
    t.notes.append("SQLite: a frozen transactional attempt blocks every journal write "
                   "(fail closed) until it resumes; no takeover possible")  # fmt: skip
    # Then the duplicate failed closed (no takeover), the resumed attempt completed
    assert rec.status == "completed" and rec.takeovers == 0
    assert effects(alias, args[0]) == 1


@pytest.mark.quick
def test_19_zombie_after_completion_purge_and_reclaim(
    broker: str, pg: str, queue: str, tally: Any
) -> None:
    from celery_grousset import journal
    from celery_grousset.models import Outcome

    t = tally("19 zombie after completed+purged+claimed again", "postgresql")
    env, armfile = fault_env("mid_effect:stop")
    key = new_key("s19")
    args = (key, 1.0)
    with workers(queue, 1, database=pg, concurrency=2, env=env) as ws:
        arm(armfile)
        # Given a frozen attempt whose claim is taken over and completed
        first = ct.brief.apply_async(args, queue=queue)
        pid = holder_pid(pg, ct.brief, args)
        zombie = record_of(pg, ct.brief, args).fence
        wait_for(lambda: stopped(pid), 20, "the attempt to be stopped")
        try:
            taker = ct.brief.apply_async(args, queue=queue).get(timeout=60)
            # and the record expires (expires_after 1 s), is purged, and claimed again
            fp = record_of(pg, ct.brief, args).fingerprint
            wait_for(lambda: journal.purge_expired(pg) or
                     not Outcome.objects.using(pg).filter(fingerprint=fp).exists(), 10,
                     "the record to be purged")  # fmt: skip
            third = ct.brief.apply_async(args, queue=queue).get(timeout=60)
        finally:
            # When the zombie resumes
            cont(pid)
        with pytest.raises(Exception) as err:
            first.get(timeout=60)
    rec = record_of(pg, ct.brief, args)
    t.add_key(pg, key, rec)
    t.add_logs(ws)
    # Then its completion matches nothing (the claim token is per attempt)
    assert _fenced(err.value)
    # And fences only grew, across the purge too: zombie < taker < the post-purge run
    assert zombie < taker["fence"] < third["fence"] == rec.fence
    assert rec.status == "completed" and memo_of(rec) == third
    assert effects(pg, key) == 3  # zombie (counted window), taker, and the post-purge run
