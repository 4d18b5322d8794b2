"""A transactional attempt whose connection to the journal database breaks before its
commit is confirmed: not the task's failure but an outage. The claim is released (never
memoized), ``TransactionLost`` (a ``StoreUnavailable``) is raised, and a task's delivery
is requeued (tests/chaos/test_network.py, scenario 27b, with real workers). Here, in
process, through a proxy that drops the connections: ``protect(transactional=True)``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from django.db import OperationalError, connections, transaction
from django.test import override_settings

from celery_grousset import protect, signals
from celery_grousset.exceptions import StoreUnavailable, TransactionLost
from celery_grousset.models import Outcome
from celery_grousset.store import reset_stores
from tests import services
from tests.chaos.proxy import TcpProxy
from tests.locks import lock_waiters
from tests.test_checks import database


@pytest.fixture
def proxied() -> Iterator[tuple[str, TcpProxy]]:
    """A PostgreSQL journal alias reached through a proxy that can drop its connections."""
    services.require_database("postgresql")
    base = connections.settings["postgresql"]
    proxy = TcpProxy((str(base["HOST"]), int(str(base["PORT"]))))
    proxy.start()
    alias = "proxied_pg"
    try:
        with database(alias, **{**base, "PORT": str(proxy.port)}), override_settings(
            GROUSSET={"DATABASE": alias, "MAX_PROCESSING_TIME": 30}
        ):
            reset_stores()
            yield alias, proxy
    finally:
        reset_stores()
        proxy.stop()


def test_a_transaction_whose_connection_breaks_is_an_outage_not_a_failure(
    proxied: tuple[str, TcpProxy],
) -> None:
    alias, proxy = proxied
    key, runs = f"lost-{uuid.uuid4().hex[:8]}", []

    def body() -> str:
        runs.append(1)
        if len(runs) == 1:
            proxy.kill_connections()  # the database "restarts" under the first attempt
        return "booked"

    # When the first attempt's connection breaks inside its transaction
    with pytest.raises(TransactionLost) as lost:
        protect(key, body, transactional=True, on_failure="memoize")
    # Then the caller is told it is an outage (a StoreUnavailable), not the task's error
    assert isinstance(lost.value, StoreUnavailable)
    assert isinstance(lost.value.__cause__, OperationalError)
    # And the claim was released, not memoized as a failure (on_failure="memoize"):
    # the next call runs the body, once, and later calls get its memo
    assert protect(key, body, transactional=True, on_failure="memoize") == "booked"
    assert protect(key, body, transactional=True, on_failure="memoize") == "booked"
    assert len(runs) == 2
    rec = Outcome.objects.using(alias).get(task_name="protect", args_repr=f"key={key!r}")
    assert rec.status == "completed" and rec.takeovers == 0


def test_a_connection_dead_before_the_transaction_is_no_drop_towards_the_limit(
    proxied: tuple[str, TcpProxy],
) -> None:
    """A connection that breaks at the transaction's first statement was dead before it
    (a database restarted under a pool child that kept its connection): it counted
    towards carry.MAX_DROPPED as if an idle limit had cut the transaction, so a delivery
    meeting several such children in a row failed for good, naming an idle timeout."""
    import time

    alias, proxy = proxied

    def lost(pause: float) -> TransactionLost:
        def body() -> str:
            time.sleep(pause)
            proxy.kill_connections()
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT 1")
            return "booked"

        with pytest.raises(TransactionLost) as caught:
            protect(f"dead-{uuid.uuid4().hex[:8]}", body, transactional=True)
        return caught.value

    # When the connection breaks at once / after the transaction was open a while
    at_once, after = lost(0.0), lost(1.2)
    # Then the first is an outage, not a drop; the second is a drop
    assert at_once.dropped is False and "CONN_HEALTH_CHECKS" in str(at_once)
    assert after.dropped is True


def test_an_operational_error_on_a_healthy_connection_is_the_tasks_failure(
    proxied: tuple[str, TcpProxy],
) -> None:
    key = f"own-{uuid.uuid4().hex[:8]}"

    def body() -> str:
        raise OperationalError("the task's own database trouble")

    # When the body raises an OperationalError while its connection is fine
    with pytest.raises(OperationalError) as failed:
        protect(key, body, transactional=True, on_failure="memoize")
    # Then it is the task's failure, as before: raised as is and memoized as asked
    assert not isinstance(failed.value, StoreUnavailable)
    with pytest.raises(Exception, match="the task's own database trouble"):
        protect(key, body, transactional=True, on_failure="memoize")


def test_a_commit_whose_answer_is_lost_is_not_reported_fenced_out(
    proxied: tuple[str, TcpProxy], caplog: pytest.LogCaptureFixture
) -> None:
    alias, proxy = proxied
    key, runs, fenced = f"committed-{uuid.uuid4().hex[:8]}", [], []

    def body() -> str:
        runs.append(1)
        if len(runs) == 1:
            proxy.cut_answers_to(b"COMMIT")  # the commit lands; its answer never comes back
        return "booked"

    def on_fenced(**kwargs: object) -> None:
        fenced.append(kwargs)

    signals.fenced_out.connect(on_fenced)
    try:
        # When the first attempt's commit reaches the server but its answer is lost
        with caplog.at_level("INFO", "celery_grousset"):
            first = protect(key, body, transactional=True)
    finally:
        signals.fenced_out.disconnect(on_fenced)
    # Then the call returns its value: the journal shows it committed (it raised
    # TransactionLost, "the delivery is sent again", to a protect() that has none)
    assert first == "booked"
    # And the attempt is not reported fenced out (nothing took its claim over): the
    # log says the connection was lost and that the journal kept the commit
    lines = [r.getMessage() for r in caplog.records]
    assert fenced == []
    assert not [line for line in lines if "grousset.fenced_out" in line]
    lost = [line for line in lines if "grousset.transaction_lost" in line]
    assert len(lost) == 1 and "committed=True" in lost[0], lines
    # And the next call answers from the commit's memo without running the body again
    assert protect(key, body, transactional=True) == "booked"
    assert len(runs) == 1
    rec = Outcome.objects.using(alias).get(task_name="protect", args_repr=f"key={key!r}")
    assert rec.status == "completed" and rec.takeovers == 0


def _isolation(level: str) -> object:
    """The driver's constant for ``level`` (Django's OPTIONS["isolation_level"])."""
    from celery_grousset.store.pgdriver import is_psycopg3

    if is_psycopg3():
        import psycopg

        return psycopg.IsolationLevel[level]
    import psycopg2.extensions

    return getattr(psycopg2.extensions, f"ISOLATION_LEVEL_{level}")


def meeting_a_duplicate(alias: str, key: str) -> tuple[Callable[[], str], list[int]]:
    """A transactional body that books ``key`` (after reading it: a snapshot opens at a
    transaction's first plain read) and, on its first attempt, meets another delivery of
    the call claiming while it runs; the list of its attempts."""
    import threading

    from celery_grousset.exceptions import ClaimInFlight
    from tests.ledger.models import Effect

    def duplicate() -> None:
        with pytest.raises(ClaimInFlight):
            protect(key, lambda: "never", on_in_flight="raise")

    attempts: list[int] = []

    def body() -> str:
        attempts.append(1)
        booked = Effect.objects.using(alias).filter(key=key).count()
        Effect.objects.using(alias).create(key=key, value=f"booked-{booked}", pid=0)
        if len(attempts) == 1:
            thread = threading.Thread(target=duplicate)
            thread.start()
            thread.join(30)
        return "booked"

    return body, attempts


@pytest.mark.parametrize("level", ["SERIALIZABLE", "REPEATABLE_READ"])
def test_a_transaction_the_database_rolls_back_is_run_again_never_memoized(level: str) -> None:
    """A duplicate's claim counts its delivery on the row the attempt holds; under
    REPEATABLE READ or SERIALIZABLE the attempt's completion then fails with a
    serialization failure, which rolled the effect back: it was memoized as the task's
    failure (on_failure="memoize"), and the effect never ran."""
    from tests.ledger.models import Effect

    services.require_database("postgresql")
    base = connections.settings["postgresql"]
    alias, key = f"pg_{level.lower()}", f"conflict-{uuid.uuid4().hex[:8]}"
    options = {**base.get("OPTIONS", {}), "isolation_level": _isolation(level)}
    with database(alias, **{**base, "OPTIONS": options}), override_settings(
        GROUSSET={"DATABASE": alias, "MAX_PROCESSING_TIME": 30}
    ):
        reset_stores()
        body, _ = meeting_a_duplicate(alias, key)
        # When the first attempt's transaction meets the duplicate's claim
        with pytest.raises(TransactionLost, match="rolled the transaction back"):
            protect(key, body, transactional=True, on_failure="memoize")
        # Then its effect was rolled back and the claim released, not memoized: the
        # next delivery runs the effect, once, and completes
        assert Effect.objects.using("postgresql").filter(key=key).count() == 0
        assert protect(key, body, transactional=True, on_failure="memoize") == "booked"
        assert Effect.objects.using("postgresql").filter(key=key).count() == 1
        record = Outcome.objects.using(alias).get(fingerprint__isnull=False, task_name="protect",
                                                  args_repr__contains=key)  # fmt: skip
        assert record.status == "completed"
    reset_stores()


def test_a_mariadb_snapshot_conflict_is_run_again_never_memoized() -> None:
    """MariaDB as 11.8 ships it (REPEATABLE READ with ``innodb_snapshot_isolation``, a
    session setting since 10.6.18): a duplicate's claim counts its delivery on the row
    after the attempt's snapshot was taken, so the completion's locking read of that row
    fails with the server's own "record has changed since last read" (1020), which
    rolled the effect back. Run again, never memoized as the task's failure."""
    from tests.ledger.models import Effect

    services.require_database("mysql")
    base = connections.settings["mysql"]
    with connections["mysql"].cursor() as cur:
        cur.execute("SHOW VARIABLES LIKE 'innodb_snapshot_isolation'")
        if cur.fetchone() is None:
            pytest.skip("this MariaDB has no innodb_snapshot_isolation (10.6.18+, 11.x)")
    options = {**base.get("OPTIONS", {}), "isolation_level": "repeatable read",
               "init_command": "SET SESSION innodb_snapshot_isolation = ON"}  # fmt: skip
    alias, key = "mysql_snapshot", f"snapshot-{uuid.uuid4().hex[:8]}"
    with database(alias, **{**base, "OPTIONS": options}), override_settings(
        GROUSSET={"DATABASE": alias, "MAX_PROCESSING_TIME": 30}
    ):
        reset_stores()
        body, attempts = meeting_a_duplicate(alias, key)
        # When the first attempt's completion meets the row the duplicate changed
        with pytest.raises(TransactionLost, match="rolled the transaction back"):
            protect(key, body, transactional=True, on_failure="memoize")
        # Then its effect was rolled back and the claim released, not memoized: the
        # next delivery runs the effect, once, and completes
        assert Effect.objects.using(alias).filter(key=key).count() == 0
        assert protect(key, body, transactional=True, on_failure="memoize") == "booked"
        booked = Effect.objects.using(alias).filter(key=key).values_list("value", flat=True)
        assert list(booked) == ["booked-0"]
        record = Outcome.objects.using(alias).get(task_name="protect", args_repr__contains=key)
        assert record.status == "completed" and len(attempts) == 2
    reset_stores()


@pytest.mark.parametrize("errno", [1213, 1020])
def test_a_mariadb_conflict_inside_the_transaction_is_run_again_never_memoized(
    errno: int,
) -> None:
    """MariaDB ends a transactional attempt for a conflict with another transaction: a
    deadlock (1213) or "record has changed since last read" (1020, REPEATABLE READ with
    innodb_snapshot_isolation, MariaDB 11.6's default). 1020 was the task's failure:
    memoized, the effect never ran."""
    from tests.ledger.models import Effect

    services.require_database("mysql")
    alias, key = "mysql", f"conflict-{errno}-{uuid.uuid4().hex[:8]}"
    attempts: list[int] = []

    def body() -> str:
        attempts.append(1)
        Effect.objects.using(alias).create(key=key, value="booked", pid=0)
        if len(attempts) == 1:  # the database's own error, as the server raises it
            with connections[alias].cursor() as cursor:
                cursor.execute(f"BEGIN NOT ATOMIC SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO "
                               f"= {errno}, MESSAGE_TEXT = 'conflict'; END")  # fmt: skip
        return "booked"

    with override_settings(GROUSSET={"DATABASE": alias, "MAX_PROCESSING_TIME": 30}):
        reset_stores()
        # When the first attempt's transaction ends with the conflict
        with pytest.raises(TransactionLost, match="rolled the transaction back"):
            protect(key, body, transactional=True, on_failure="memoize")
        # Then its effect was rolled back and the claim released, not memoized: the
        # next delivery runs the effect, once
        assert Effect.objects.using(alias).filter(key=key).count() == 0
        assert protect(key, body, transactional=True, on_failure="memoize") == "booked"
        assert Effect.objects.using(alias).filter(key=key).count() == 1
    reset_stores()


@pytest.mark.parametrize("alias", ["postgresql", "mysql"])
def test_a_completion_the_journal_does_not_take_is_an_outage_not_the_tasks_failure(
    alias: str,
) -> None:
    """The transactional completion's own statement fails while the journal's row is
    locked by another session past the server's lock wait timeout: it was the task's
    failure (the row released with that error, the message consumed), the call lost."""
    import threading

    from tests.ledger.models import Effect

    services.require_database("postgresql" if alias == "postgresql" else "mysql")
    key, attempts, locked = f"locked-{uuid.uuid4().hex[:8]}", [], threading.Event()

    def locker(pk: int) -> None:  # another session holds the row past the lock timeout
        with transaction.atomic(using=alias):
            list(Outcome.objects.using(alias).select_for_update().filter(pk=pk))
            locked.set()
            deadline = time.monotonic() + 10
            while not lock_waiters(alias) and time.monotonic() < deadline:
                time.sleep(0.02)  # the completion waits (seen: PostgreSQL at once,
            # MariaDB 0.2 s in), then past its timeout (1 s), not the release's after it
            time.sleep(1.5 if alias == "postgresql" else 1.3)
        connections[alias].close()

    def body() -> str:
        attempts.append(1)
        Effect.objects.using(alias).create(key=key, value="booked", pid=0)
        if len(attempts) == 1:
            if alias == "mysql":  # the server's lock wait timeout (PostgreSQL: STORE_TIMEOUT)
                with connections[alias].cursor() as cursor:
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
            pk = Outcome.objects.using(alias).get(args_repr__contains=key).pk
            threading.Thread(target=locker, args=(pk,), daemon=True).start()
            assert locked.wait(10)
        return "booked"

    grousset = {"DATABASE": alias, "MAX_PROCESSING_TIME": 30, "STORE_TIMEOUT": 1}
    with override_settings(GROUSSET=grousset):
        reset_stores()
        try:
            # When the first attempt's completion times out on the lock
            with pytest.raises(TransactionLost, match="did not take the transaction's"):
                protect(key, body, transactional=True, on_failure="memoize")
        finally:
            if alias == "mysql":
                with connections[alias].cursor() as cursor:
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
        # Then its effect was rolled back with it and the claim released, never the
        # task's failure: the next delivery runs the effect, once, and completes
        assert Effect.objects.using(alias).filter(key=key).count() == 0
        assert protect(key, body, transactional=True, on_failure="memoize") == "booked"
        assert Effect.objects.using(alias).filter(key=key).count() == 1
        record = Outcome.objects.using(alias).get(args_repr__contains=key)
        assert record.status == "completed" and len(attempts) == 2
    reset_stores()


def test_a_transaction_the_body_aborted_is_the_tasks_failure_not_an_outage() -> None:
    """A body that catches a database error without a savepoint leaves PostgreSQL's
    transaction aborted: the completion statement surfaces it, but it is the body's
    failure — sent again as an outage, it would be sent again forever."""
    from django.db import DatabaseError

    from tests.ledger.models import Effect

    services.require_database("postgresql")
    alias, key = "postgresql", f"aborted-{uuid.uuid4().hex[:8]}"

    def body() -> str:
        Effect.objects.using(alias).create(key=key, value="booked", pid=0)
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT 1 / 0")  # caught without a savepoint: a bug
        except DatabaseError:
            pass
        return "booked"

    with override_settings(GROUSSET={"DATABASE": alias, "MAX_PROCESSING_TIME": 30}):
        reset_stores()
        # When the attempt's completion meets the aborted transaction
        with pytest.raises(DatabaseError) as failed:
            protect(key, body, transactional=True)
        # Then it is the task's failure (its own error), not TransactionLost
        assert not isinstance(failed.value, TransactionLost), failed.value
        assert Effect.objects.using(alias).filter(key=key).count() == 0
        record = Outcome.objects.using(alias).get(args_repr__contains=key)
        assert record.status == "failed" and "aborted" in record.error, record.error
    reset_stores()


def test_a_transaction_dropped_every_time_fails_after_max_dropped_not_forever() -> None:
    """A transactional body idle longer than the server's wait_timeout loses its
    connection on every attempt: each was an outage (TransactionLost, requeued), so the
    delivery was sent again forever, the body's non-database work repeated each time."""
    from celery_grousset.carry import MAX_DROPPED
    from tests.ledger.models import Effect
    from tests.tasks import idle_past_timeout
    from tests.workers import workers

    services.require_database("mysql")
    broker = services.require_redis()
    queue, key = f"q-{uuid.uuid4().hex[:10]}", f"idle-{uuid.uuid4().hex[:8]}"
    with workers(queue, 1, database="mysql", broker=broker, concurrency=1):
        # When every attempt's connection is dropped by the server before it commits
        result = idle_past_timeout.apply_async((key,), queue=queue)
        # Then the delivery fails after MAX_DROPPED attempts, saying why and the fix
        with pytest.raises(TransactionLost, match=rf"{MAX_DROPPED} times in a row") as lost:
            result.get(timeout=120)
    assert "wait_timeout" in str(lost.value) and "out of the transaction" in str(lost.value)
    attempts = Effect.objects.using("default").filter(key=key, value="attempt").count()
    assert attempts == MAX_DROPPED
    # And nothing of it committed; the claim is released, not memoized
    assert Effect.objects.using("mysql").filter(key=key).count() == 0
    rec = Outcome.objects.using("mysql").get(task_name=idle_past_timeout.name,
                                            args_repr__contains=key)  # fmt: skip
    assert rec.status == "failed" and rec.result is None


def test_the_dropped_count_follows_the_delivery_and_ends_in_a_dropped_failure() -> None:
    from types import SimpleNamespace

    from celery_grousset import carry
    from celery_grousset.claim import ClaimRequest

    req = ClaimRequest(processor_id="p", fingerprint="f" * 64, task_name="t", task_id="i",
                       token="tok", worker="w", args_repr="", max_processing_time=30,
                       expires_after=60, max_takeovers=3)  # fmt: skip
    drop = TransactionLost("lost", dropped=True)
    # A first loss counts 1; a loss that was no drop (a conflict, an outage) counts 0
    assert carry.dropped(SimpleNamespace(carried=None), req, drop) == 1
    assert carry.dropped(SimpleNamespace(carried=None), req, TransactionLost("c")) == 0
    # The count travels in the carried claim, for this key only
    carried = carry.lost_claim(req, 3)
    assert carry.dropped(SimpleNamespace(carried=carried), req, drop) == 4
    other = {**carried, "fingerprint": "0" * 64}
    assert carry.dropped(SimpleNamespace(carried=other), req, drop) == 1
    # At MAX_DROPPED the delivery fails: a TransactionLost that says it was dropped
    with pytest.raises(TransactionLost) as failed:
        carry.dropped(SimpleNamespace(carried=carry.lost_claim(req, carry.MAX_DROPPED - 1)),
                      req, drop)  # fmt: skip
    assert failed.value.dropped is True and failed.value.__cause__ is drop
