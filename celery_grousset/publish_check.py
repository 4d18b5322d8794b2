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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery_grousset.delivery import KEY_HEADER, misspelt_key
from celery_grousset.events import emit

EVENT = "grousset.published_in_transaction"
EFFECT_EVENT = "grousset.effect_in_transaction"
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


def from_testcase(block: object) -> bool:
    """Whether an atomic block is the one a Django ``TestCase`` opened around its test
    (rolled back at its end), not one the code under test opened."""
    return bool(getattr(block, "_from_testcase", False))


def open_transactions() -> list[str]:
    """The aliases of the databases with an open ``transaction.atomic()`` in this thread
    (one a ``TestCase`` opened does not count)."""
    from django.db import connections

    return [
        str(conn.alias)
        for conn in connections.all(initialized_only=True)
        if any(not from_testcase(block) for block in conn.atomic_blocks)
    ]


def effect_in_transaction(task_name: str, transactional_on: str | None) -> None:
    """Warn when a guarded effect runs in this process (``protect()``, an eager or direct
    call) inside an open transaction its completion does not join: the journal records
    the outcome at once, on its own connection, while the effect's writes commit or roll
    back with that transaction. ``transactional_on``: the database a transactional
    effect's completion joins (its transaction there is no hazard)."""
    aliases = [a for a in open_transactions() if a != transactional_on]
    if not aliases:
        return
    emit(logging.WARNING, EFFECT_EVENT, {"task": task_name, "database": ",".join(aliases)}, note=(
        "the effect runs inside an open transaction.atomic(): the journal records its "
        "outcome now, but what it writes to that database commits or rolls back with the "
        "transaction; rolled back, the effect is undone while its key is answered from the "
        "journal. Run it after the commit (transaction.on_commit), or pass "
        "transactional=True with its journal on that database (its completion then "
        "commits with the transaction)"
    ))  # fmt: skip


def in_transaction(task: Any, options: dict[str, Any]) -> None:
    """Warn when ``task`` is published (``options`` of ``apply_async``) inside an open
    transaction; see the module's docstring."""
    aliases = open_transactions()  # every one (ATOMIC_REQUESTS opens one on each)
    if not aliases or "retries" in options or _DELIBERATE.get():
        return
    if task.app.conf.task_always_eager:
        return
    fix = (
        f"{task.name}.delay_on_commit(...) (or apply_async_on_commit, transaction.on_commit)"
        if hasattr(task, "delay_on_commit") and "default" in aliases  # (on_commit of default)
        else f"transaction.on_commit(lambda: {task.name}.delay(...), using={aliases[0]!r})"
    )
    emit(logging.WARNING, EVENT, {"task": task.name, "database": ",".join(aliases)}, note=(
        "published inside an open transaction.atomic(): a worker may run it before the "
        f"commit, without the transaction's writes. Publish it after the commit: {fix}"
    ))  # fmt: skip


def _in_a_task() -> bool:
    """Whether a task runs in this thread (a worker's, or an eager one)."""
    from celery._state import get_current_task

    return get_current_task() is not None


def refuse_misspelt_key(
    task_name: str, options: dict[str, Any], guarded: bool = True, anywhere: bool = False,
    method: str = "apply_async",
) -> None:
    """A call's identity under a name nothing reads (``idempotency_keys=…``, a
    ``grousset-key`` header) would publish a call keyed by all its arguments, which runs
    again for every other argument: refused, naming the name that works (``options``:
    ``apply_async``'s; ``guarded``: a guarded task's, whose headers are checked too, and
    a celery-once ``once=`` left on it, outside the relay, and outside a task unless
    ``anywhere``: ``outbox.enqueue``, ``delay_on_commit``, a call the worker never makes
    itself, refused to its caller wherever it runs). A delivery
    sent again (Celery's ``retry()``, the guard's requeue: they pass ``retries``) keeps
    the headers it came with, whoever wrote them: never refused. ``method``: the call
    the error names (``apply`` for an eager one)."""
    if "retries" in options:
        return
    # refused to a caller (outside a task, or ``anywhere``), never to the outbox relay (a
    # row enqueued by name, or before this check, would go dead) nor to the worker's own
    # publish inside a task (a chain's next link, a callback or a chord's body, published
    # after the body completed, would be lost): celery-once's per-call options, and the
    # key under grousset_key= or a name close to it ("idempot…" names: refused everywhere)
    caller = not _DELIBERATE.get() and (anywhere or not _in_a_task())
    for name in options:
        if not isinstance(name, str) or name == "idempotency_key":
            continue
        if name == KEY_HEADER and caller:  # the task option's name, not a call's
            raise TypeError(
                f"{task_name}.{method}() got the option {KEY_HEADER!r}, which nothing "
                f"reads per call: {KEY_HEADER} is a task option (the argument names that "
                "key every call, given to the task decorator). A call's own key is "
                "idempotency_key=… (a non-empty str that names the call)."
            )
        if "idempot" in name.lower() or (caller and misspelt_key(name)):
            raise TypeError(
                f"{task_name}.{method}() got the option {name!r}, which nothing reads: "
                "did you mean idempotency_key? (a non-empty str that names the call)"
            )
    if guarded and "once" in options and caller:
        raise TypeError(
            f"{task_name}: once={options['once']!r} is celery-once's per-call option, which "
            "nothing reads here: a duplicate of the call gets the first call's result "
            "instead of raising (its 'graceful'), and an attempt holds its claim for the "
            "task's max_processing_time (its 'timeout'). Remove once= from the call "
            "(docs/migrating.md)."
        )
    headers = options.get("headers")
    for name in headers if guarded and isinstance(headers, Mapping) else ():
        if misspelt_key(name):
            raise ValueError(
                f"{task_name}: the header {name!r} is not read: the key of a call travels in "
                f"the header {KEY_HEADER!r}. Pass idempotency_key=… to apply_async(), or "
                f"headers={{{KEY_HEADER!r}: …}} to app.send_task()."
            )


#: the options in which a publish carries calls for the worker to publish later
_LATER = ("chain", "link", "link_error", "chord")


def refuse_misspelt_links(
    app: Any, caller: str, options: dict[str, Any], anywhere: bool = False
) -> None:
    """The calls a publish carries for the worker to publish later (a chain's next
    links, ``link``/``link_error`` callbacks, a chord's body) are checked as the caller's
    own call is (:func:`refuse_misspelt_key`): the worker publishes them after a body
    completed, where a refusal would lose the call. A guarded task's are checked whole;
    a task this process has not imported (named by a string: it may be guarded where it
    runs) for its options only; a plain task's not at all. Not inside a task, unless
    ``anywhere`` (a call the worker never makes itself: ``outbox.enqueue``,
    ``delay_on_commit``): there the worker's own publish of a chain's next link carries
    the rest."""
    if not any(options.get(name) for name in _LATER):
        return
    if "retries" in options or _DELIBERATE.get() or (not anywhere and _in_a_task()):
        return
    for name, given in _later(options, {}, set()):
        task = app.tasks.get(name) if isinstance(name, str) else None
        if task is not None and not hasattr(task, "grousset_options"):
            continue  # a plain task: nothing here reads its options
        try:
            refuse_misspelt_key(str(name), given, guarded=task is not None, anywhere=anywhere)
        except (TypeError, ValueError) as exc:
            raise type(exc)(
                f"{exc} This call is one {caller}'s publish carries for the worker to "
                "publish later (a chain's next link, a link or link_error callback, a "
                "chord's body), where it would be refused and lost. It was not published "
                "(in a group or a chord, the members before it were)."
            ) from None


def _later(
    options: Mapping[str, Any], inherited: dict[str, Any], seen: set[int]
) -> Iterator[tuple[object, dict[str, Any]]]:
    """The task calls inside ``options``' chain, callbacks and chord body, at any depth
    (a group's, a chain's and a chord's parts), each with the options Celery publishes
    it with: its own over those of the group, chord or chain it is in."""
    for name in _LATER:
        value = options.get(name)
        for sig in value if isinstance(value, (list, tuple)) else (value,):
            if not isinstance(sig, Mapping) or id(sig) in seen:
                continue
            seen.add(id(sig))
            given = _merged(inherited, sig.get("options"))
            if sig.get("subtask_type"):  # a chain, a group, a chord: its parts
                parts = sig.get("kwargs") or {}
                for part in (parts.get("tasks"), parts.get("header"), parts.get("body")):
                    yield from _later({"chain": part}, given, seen)
            else:
                yield sig.get("task"), given
            yield from _later(sig.get("options") or {}, {}, seen)


def _merged(inherited: dict[str, Any], options: object) -> dict[str, Any]:
    """A member's options over its group's, chord's or chain's (their headers joined)."""
    own = dict(options) if isinstance(options, Mapping) else {}
    if not inherited:
        return own
    merged = {**inherited, **own}
    outer, inner = inherited.get("headers"), own.get("headers")
    if isinstance(outer, Mapping) and isinstance(inner, Mapping):
        merged["headers"] = {**outer, **inner}
    return merged
