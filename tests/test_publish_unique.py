"""``task.publish_unique(calls)``: two-layer deduplication at publish time.

Messages go to a Redis queue of their own that no worker consumes; the test reads
them back from Redis (what was really published) and deletes the queue's keys.
Journal rows come from the real claim store on every backend.
"""

from __future__ import annotations

import base64
import json
import math
import random
import tracemalloc
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from celery_grousset import GroussetTask
from celery_grousset.claim import ENC_EXCEPTION, ClaimRequest
from celery_grousset.exceptions import InvalidArgument
from celery_grousset.journal import now as _db_now
from celery_grousset.models import Outcome
from celery_grousset.publish import PublishReport, plan
from celery_grousset.store import get_store
from celery_grousset.store.base import Completion
from tests import services
from tests.celeryapp import app


def make_task(alias: str, processor: str) -> Any:
    """A guarded task on ``alias`` with a processor id of its own."""

    @app.task(base=GroussetTask, bind=True, shared=False, max_processing_time=30,
              database=alias, processor_id=processor, name=f"tests.pu.{processor}")  # fmt: skip
    def job(self: Any, key: str, sleep: float = 0.0) -> str:
        return key

    return job


@pytest.fixture
def queue() -> Iterator[str]:
    """A queue nobody consumes; its Redis keys are deleted afterwards."""
    url = services.require_redis()
    name = f"pu-{uuid.uuid4().hex[:10]}"
    yield name
    client = _redis(url)
    keys = [*client.scan_iter(match=f"{name}*"), *client.scan_iter(match=f"_kombu.binding*.{name}")]
    if keys:
        client.delete(*keys)


def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def published_keys(queue: str) -> list[str]:
    """The first argument of every message sitting in ``queue`` (read back from Redis)."""
    client = _redis(services.require_redis())
    keys: list[str] = []
    for name in client.scan_iter(match=f"{queue}*"):
        if client.type(name) != b"list":
            continue
        for start in range(0, int(client.llen(name)), 10_000):
            for raw in client.lrange(name, start, start + 9_999):
                body = json.loads(raw)["body"]
                args, _kwargs, _embed = json.loads(base64.b64decode(body))
                keys.append(args[0])
    return keys


def claim(alias: str, processor: str, task: Any, key: str) -> tuple[str, str]:
    fp = task.grousset_fingerprint((key,), {})
    req = ClaimRequest(processor_id=processor, fingerprint=fp, task_name=task.name,
                       task_id=uuid.uuid4().hex, token=uuid.uuid4().hex, worker="test:1",
                       args_repr="", max_processing_time=30, expires_after=3600,
                       max_takeovers=3)  # fmt: skip
    assert get_store(alias).claim(req).owned
    return fp, req.token


def test_each_journal_state_is_skipped_or_published_as_a_claim_would(
    alias: str, processor: str, queue: str
) -> None:
    task = make_task(alias, processor)
    store = get_store(alias)
    rows = Outcome.objects.using(alias).filter(processor_id=processor)
    # Given a journal with one row in each state for this processor
    fp, tok = claim(alias, processor, task, "completed")
    store.finish(processor, fp, tok, Completion("completed", b"1", "application/json"))
    fp, tok = claim(alias, processor, task, "expired")
    store.finish(processor, fp, tok, Completion("completed", b"1", "application/json"))
    rows.filter(fingerprint=fp).update(expires_on=_db_now(alias) - timedelta(seconds=1))
    claim(alias, processor, task, "in-flight")
    fp, _ = claim(alias, processor, task, "stale")
    rows.filter(fingerprint=fp).update(stale_at=_db_now(alias) - timedelta(seconds=1))
    fp, tok = claim(alias, processor, task, "released")
    store.release(processor, fp, tok)
    fp, tok = claim(alias, processor, task, "memoized-failure")
    store.finish(processor, fp, tok, Completion("failed", b"{}", ENC_EXCEPTION, "E: x"))
    # ... and the same row under another processor, which must not count
    other = make_task(alias, processor + "-other")
    claim(alias, processor + "-other", other, "new-1")
    # When a batch with in-batch duplicates is published in chunks of 4
    names = ["completed", "expired", "in-flight", "stale", "released", "memoized-failure",
             "new-1", "new-2", "new-1", "completed", "new-2"]  # fmt: skip
    calls = [((name,), {}) for name in names]
    with CaptureQueriesContext(connections[alias]) as ctx:
        report = task.publish_unique(calls, chunk_size=4, queue=queue)
    # Then only what a claim would run again is published, each once
    expected = ["expired", "stale", "released", "new-1", "new-2"]
    assert sorted(published_keys(queue)) == sorted(expected)
    assert [r.id for r in report.results] and len(report.results) == len(expected)
    assert (report.published, report.skipped_in_batch, report.skipped_completed,
            report.skipped_in_flight) == (5, 3, 2, 1)  # fmt: skip
    # ... with one journal query per chunk of 4 calls, none for the last chunk (all three
    # of its calls were seen before: layer 1 answers them)
    assert report.chunks == math.ceil(len(calls) / 4) and report.queries == 2
    assert len(ctx.captured_queries) == report.queries
    marker = "= ANY(" if connections[alias].vendor == "postgresql" else " IN ("
    assert all(marker in q["sql"] for q in ctx.captured_queries)


def test_idempotency_keys_and_key_triples(alias: str, processor: str, queue: str) -> None:
    task = make_task(alias, processor)
    # Given calls given as idempotency keys: "a" twice, and two triples with the key "b"
    calls: list[Any] = ["a", "a", (("x",), {}, "b"), (("x",), {}, "b")]
    # When they are published
    report = task.publish_unique(calls, queue=queue)
    # Then "a" and the first "b" call go out, with the key as the first argument for "a"
    assert sorted(published_keys(queue)) == ["a", "x"]
    assert (report.published, report.skipped_in_batch) == (2, 2)


def test_a_key_for_every_call_and_malformed_calls_are_refused_before_any_publish(
    alias: str, processor: str, queue: str
) -> None:
    """idempotency_key in the options went to every call: deduplicated by arguments in
    the batch, then refused by the worker as one key with other arguments (5 published,
    1 ran); a str as a call's args was split into characters; an int as its kwargs
    failed with a bare TypeError."""
    task = make_task(alias, processor)
    with pytest.raises(InvalidArgument, match="every call one key"):
        task.publish_unique([(("a",), {}), (("b",), {})], queue=queue, idempotency_key="same")
    with pytest.raises(InvalidArgument, match="every call one key"):
        task.publish_unique([(("a",), {})], queue=queue, headers={"grousset_key": "same"})
    # (and a task_id there: distinct calls shared it, their results overwrote each other)
    with pytest.raises(InvalidArgument, match="every call one task id"):
        task.publish_unique([(("a",), {}), (("b",), {})], queue=queue, task_id="fixed-id")
    for call in [("abc", {}), (("a",), 1)]:
        with pytest.raises(InvalidArgument, match="args a list or tuple, kwargs a dict"):
            task.publish_unique([call], queue=queue)
    assert published_keys(queue) == []


def test_a_call_that_does_not_fit_the_task_fails_before_its_chunk_and_says_what_went_out(
    alias: str, processor: str, queue: str
) -> None:
    task = make_task(alias, processor)
    # Given a batch whose third call, named by its idempotency key (its arguments are
    # not bound for the fingerprint), has an argument too many for the task
    calls: list[Any] = [(("a",), {}), (("b",), {}), (("c", 0.0, "Extra-pw-41"), {}, "k-c"), "d"]
    # When it is published in chunks of two
    with pytest.raises(InvalidArgument, match="does not fit the task's parameters") as failed:
        task.publish_unique(calls, queue=queue, chunk_size=2)
    # Then the first chunk went out, nothing of the chunk with the wrong call, and the
    # error carries the report of what was published
    assert sorted(published_keys(queue)) == ["a", "b"]
    assert failed.value.grousset_report.published == 2  # type: ignore[attr-defined]
    assert "2 call(s) were published before this error" in "".join(failed.value.__notes__)
    # ... and names the call's shape, not its values (one may be a secret)
    assert "Extra-pw-41" not in str(failed.value) and "3 positional" in str(failed.value)


def test_a_key_reused_with_other_arguments_is_published_not_dropped(
    alias: str, processor: str, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    task = make_task(alias, processor)
    # Given the key "b" used with "x" twice and with "y" in one batch
    calls: list[Any] = [(("x",), {}, "b"), (("x",), {}, "b"), (("y",), {}, "b")]
    with caplog.at_level("WARNING", logger="celery_grousset"):
        report = task.publish_unique(calls, queue=queue)
    # Then the copy of "x" is skipped, but "y" goes out for the worker to refuse
    # (PayloadMismatch), counted and logged, never dropped silently
    assert sorted(published_keys(queue)) == ["x", "y"]
    assert (report.published, report.skipped_in_batch, report.payload_mismatches) == (2, 1, 1)
    assert "grousset.publish_payload_mismatch" in caplog.text


def test_a_reused_key_is_published_after_the_call_it_differs_from(
    alias: str, processor: str
) -> None:
    task = make_task(alias, processor)
    # Given the key "b" with "x", another key, then "b" again with "y"
    calls: list[Any] = [(("x",), {}, "b"), (("z",), {}, "c"), (("y",), {}, "b")]
    # When the batch is planned
    planned = [c.args[0] for chunk in plan(task, calls, PublishReport()) for c in chunk]
    # Then the calls go out in input order: "x" first, so the worker runs it and refuses
    # "y" (PayloadMismatch), as the producer docs say, not the other way round
    assert planned == ["x", "z", "y"]


def test_a_key_whose_record_has_other_arguments_is_published(
    alias: str, processor: str, queue: str
) -> None:
    task = make_task(alias, processor)
    # Given the key "b" completed for "x"
    assert task.apply(("x",), headers={"grousset_key": "b"}).get() == "x"
    # When "x" and "y" are published under it / Then "x" is skipped, "y" goes out
    report = task.publish_unique([(("x",), {}, "b")], queue=queue)
    assert (report.published, report.skipped_completed) == (0, 1)
    report = task.publish_unique([(("y",), {}, "b")], queue=queue)
    assert (report.published, report.skipped_completed, report.payload_mismatches) == (1, 0, 1)
    assert published_keys(queue) == ["y"]
    # With validation off the key alone decides, as before
    with override_settings(GROUSSET={"VALIDATE_PAYLOAD": False}):
        report = task.publish_unique([(("z",), {}, "b")], queue=queue)
    assert (report.published, report.skipped_completed, report.payload_mismatches) == (0, 1, 0)


def test_window_bounds_layer_one_across_chunks(alias: str, processor: str) -> None:
    task = make_task(alias, processor)
    # Given "k0" repeated after 50 other distinct calls, chunks of 10
    calls = [(("k0",), {})] + [((f"k{i}",), {}) for i in range(1, 51)] + [(("k0",), {})]
    for window, in_batch in ((100, 1), (20, 0)):
        report = PublishReport()
        # When planned with a window larger, then smaller, than the distance
        todo = [c for chunk in plan(task, calls, report, chunk_size=10, window=window)
                for c in chunk]  # fmt: skip
        # Then the late copy is caught by layer 1 only when the window still holds "k0"
        assert report.skipped_in_batch == in_batch
        assert len(todo) == len(calls) - in_batch


def test_a_long_generator_is_planned_in_bounded_memory(processor: str) -> None:
    services.require_database("default")
    task = make_task("default", processor)

    def peak(n: int) -> int:
        report = PublishReport()
        calls = (((f"key-{i % (n // 2)}",), {}) for i in range(n))  # half are duplicates
        tracemalloc.start()
        try:
            for chunk in plan(task, calls, report, chunk_size=1000, window=5000):
                report.published += len(chunk)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            assert report.total == n and report.queries == math.ceil(n / 1000)

    # Given generators of 20,000 and 160,000 calls (never materialised as lists)
    small, large = peak(20_000), peak(160_000)
    # Then 8x the calls costs about the same peak memory (chunk + window, not input)
    assert large < small * 1.5 + 512 * 1024, (small, large)


@pytest.mark.slow
def test_100k_calls_30pct_duplicates_20pct_completed(processor: str, queue: str) -> None:
    services.require_database("postgresql")
    alias, chunk_size = "postgresql", 1000
    task = make_task(alias, processor)
    rng = random.Random(8)
    # Given 100,000 calls: 70,000 distinct keys, 30,000 in-batch duplicates
    distinct = [f"k{i}" for i in range(70_000)]
    calls = distinct + [rng.choice(distinct) for _ in range(30_000)]
    rng.shuffle(calls)
    # ... of which 20,000 distinct keys the journal already holds as completed
    done = set(rng.sample(distinct, 20_000))
    now = _db_now(alias)
    Outcome.objects.using(alias).bulk_create(
        [Outcome(processor_id=processor, fingerprint=task.grousset_fingerprint((k,), {}),
                 task_name=task.name, task_id=uuid.uuid4().hex, status="completed", fence=1,
                 claim_token="t", started_at=now, stale_at=now, completed_at=now,
                 expires_on=now + timedelta(hours=1), result=b"1",
                 result_encoding="application/json") for k in done],
        batch_size=5000,
    )  # fmt: skip
    # When they are published unique in chunks of 1000
    with CaptureQueriesContext(connections[alias]) as ctx:
        report = task.publish_unique(
            (((k,), {}) for k in calls), chunk_size=chunk_size, queue=queue,
            ignore_result=True, keep_results=False,
        )  # fmt: skip
    # Then exactly the other 50,000 keys were published, each once
    sent = published_keys(queue)
    assert len(sent) == 50_000 and set(sent) == set(distinct) - done
    assert (report.published, report.skipped_in_batch, report.skipped_completed,
            report.skipped_in_flight) == (50_000, 30_000, 20_000, 0)  # fmt: skip
    # ... with ⌈100,000 / 1000⌉ = 100 journal queries, each one "= ANY(...)"
    assert len(ctx.captured_queries) == math.ceil(100_000 / chunk_size) == report.queries
    assert all("= ANY(" in q["sql"] for q in ctx.captured_queries)
