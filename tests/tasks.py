"""Tasks the worker tests run. Each effect writes a row in the effect ledger (a
table with no unique constraint) on the journal's database, so duplicate effects
are counted, not guessed."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task

from celery_grousset import GroussetTask


def _db() -> str:
    # the raw setting, not grousset_settings: a bypassed worker whose GROUSSET fails
    # validation still records its effects
    from django.conf import settings

    return str(getattr(settings, "GROUSSET", {}).get("DATABASE", "default"))


def record(key: str, value: str = "") -> None:
    from tests.ledger.models import Effect

    Effect.objects.using(_db()).create(key=key, value=value, pid=os.getpid())


def _pause(seconds: float) -> None:
    if seconds:
        from celery_grousset.faults import fault

        fault("mid_effect")
        time.sleep(seconds)


@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def effect(self: Any, key: str, sleep: float = 0.0) -> dict[str, Any]:
    record(key)
    _pause(sleep)
    return {"key": key, "pid": os.getpid(), "fence": self.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def graceful(self: Any, key: str, sleep: float = 20.0) -> dict[str, Any]:
    """``effect`` that ends gracefully on a soft time limit (SIGUSR1: a revoke with
    terminate=True, signal="SIGUSR1", too), after a short clean-up: its effect stands."""
    from celery.exceptions import SoftTimeLimitExceeded

    record(key, "graceful")
    try:
        time.sleep(sleep)
    except SoftTimeLimitExceeded:
        record(f"{key}:signalled")  # (not the effect: the test waits for the signal)
        time.sleep(2.0)  # the clean-up, still holding the claim
        return {"key": key, "partial": True, "fence": self.grousset.fence}
    return {"key": key, "partial": False, "fence": self.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def stubborn(self: Any, key: str, seconds: float = 3.0) -> dict[str, Any]:
    """A body that catches the SystemExit a revoke's SIGTERM raises in it and goes on
    (a bare ``except:`` around its work) for ``seconds`` more, then makes its effect.
    It waits for the signal (at most 20 s), however late a loaded worker delivers it."""
    record(f"{key}:started")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except BaseException:  # the point: it swallows the revoke's exit
            record(f"{key}:signalled")
            deadline = min(deadline, time.monotonic() + seconds)
    record(key, "stubborn")
    return {"key": key, "fence": self.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def fails_first(self: Any, key: str) -> dict[str, Any]:
    """``effect`` whose first attempt fails (its claim released: the key's row stays)."""
    from tests.ledger.models import Effect

    if not Effect.objects.using(_db()).filter(key=f"{key}:failed").exists():
        record(f"{key}:failed")
        raise RuntimeError("the first attempt fails")
    record(key)
    return {"key": key, "fence": self.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def fails_slowly(self: Any, key: str, sleep: float = 1.0) -> None:
    """A body that fails after ``sleep`` seconds with its own error."""
    record(f"{key}:started")
    time.sleep(sleep)
    raise RuntimeError(f"the body's own error ({key})")


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, rate_limit="20/s")
def limited(self: Any, key: str) -> dict[str, Any]:
    """``effect`` under a rate limit: its requests reach the pool through Celery's
    token buckets and timer."""
    record(key, "limited")
    return {"key": key, "pid": os.getpid(), "fence": self.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, on_in_flight="wait")
def effect_wait(self: Any, key: str, sleep: float = 0.0) -> dict[str, Any]:
    """``effect`` whose deliveries wait for a key in flight elsewhere instead of retrying."""
    record(key, "wait")
    _pause(sleep)
    return {"key": key, "pid": os.getpid(), "fence": self.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=3)
def short_claim(self: Any, key: str, sleep: float = 0.0) -> dict[str, Any]:
    """max_processing_time 3 s: takeover tests."""
    record(key)
    _pause(sleep)
    return {"key": key, "pid": os.getpid(), "fence": self.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=3, transactional=True)
def booking(self: Any, key: str, sleep: float = 0.0) -> dict[str, Any]:
    """Transactional: the ledger row commits with the completion, fenced."""
    record(key, "booking")
    _pause(sleep)
    return {"key": key, "pid": os.getpid(), "fence": self.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, max_retries=3)
def flaky_retry(self: Any, key: str, fail_times: int = 1) -> str:
    """Fails ``fail_times`` times via self.retry(), then succeeds."""
    from tests.ledger.models import Effect

    attempts = Effect.objects.using(_db()).filter(key=key, value="attempt").count()
    record(key, "attempt")
    if attempts < fail_times:
        raise self.retry(countdown=0.1)
    record(key, "done")
    return f"done after {attempts + 1}"


@shared_task(
    base=GroussetTask,
    bind=True,
    max_processing_time=30,
    autoretry_for=(ValueError,),
    retry_kwargs={"max_retries": 3, "countdown": 0.1},
)
def flaky_auto(self: Any, key: str, fail_times: int = 1) -> str:
    from tests.ledger.models import Effect

    attempts = Effect.objects.using(_db()).filter(key=key, value="attempt").count()
    record(key, "attempt")
    if attempts < fail_times:
        raise ValueError("transient")
    record(key, "done")
    return f"done after {attempts + 1}"


@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def login(self: Any, user: str, password: str) -> str:
    record(user, "login")
    return f"logged in {user}"


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, grousset_key=("order_id",))
def charge(self: Any, order_id: int, amount: str, note: str = "") -> str:
    record(f"charge-{order_id}")
    return f"charged {order_id} with key {self.grousset.fingerprint[:8]}"


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, grousset_key=("order_id",),
             max_retries=3)  # fmt: skip
def capture(self: Any, order_id: str, amount: str, gateway: str = "primary") -> str:
    """Retried once, on a backup gateway: ``self.retry(kwargs=…)`` changes its arguments."""
    if gateway == "primary":
        raise self.retry(kwargs={"order_id": order_id, "amount": amount, "gateway": "backup"},
                         countdown=0.1)  # fmt: skip
    record(f"capture-{order_id}", gateway)
    return f"captured {order_id} via {gateway}"


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, max_retries=3)
def capture_unkeyed(self: Any, order_id: str, amount: str, gateway: str = "primary") -> str:
    """Unkeyed; the primary gateway is down for the call's first attempt alone, which
    retries on the backup: ``self.retry(args=…)`` changes its arguments (``kwargs=``
    alone would repeat the request's positional ones on Celery 5.3)."""
    from tests.ledger.models import Effect

    down = Effect.objects.using(_db()).filter(key=f"capture-{order_id}", value="down")
    if gateway == "primary" and not down.exists():
        record(f"capture-{order_id}", "down")
        raise self.retry(args=(order_id, amount, "backup"), countdown=0.1)
    record(f"capture-{order_id}", gateway)
    return f"captured {order_id} via {gateway}"


@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def notify_fallback(self: Any, order_id: str, channel: str = "sms") -> str:
    """Retries on email with ``throw=False`` and goes on: this attempt completes, and
    its retry, with other arguments, is a call of its own."""
    if channel == "sms":
        self.retry(args=(order_id, "email"), countdown=0.1, throw=False)
        return "sms down"
    record(f"notify-{order_id}", channel)
    return f"sent via {channel}"


@shared_task(base=GroussetTask, bind=True, max_processing_time=30)
def periodic_effect(self: Any, key: str, sleep: float = 0.0) -> dict[str, Any]:
    """Run by celery beat (tests/beatapp.py): the ledger row records the run's slot."""
    from celery_grousset.periodic import SLOT_HEADER

    slot = getattr(self.request, SLOT_HEADER, None) or (self.request.headers or {}).get(
        SLOT_HEADER
    )
    record(key, str(slot))
    _pause(sleep)
    return {"key": key, "slot": slot}


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, database="mysql")
def effect_on_mysql(self: Any, key: str) -> dict[str, Any]:
    """``effect`` with its journal on the ``mysql`` alias, whatever the worker's
    ``GROUSSET["DATABASE"]``: one worker, two journal databases."""
    record(key, "mysql-journal")
    return {"key": key, "pid": os.getpid(), "fence": self.grousset.fence}


class _RequeueRefused(GroussetTask):
    """A task whose requeues the broker cannot take: each republish names a serializer
    the worker does not have (a persistent publish failure)."""

    def signature_from_request(self, *args: Any, **kwargs: Any) -> Any:
        return super().signature_from_request(*args, **kwargs).set(
            serializer="grousset-test-not-installed"
        )


@shared_task(base=_RequeueRefused, bind=True, max_processing_time=30)
def unrequeuable(self: Any, key: str, sleep: float = 0.0) -> dict[str, Any]:
    """``effect`` whose in-flight duplicates cannot be requeued."""
    record(key, "unrequeuable")
    _pause(sleep)
    return {"key": key, "pid": os.getpid(), "fence": self.grousset.fence}


#: a transaction the database rolls back for a conflict, raised by the database itself
_CONFLICT_SQL = {
    "postgresql": "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'serialization_failure'; END $$",
    "mysql": "BEGIN NOT ATOMIC SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213; END",
}


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, transactional=True)
def conflicted(self: Any, key: str) -> dict[str, Any]:
    """Transactional: its first delivery's transaction is rolled back by the database for a
    conflict (a serialization failure, a deadlock), after its ledger row was written; the
    requeued delivery (``grousset_requeues``) commits."""
    from django.db import connections

    record(key, "conflicted")
    if not (self.request.headers or {}).get("grousset_requeues") and not getattr(
        self.request, "grousset_requeues", None
    ):
        conn = connections[_db()]
        with conn.cursor() as cursor:
            cursor.execute(_CONFLICT_SQL[conn.vendor])
    return {"key": key, "pid": os.getpid(), "fence": self.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, transactional=True)
def idle_past_timeout(self: Any, order: str) -> str:
    """Transactional, on MariaDB: its transaction sits idle longer than the session's
    wait_timeout (1 s), so the server drops the connection under every attempt. Each
    attempt is counted on the SQLite ledger, outside the transaction."""
    from django.db import connections

    from tests.ledger.models import Effect

    Effect.objects.using("default").create(key=order, value="attempt", pid=os.getpid())
    with connections[_db()].cursor() as cursor:
        cursor.execute("SET SESSION wait_timeout = 1")
    time.sleep(2.5)
    record(order, "committed")  # on the dropped connection: never commits
    return order


@shared_task
def handed_requests() -> list[int]:
    """Unguarded: the requests each main-process claimer of this process keeps as handed
    to the pool (run it in a threads-pool worker: the main process)."""
    from celery_grousset import batch_claim

    return [len(c.handed) for c in list(batch_claim._CLAIMERS)]


@shared_task(base=GroussetTask, max_processing_time=30, memoize=False)
def unmemoized(key: str) -> str:
    """``effect`` whose value is not memoized: a duplicate has none to answer with."""
    record(key)
    return f"value-{key}"


@shared_task
def gathered(values: list[Any], key: str) -> list[Any]:
    """A chord's body (unguarded): records that it ran, and with what."""
    record(f"{key}:body", repr(values))
    return values


@shared_task(base=GroussetTask, max_processing_time=60, soft_time_limit=20, time_limit=30)
def soft_limited(key: str) -> str:
    """``effect`` with a soft time limit (which a gevent worker says it does not enforce)."""
    record(key)
    return key


@shared_task(base=GroussetTask, max_processing_time=60, time_limit=12)
def hard_limited(key: str) -> str:
    """``effect`` with a hard time limit (which a gevent worker enforces, on the greenlet:
    a task killed before its claim is made fails, its message acknowledged)."""
    record(key)
    return key
