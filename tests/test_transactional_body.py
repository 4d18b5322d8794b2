"""A transactional body that does things to the transaction it runs in: leaves it
marked for rollback or aborted, closes its connection, catches a deadlock inside a
savepoint, registers an on_commit callback that raises. On every backend, with the
effect counted in the ledger (celery_grousset/txbody.py)."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any

import pytest
from celery.exceptions import Retry
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    transaction,
)
from django.db.models import F
from django.db.transaction import TransactionManagementError

from celery_grousset import protect
from celery_grousset.exceptions import TransactionLost
from celery_grousset.models import Outcome
from celery_grousset.store import refusals
from tests.ledger.models import Effect


class GaveUp(Exception):
    """A body's own error, raised on giving up a step whose conflict it caught."""


def _protect(alias: str, processor: str, key: str, fn: Any, *args: Any) -> Any:
    return protect(key, fn, *args, max_processing_time=30, processor_id=processor,
                   database=alias, transactional=True)  # fmt: skip


def _record(alias: str, processor: str) -> Outcome:
    return Outcome.objects.using(alias).get(processor_id=processor)


def test_a_body_that_breaks_its_transaction_fails_with_the_cause_and_the_fix(
    alias: str,
) -> None:
    def rolled_back(key: str) -> str:  # marks the guard's transaction for rollback
        Effect.objects.using(alias).create(key=key)
        transaction.set_rollback(True, using=alias)
        return "booked"

    def caught(key: str) -> str:  # a caught error without a savepoint (PostgreSQL
        Effect.objects.using(alias).create(key=key)  # aborts the transaction)
        with contextlib.suppress(DatabaseError), connections[alias].cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        return "booked"

    bodies = [(rolled_back, "marked for rollback")]
    if connections[alias].vendor == "postgresql":
        bodies.append((caught, "aborted by a database error"))
    for body, how in bodies:
        processor, key = f"test-{uuid.uuid4().hex[:12]}", f"broken-{uuid.uuid4().hex[:8]}"
        # When a transactional body returns but has left its transaction unable to commit
        for _ in range(2):
            with pytest.raises(TransactionManagementError) as raised:
                _protect(alias, processor, key, body, key)
            # Then the attempt fails with what happened and the fix, its writes rolled
            # back, the failure recorded (released: the next call runs it again)
            text = str(raised.value)
            assert how in text and "savepoint" in text and "transaction.atomic()" in text, text
            assert not Effect.objects.using(alias).filter(key=key).exists()
            rec = _record(alias, processor)
            assert rec.status == "failed" and "TransactionManagementError" in rec.error


@pytest.mark.parametrize("close", [close_old_connections, "close"])
def test_a_body_that_closes_its_connection_fails_instead_of_being_sent_again(
    alias: str, processor: str, close: Any
) -> None:
    key, runs = f"closed-{uuid.uuid4().hex[:8]}", []

    def body() -> str:
        runs.append(1)
        Effect.objects.using(alias).create(key=key, value="before")
        if close == "close":
            connections[alias].close()
        else:
            close()
        Effect.objects.using(alias).create(key=key, value="after")  # on a closed connection
        return "booked"

    # When a transactional body closes the connection its transaction runs on (Django's
    # close_old_connections() always does inside a transaction) and goes on writing
    for attempt in (1, 2):
        with pytest.raises(TransactionManagementError, match="closed") as raised:
            _protect(alias, processor, key, body)
        # Then it is the body's failure, said as such — not a lost connection, which is
        # sent again (TransactionLost) for ever, each attempt as quick as the first
        assert not isinstance(raised.value, TransactionLost)
        assert "close_old_connections()" in str(raised.value)
        assert len(runs) == attempt and _record(alias, processor).status == "failed"
    assert not Effect.objects.using(alias).filter(key=key).exists()


def test_an_on_commit_callback_that_raises_leaves_the_call_committed(
    alias: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    key, sent = f"hook-{uuid.uuid4().hex[:8]}", []

    def body() -> str:
        Effect.objects.using(alias).create(key=key)
        transaction.on_commit(lambda: (_ for _ in ()).throw(ValueError("mail server down")),
                              using=alias)  # fmt: skip
        transaction.on_commit(lambda: sent.append(key), using=alias)
        return "booked"

    # When the body's on_commit callback raises after the transaction committed
    with (
        caplog.at_level("WARNING", logger="celery_grousset"),
        pytest.raises(ValueError, match="mail server down"),
    ):
        _protect(alias, processor, key, body)
    lines = [r.getMessage() for r in caplog.records]
    # Then the caller gets the callback's error (as Django raises it), the call stays
    # completed, and the log says so — not that the attempt was fenced out
    assert _record(alias, processor).status == "completed"
    assert Effect.objects.using(alias).filter(key=key).count() == 1
    assert any(line.startswith("grousset.on_commit_failed") and "committed=True" in line
               for line in lines), lines  # fmt: skip
    assert not any("fenced_out" in line for line in lines), lines
    # And a duplicate gets the memo: the effect and its callbacks are not run again
    assert _protect(alias, processor, key, body) == "booked"
    assert Effect.objects.using(alias).filter(key=key).count() == 1 and sent == []


def test_a_body_that_reads_then_writes_is_not_refused_for_a_commit_made_in_between(
    alias: str, processor: str
) -> None:
    """SQLite (WAL) refused a transaction's first write at once when another connection
    had committed since its first read: the body failed (and with on_failure="memoize"
    its call never ran). Its transaction now takes the write lock first."""
    key, read, other_done, other = f"rw-{uuid.uuid4().hex[:8]}", threading.Event(), [], []

    def body() -> str:
        seen = Effect.objects.using(alias).filter(key=key).count()  # read (an order)
        read.set()
        for _ in range(40):  # then wait for the other call (or, blocked behind us, 1 s)
            if other_done:
                break
            time.sleep(0.025)
        Effect.objects.using(alias).create(key=f"{key}-{seen}")  # then write
        return "booked"

    def unrelated() -> None:
        try:
            read.wait(10)
            other.append(protect(f"{key}-other", lambda: "other", max_processing_time=30,
                                 processor_id=processor, database=alias))  # fmt: skip
        except Exception as exc:  # reported by the assertion below
            other.append(exc)
        finally:
            other_done.append(True)
            connections.close_all()

    # Given an unrelated guarded call that commits between the body's read and its write
    thread = threading.Thread(target=unrelated)
    thread.start()
    try:
        # When the transactional body runs
        result = protect(key, body, max_processing_time=30, processor_id=processor,
                         database=alias, transactional=True, on_failure="memoize")  # fmt: skip
    finally:
        thread.join(30)
    # Then both calls complete, the body's write made once
    assert result == "booked" and other == ["other"]
    assert Effect.objects.using(alias).filter(key=f"{key}-0").count() == 1
    rows = Outcome.objects.using(alias).filter(processor_id=processor)
    assert sorted(rows.values_list("status", flat=True)) == ["completed", "completed"]


def _waiting(alias: str) -> bool:
    """A row lock wait is under way on ``alias``'s server (asked on a connection of its
    own: MariaDB answers a transaction that has read its lock tables once from a snapshot
    of them)."""
    sql = {"postgresql": "SELECT count(*) FROM pg_locks WHERE NOT granted",
           "mysql": "SELECT count(*) FROM information_schema.INNODB_TRX "
                    "WHERE trx_state = 'LOCK WAIT'"}  # fmt: skip
    probe = connections.create_connection(alias)
    try:
        with probe.cursor() as cursor:
            cursor.execute(sql[probe.vendor])
            return bool(cursor.fetchone()[0])
    finally:
        probe.close()


@pytest.mark.parametrize(
    "then", ["returns", "fails", "gives_up", "gives_up_from", "retries", "marks", "closes"]
)
def test_a_deadlock_caught_inside_a_savepoint_is_sent_again_not_the_failure(
    alias: str, processor: str, then: str
) -> None:
    if connections[alias].vendor == "sqlite":
        pytest.skip("SQLite: one writer at a time, no deadlock between two transactions")
    key = f"deadlock-{uuid.uuid4().hex[:8]}"
    a, b = (Effect.objects.using(alias).create(key=f"{key}-lock").pk for _ in range(2))
    other: list[BaseException] = []  # the rival's error, if it was the one rolled back
    caught: list[BaseException] = []  # the body's
    holds_b = threading.Event()

    def rival() -> None:  # holds B, heavier (InnoDB rolls back the lighter), then wants A
        try:
            with transaction.atomic(using=alias):
                Effect.objects.using(alias).bulk_create(
                    [Effect(key=f"{key}-weight") for _ in range(20)])  # fmt: skip
                Effect.objects.using(alias).filter(pk=b).update(value=F("value"))
                holds_b.set()
                deadline = time.monotonic() + 10
                while not _waiting(alias) and time.monotonic() < deadline:
                    time.sleep(0.02)  # until the body waits for B
                Effect.objects.using(alias).filter(pk=a).update(value=F("value"))
        except BaseException as exc:
            other.append(exc)
        finally:
            connections[alias].close()

    started: list[threading.Thread] = []

    def body() -> str:
        Effect.objects.using(alias).create(key=key)
        Effect.objects.using(alias).filter(pk=a).update(value=F("value"))  # holds A
        first_attempt = not started
        if first_attempt:  # the first attempt meets the rival
            started.append(threading.Thread(target=rival))
            started[0].start()
            assert holds_b.wait(10)
        try:
            with transaction.atomic(using=alias):  # Django's pattern for a retried step
                Effect.objects.using(alias).filter(pk=b).update(value=F("value"))
        except OperationalError as exc:
            caught.append(exc)  # the step is given up; the body goes on
            if then == "gives_up" and first_attempt:  # or raises an error of its own
                raise GaveUp("could not book")  # noqa: B904 (as a body may)
            if then == "gives_up_from" and first_attempt:
                raise GaveUp("could not book") from exc
            if then == "retries" and first_attempt:  # Celery's self.retry(exc=exc), raised
                raise Retry("retry in 5s", exc=exc) from exc  # from the conflict
        if then == "fails" and first_attempt:  # then fails on an error of its own
            Effect.objects.using(alias).create(pk=a, key=key)  # (a key taken: IntegrityError)
        if then == "marks" and first_attempt:  # or marks its transaction for rollback
            transaction.set_rollback(True, using=alias)
        if then == "closes" and first_attempt:  # or closes its connection
            connections[alias].close()
        return "booked"

    # When a transactional body catches a deadlock inside a savepoint and returns (or
    # then fails on an error of its own)
    try:
        first: Any = _protect(alias, processor, key, body)
    except (TransactionLost, IntegrityError, TransactionManagementError, GaveUp, Retry) as exc:
        first = exc
    started[0].join(30)
    # (the deadlock happened, and the body was the transaction the database chose)
    assert len(caught) == 1 and refusals.rolled_back(caught[0]) and not other, (caught, other)
    mysql = connections[alias].vendor == "mysql"
    if then in ("closes", "retries") or (then not in ("returns", "gives_up_from") and not mysql):
        # Then on PostgreSQL, where the savepoint took the deadlock back, what the body
        # did of its own is its failure, not taken for the conflict it handled (a closed
        # connection, on every backend; Celery's retry, which published the retry
        # already): not sent again, which would run it twice
        expected = {"fails": IntegrityError, "gives_up": GaveUp, "retries": Retry}.get(
            then, TransactionManagementError)  # fmt: skip
        assert isinstance(first, expected) and not isinstance(first, TransactionLost), first
        assert _record(alias, processor).status == "failed"
        assert not Effect.objects.using(alias).filter(key=key).exists()
        return
    if mysql or then == "gives_up_from":
        # Then on MySQL/MariaDB, which rolled the whole transaction back, the attempt is
        # sent again (TransactionLost, the claim released) — not the body's failure,
        # whatever the body raised after; an error raised `from` the conflict is the
        # conflict, on every backend
        assert isinstance(first, TransactionLost), first
        assert "conflict" in str(first)
        assert _record(alias, processor).status == "failed"  # (released)
        assert _protect(alias, processor, key, body) == "booked"
    else:  # PostgreSQL rolls back to the savepoint: the attempt goes on and commits
        assert first == "booked", first
    # And the body's own write stands once
    assert Effect.objects.using(alias).filter(key=key).count() == 1
    assert _record(alias, processor).status == "completed"


def _kill(alias: str) -> None:
    """End the connection of this thread's ``alias`` from another one, as a server
    restart or an idle limit would."""
    conn = connections[alias]
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()" if conn.vendor == "postgresql"
                       else "SELECT CONNECTION_ID()")  # fmt: skip
        pid = cursor.fetchone()[0]
    killer = connections.create_connection(alias)
    try:
        with killer.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)" if conn.vendor == "postgresql"
                           else "KILL %s", [pid])  # fmt: skip
    finally:
        killer.close()


@pytest.mark.parametrize("then", ["returns", "gives_up"])
def test_a_lost_connection_the_body_caught_is_sent_again_not_the_failure(
    alias: str, processor: str, then: str
) -> None:
    if connections[alias].vendor == "sqlite":
        pytest.skip("SQLite: no connection to lose")
    key, runs = f"lost-{uuid.uuid4().hex[:8]}", []

    def body() -> str:
        runs.append(1)
        Effect.objects.using(alias).create(key=key)
        if len(runs) == 1:
            _kill(alias)
        if then == "gives_up" and len(runs) == 1:
            try:  # a raw statement (no atomic block of Django's marks the transaction)
                with connections[alias].cursor() as cursor:
                    cursor.execute("SELECT 1")
            except (OperationalError, InterfaceError):
                raise GaveUp("the audit write failed")  # noqa: B904 (as a body may)
        with contextlib.suppress(OperationalError):  # a best-effort write, its error caught
            Effect.objects.using(alias).create(key=f"{key}-audit")
        return "booked"

    # When the server drops the body's connection and the body catches the error and
    # returns (or raises an error of its own) / Then the attempt is sent again (its
    # transaction is gone), not failed
    with pytest.raises(TransactionLost):
        _protect(alias, processor, key, body)
    assert _protect(alias, processor, key, body) == "booked" and len(runs) == 2
    assert Effect.objects.using(alias).filter(key=key).count() == 1
    assert _record(alias, processor).status == "completed"


def _deadlock(vendor: str) -> BaseException:
    """The error a deadlock of an earlier transaction left on a connection (Django keeps
    the last one its ORM marked a transaction for rollback with, and never clears it)."""
    if vendor == "postgresql":
        from celery_grousset.store.pgdriver import driver

        cause: BaseException = driver().module.errors.DeadlockDetected("deadlock detected")
    else:
        import MySQLdb

        cause = MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock")
    error = OperationalError(*cause.args)
    error.__cause__ = cause
    return error


def test_a_deadlock_of_an_earlier_transaction_is_not_taken_for_this_ones(
    alias: str, processor: str
) -> None:
    conn = connections[alias]
    if conn.vendor == "sqlite":
        pytest.skip("SQLite: no deadlock error")
    key, runs = f"stale-{uuid.uuid4().hex[:8]}", []
    conn.ensure_connection()
    conn.rollback_exc = _deadlock(conn.vendor)  # (left by an earlier transaction)

    def body() -> str:
        runs.append(1)
        Effect.objects.using(alias).create(key=key)
        transaction.set_rollback(True, using=alias)
        return str(Effect.objects.using(alias).count())  # refused: the transaction is broken

    # When a body marks its transaction for rollback and goes on querying (Django refuses
    # it with an error raised from the connection's last rollback cause, an old deadlock)
    with pytest.raises(TransactionManagementError) as raised:
        _protect(alias, processor, key, body)
    # Then it is the body's failure, once: not a conflict of this transaction, sent again
    assert not isinstance(raised.value, TransactionLost)
    assert len(runs) == 1 and _record(alias, processor).status == "failed"
