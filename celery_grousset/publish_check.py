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
inside its batch transaction), and the atomic blocks Django's ``TestCase`` wraps each test
in.
"""

from __future__ import annotations

import logging
from types import FrameType
from typing import Any

logger = logging.getLogger("celery_grousset")

EVENT = "grousset.published_in_transaction"
#: modules that publish inside a transaction on purpose
DELIBERATE = frozenset({"celery_grousset.outbox"})


def open_transaction() -> str | None:
    """The alias of a database with an open ``transaction.atomic()`` in this thread (one
    a ``TestCase`` opened does not count), or None."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if any(not getattr(block, "_from_testcase", False) for block in conn.atomic_blocks):
            return str(conn.alias)
    return None


def in_transaction(task: Any, options: dict[str, Any], caller: FrameType | None) -> None:
    """Warn when ``task`` is published (``options`` of ``apply_async``, by the code of the
    frame ``caller``) inside an open transaction; see the module's docstring."""
    alias = open_transaction()
    if alias is None or "retries" in options:
        return
    if caller is not None and caller.f_globals.get("__name__") in DELIBERATE:
        return
    if task.app.conf.task_always_eager:
        return
    fields = {"task": task.name, "database": alias}
    logger.warning(
        "%s task=%s database=%s note=published inside an open transaction.atomic(): a worker "
        "may run it before the commit, without the transaction's writes. Publish it after "
        "the commit: %s.delay_on_commit(...) (or apply_async_on_commit, transaction.on_commit)",
        EVENT, task.name, alias, task.name,
        extra={"grousset": {"event": EVENT, **fields}, "grousset_event": EVENT,
               **{f"grousset_{k}": v for k, v in fields.items()}},
    )  # fmt: skip
