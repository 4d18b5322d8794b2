"""GroussetTask in-process: eager mode, publish-time checks, options, memo edge cases.
(Real-worker behaviour is in test_worker_integration.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from celery_grousset import GroussetTask
from celery_grousset.exceptions import FingerprintError, ResultNotStored
from celery_grousset.models import Outcome
from tests.celeryapp import app
from tests.ledger.models import Effect


@pytest.fixture
def journal(alias: str) -> Iterator[str]:
    """Point the guard (and the test tasks' ledger) at ``alias``."""
    with override_settings(GROUSSET={"DATABASE": alias}):
        yield alias


@pytest.fixture
def temp_task() -> Iterator[Any]:
    """Register throw-away tasks on the test app; unregister them afterwards."""
    made: list[str] = []

    def make(fn: Any, **options: Any) -> Any:
        name = f"tests.temp.{fn.__name__}.{uuid.uuid4().hex[:6]}"
        made.append(name)
        return app.task(base=GroussetTask, bind=True, name=name, **options)(fn)

    yield make
    for name in made:
        app.tasks.pop(name, None)


def ledger(alias: str, key: str) -> int:
    return Effect.objects.using(alias).filter(key=key).count()


def test_eager_calls_are_guarded(journal: str) -> None:
    from tests.tasks import effect

    key = f"eager-{uuid.uuid4().hex[:8]}"
    # Given the same call applied eagerly twice
    first = effect.apply((key,)).get()
    second = effect.apply((key,)).get()
    # Then one effect, and the duplicate got the memo
    assert ledger(journal, key) == 1
    assert first == second
    assert (
        Outcome.objects.using(journal)
        .get(fingerprint=effect.grousset_fingerprint((key,), {}))
        .deliveries
        == 2
    )


def test_positional_and_keyword_calls_are_the_same(journal: str) -> None:
    from tests.tasks import effect

    key = f"bind-{uuid.uuid4().hex[:8]}"
    effect.apply((key,))
    effect.apply(kwargs={"key": key, "sleep": 0.0})
    assert ledger(journal, key) == 1


def test_grousset_key_selects_arguments(journal: str) -> None:
    from tests.tasks import charge

    order = int(uuid.uuid4().int % 10**9)
    # Given two calls that differ only outside grousset_key=("order_id",)
    a = charge.apply((order, "10.00"), {"note": "first"}).get()
    b = charge.apply((order, "20.00"), {"note": "second"}).get()
    # Then they are one operation
    assert a == b and ledger(journal, f"charge-{order}") == 1


def test_idempotency_key_per_call(journal: str) -> None:
    from tests.tasks import effect

    key = f"ik-{uuid.uuid4().hex[:8]}"
    idem = f"order-{uuid.uuid4().hex[:8]}"
    effect.apply((key,), headers={"grousset_key": idem})
    effect.apply((key + "-other",), headers={"grousset_key": idem})
    assert ledger(journal, key) == 1 and ledger(journal, key + "-other") == 0


def test_unfingerprintable_argument_fails_at_publish(journal: str) -> None:
    from tests.tasks import effect

    # Given a set argument (no deterministic order) / Then publishing fails, naming it
    with pytest.raises(FingerprintError, match="key"):
        effect.apply_async(({"a", "b"},), queue="never-consumed")
    with pytest.raises(FingerprintError, match="idempotency_key"):
        effect.apply_async(("x",), queue="never-consumed", idempotency_key="")


def test_missing_max_processing_time_refuses_to_run(journal: str, temp_task: Any) -> None:
    ran: list[int] = []

    def no_limit(self: Any) -> None:
        ran.append(1)

    task = temp_task(no_limit)
    # When it runs / Then it refuses, saying where to set it, and the body never ran
    result = task.apply()
    assert isinstance(result.result, ImproperlyConfigured)
    assert "max_processing_time" in str(result.result) and "GROUSSET" in str(result.result)
    assert ran == []


def test_memoize_false_returns_none_to_duplicates(journal: str, temp_task: Any) -> None:
    def value(self: Any, k: str) -> str:
        return f"value-{k}"

    task = temp_task(value, max_processing_time=30, memoize=False)
    assert task.apply(("a",)).get() == "value-a"
    assert task.apply(("a",)).get() is None


def test_unserializable_result_is_not_rerun(journal: str, temp_task: Any) -> None:
    runs: list[int] = []

    def odd(self: Any) -> object:
        runs.append(1)
        return object()

    task = temp_task(odd, max_processing_time=30)
    # Given a result JSON cannot encode / When it runs, then a duplicate arrives
    task.apply()
    dup = task.apply()
    # Then the effect ran once; the duplicate is told the result was not stored, and why
    assert runs == [1]
    assert isinstance(dup.result, ResultNotStored)
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    assert rec.status == "completed" and "cannot encode" in rec.error


def test_on_failure_memoize_replays_the_error(journal: str, temp_task: Any) -> None:
    runs: list[int] = []

    def bad(self: Any) -> None:
        runs.append(1)
        raise LookupError("no such order")

    task = temp_task(bad, max_processing_time=30, on_failure="memoize")
    first, second = task.apply(), task.apply()
    assert isinstance(first.result, LookupError) and isinstance(second.result, LookupError)
    assert str(second.result) == "no such order"
    assert runs == [1]


def test_failure_releases_by_default(journal: str, temp_task: Any) -> None:
    runs: list[int] = []

    def bad_once(self: Any) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("transient")
        return "ok"

    task = temp_task(bad_once, max_processing_time=30)
    assert isinstance(task.apply().result, RuntimeError)
    assert task.apply().get() == "ok"
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    assert rec.status == "completed" and rec.fence == 2


def test_transactional_effect_commits_with_completion(journal: str) -> None:
    from tests.tasks import booking

    key = f"txn-{uuid.uuid4().hex[:8]}"
    assert booking.apply((key,)).get()["fence"] == 1
    assert booking.apply((key,)).get()["fence"] == 1
    assert ledger(journal, key) == 1


def test_self_grousset_exposes_the_claim(journal: str, temp_task: Any) -> None:
    def show(self: Any) -> dict[str, Any]:
        g = self.grousset
        return {"fp": g.fingerprint, "fence": g.fence, "deliveries": g.deliveries}

    task = temp_task(show, max_processing_time=30)
    value = task.apply().get()
    assert value == {"fp": task.grousset_fingerprint((), {}), "fence": 1, "deliveries": 1}


def test_the_body_sees_the_request_and_a_user_call_wrapper_still_runs(journal: str) -> None:
    from celery import Task

    seen: list[str] = []

    class Wrapping(Task):  # type: ignore[misc]
        """A user base class whose __call__ does setup (a common Celery pattern)."""

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(f"wrapper:{self.request.id}")
            return super().__call__(*args, **kwargs)

    class Guarded(GroussetTask, Wrapping):  # type: ignore[misc]
        pass

    def plain(self: Any, n: int) -> str:
        return f"{self.request.id}:{n}"

    def wrapped(self: Any, n: int) -> str:
        seen.append(f"body:{self.request.id}")
        return f"{self.request.id}:{n}"

    names = [f"tests.temp.call.{uuid.uuid4().hex[:6]}" for _ in range(2)]
    try:
        # GroussetTask directly: run() is called under the tracer with its request
        t1 = app.task(base=GroussetTask, bind=True, name=names[0], max_processing_time=30)(plain)
        r1 = t1.apply(args=(1,), task_id="id-plain")
        assert r1.get() == "id-plain:1"
        # a user __call__ later in the MRO is honoured, once per attempt
        t2 = app.task(base=Guarded, bind=True, name=names[1], max_processing_time=30)(wrapped)
        # (what the body sees as self.request behind a user __call__ is Celery's
        # business: Celery < 5.4's Task.__call__ pushes a fresh request)
        r2 = t2.apply(args=(2,), task_id="id-wrapped")
        assert r2.get().endswith(":2")
        assert seen[0] == "wrapper:id-wrapped"
        assert [entry.split(":")[0] for entry in seen] == ["wrapper", "body"]
        # and a direct call still goes through Celery's Task.__call__
        assert t1(3).endswith(":3")
    finally:
        for name in names:
            app.tasks.pop(name, None)


def test_settings_are_validated(journal: str) -> None:
    from celery_grousset.conf import grousset_settings

    with (
        override_settings(GROUSSET={"MAX_PROCESING_TIME": 5}),
        pytest.raises(ImproperlyConfigured, match="unknown GROUSSET setting"),
    ):
        grousset_settings.DATABASE  # noqa: B018
    with (
        override_settings(GROUSSET={"ON_IN_FLIGHT": "spin"}),
        pytest.raises(ImproperlyConfigured, match="on_in_flight"),
    ):
        grousset_settings.DATABASE  # noqa: B018


# -- requeue backoff jitter ----------------------------------------------------------------


def _requeued(n: int) -> Any:
    """A request re-queued ``n`` times (the countdown reads the requeue header)."""
    from types import SimpleNamespace

    from celery_grousset.task import REQUEUES_HEADER

    return SimpleNamespace(headers={REQUEUES_HEADER: n})


def test_in_flight_requeue_countdowns_are_jittered_never_past_the_stale_moment() -> None:
    countdown = GroussetTask._in_flight_countdown
    # Given an in-flight duplicate re-queued 3 times (backoff 0.25 s * 2**3 = 2 s) whose
    # holder's claim turns stale in 60 s
    # When its next countdown is drawn 500 times
    drawn = [countdown(_requeued(3), 60.0) for _ in range(500)]
    # Then the countdowns differ (jitter), each within [0.5, 1.0] * the backoff
    assert len(set(drawn)) > 400
    assert all(1.0 <= c <= 2.0 for c in drawn)
    assert min(drawn) < 1.25 and max(drawn) > 1.75  # spread over the whole range
    # And none is past the moment the claim turns stale, however long the backoff
    near = [countdown(_requeued(3), 1.5) for _ in range(500)]
    assert all(1.0 <= c <= 1.5 for c in near) and len(set(near)) > 100
    assert {countdown(_requeued(12), 30.0) for _ in range(100)} == {30.0}
    assert {countdown(_requeued(0), 0.0) for _ in range(100)} == {0.0}


def test_store_outage_requeue_countdowns_are_jittered_within_their_cap() -> None:
    countdown = GroussetTask._store_countdown
    with override_settings(GROUSSET={"STORE_RETRY_BACKOFF": 1.0, "STORE_RETRY_BACKOFF_MAX": 60.0}):
        # Given deliveries that found the journal down, re-queued twice (1 s * 2**2 = 4 s)
        drawn = [countdown(_requeued(2)) for _ in range(500)]
        # Then their countdowns differ, each within [0.5, 1.0] * the backoff
        assert len(set(drawn)) > 400 and all(2.0 <= c <= 4.0 for c in drawn)
        # And past the cap they stay within [0.5, 1.0] * STORE_RETRY_BACKOFF_MAX
        capped = [countdown(_requeued(20)) for _ in range(500)]
        assert len(set(capped)) > 400 and all(30.0 <= c <= 60.0 for c in capped)
