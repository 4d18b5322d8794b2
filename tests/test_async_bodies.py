"""Guarded code and asyncio (docs/faq.md, "Async Django"): an ``async def`` body is
refused before it claims (and by check E019), a body that returns an awaitable it did
not await fails (never recorded as completed), and a guarded call in an event loop's
thread is refused before it claims, naming ``sync_to_async``."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from typing import Any

import pytest
from django.core.exceptions import SynchronousOnlyOperation

from celery_grousset import protect
from celery_grousset.exceptions import NotAwaited
from celery_grousset.models import Outcome


async def _book(key: str) -> str:
    return f"booked {key}"


def test_an_async_def_task_is_refused_before_it_claims_and_by_the_checks(
    journal: str, temp_task: Any
) -> None:
    from django.core import checks

    async def charge(self: Any, order: str) -> str:
        return order

    # Given a guarded task defined on an async def body (defining it raises nothing: an
    # error while Celery finalizes its app would leave the app's other tasks unbuilt)
    task = temp_task(charge, max_processing_time=30)
    # When it is called / Then it is refused before any claim, naming the fix
    result = task.apply(("o-1",))
    assert isinstance(result.result, NotAwaited), result.result
    assert "async def function" in str(result.result)
    assert "async_to_sync" in str(result.result)
    assert not Outcome.objects.using(journal).filter(task_name=task.name).exists()
    # And `manage.py check` says it, as an error of that task
    found = [m for m in checks.run_checks(tags=["celery_grousset"]) if m.obj == task.name]
    assert {m.id for m in found} == {"celery_grousset.E019"}, [m.msg for m in found]


def test_an_async_def_task_is_refused_at_publish(journal: str, temp_task: Any) -> None:
    """Published, its message waited for a worker that refuses to start (E019) while
    delay() said nothing (an async-producers review)."""
    from django.db import transaction

    async def notify(self: Any, user: str) -> str:
        return user

    task = temp_task(notify, max_processing_time=30)
    nowhere = f"nowhere-{uuid.uuid4().hex[:8]}"
    # When a producer publishes a call of a guarded async def task / Then it is refused
    # before anything is sent, naming the fix
    with pytest.raises(NotAwaited, match=r"async def function.*async_to_sync"):
        task.apply_async(("u-1",), queue=nowhere)
    if hasattr(task, "apply_async_on_commit"):  # (Celery 5.4+)
        with pytest.raises(NotAwaited, match="async def"), transaction.atomic(journal):
            task.apply_async_on_commit(("u-2",), queue=nowhere)
            transaction.set_rollback(True, journal)  # (nothing sent even if not refused)


def test_a_sync_wrapper_of_an_async_function_is_a_body_like_any_other(journal: str) -> None:
    import functools

    from asgiref.sync import async_to_sync

    @functools.wraps(_book)
    def book(key: str) -> str:  # the FAQ's advice, written as a decorator
        return async_to_sync(_book)(key)

    key = f"wrapped-{uuid.uuid4().hex[:8]}"
    assert protect(key, book, key, max_processing_time=30, database=journal) == f"booked {key}"


def test_an_async_def_function_is_refused_by_protect_before_it_claims(journal: str) -> None:
    key = f"async-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotAwaited, match="_book"):
        protect(key, _book, key, max_processing_time=30, database=journal)
    assert not Outcome.objects.using(journal).filter(args_repr__contains=key).exists()


def test_an_async_callable_that_is_no_async_def_function_is_refused_before_it_claims(
    journal: str,
) -> None:
    """sync_to_async(fn) and an object whose __call__ is async def passed the check: they
    claimed, then failed NotAwaited, and with on_failure="memoize" the key kept replaying
    NotAwaited after the code was fixed."""
    from asgiref.sync import sync_to_async

    class Booker:
        async def __call__(self, key: str) -> str:
            return f"booked {key}"

    def book(key: str) -> str:
        return f"booked {key}"

    for body in (sync_to_async(book), Booker()):
        key = f"async-{uuid.uuid4().hex[:8]}"
        # When protect() is given it / Then it is refused before anything is claimed
        with pytest.raises(NotAwaited, match="async def"):
            protect(key, body, key, max_processing_time=30, database=journal,
                    on_failure="memoize")  # fmt: skip
        assert not Outcome.objects.using(journal).filter(args_repr__contains=key).exists()
        # And the fixed call runs (nothing was memoized)
        assert protect(key, book, key, max_processing_time=30, database=journal) == (
            f"booked {key}"
        )


@pytest.mark.parametrize("options", [{}, {"transactional": True}, {"on_failure": "memoize"}])
def test_a_body_that_returns_an_unawaited_coroutine_is_never_recorded_completed(
    journal: str, temp_task: Any, options: dict[str, Any]
) -> None:
    runs: list[int] = []

    def forgot_await(self: Any, key: str) -> Any:
        runs.append(1)
        return _book(key)  # the effect is in the coroutine, which nobody awaits

    task = temp_task(forgot_await, max_processing_time=30, **options)
    key = f"coro-{uuid.uuid4().hex[:8]}"
    # When it runs
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (closed: no "coroutine was never awaited")
        first = task.apply((key,))
    # Then it fails naming the fix: a failure, never a completion
    assert isinstance(first.result, NotAwaited), first.result
    assert "did not await" in str(first.result) and "async_to_sync" in str(first.result)
    # (and it says what becomes of the attempt under either on_failure: it said
    # "released" whatever the task's on_failure, and memoize replays it)
    assert "released, so" in str(first.result) and "or memoized and replayed" in str(
        first.result
    )
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    assert rec.status == "failed"
    again = task.apply((key,))
    assert isinstance(again.result, NotAwaited)
    if options.get("on_failure") == "memoize":
        # And memoized as asked (the body may have done part of its work): not run again
        assert rec.result is not None and runs == [1]
    else:  # released: the next delivery runs the body again
        assert rec.result is None and rec.result_encoding == "" and runs == [1, 1]


def _rows(day: str) -> Any:
    yield f"row of {day}"  # the effect would be here: it runs only when iterated


async def _arows(day: str) -> Any:
    yield f"row of {day}"


@pytest.mark.parametrize("fn", [_rows, _arows], ids=["generator", "async-generator"])
def test_a_generator_function_is_refused_by_protect_before_it_claims(
    journal: str, fn: Any
) -> None:
    """Calling it ran none of its body, and the journal recorded the call completed: a
    duplicate got no value (or None) and the effect never ran under the guard."""
    key = f"gen-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotAwaited, match=r"generator function.*list\("):
        protect(key, fn, key, max_processing_time=30, database=journal)
    assert not Outcome.objects.using(journal).filter(args_repr__contains=key).exists()
    # And a function that consumes it is a body like any other
    got = protect(key, lambda day: list(_rows(day)), key, max_processing_time=30,
                  database=journal)  # fmt: skip
    assert got == [f"row of {key}"]


def test_a_body_that_returns_a_generator_is_never_recorded_completed(
    journal: str, temp_task: Any
) -> None:
    runs: list[int] = []

    def lazy(self: Any, key: str) -> Any:
        runs.append(1)
        return _rows(key)  # the effect is in the generator, which nobody iterates

    task = temp_task(lazy, max_processing_time=30)
    key = f"genret-{uuid.uuid4().hex[:8]}"
    # When it runs / Then it fails naming the fix, released: never a completion
    first = task.apply((key,))
    assert isinstance(first.result, NotAwaited), first.result
    assert "returned a generator" in str(first.result) and "list(" in str(first.result)
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    assert rec.status == "failed" and rec.result is None
    assert isinstance(task.apply((key,)).result, NotAwaited) and runs == [1, 1]


def test_a_direct_or_eager_call_in_an_event_loop_thread_is_refused_before_it_claims(
    journal: str, temp_task: Any
) -> None:
    from asgiref.sync import sync_to_async

    runs: list[int] = []

    def book(self: Any, key: str) -> str:
        runs.append(1)
        return f"booked {key}"

    task = temp_task(book, max_processing_time=30)
    key = f"loop-{uuid.uuid4().hex[:8]}"

    async def in_the_loop(call: Any) -> Any:
        return call()

    # When a view's coroutine calls the task directly, or eagerly, in the loop's thread
    with pytest.raises(SynchronousOnlyOperation, match=r"sync_to_async\(task.apply\)"):
        asyncio.run(in_the_loop(lambda: task(key)))
    # (eagerly: raised to the caller, not kept on the result, which a caller that does
    # not read it never saw; a review saw delay() under task_always_eager skip the effect)
    with pytest.raises(SynchronousOnlyOperation, match=r"run eagerly .*sync_to_async"):
        asyncio.run(in_the_loop(lambda: task.apply((key,))))
    conf = task.app.conf
    was = conf.task_always_eager, conf.task_eager_propagates
    conf.task_always_eager, conf.task_eager_propagates = True, False
    try:
        with pytest.raises(SynchronousOnlyOperation, match="task_always_eager"):
            asyncio.run(in_the_loop(lambda: task.delay(key)))
    finally:
        conf.task_always_eager, conf.task_eager_propagates = was
    # Then nothing ran and nothing was claimed
    assert runs == []
    assert not Outcome.objects.using(journal).filter(task_name=task.name).exists()

    # And through sync_to_async it runs, once
    async def through_a_thread() -> Any:
        return (await sync_to_async(task.apply)((key,))).get()

    assert asyncio.run(through_a_thread()) == asyncio.run(through_a_thread()) == f"booked {key}"
    assert runs == [1]


def test_an_async_def_task_leaves_its_app_and_other_tasks_whole() -> None:
    """Refused where it was defined, it raised while Celery finalized the app: the tasks
    built after it were never registered, and a worker discarded their messages."""
    from celery import Celery

    from celery_grousset import GroussetTask

    app = Celery(f"async-{uuid.uuid4().hex[:6]}", set_as_current=False, fixups=[])

    @app.task(base=GroussetTask, bind=True, max_processing_time=30, name="a.fetch")
    async def fetch(self: Any) -> None: ...

    @app.task(base=GroussetTask, bind=True, max_processing_time=30, name="a.book")
    def book(self: Any) -> None: ...

    # When the app is finalized (as a worker does at start, a web process at its first
    # publish) / Then both tasks are registered; only the async one is refused, when called
    app.finalize()
    assert {"a.fetch", "a.book"} <= set(app.tasks)


def test_an_eager_call_in_the_loop_runs_under_bypass(journal: str, temp_task: Any) -> None:
    """BYPASS touches no journal: its eager call in an event loop's thread ran before the
    eager refusal, and must still (a review)."""
    from django.test import override_settings

    runs: list[int] = []

    def book(self: Any, key: str) -> str:
        runs.append(1)
        return f"booked {key}"

    task = temp_task(book, max_processing_time=30)

    async def in_the_loop() -> Any:
        return task.apply(("bypassed",)).get()

    # Given the emergency switch on, when a coroutine calls the task eagerly
    with override_settings(GROUSSET={"DATABASE": journal, "BYPASS": True}):
        value = asyncio.run(in_the_loop())
    # Then it runs, unguarded, as it did
    assert value == "booked bypassed" and runs == [1]
    assert not Outcome.objects.using(journal).filter(task_name=task.name).exists()


def test_what_writes_or_reads_the_database_at_publish_is_refused_in_the_loop_by_name(
    journal: str, temp_task: Any
) -> None:
    """publish_unique(), outbox.enqueue() and delay_on_commit() called in an event loop's
    thread: Django's generic refusal came from deep inside the package (a review)."""
    from asgiref.sync import sync_to_async
    from django.db import transaction

    from celery_grousset import outbox
    from celery_grousset.models import OutboxMessage

    def book(self: Any, key: str) -> str:
        return f"booked {key}"

    task = temp_task(book, max_processing_time=30)
    key = f"loop-{uuid.uuid4().hex[:8]}"

    async def in_the_loop(call: Any) -> Any:
        return call()

    # When a view's coroutine calls them in the loop's thread
    # Then each is refused by its own name, naming the way out
    for call, name, fix in (
        (lambda: task.publish_unique([key]), "publish_unique()", "task.publish_unique"),
        (lambda: outbox.enqueue(task, [key], using=journal), "outbox.enqueue()", "atomic"),
        (lambda: task.delay_on_commit(key), "delay_on_commit()", "atomic"),
    ):
        with pytest.raises(SynchronousOnlyOperation, match=rf"celery-grousset: .*{name[:-2]}"):
            asyncio.run(in_the_loop(call))
        with pytest.raises(SynchronousOnlyOperation, match=fix):
            asyncio.run(in_the_loop(call))
    # And nothing was written
    assert not OutboxMessage.objects.using(journal).filter(task_name=task.name).exists()

    # While through sync_to_async, with the transaction inside, the outbox takes the row
    def place() -> None:
        with transaction.atomic(using=journal):
            outbox.enqueue(task, [key], using=journal)

    async def through_a_thread() -> None:
        await sync_to_async(place)()

    asyncio.run(through_a_thread())
    assert OutboxMessage.objects.using(journal).filter(task_name=task.name).count() == 1
