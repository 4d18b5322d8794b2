"""Guarded code and asyncio (docs/faq.md, "Async Django"): an ``async def`` body is
refused where it is defined or called, a body that returns an awaitable it did not await
is the code's error (the claim released, never memoized, never recorded as completed),
and a guarded call in an event loop's thread is refused before it claims, naming
``sync_to_async``."""

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


def test_an_async_def_task_is_refused_where_it_is_defined(temp_task: Any) -> None:
    async def charge(self: Any, order: str) -> str:
        return order

    # When a guarded task is defined on an async def body
    with pytest.raises(NotAwaited, match=r"async def function.*async_to_sync"):
        temp_task(charge, max_processing_time=30)


def test_an_async_def_function_is_refused_by_protect_before_it_claims(journal: str) -> None:
    key = f"async-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotAwaited, match="_book"):
        protect(key, _book, key, max_processing_time=30, database=journal)
    assert not Outcome.objects.using(journal).filter(args_repr__contains=key).exists()


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
    # Then it fails naming the fix, and the record is released, not completed nor memoized
    assert isinstance(first.result, NotAwaited), first.result
    assert "did not await" in str(first.result) and "async_to_sync" in str(first.result)
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    assert rec.status == "failed" and rec.result is None and rec.result_encoding == ""
    # And the next delivery runs the body again (once the code is fixed, it can complete)
    assert isinstance(task.apply((key,)).result, NotAwaited)
    assert runs == [1, 1]


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
    eager = asyncio.run(in_the_loop(lambda: task.apply((key,))))
    assert isinstance(eager.result, SynchronousOnlyOperation), eager.result
    # Then nothing ran and nothing was claimed
    assert runs == []
    assert not Outcome.objects.using(journal).filter(task_name=task.name).exists()

    # And through sync_to_async it runs, once
    async def through_a_thread() -> Any:
        return (await sync_to_async(task.apply)((key,))).get()

    assert asyncio.run(through_a_thread()) == asyncio.run(through_a_thread()) == f"booked {key}"
    assert runs == [1]
