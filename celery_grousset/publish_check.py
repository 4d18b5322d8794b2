"""A guarded task published inside an open ``transaction.atomic()``: a warning.

The broker gets the message at once, before the caller's transaction commits; a worker
may run the task before that commit, without the transaction's writes (and after a
rollback, for a transaction that never commits). The journal then records the outcome
of a call the caller meant to make only once its writes were visible, often ``failed``.
``delay_on_commit()`` / ``apply_async_on_commit()`` (``GroussetTask`` is Celery's
``DjangoTask``) or the transactional outbox publish after the commit instead.

Not warned about: eager mode (the task runs here, inside the transaction), Celery's own
re-publishing of a running delivery (``retry()``, the guard's requeue: they pass
``retries``), the transactional outbox's relay (it publishes rows committed long before,
inside its batch transaction, within :func:`deliberate`), and the atomic blocks
Django's ``TestCase`` wraps each test in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery_grousset.events import emit

EVENT = "grousset.published_in_transaction"
#: set while a publisher that publishes inside a transaction on purpose runs (the relay)
_DELIBERATE: ContextVar[bool] = ContextVar("grousset_deliberate_publish", default=False)


@contextmanager
def deliberate() -> Iterator[None]:
    """Publishes inside this block are deliberate (the outbox relay publishes rows that
    were committed long before, inside its batch transaction): no warning."""
    token = _DELIBERATE.set(True)
    try:
        yield
    finally:
        _DELIBERATE.reset(token)


def open_transaction() -> str | None:
    """The alias of a database with an open ``transaction.atomic()`` in this thread (one
    a ``TestCase`` opened does not count), or None."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if any(not getattr(block, "_from_testcase", False) for block in conn.atomic_blocks):
            return str(conn.alias)
    return None


def in_transaction(task: Any, options: dict[str, Any]) -> None:
    """Warn when ``task`` is published (``options`` of ``apply_async``) inside an open
    transaction; see the module's docstring."""
    alias = open_transaction()
    if alias is None or "retries" in options or _DELIBERATE.get():
        return
    if task.app.conf.task_always_eager:
        return
    fix = (
        f"{task.name}.delay_on_commit(...) (or apply_async_on_commit, transaction.on_commit)"
        if hasattr(task, "delay_on_commit")  # Celery 5.4+: GroussetTask is a DjangoTask
        else f"transaction.on_commit(lambda: {task.name}.delay(...))"
    )
    emit(logging.WARNING, EVENT, {"task": task.name, "database": alias}, note=(
        "published inside an open transaction.atomic(): a worker may run it before the "
        f"commit, without the transaction's writes. Publish it after the commit: {fix}"
    ))  # fmt: skip
