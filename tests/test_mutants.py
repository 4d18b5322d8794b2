"""Regressions the suite used to miss (issue 16, "Tests that cannot fail, and regressions
the suite misses"): each test here fails on one line of the package mutated, and runs
fast (no worker process) on every backend the line concerns.

Every wait in this file is bounded (events, joins, a claim's own ``max_processing_time``),
so a regression shows as a failure, never as a hang.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.db.models import F
from django.dispatch import Signal
from django.test import override_settings

from celery_grousset import journal, memo, protect, revoked, signals
from celery_grousset.claim import PROTECT_NAME, ClaimRequest, Kind
from celery_grousset.exceptions import FencedOut, StoreUnavailable
from celery_grousset.fingerprint import fingerprint
from celery_grousset.models import Outcome
from celery_grousset.store import Store, store_class
from celery_grousset.store.base import Completion
from celery_grousset.store.rows import RELEASED
from tests import services
from tests.celeryapp import app
from tests.ledger.models import Effect

#: bound of every join / event wait in this file (seconds)
BOUND = 15.0


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def journal_db(journal: str) -> str:
    """The guard pointed at the backend under test (conftest's ``journal``)."""
    return journal


@pytest.fixture
def scratch_queue() -> Iterator[str]:
    """A broker queue nobody consumes (Redis at GROUSSET_TEST_BROKER); deleted afterwards."""
    services.require_redis()
    name = f"grousset-mut-scratch-{uuid.uuid4().hex[:10]}"
    yield name
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(name)


def take_message(queue: str) -> Any:
    """The one message published to ``queue`` (acknowledged: the queue is left empty)."""
    with app.connection_for_read() as conn, conn.SimpleQueue(queue) as q:
        message = q.get(timeout=5)
        message.ack()
        with pytest.raises(q.Empty):
            q.get(timeout=0.2)  # and only one
        return message


@pytest.fixture
def other_store(alias: str) -> Iterator[Store]:
    """A second store on ``alias``: another worker's private connection."""
    settings = connections.settings[alias]
    other = store_class(settings["ENGINE"])(alias, settings, 5.0)
    yield other
    other.close()


def claim_request(
    processor: str, fp: str, task_name: str = PROTECT_NAME, **over: Any
) -> ClaimRequest:
    values: dict[str, Any] = dict(
        processor_id=processor,
        fingerprint=fp,
        task_name=task_name,
        task_id=f"other-{uuid.uuid4().hex[:8]}",
        token=uuid.uuid4().hex,
        worker="other:1",
        args_repr="",
        max_processing_time=60.0,
        expires_after=3600.0,
        max_takeovers=3,
    )
    values.update(over)
    return ClaimRequest(**values)


def age(alias: str, processor: str, fp: str, seconds: float) -> None:
    """Move a claim back in time (its started_at and its stale_at)."""
    Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fp).update(
        started_at=F("started_at") - timedelta(seconds=seconds),
        stale_at=F("stale_at") - timedelta(seconds=seconds),
    )


def row(alias: str, processor: str, fp: str) -> Outcome:
    return Outcome.objects.using(alias).get(processor_id=processor, fingerprint=fp)


def ledger(alias: str, key: str) -> int:
    return Effect.objects.using(alias).filter(key=key).count()


def json_memo(value: Any) -> Completion:
    result, enc, error = memo.encode(value, serializer="json", memoize=True, max_bytes=1 << 18)
    return Completion("completed", result, enc, error)


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on another thread (its own Django connections) and return its value."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's connections only

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(BOUND)
    assert not t.is_alive(), f"the other thread did not finish in {BOUND:g} s"
    if errors:
        raise errors[0]
    return out[0]


@contextmanager
def received(signal: Signal) -> Iterator[list[dict[str, Any]]]:
    """The sends of a Django signal while the block runs."""
    got: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        kwargs.pop("signal", None)
        got.append({"sender": sender, **kwargs})

    signal.connect(receiver, weak=False)
    try:
        yield got
    finally:
        signal.disconnect(receiver)


def one_line(caplog: pytest.LogCaptureFixture, event: str) -> logging.LogRecord:
    """The one log record of ``event`` (the logger is ``celery_grousset``)."""
    found = [
        r
        for r in caplog.records
        if r.name == "celery_grousset" and r.getMessage().startswith(event + " ")
    ]
    assert len(found) == 1, f"{len(found)} {event} log lines: {caplog.messages}"
    return found[0]


# -- transactional mode: the effect and the completion are one transaction -----------------


def test_transactional_fenced_out_attempt_rolls_its_effect_back(
    journal_db: str, temp_task: Any, other_store: Store
) -> None:
    alias = journal_db
    if connections[alias].vendor == "sqlite":
        pytest.skip("SQLite: the attempt's transaction holds the write lock a takeover needs")
    key = f"zombie-{uuid.uuid4().hex[:8]}"
    taker: list[ClaimRequest] = []

    def stalled(self: Any, k: str) -> str:
        # While this attempt stalls, another delivery takes its claim over (and is still
        # running when this one tries to complete)
        g = self.grousset
        taker.append(claim_request(g.processor_id, g.fingerprint, self.name))

        def take_over() -> Kind:
            age(alias, g.processor_id, g.fingerprint, 120)
            return other_store.claim(taker[0]).kind

        assert in_thread(take_over) is Kind.TAKEOVER
        Effect.objects.using(alias).create(key=k, value="zombie")  # the zombie's write
        return "zombie's result"

    task = temp_task(stalled, max_processing_time=30, transactional=True)
    with received(signals.fenced_out) as fenced:
        result = task.apply((key,))
    # Then the zombie is fenced out and its write rolled back with its completion
    assert isinstance(result.result, FencedOut), result.result
    assert ledger(alias, key) == 0, "the fenced-out attempt's write was committed"
    rec = row(alias, taker[0].processor_id, taker[0].fingerprint)
    assert (rec.status, rec.claim_token) == ("in_flight", taker[0].token)
    assert [f["sender"] for f in fenced] == [task.name] and fenced[0]["fence"] < rec.fence
    # And the taker, still holding the claim, completes
    assert other_store.finish(rec.processor_id, rec.fingerprint, taker[0].token, json_memo(1))


def test_a_transactional_completion_waits_no_longer_than_store_timeout_for_a_lock(
    journal_db: str, temp_task: Any
) -> None:
    import time

    vendor = connections[journal_db].vendor
    if vendor == "sqlite":
        pytest.skip("SQLite locks the whole database: its busy timeout is STORE_TIMEOUT")
    alias, key = journal_db, f"locked-{uuid.uuid4().hex[:8]}"
    held = threading.Event()
    release = threading.Event()
    before = lock_wait_timeout(alias)

    def lock_row(processor: str, fp: str) -> None:
        # another session holds the journal row's lock for 30 s (or until released)
        params = connections[alias].get_connection_params()
        if vendor == "postgresql":
            conn = services.pg_connect(**params)
            conn.execute("BEGIN")
        else:
            import MySQLdb

            conn = MySQLdb.connect(**params)
            conn.autocommit(False)
        try:
            conn.cursor().execute(
                "SELECT 1 FROM celery_grousset_outcome WHERE processor_id = %s AND "
                "fingerprint = %s FOR UPDATE", (processor, fp))  # fmt: skip
            held.set()
            release.wait(30)
        finally:
            conn.close()

    def effect(self: Any, k: str) -> str:
        g = self.grousset
        threading.Thread(target=lock_row, args=(g.processor_id, g.fingerprint)).start()
        assert held.wait(10)
        Effect.objects.using(alias).create(key=k, value="effect")
        return "done"

    task = temp_task(effect, max_processing_time=60, transactional=True)
    # Given a transactional task whose journal row another session locks during its body
    started = time.monotonic()
    try:
        with override_settings(GROUSSET={"DATABASE": alias, "STORE_TIMEOUT": 1.0}):
            result = task.apply((key,))
    finally:
        release.set()
    # Then its completion gave up within about STORE_TIMEOUT, not after the lock's 30 s,
    # and its effect was rolled back with it (nothing committed: it may run again)
    assert time.monotonic() - started < 15
    assert isinstance(result.result, Exception), result.result
    assert ledger(alias, key) == 0
    # And the connection's own lock wait is what it was (MySQL/MariaDB: a session value)
    assert lock_wait_timeout(alias) == before


def lock_wait_timeout(alias: str) -> str:
    with connections[alias].cursor() as cur:
        if connections[alias].vendor == "postgresql":
            cur.execute("SHOW lock_timeout")
        else:
            cur.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
        return str(cur.fetchone()[0])


def test_a_transactional_protect_in_the_callers_transaction_leaves_its_settings_alone(
    journal_db: str, processor: str
) -> None:
    if connections[journal_db].vendor == "sqlite":
        pytest.skip("the bound is set on PostgreSQL and MySQL/MariaDB")
    alias = journal_db
    names = (("lock_timeout", "idle_in_transaction_session_timeout")
             if connections[alias].vendor == "postgresql" else ("innodb_lock_wait_timeout",))

    def show() -> list[str]:
        with connections[alias].cursor() as cur:
            if connections[alias].vendor != "postgresql":
                cur.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
                return [str(cur.fetchone()[0])]
            shown = []
            for name in names:
                cur.execute(f"SHOW {name}")
                shown.append(str(cur.fetchone()[0]))
            return shown

    # Given a caller's own open transaction (a view under ATOMIC_REQUESTS, say)
    with transaction.atomic(using=alias):
        before = show()
        # When a transactional protect() completes inside it
        assert protect(f"in-caller-{uuid.uuid4().hex[:8]}", lambda: 1, max_processing_time=30,
                       processor_id=processor, database=alias, transactional=True) == 1  # fmt: skip
        # Then the caller's later statements keep the session's own settings
        after = show()
    assert after == before


def test_transactional_completion_is_fenced_while_the_taker_holds_the_claim(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a zombie's claim, taken over by a delivery that is still running
    zombie = claim_request(processor, fp, "tests.booking")
    assert store.claim(zombie).kind is Kind.NEW
    age(alias, processor, fp, 120)
    taker = claim_request(processor, fp, "tests.booking")
    assert store.claim(taker).kind is Kind.TAKEOVER
    # When the zombie completes in its transaction (transactional=True)
    with transaction.atomic(using=alias):
        done = store.finish_in_transaction(zombie, json_memo("zombie"))
    # Then nothing lands: the claim is the taker's, still in flight
    assert done is False
    rec = row(alias, processor, fp)
    assert (rec.status, rec.claim_token, rec.result) == ("in_flight", taker.token, None)
    # And the taker's own transactional completion lands, once
    with transaction.atomic(using=alias):
        assert store.finish_in_transaction(taker, json_memo("taker"))
    with transaction.atomic(using=alias):
        assert not store.finish_in_transaction(zombie, json_memo("zombie"))
    assert bytes(row(alias, processor, fp).result) == b'"taker"'


# -- the wait policy answers with the memo --------------------------------------------------


def hold_then_complete(
    other: Store, req: ClaimRequest, value: Any, after: float = 0.2
) -> Callable[[], None]:
    """Hold ``req``'s claim on another connection; complete it with ``value`` after
    ``after`` seconds, on another thread. Returns ``join`` (raises what the thread raised)."""
    assert other.claim(req).kind is Kind.NEW
    errors: list[BaseException] = []

    def complete() -> None:
        try:
            threading.Event().wait(after)
            assert other.finish(req.processor_id, req.fingerprint, req.token, json_memo(value))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=complete, daemon=True)
    t.start()

    def join() -> None:
        t.join(BOUND)
        assert not t.is_alive(), f"the holder did not complete in {BOUND:g} s"
        if errors:
            raise errors[0]

    return join


def test_protect_waiting_caller_gets_the_memo(
    alias: str, processor: str, other_store: Store
) -> None:
    key = f"wait-{uuid.uuid4().hex[:8]}"
    holder = claim_request(
        processor,
        fingerprint(PROTECT_NAME, idempotency_key=key),
        max_processing_time=5.0,  # a wait that never notices the memo ends in 5 s
    )
    join = hold_then_complete(other_store, holder, {"rows": 42})
    value = protect(
        key, lambda: pytest.fail("must not run"), max_processing_time=5,
        processor_id=processor, database=alias,
    )  # fmt: skip
    join()
    assert value == {"rows": 42}
    assert row(alias, processor, holder.fingerprint).task_id == holder.task_id


@pytest.mark.parametrize("how", ["eager", "worker"])
def test_task_waiting_delivery_gets_the_memo(
    journal_db: str, temp_task: Any, other_store: Store, scratch_queue: str, how: str
) -> None:
    ran: list[int] = []

    def waits(self: Any, k: str) -> str:
        ran.append(1)
        return "second run"

    task = temp_task(waits, max_processing_time=5, on_in_flight="wait")
    key = f"wait-{uuid.uuid4().hex[:8]}"
    fp = task.grousset_fingerprint((key,), {})
    holder = claim_request(
        task.grousset_options().processor_id, fp, task.name, max_processing_time=5.0
    )
    # Given another worker holding the call's claim, completing it 0.2 s later
    join = hold_then_complete(other_store, holder, {"first": True})
    # When a delivery of the same call arrives (eagerly, or as a worker runs it)
    if how == "eager":
        value = task.apply((key,)).get()
    else:
        task.push_request(
            id=f"w-{uuid.uuid4().hex[:8]}", args=[key], kwargs={}, called_directly=False,
            is_eager=False, delivery_info={"exchange": "", "routing_key": scratch_queue},
        )  # fmt: skip
        try:
            value = task(key)
        finally:
            task.pop_request()
    join()
    # Then it waited and returns the holder's memo; the body did not run again
    assert value == {"first": True}
    assert ran == []


# -- a re-queued in-flight delivery keeps its retries ---------------------------------------


def test_in_flight_requeue_does_not_use_up_max_retries(
    journal_db: str, temp_task: Any, other_store: Store, scratch_queue: str
) -> None:
    from celery.exceptions import Retry

    ran: list[int] = []

    def busy(self: Any, k: str) -> None:
        ran.append(1)

    task = temp_task(busy, max_processing_time=30, max_retries=3)
    key = f"requeue-{uuid.uuid4().hex[:8]}"
    fp = task.grousset_fingerprint((key,), {})
    assert other_store.claim(
        claim_request(task.grousset_options().processor_id, fp, task.name)
    ).owned
    task_id = f"d-{uuid.uuid4().hex[:8]}"
    # Given a delivery that has used up all its max_retries, finding a fresh claim
    task.push_request(
        id=task_id, args=[key], kwargs={}, retries=3, called_directly=False, is_eager=False,
        headers={}, delivery_info={"exchange": "", "routing_key": scratch_queue},
    )  # fmt: skip
    try:
        with pytest.raises(Retry) as err:
            task(key)
    finally:
        task.pop_request()
    # Then it is re-published with the same retries (not one more), not failed with
    # MaxRetriesExceededError, and the body did not run
    assert ran == []
    assert err.value.sig.options["retries"] == 3
    message = take_message(scratch_queue)
    assert message.headers["id"] == task_id
    assert message.headers["retries"] == 3
    assert message.headers["grousset_requeues"] == 1
    # ... and says that the journal counted it (its next claim is a redelivery)
    assert message.headers["grousset_counted"] == 1


def test_a_requeue_the_journal_did_not_count_is_a_duplicate_later(
    journal_db: str, temp_task: Any, other_store: Store, scratch_queue: str
) -> None:
    ran: list[int] = []

    def effect(self: Any, k: str) -> str:
        ran.append(1)
        return "second run"

    task = temp_task(effect, max_processing_time=30)
    key = f"outage-{uuid.uuid4().hex[:8]}"
    fp = task.grousset_fingerprint((key,), {})
    processor = task.grousset_options().processor_id
    first = claim_request(processor, fp, task.name)
    assert other_store.claim(first).owned
    assert other_store.finish(processor, fp, first.token, Completion("completed", b'"done"',
                                                                     "application/json"))
    # Given another publish of the call, requeued twice while the journal was down (its
    # claims never committed: the requeues header, and no grousset_counted)
    task.push_request(
        id=f"d-{uuid.uuid4().hex[:8]}", args=[key], kwargs={}, called_directly=False,
        is_eager=False, headers={"grousset_requeues": 2},
        delivery_info={"exchange": "", "routing_key": scratch_queue},
    )  # fmt: skip
    try:
        # When it is delivered again, the journal back
        assert task(key) == "done"
    finally:
        task.pop_request()
    # Then the record answered it as the duplicate it is, and the body did not run
    assert ran == []
    rec = row(journal_db, processor, fp)
    assert (rec.deliveries, rec.duplicates) == (2, 1)


def test_a_carried_outcome_is_requeued_to_arrive_before_its_claim_turns_stale(
    journal_db: str, temp_task: Any, scratch_queue: str
) -> None:
    from celery.exceptions import Retry

    from tests.test_carry import _row_locked

    locked = contextlib.ExitStack()
    processor = f"carry-{uuid.uuid4().hex[:8]}"

    def effect(self: Any, k: str) -> str:
        locked.enter_context(_row_locked(journal_db, processor))  # the completion waits
        return "done"

    task = temp_task(effect, max_processing_time=4, processor_id=processor)
    # Given a delivery requeued 6 times before (in flight, outages: a 60 s backoff by
    # now) whose effect runs and whose completion the journal then refuses
    task.push_request(
        id=f"c-{uuid.uuid4().hex[:8]}", args=["k"], kwargs={}, called_directly=False,
        is_eager=False, headers={"grousset_requeues": 6},
        delivery_info={"exchange": "", "routing_key": scratch_queue},
    )  # fmt: skip
    try:
        with override_settings(GROUSSET={"DATABASE": journal_db, "STORE_TIMEOUT": 0.5}), \
                locked, pytest.raises(Retry) as err:  # fmt: skip
            task("k")
    finally:
        task.pop_request()
    # Then it is requeued with its outcome to arrive while the claim is still its own:
    # within half the time left before stale_at (4 s from the claim), not after 30-60 s
    message = take_message(scratch_queue)
    assert message.headers["grousset_outcome"]["status"] == "completed"
    assert 0 <= float(err.value.when) <= 2.0  # type: ignore[arg-type]


# -- Celery's revoke with terminate releases the claim -------------------------------------


def test_task_revoked_signal_releases_a_terminated_claim(
    journal_db: str, temp_task: Any, other_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    from celery.app.task import Context
    from celery.signals import task_revoked

    alias = journal_db
    runs: list[int] = []

    def long(self: Any, k: str) -> str:
        runs.append(1)
        return f"ran {k}"

    task = temp_task(long, max_processing_time=30)
    key = f"revoke-{uuid.uuid4().hex[:8]}"
    processor = task.grousset_options().processor_id
    fp = task.grousset_fingerprint((key,), {})
    running = claim_request(processor, fp, task.name)
    first = other_store.claim(running)
    assert first.kind is Kind.NEW
    request = Context(id=running.task_id)
    # When its process ends terminated without a revoke (a cancel on a lost connection:
    # the message is redelivered): nothing is released
    assert revoked.process_gone(task, running.task_id) is None
    # When it is revoked without terminate: the task keeps running, its claim stays
    task_revoked.send(sender=task, request=request, terminated=False, signum=None, expired=False)
    assert row(alias, processor, fp).status == "in_flight"
    # When it is revoked with terminate=True: its claim stays while its process may run
    # on (a body that catches the signal goes on, under its claim)
    with caplog.at_level(logging.WARNING, logger="celery_grousset"):
        task_revoked.send(sender=task, request=request, terminated=True, signum=15, expired=False)
        assert row(alias, processor, fp).status == "in_flight"
        # When the pool reports its process gone (billiard's Terminated)
        released = revoked.process_gone(task, running.task_id)
        assert released is not None
        released.join(10)
    # Then its claim is released, and the next delivery runs without waiting
    rec = row(alias, processor, fp)
    assert (rec.status, rec.error, rec.result_encoding) == ("failed", RELEASED, "")
    line = one_line(caplog, "grousset.released_revoked")
    assert f"fingerprint={fp}" in line.getMessage()
    assert f"task_id={running.task_id}" in line.getMessage()
    assert task.apply((key,)).get() == f"ran {key}" and runs == [1]
    assert row(alias, processor, fp).fence > first.fence


def test_a_terminate_is_noted_before_its_signal_is_sent() -> None:
    """A review: without the event loop, billiard reports the job terminated from its own
    threads, which could come before Celery sent task_revoked (after the signal and the
    result backend's write): the exit was then not taken for a revoke's, nothing released."""
    order: list[str] = []

    class Base:  # what ReleasedWhenGone overrides of Celery's Request
        def terminate(self, pool: Any, signal: Any = None) -> None:
            order.append("noted" if "tid-1" in revoked.TERMINATING else "not noted")

    class Request(revoked.ReleasedWhenGone, Base):  # type: ignore[misc]
        id = "tid-1"

    # When Celery terminates the request / Then it is noted before the signal goes out
    try:
        Request().terminate(object(), 15)
        assert order == ["noted"]
    finally:
        revoked.TERMINATING.pop("tid-1", None)


def test_task_revoked_signal_leaves_a_claim_taken_over_since(
    journal_db: str, temp_task: Any, other_store: Store
) -> None:
    from celery.app.task import Context
    from celery.signals import task_revoked

    alias = journal_db

    def echo(self: Any, k: str) -> str:
        return k

    task = temp_task(echo, max_processing_time=30)
    key = f"revoke-{uuid.uuid4().hex[:8]}"
    processor = task.grousset_options().processor_id
    fp = task.grousset_fingerprint((key,), {})
    dead = claim_request(processor, fp, task.name)
    assert other_store.claim(dead).owned
    age(alias, processor, fp, 120)
    taker = claim_request(processor, fp, task.name)
    assert other_store.claim(taker).kind is Kind.TAKEOVER
    # When the dead delivery's revoke (terminated) arrives late, and its process is gone
    task_revoked.send(
        sender=task, request=Context(id=dead.task_id), terminated=True, signum=9, expired=False
    )
    released = revoked.process_gone(task, dead.task_id)
    assert released is not None
    released.join(10)
    # Then the taker keeps its claim
    rec = row(alias, processor, fp)
    assert (rec.status, rec.claim_token) == ("in_flight", taker.token)


# -- operators' signals and log lines -------------------------------------------------------


def test_duplicate_is_logged_and_signalled(
    alias: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    opts: dict[str, Any] = {"max_processing_time": 60, "processor_id": processor}
    assert protect("dup", lambda: 7, database=alias, **opts) == 7
    with (
        received(signals.duplicate_skipped) as got,
        caplog.at_level(logging.INFO, logger="celery_grousset"),
    ):
        assert protect("dup", lambda: 8, database=alias, **opts) == 7
    rec = Outcome.objects.using(alias).get(processor_id=processor)
    assert got == [
        {
            "sender": PROTECT_NAME,
            "fingerprint": rec.fingerprint,
            "task_id": "",
            "processor_id": processor,
            "original_task_id": rec.task_id,
            "completed_at": rec.completed_at,
            "deliveries": 2,
            "outcome": "completed",
        }
    ]
    line = one_line(caplog, "grousset.duplicate_skipped")
    assert line.levelno == logging.INFO
    assert f"fingerprint={rec.fingerprint} task=protect" in line.getMessage()
    assert f"processor={processor}" in line.getMessage()
    assert "deliveries=2" in line.getMessage()


def test_a_replayed_failure_is_logged_and_signalled_as_a_duplicate(
    alias: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A duplicate that replayed a memoized failure was counted by the metrics but had no
    log line and no signal: operators counting duplicates from either were short (a
    review: 8 of 11)."""
    runs: list[int] = []

    def boom() -> None:
        runs.append(1)
        raise KeyError("gone")

    opts: dict[str, Any] = {"max_processing_time": 60, "processor_id": processor,
                            "database": alias, "on_failure": "memoize"}  # fmt: skip
    with pytest.raises(KeyError):
        protect("boom", boom, **opts)
    # When the call comes again and its failure is replayed
    with (
        received(signals.duplicate_skipped) as got,
        caplog.at_level(logging.INFO, logger="celery_grousset"),
        pytest.raises(KeyError, match="gone"),
    ):
        protect("boom", boom, **opts)
    # Then it did not run, and it was signalled and logged as a duplicate of a failure
    rec = Outcome.objects.using(alias).get(processor_id=processor)
    assert runs == [1] and rec.status == "failed"
    assert [(g["fingerprint"], g["deliveries"], g["outcome"]) for g in got] == [
        (rec.fingerprint, 2, "failed")
    ]
    line = one_line(caplog, "grousset.duplicate_skipped").getMessage()
    assert f"fingerprint={rec.fingerprint}" in line and "outcome=failed" in line, line


def test_task_duplicate_is_signalled_with_both_task_ids(
    journal_db: str, temp_task: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def value(self: Any, k: str) -> str:
        return f"v-{k}"

    task = temp_task(value, max_processing_time=30)
    first = task.apply(("a",), task_id=f"first-{uuid.uuid4().hex[:6]}")
    with (
        received(signals.duplicate_skipped) as got,
        caplog.at_level(logging.INFO, logger="celery_grousset"),
    ):
        second = task.apply(("a",), task_id=f"second-{uuid.uuid4().hex[:6]}")
    assert first.get() == second.get() == "v-a"
    assert [(g["sender"], g["task_id"], g["original_task_id"], g["deliveries"]) for g in got] == [
        (task.name, second.id, first.id, 2)
    ]
    line = one_line(caplog, "grousset.duplicate_skipped")
    assert f"task_id={second.id}" in line.getMessage()
    assert f"original_task_id={first.id}" in line.getMessage()


def test_takeover_is_logged_and_signalled(
    alias: str, processor: str, other_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    fp = fingerprint(PROTECT_NAME, idempotency_key="dead")
    # Given a claim whose holder died, past its max_processing_time
    held = other_store.claim(claim_request(processor, fp))
    assert held.owned
    age(alias, processor, fp, 120)
    # When protect() is called for its key
    with (
        received(signals.claim_taken_over) as got,
        caplog.at_level(logging.INFO, logger="celery_grousset"),
    ):
        value = protect(
            "dead", lambda: "mine", max_processing_time=60, processor_id=processor,
            database=alias,
        )  # fmt: skip
    # Then it took the claim over, and said so
    assert value == "mine"
    assert got == [
        {
            "sender": PROTECT_NAME,
            "fingerprint": fp,
            "task_id": "",
            "processor_id": processor,
            "fence": row(alias, processor, fp).fence,
            "takeovers": 1,
        }
    ]
    assert got[0]["fence"] > held.fence
    line = one_line(caplog, "grousset.claim_taken_over")
    assert line.levelno == logging.WARNING
    assert f"fingerprint={fp}" in line.getMessage()
    assert f"fence={got[0]['fence']}" in line.getMessage()
    assert "takeovers=1" in line.getMessage()


def test_fenced_out_is_logged_and_signalled(
    alias: str, processor: str, other_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    fp = fingerprint(PROTECT_NAME, idempotency_key="zombie")
    taker = claim_request(processor, fp)

    def stalls() -> str:
        # taken over while it runs
        age(alias, processor, fp, 120)
        assert other_store.claim(taker).kind is Kind.TAKEOVER
        return "late"

    with (
        received(signals.fenced_out) as got,
        caplog.at_level(logging.INFO, logger="celery_grousset"),
        pytest.raises(FencedOut),
    ):
        protect("zombie", stalls, max_processing_time=60, processor_id=processor, database=alias)
    assert got == [
        {
            "sender": PROTECT_NAME,
            "fingerprint": fp,
            "task_id": "",
            "processor_id": processor,
            "fence": got[0]["fence"],
        }
    ]
    line = one_line(caplog, "grousset.fenced_out")
    assert line.levelno == logging.ERROR
    assert f"fingerprint={fp}" in line.getMessage()
    assert f"fence={got[0]['fence']}" in line.getMessage()
    rec = row(alias, processor, fp)
    assert (rec.status, rec.claim_token) == ("in_flight", taker.token)
    assert got[0]["fence"] < rec.fence  # the zombie's fence is below the taker's


# -- purge: a future ``before`` is capped at the database clock -----------------------------


def test_purge_and_dry_run_cap_a_future_before_at_the_database_clock(
    store: Store, alias: str, processor: str
) -> None:
    fps = {name: uuid.uuid4().hex * 2 for name in ("expired", "fresh")}
    for name, fp in fps.items():
        r = claim_request(processor, fp, expires_after=3600.0)
        assert store.claim(r).owned
        assert store.finish(processor, fp, r.token, json_memo(name))
    Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fps["expired"]).update(
        expires_on=F("expires_on") - timedelta(seconds=3601)
    )
    future = journal.now(alias) + timedelta(hours=2)  # after the fresh row's expiry
    # The dry run counts what the purge would delete: not the unexpired row
    would = set(
        journal.expired(alias, at=future, processor_id=processor).values_list(
            "fingerprint", flat=True
        )
    )
    assert would == {fps["expired"]}
    # When purged with that `before` / Then the unexpired row survives
    journal.purge_expired(alias, before=future)
    left = set(
        Outcome.objects.using(alias)
        .filter(processor_id=processor)
        .values_list("fingerprint", flat=True)
    )
    assert left == {fps["fresh"]}
    # And its duplicates still get the memo
    res = store.claim(claim_request(processor, fps["fresh"]))
    assert res.kind is Kind.COMPLETED and res.result == b'"fresh"'


# -- SQLite: the claim's read-decide-write holds the write lock from the start --------------


def test_sqlite_claims_racing_on_two_connections_are_serialised(processor: str, fp: str) -> None:
    from celery_grousset.store.sqlite import SQLiteStore

    services.require_database("default")
    settings = connections.settings["default"]
    first, second = (SQLiteStore("default", settings, timeout=5.0) for _ in range(2))
    first_writes, second_begins, second_writes = (threading.Event() for _ in range(3))

    def trace_first(sql: str) -> None:
        if sql.startswith("INSERT INTO celery_grousset_outcome"):
            # The first claim has read the key (absent) and is about to insert: let the
            # second claim begin, and read the key too if its BEGIN lets it.
            first_writes.set()
            second_begins.wait(BOUND)
            second_writes.wait(0.3)

    def trace_second(sql: str) -> None:
        if sql.startswith("BEGIN"):
            second_begins.set()
        elif sql.startswith("INSERT INTO celery_grousset_outcome"):
            second_writes.set()

    results: dict[str, Any] = {}

    def claim(name: str, store: SQLiteStore) -> None:
        try:
            results[name] = store.claim(claim_request(processor, fp)).kind
        except StoreUnavailable as exc:
            results[name] = exc

    try:
        for store, trace in ((first, trace_first), (second, trace_second)):
            store._cursor()
            store._conn.set_trace_callback(trace)
        a = threading.Thread(target=claim, args=("first", first), daemon=True)
        a.start()
        assert first_writes.wait(BOUND)
        b = threading.Thread(target=claim, args=("second", second), daemon=True)
        b.start()
        a.join(BOUND)
        b.join(BOUND)
        assert not a.is_alive() and not b.is_alive()
    finally:
        first.close()
        second.close()
    # Then the second claim waited for the first one's write lock and saw its claim:
    # one owner, and no "database is locked"
    assert results == {"first": Kind.NEW, "second": Kind.IN_FLIGHT}
    assert not second_writes.is_set()


# -- the task's REDACT_KEYS reach what the journal stores -----------------------------------


def test_task_args_repr_honours_redact_keys(alias: str, temp_task: Any, scratch_queue: str) -> None:
    def wear(self: Any, favourite_colour: str, size: int) -> int:
        return size

    task = temp_task(wear, max_processing_time=30)

    def stored(*args: Any, **kwargs: Any) -> str:
        assert task.apply(args, kwargs).successful()
        return row(alias, task.grousset_options().processor_id,
                   task.grousset_fingerprint(args, kwargs)).args_repr  # fmt: skip

    # Given a name the default redaction does not cover (the test would prove nothing)
    with override_settings(GROUSSET={"DATABASE": alias}):
        assert "teal-0c2" in stored("teal-0c2", 41)
    # When REDACT_KEYS names it
    with override_settings(GROUSSET={"DATABASE": alias, "REDACT_KEYS": ["favourite_colour"]}):
        # Then neither a positional nor a keyword value is stored
        positional = stored("ultramarine-7f3", 42)
        keyword = stored(favourite_colour="crimson-9a1", size=43)
        # nor published in the message's argsrepr
        task.apply_async(("ochre-5d4", 44), queue=scratch_queue)
        argsrepr = take_message(scratch_queue).headers["argsrepr"]
        # ... also for a call an idempotency_key names (its arguments are not fingerprinted)
        task.apply_async(("umber-3c9", 45), queue=scratch_queue, idempotency_key="k-45")
        keyed = take_message(scratch_queue).headers["argsrepr"]
    assert "ultramarine" not in positional and "42" in positional and "***" in positional
    assert "crimson" not in keyword and "43" in keyword and "***" in keyword
    assert "ochre" not in argsrepr and "44" in argsrepr
    assert "umber" not in keyed and "45" in keyed and "***" in keyed


def test_a_transactional_body_writing_to_another_database_is_said_once(
    journal_db: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    other = "postgresql" if journal_db != "postgresql" else "default"
    services.require_database(other)
    alias = journal_db

    def book(where: str, key: str) -> Callable[[], str]:
        def body() -> str:
            Effect.objects.using(where).create(key=key, value="booked")
            return "booked"

        return body

    name = f"elsewhere-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger="celery_grousset"):
        # Given transactional calls whose bodies write to the journal's own database
        for n in range(2):
            protect(f"{name}-own-{n}", book(alias, f"{name}-own-{n}"), processor_id=name,
                    max_processing_time=30, database=alias, transactional=True)  # fmt: skip
        # Then nothing is said: those writes commit with the outcome
        assert not [r for r in caplog.records if "transactional_elsewhere" in r.getMessage()]
        # When two calls write to another database instead
        for n in range(2):
            protect(f"{name}-other-{n}", book(other, f"{name}-other-{n}"), processor_id=name,
                    max_processing_time=30, database=alias, transactional=True)  # fmt: skip
    # Then it is said once, naming that database and the journal's
    record = one_line(caplog, "grousset.transactional_elsewhere")
    assert record.levelno == logging.WARNING
    assert (record.grousset_database, record.grousset_journal) == (other, alias)  # type: ignore[attr-defined]
    # And the writes themselves stood (nothing is refused)
    assert ledger(other, f"{name}-other-1") == 1 and ledger(alias, f"{name}-own-1") == 1


def test_a_transactional_body_that_wrote_elsewhere_and_raised_is_said_too(
    journal_db: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The failing body is the one whose writes there run again: it was never said."""
    other = "postgresql" if journal_db != "postgresql" else "default"
    services.require_database(other)
    key = f"elsewhere-raised-{uuid.uuid4().hex[:8]}"

    def body() -> str:
        Effect.objects.using(other).create(key=key, value="booked")
        raise RuntimeError("card declined")

    # When a transactional body writes to another database, then raises
    with caplog.at_level(logging.WARNING, logger="celery_grousset"), pytest.raises(RuntimeError):
        protect(key, body, processor_id=key, max_processing_time=30, database=journal_db,
                transactional=True)  # fmt: skip
    # Then the write elsewhere stood, and it is said, naming that database
    assert ledger(other, key) == 1
    record = one_line(caplog, "grousset.transactional_elsewhere")
    assert record.grousset_database == other  # type: ignore[attr-defined]
