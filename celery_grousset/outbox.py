"""The transactional outbox: publish a task only if the caller's transaction commits.

:func:`enqueue` writes an :class:`~celery_grousset.models.OutboxMessage` row in the
caller's current transaction: a rollback leaves nothing to publish, a crash right
after the commit loses nothing. A :class:`Relay` (``manage.py grousset_relay`` or the
worker flag ``--grousset-relay``) publishes pending rows in the order they fell due, in
batches locked with ``SELECT … FOR UPDATE SKIP LOCKED`` (PostgreSQL, MySQL 8,
MariaDB 10.6+; on SQLite, which has one writer, the batch takes the write lock
first), marks them sent, and retries failures with exponential backoff until
``max_attempts``, when the row goes ``dead`` with its last error.

Several relays may run at once: a locked row is skipped. A relay killed between the
publish and the commit of "sent" leaves its rows pending; another relay publishes them
again, and the consumer's claim absorbs the copy: the same call, with the identity
``delay()`` gives it (its arguments, ``grousset_key`` or ``idempotency_key``). So is a
second row for the same call (a form submitted twice): it runs once.

Unlike the journal, the outbox holds the task's arguments (JSON) until the row is
sent, as a broker would; "sent" drops them, the message headers and the key.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction
from django.db import Error as DjangoDbError
from django.db.models import F

from celery_grousset import events
from celery_grousset.binding import WRAP_ATOMIC, WRITES, off_the_loop
from celery_grousset.exceptions import InvalidArgument
from celery_grousset.memo import error_summary
from celery_grousset.models import OutboxMessage, OutboxStatus
from celery_grousset.outbox_failures import (
    broker_down,
    check_seconds,
    confirmed_connection,
    permanent,
    refused,
)
from celery_grousset.publish_check import deliberate, open_transactions
from celery_grousset.published import SIGNATURE_OPTIONS as _SIGNATURES
from celery_grousset.published import arguments, check_enqueued, stored, stored_options
from celery_grousset.store import refusals

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


DEFAULT_BATCH_SIZE = 100
DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_BACKOFF = 2.0
DEFAULT_BACKOFF_MAX = 600.0
DEFAULT_INTERVAL = 1.0
#: the options a sent row drops with its arguments (each may carry a token or arguments)
_SECRET_OPTIONS = frozenset(("headers", "idempotency_key", *_SIGNATURES))
#: seconds a publish waits for the broker's confirm before it counts as failed
DEFAULT_CONFIRM_TIMEOUT = 10.0
#: the share of STORE_TIMEOUT a batch may hold its transaction before it begins no more
#: publishes: SQLite's one write lock (every claim waits), and elsewhere its row locks
#: and a session idle limit (idle_in_transaction_session_timeout) that ends it
BATCH_HOLD = 0.5


def _alias(using: str | None) -> str:
    from celery_grousset.conf import grousset_settings

    return using or str(grousset_settings.DATABASE)


def clock(alias: str, plus: float = 0.0) -> Any:
    """The database clock (+ ``plus`` seconds) as a value for a query or an insert."""
    from celery_grousset.store import get_store

    return get_store(alias).now_expression(plus)


def _refuse_outside_transaction(alias: str) -> None:
    """A row written without ``using=`` while a transaction is open on another database
    would not commit with it (at once, or with the one open on its own database, which
    commits apart): refused. (A TestCase's blocks are not counted.)"""
    open_on = open_transactions()
    if not (others := [a for a in open_on if a != alias]):
        return
    where = (f"with the transaction open there, apart from the one on {others[0]!r}"
             if alias in open_on else "at once whatever that transaction does")  # fmt: skip
    raise InvalidArgument(
        f"outbox.enqueue: a transaction is open on database {others[0]!r}, but this "
        f"row would be written to {alias!r} (GROUSSET['DATABASE']), where it commits "
        f"{where}. Pass using={others[0]!r} (the outbox's table must exist there: manage.py "
        f"migrate celery_grousset --database {others[0]}; a relay: grousset_relay --database "
        f"{others[0]}), or using={alias!r} if the rows it goes with are written there."
    )


def enqueue(
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    using: str | None = None,
    **options: Any,
) -> OutboxMessage:
    """Write a message for ``task`` (a task or its name) in the current transaction.

    ``options`` are ``apply_async``'s (``queue``, ``countdown``, ``eta``, ``priority``,
    ``idempotency_key``…); ``args``/``kwargs`` as Celery's json serializer takes them. ``using``:
    the database of the caller's transaction (default ``GROUSSET["DATABASE"]``; without
    it, a transaction open on another database is refused: ``InvalidArgument``). The
    arguments are checked against a task's signature now, as ``delay()`` checks them
    (a ``TypeError``). The row's ``task_id`` is the Celery task id the message will carry;
    its ``created_at``/``available_at`` come from the database clock (``None`` here)."""
    off_the_loop("outbox.enqueue()", WRAP_ATOMIC, WRITES)
    alias = _alias(using)
    if using is None:
        _refuse_outside_transaction(alias)
    name = task if isinstance(task, str) else task.name
    check_enqueued(task, args, kwargs, options)  # as delay() checks the call, before the row
    task_id = str(options.pop("task_id", None) or uuid.uuid4())
    row = OutboxMessage(
        task_name=name,
        task_id=task_id,
        args=stored(name, "args", list(args or ())),
        kwargs=stored(name, "kwargs", dict(kwargs or {})),
        options=stored_options(options),
        created_at=clock(alias),
        available_at=clock(alias),
    )
    try:
        row.save(using=alias, force_insert=True)
    except DatabaseError as exc:
        if not refusals.table_missing(exc):
            raise
        fix = refusals.missing_table_fix(alias)  # (the same type: callers catch DatabaseError)
        raise type(exc)(f"the outbox's table is missing in database {alias!r}: {fix}") from exc
    if not isinstance(row.created_at, datetime):
        row.created_at = row.available_at = None
    return row


def publish(app: Any, row: OutboxMessage, **publishing: Any) -> Any:
    """Publish one outbox row, with its ``task_id``: the call's identity is the one
    ``delay()`` gives it (the arguments, or the ``idempotency_key`` enqueued with it).
    ``publishing``: ``apply_async``'s (the relay's ``producer`` and ``timeout``; the row's
    own options win)."""
    from celery_grousset.delivery import KEY_HEADER
    from celery_grousset.published import REPR_HEADER
    from celery_grousset.task import GroussetTaskMixin

    options = dict(row.options or {})
    for name in ("eta", "expires"):
        if isinstance(options.get(name), str):
            options[name] = datetime.fromisoformat(options[name])
    key = options.pop("idempotency_key", None)
    if key is None and not isinstance(row.args, str):  # a 0.1.0 row: 0.1.0's relay keyed
        key = f"outbox:{row.id}"  # it so (one it published and did not mark sent ran once)
    task, (args, kwargs) = app.tasks.get(row.task_name), arguments(row)
    if isinstance(task, GroussetTaskMixin):
        with deliberate():  # inside the relay's batch transaction, on purpose
            return task.apply_async(args, kwargs, task_id=row.task_id, idempotency_key=key,
                                    **{**publishing, **options})  # fmt: skip
    headers = {**(options.pop("headers", None) or {}), REPR_HEADER: 1}
    if key is not None:
        headers[KEY_HEADER] = key
    options = {"argsrepr": f"(outbox:{row.id})", "kwargsrepr": "{}", **options}
    return app.send_task(row.task_name, args, kwargs, task_id=row.task_id, headers=headers,
                         **{**publishing, **options})  # fmt: skip


@dataclass
class RelayStats:
    fetched: int = 0
    sent: int = 0
    failed: int = 0
    dead: int = 0
    batches: int = 0
    broker_down: bool = False
    more: bool = False  # rows left due: the lock let go 0.25-1 s for the claims waiting

    def add(self, other: RelayStats) -> None:
        for name in ("fetched", "sent", "failed", "dead", "batches"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.broker_down = self.broker_down or other.broker_down


class Relay:
    """Publishes due outbox rows of one database, one locked batch at a time."""

    def __init__(
        self,
        app: Any,
        *,
        using: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: float = DEFAULT_BACKOFF,
        backoff_max: float = DEFAULT_BACKOFF_MAX,
        interval: float = DEFAULT_INTERVAL,
        confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("max_attempts", max_attempts)):
            if value < 1:
                raise InvalidArgument(f"{name} (--{name.replace('_', '-')}) must be at least "
                                      f"1, got {value}")  # fmt: skip
        check_seconds(backoff=backoff, backoff_max=backoff_max, interval=interval,
                       confirm_timeout=confirm_timeout)  # fmt: skip
        if backoff_max < backoff:
            raise InvalidArgument(f"backoff_max ({backoff_max:g} s) must be at least backoff "
                                  f"({backoff:g} s)")  # fmt: skip
        self.app = app
        self.alias = _alias(using)
        self.batch_size = batch_size
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.interval = interval
        self.confirm_timeout = confirm_timeout
        self._conn: Any = None
        if fault is None:
            from celery_grousset.faults import fault as guard_fault

            fault = guard_fault
        self.fault: Callable[[str], None] = fault

    def delay(self, attempts: int) -> float:
        """Seconds before the next try after ``attempts`` failed publishes: the backoff
        doubled per attempt up to ``backoff_max``, times a random factor in [0.5, 1.0] (as
        Celery jitters its retry backoff), so rows that failed together — a broker
        outage — are not all retried at the same moment."""
        doublings = min(max(attempts - 1, 0), 64)  # (2.0 ** 1024 overflows: capped first)
        wait = min(self.backoff * 2.0**doublings, self.backoff_max)
        return float(wait * random.uniform(0.5, 1.0))

    def run_batch(self) -> RelayStats:
        """Lock up to ``batch_size`` due rows, publish them, mark them; one transaction."""
        from celery_grousset.store import get_store

        alias, stats, store = self.alias, RelayStats(batches=1), get_store(self.alias)
        manager, sent = OutboxMessage.objects.using(alias), list[int]()
        try:
            with transaction.atomic(using=alias):
                due = manager.filter(status=OutboxStatus.PENDING, available_at__lte=clock(alias))
                due = store.lock_for_batch(due)
                # the due index's own order: InnoDB then locks only the rows it returns
                # (by id it would sort, locking every due row, and starve the other relays)
                rows = list(due.order_by("available_at", "id")[: self.batch_size])
                stats.fetched = len(rows)
                if rows:
                    self._publish(rows, stats, BATCH_HOLD * store.timeout, sent)
                if sent:
                    manager.filter(pk__in=sent).update(status=OutboxStatus.SENT, args=[],
                        kwargs={}, sent_at=clock(alias), attempts=F("attempts") + 1,
                        last_error="")  # fmt: skip
                    stats.sent = len(sent)
        except DjangoDbError as exc:  # (an InterfaceError too: not a DatabaseError)
            if sent:  # published, not marked: the next batch publishes them again
                events.emit(logging.ERROR, "grousset.outbox_unmarked", {"count": len(sent),
                            "database": alias, "error": events.error_text(exc)})  # fmt: skip
            raise
        if sent:
            events.emit(logging.INFO, "grousset.outbox_sent",
                        {"count": len(sent), "database": alias})  # fmt: skip
        return stats

    def _publish(self, rows: list[OutboxMessage], stats: RelayStats, hold: float,
                 sent: list[int]) -> None:  # fmt: skip
        """Publish ``rows`` in order, each confirmed (none begun after ``hold`` s); the ids
        sent are added to ``sent``."""
        manager, started = OutboxMessage.objects.using(self.alias), time.monotonic()
        if self._conn is None:  # kept across batches (its queues declared once)
            self._conn = confirmed_connection(self.app, self.confirm_timeout)
        producer = self.app.amqp.Producer(self._conn)  # (connects on its first publish)
        try:
            for i, row in enumerate(rows):  # (one at least: else --once would never end)
                if i and time.monotonic() - started > hold:
                    stats.more = True  # (the rest: due, in the next batch)
                    break
                try:
                    publish(self.app, row, producer=producer, timeout=self.confirm_timeout)
                except Exception as exc:
                    down = broker_down(self.app, exc) and not refused(self.app, exc)
                    self._failed(row, exc, stats, counted=not down)
                    if down:
                        stats.broker_down = True
                        break
                else:
                    sent.append(row.id)
                    self.fault("outbox_published")  # chaos hook: die mid-batch
                    if _SECRET_OPTIONS & set(row.options or {}):  # may be a token: dropped
                        options = {k: v for k, v in row.options.items()
                                   if k not in _SECRET_OPTIONS}  # fmt: skip
                        manager.filter(pk=row.id).update(options=options)
        finally:  # (a row gone dead for its own sake says nothing of the connection)
            if stats.broker_down or stats.failed:
                self.close(broken=True)

    def close(self, *, broken: bool = False) -> None:
        """Close the relay's broker connection (a broken one without the goodbye it
        would wait for); the next batch opens another."""
        conn, self._conn = self._conn, None
        with contextlib.suppress(Exception):
            if conn is not None:
                conn.collect() if broken else conn.release()

    def _failed(
        self, row: OutboxMessage, exc: BaseException, stats: RelayStats, counted: bool
    ) -> None:
        """A failed publish: retried with backoff, ``dead`` after ``max_attempts`` or
        when the call itself is wrong. A broker outage (``counted`` False) costs the row
        no attempt, however long it lasts: it is retried, never dead for it."""
        attempts = row.attempts + counted
        error = error_summary(exc)  # redacted (a DSN's password, a token), never raises
        rows = OutboxMessage.objects.using(self.alias).filter(pk=row.pk)
        if counted and (attempts >= self.max_attempts or permanent(self.app, exc)):
            rows.update(status=OutboxStatus.DEAD, attempts=attempts, last_error=error)
            stats.dead += 1
            events.emit(logging.ERROR, "grousset.outbox_dead", {
                "id": row.id, "task": row.task_name, "attempts": attempts, "error": error,
            })  # fmt: skip
            return
        wait = self.delay(max(attempts, 1))
        events.emit(logging.WARNING, "grousset.outbox_publish_failed", {  # (first: the row's
            "id": row.id, "task": row.task_name, "attempts": attempts,  # update may fail,
            "retry_in": round(wait, 1), "error": error,  # its session lost meanwhile)
        })  # fmt: skip
        rows.update(attempts=attempts, last_error=error, available_at=clock(self.alias, wait))
        stats.failed += 1

    def run(self, stop: threading.Event | None = None, *, once: bool = False) -> RelayStats:
        """Publish until ``stop`` is set (``once``: until nothing is due). A database or
        broker outage pauses the loop with backoff; it never ends it."""
        try:
            return self._loop(stop or threading.Event(), once)
        finally:
            self.close()

    def _loop(self, stop: threading.Event, once: bool) -> RelayStats:
        total, errors = RelayStats(), 0
        while not stop.is_set():
            try:
                stats = self.run_batch()
            except Exception as exc:  # any error pauses the loop, none ends it
                errors += 1
                database = isinstance(exc, DatabaseError)
                events.emit(logging.WARNING if database else logging.ERROR,
                            "grousset.outbox_database_error" if database else
                            "grousset.outbox_relay_error",
                            {"database": self.alias, "error": events.error_text(exc)},
                            exc_info=not database)  # fmt: skip
                connections[self.alias].close()
                if once:
                    raise
                stop.wait(self.delay(errors))
                continue
            errors = 0
            total.add(stats)
            if stats.fetched < self.batch_size or stats.more or stats.broker_down:
                if once and not stats.more:
                    break
                pause = self.delay(2) if stats.broker_down else self.interval
                stop.wait(min(max(pause, 0.25), 1.0) if stats.more else pause)
        return total
