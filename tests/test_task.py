"""GroussetTask in-process: eager mode, publish-time checks, options, memo edge cases.
(Real-worker behaviour is in test_worker_integration.py.)"""

from __future__ import annotations

import logging
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


def test_the_mixin_after_a_task_class_is_refused_not_silently_unguarded(journal: str) -> None:
    from celery import Task

    from celery_grousset import GroussetTaskMixin  # the import docs/configuration.md shows

    class Audited(Task):  # a project's own base task class
        abstract = True

    # When the mixin is listed after it (Celery's Task.__call__ would come first, and
    # run every delivery unguarded) / Then the class is refused, naming the fix
    with pytest.raises(TypeError, match="list GroussetTaskMixin before the Celery task"):
        type("WrongOrder", (Audited, GroussetTaskMixin), {"max_processing_time": 30})
    # And listed first, the task is guarded: the same call runs once
    right = type("RightOrder", (GroussetTaskMixin, Audited), {"max_processing_time": 30})
    assert _runs_of_one_call_applied_twice(right) == 1


def _runs_of_one_call_applied_twice(base: type) -> int:
    """A task on ``base``, one call applied eagerly twice: how many times its body ran."""
    key, ran = f"base-{uuid.uuid4().hex[:8]}", []

    def body(self: Any, k: str) -> None:
        ran.append(k)

    task = app.task(base=base, bind=True, name=f"tests.base.{key}")(body)
    try:
        task.apply((key,)).get()
        task.apply((key,)).get()
    finally:
        app.tasks.pop(task.name, None)
    return len(ran)


def test_a_base_that_passes_the_call_on_before_the_guard_keeps_it(journal: str) -> None:
    from celery import Task

    from celery_grousset import GroussetTask

    class Passing(Task):  # a project's base: passes the delivery on
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return super().__call__(*args, **kwargs)

    # When it is listed before GroussetTask / Then the task is guarded: one call runs once
    passing = type("PassingFirst", (Passing, GroussetTask), {"max_processing_time": 30})
    assert _runs_of_one_call_applied_twice(passing) == 1


def test_positional_and_keyword_calls_are_the_same(journal: str) -> None:
    from tests.tasks import effect

    key = f"bind-{uuid.uuid4().hex[:8]}"
    first = effect.apply((key,))
    second = effect.apply(kwargs={"key": key, "sleep": 0.0})
    # Then the keyword call is a duplicate that succeeded with the positional call's memo
    assert first.successful(), first.result
    assert second.successful(), second.result
    assert second.get() == first.get() and first.get()["key"] == key
    assert ledger(journal, key) == 1
    fp = effect.grousset_fingerprint((key,), {})
    assert effect.grousset_fingerprint((), {"key": key, "sleep": 0.0}) == fp
    rec = Outcome.objects.using(journal).get(fingerprint=fp)
    assert (rec.status, rec.deliveries, rec.task_id) == ("completed", 2, first.id)


def test_a_positional_secret_of_a_call_that_does_not_fit_its_task_is_not_stored(
    journal: str,
) -> None:
    """A call its idempotency key names need not fit the task (a message sent before a
    deploy changed the task's parameters): its arguments were stored call-like, the
    positional password unredacted."""
    from tests.tasks import login

    key = f"loose-{uuid.uuid4().hex[:8]}"
    # Given a call of login(user, password) with one positional argument too many
    result = login.apply(("bob", "Hunter2-secret-77", "extra-value-9"), idempotency_key=key)
    # When it has run (its body refuses the arguments)
    assert result.failed()
    rec = Outcome.objects.using(journal).get(task_id=result.id)
    # Then the stored arguments name the password by its parameter and mask it, and do
    # not show the value no parameter names
    assert "Hunter2-secret-77" not in rec.args_repr, rec.args_repr
    assert "extra-value-9" not in rec.args_repr, rec.args_repr
    assert rec.args_repr.startswith("user='bob', password='***', "), rec.args_repr
    assert "Hunter2-secret-77" not in rec.error, rec.error


def test_a_secret_with_a_lone_surrogate_runs_and_is_stored_redacted(journal: str) -> None:
    """A sensitive argument holding a lone surrogate (``json.loads('"\\ud800"')`` of a
    form's input gives one) raised UnicodeEncodeError from the guard's redaction: the
    call was refused with an error that is not the package's (a review)."""
    from tests.tasks import login

    user, secret = f"eve-{uuid.uuid4().hex[:8]}", "\ud800Hunter2-secret-55"
    # Given a call whose password has a lone surrogate
    result = login.apply((user,), {"password": secret})
    # When it runs / Then it is guarded like any other call: it ran once, its stored
    # arguments hide the password
    assert result.get() == f"logged in {user}"
    rec = Outcome.objects.using(journal).get(task_id=result.id)
    assert rec.status == "completed" and ledger(journal, user) == 1
    assert "Hunter2" not in rec.args_repr and "password='***'" in rec.args_repr, rec.args_repr


def test_grousset_key_selects_arguments(journal: str) -> None:
    from tests.tasks import charge

    order = int(uuid.uuid4().int % 10**9)
    # Given two calls that differ only outside grousset_key=("order_id",), with payload
    # validation off (on, the second raises PayloadMismatch: tests/test_payload.py)
    with override_settings(GROUSSET={"DATABASE": journal, "VALIDATE_PAYLOAD": False}):
        a = charge.apply((order, "10.00"), {"note": "first"}).get()
        b = charge.apply((order, "20.00"), {"note": "second"}).get()
    # Then they are one operation
    assert a == b and ledger(journal, f"charge-{order}") == 1


def test_idempotency_key_per_call(journal: str) -> None:
    from tests.tasks import effect

    key = f"ik-{uuid.uuid4().hex[:8]}"
    idem = f"order-{uuid.uuid4().hex[:8]}"
    # Given two calls with other arguments and one idempotency key (validation off: on,
    # the second raises PayloadMismatch, tests/test_payload.py) / Then one operation
    with override_settings(GROUSSET={"DATABASE": journal, "VALIDATE_PAYLOAD": False}):
        first = effect.apply((key,), headers={"grousset_key": idem})
        second = effect.apply((key + "-other",), headers={"grousset_key": idem})
    assert first.successful() and second.successful() and second.get() == first.get()
    assert ledger(journal, key) == 1 and ledger(journal, key + "-other") == 0


def test_grousset_fingerprint_takes_args_as_apply_async_and_names_a_misuse() -> None:
    from celery_grousset.exceptions import InvalidArgument
    from tests.tasks import effect

    # Given the call effect("k"): args alone, args with kwargs, and by keyword are one
    fp = effect.grousset_fingerprint(("k",))
    assert fp == effect.grousset_fingerprint(("k",), {}) == effect.grousset_fingerprint(
        (), {"key": "k"}
    )
    # When the arguments are passed as the task's own (not as a tuple and a dict)
    # Then InvalidArgument names the method and shows the right form
    for args, kwargs in [(42, None), (("k",), "x")]:
        with pytest.raises(InvalidArgument, match=r"grousset_fingerprint\(args, kwargs\)"):
            effect.grousset_fingerprint(args, kwargs)  # type: ignore[arg-type]


def test_apply_takes_an_idempotency_key_as_apply_async_does(journal: str) -> None:
    from celery_grousset.exceptions import PayloadMismatch
    from tests.tasks import effect

    key = f"ik-apply-{uuid.uuid4().hex[:8]}"
    idem = f"order-{uuid.uuid4().hex[:8]}"
    # Given an eager call with idempotency_key= (the docs try tasks with .apply())
    with override_settings(GROUSSET={"DATABASE": journal}):
        first = effect.apply((key,), idempotency_key=idem)
        again = effect.apply((key,), idempotency_key=idem)
        # When the key comes again with other arguments
        other = effect.apply((key + "-other",), idempotency_key=idem)
    # Then the same call is one operation, and the other arguments are refused, not run
    assert first.successful() and again.get() == first.get()
    assert other.failed() and isinstance(other.result, PayloadMismatch)
    assert ledger(journal, key) == 1 and ledger(journal, key + "-other") == 0
    # And the key names the row (the key's fingerprint, not the arguments'): three
    # deliveries of it, the run, its duplicate and the refused call
    fp = effect.grousset_fingerprint((key,), {}, idem)
    assert Outcome.objects.using(journal).get(fingerprint=fp).deliveries == 3
    with pytest.raises(FingerprintError, match="idempotency_key"):
        effect.apply(("x",), idempotency_key="")


def test_unfingerprintable_argument_fails_at_publish(journal: str) -> None:
    from tests.tasks import effect

    # Given a set argument (no deterministic order) / Then publishing fails, naming it
    with pytest.raises(FingerprintError, match="key"):
        effect.apply_async(({"a", "b"},), queue="never-consumed")
    with pytest.raises(FingerprintError, match="idempotency_key"):
        effect.apply_async(("x",), queue="never-consumed", idempotency_key="")


def test_a_call_that_does_not_fit_the_task_is_a_type_error_naming_it(journal: str) -> None:
    from tests.tasks import effect

    # Given a guarded task effect(key, sleep=0.0) / When it is published with an argument
    # too many, or a keyword it does not take
    for args, kwargs in (((1, 2, 3), {}), (("k",), {"colour": "red"})):
        with pytest.raises(TypeError) as err:
            effect.apply_async(args, kwargs, queue="never-consumed")
        # Then it is a TypeError, as Celery's own delay() check raises, naming the task
        assert isinstance(err.value, FingerprintError)
        assert effect.name in str(err.value) and "(key, sleep)" in str(err.value)


def test_a_self_parameter_without_bind_is_named_in_the_error(journal: str) -> None:
    from celery_grousset import GroussetTask

    def charge(self: Any, order_id: int) -> int:  # bind=True forgotten
        return order_id

    task = app.task(base=GroussetTask, name=f"tests.unbound.{uuid.uuid4().hex[:8]}",
                    max_processing_time=30)(charge)  # fmt: skip
    try:
        # When it is called as its body reads / Then the error says what self needs
        with pytest.raises(TypeError, match=r"named self: .* only with bind=True"):
            task.apply_async((7,), queue="never-consumed")
    finally:
        app.tasks.pop(task.name, None)


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


def test_unserializable_result_is_not_rerun(
    journal: str, temp_task: Any, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[int] = []

    def odd(self: Any) -> object:
        runs.append(1)
        return object()

    task = temp_task(odd, max_processing_time=30)
    # Given a result JSON cannot encode / When it runs
    with caplog.at_level(logging.WARNING, logger="celery_grousset"):
        task.apply()
    # Then it is said at once, not only to a duplicate later
    [line] = [r for r in caplog.records if r.getMessage().startswith("grousset.result_not_stored")]
    assert line.grousset_task == task.name and "cannot encode" in line.getMessage()
    # When a duplicate arrives
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
    # and the replay says it is one (an error tool's filter), the failure itself not
    assert second.result.grousset_replayed == task.grousset_fingerprint()
    assert not hasattr(first.result, "grousset_replayed")


def test_failure_releases_by_default(journal: str, temp_task: Any) -> None:
    runs: list[int] = []

    def bad_once(self: Any) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("transient")
        return "ok"

    task = temp_task(bad_once, max_processing_time=30)
    assert isinstance(task.apply().result, RuntimeError)
    failed = Outcome.objects.using(journal).get(task_name=task.name)
    assert task.apply().get() == "ok"
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    assert rec.status == "completed" and rec.fence > failed.fence


def test_transactional_effect_commits_with_completion(
    journal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import DatabaseError, connections

    from celery_grousset.store import get_store
    from tests.tasks import booking

    key = f"txn-{uuid.uuid4().hex[:8]}"
    fp = booking.grousset_fingerprint((key,), {})
    conn = connections[journal]
    real_commit, commits = conn.commit, []

    def commit_fails_once() -> None:
        commits.append(1)
        if len(commits) == 1:
            raise DatabaseError("simulated: the transaction's COMMIT failed")
        real_commit()

    # Given the first attempt's transaction fails at COMMIT (connection lost, serialization
    # failure): Django rolls back whatever the transaction holds
    monkeypatch.setattr(conn, "commit", commit_fails_once)
    with override_settings(GROUSSET={"DATABASE": journal, "STORE_TIMEOUT": 2}):
        failed = booking.apply((key,))
        # Then neither the effect nor the completion exists: the claim was released
        assert isinstance(failed.result, DatabaseError), failed.result
        assert commits == [1], "the body and its completion did not run in a transaction"
        assert ledger(journal, key) == 0
        rec = Outcome.objects.using(journal).get(fingerprint=fp)
        assert (rec.status, rec.result_encoding) == ("failed", "")
        # And the next delivery runs it again: effect and completion commit together, once
        rerun = booking.apply((key,)).get()["fence"]
        assert rerun > rec.fence and booking.apply((key,)).get()["fence"] == rerun
    assert ledger(journal, key) == 1
    rec = Outcome.objects.using(journal).get(fingerprint=fp)
    assert (rec.status, rec.deliveries) == ("completed", 3)  # failed, re-run, duplicate
    assert get_store(journal).holder(rec.processor_id, fp) == ("completed", rerun)


def test_self_grousset_exposes_the_claim(journal: str, temp_task: Any) -> None:
    def show(self: Any) -> dict[str, Any]:
        g = self.grousset
        return {"fp": g.fingerprint, "fence": g.fence, "deliveries": g.deliveries}

    task = temp_task(show, max_processing_time=30)
    value = task.apply().get()
    fence = Outcome.objects.using(journal).get(task_name=task.name).fence
    assert value == {"fp": task.grousset_fingerprint((), {}), "fence": fence, "deliveries": 1}


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
    from celery_grousset.delivery import in_flight_countdown as countdown

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
    # And a long claim's duplicates come back at least every minute (a worker holding an
    # ETA message past RabbitMQ's consumer_timeout loses its channel)
    far = [countdown(_requeued(n), 7200.0) for n in (12, 40, 10_000) for _ in range(100)]
    assert all(30.0 <= c <= 60.0 for c in far) and len(set(far)) > 200
    # ... and a journal outage after that many requeues is still a countdown, not an
    # OverflowError (the two requeues share one counter)
    from celery_grousset.delivery import store_countdown

    assert 0 < store_countdown(_requeued(10_000)) <= 600.0
    assert {countdown(_requeued(0), 0.0) for _ in range(100)} == {0.0}


def test_store_outage_requeue_countdowns_are_jittered_within_their_cap() -> None:
    from celery_grousset.delivery import store_countdown as countdown

    with override_settings(GROUSSET={"STORE_RETRY_BACKOFF": 1.0, "STORE_RETRY_BACKOFF_MAX": 60.0}):
        # Given deliveries that found the journal down, re-queued twice (1 s * 2**2 = 4 s)
        drawn = [countdown(_requeued(2)) for _ in range(500)]
        # Then their countdowns differ, each within [0.5, 1.0] * the backoff
        assert len(set(drawn)) > 400 and all(2.0 <= c <= 4.0 for c in drawn)
        # And past the cap they stay within [0.5, 1.0] * STORE_RETRY_BACKOFF_MAX
        capped = [countdown(_requeued(20)) for _ in range(500)]
        assert len(set(capped)) > 400 and all(30.0 <= c <= 60.0 for c in capped)


# -- one Django base class; publishing inside a transaction -----------------------------------


@pytest.fixture
def default_journal() -> Iterator[str]:
    """The journal on the ``default`` database (SQLite), whose transactions the test opens."""
    from tests import services

    services.require_database("default")
    with override_settings(GROUSSET={"DATABASE": "default"}):
        yield "default"


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """What reaches Celery's own ``Task.apply_async`` (nothing goes to a broker)."""
    from celery.app.task import Task

    sent: list[tuple[Any, ...]] = []

    def publish(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        sent.append((self.name, tuple(args or ()), options))

    monkeypatch.setattr(Task, "apply_async", publish)
    return sent


try:  # Celery >= 5.4 ships a Django task class (delay_on_commit); 5.3 does not
    from celery.contrib.django.task import DjangoTask as _DjangoTask  # noqa: F401

    HAS_DJANGO_TASK = True
except ImportError:  # pragma: no cover - Celery 5.3
    HAS_DJANGO_TASK = False
needs_django_task = pytest.mark.skipif(
    not HAS_DJANGO_TASK, reason="Celery < 5.4 has no DjangoTask (no delay_on_commit)"
)


@needs_django_task
def test_grousset_task_is_a_django_task_that_publishes_on_commit(
    default_journal: str, temp_task: Any, captured: list[tuple[Any, ...]]
) -> None:
    from celery.contrib.django.task import DjangoTask
    from django.db import transaction

    from celery_grousset import GroussetDjangoTask

    def greet(self: Any, name: str) -> str:
        return f"hello {name}"

    # Given a task declared with base=GroussetTask
    task = temp_task(greet, max_processing_time=60)
    # Then it is Celery's Django task class (GroussetDjangoTask is the same class)
    assert isinstance(task, DjangoTask) and GroussetDjangoTask is GroussetTask
    assert callable(task.delay_on_commit) and callable(task.apply_async_on_commit)
    # When delay_on_commit() is called inside transaction.atomic()
    with transaction.atomic(using=default_journal):
        task.delay_on_commit("ann")
        task.apply_async_on_commit(("bob",), idempotency_key="greet-bob")
        # Then nothing is published before the commit
        assert captured == []
    # And both are published on commit, through the guard's apply_async
    assert [(name, args) for name, args, _ in captured] == [(task.name, ("ann",)),
                                                            (task.name, ("bob",))]  # fmt: skip
    assert captured[1][2]["headers"]["grousset_key"] == "greet-bob"
    # And a rollback publishes nothing
    with pytest.raises(RuntimeError), transaction.atomic(using=default_journal):
        task.delay_on_commit("cy")
        raise RuntimeError("rolled back")
    assert len(captured) == 2


@needs_django_task
def test_delay_on_commit_runs_the_guarded_task_after_the_commit_in_eager_mode(
    default_journal: str, temp_task: Any
) -> None:
    from django.db import transaction

    ran: list[str] = []

    def note(self: Any, key: str) -> str:
        ran.append(key)
        return key

    task = temp_task(note, max_processing_time=60)
    key = f"on-commit-{uuid.uuid4().hex[:8]}"
    app.conf.task_always_eager = True
    try:
        # Given eager mode / When delay_on_commit() is called twice in a transaction
        with transaction.atomic(using=default_journal):
            task.delay_on_commit(key)
            task.delay_on_commit(key)
            # Then the task has not run before the commit
            assert ran == []
    finally:
        app.conf.task_always_eager = False
    # And after it, it ran once (the second call was a duplicate answered by the journal)
    assert ran == [key]
    fp = task.grousset_fingerprint((key,), {})
    row = Outcome.objects.using(default_journal).get(fingerprint=fp)
    assert row.status == "completed" and row.deliveries == 2


@needs_django_task
def test_an_on_commit_call_is_checked_before_the_commit(
    default_journal: str, temp_task: Any, captured: list[tuple[Any, ...]]
) -> None:
    """delay_on_commit / apply_async_on_commit checked a call in the on-commit callback,
    after the commit: a call that cannot be fingerprinted failed there (the view's rows
    committed, the call lost), and Django skipped every later on-commit callback."""
    from django.db import transaction

    from celery_grousset.exceptions import FingerprintError

    def ship(self: Any, order: Any) -> Any:
        return order

    task = temp_task(ship, max_processing_time=60)
    # When calls that cannot be published are made on commit inside a transaction
    with transaction.atomic(using=default_journal):
        with pytest.raises(FingerprintError, match="set"):
            task.delay_on_commit({1, 2})
        with pytest.raises(FingerprintError, match="idempotency_key"):
            task.apply_async_on_commit((1,), idempotency_key="")
        with pytest.raises(TypeError, match="did you mean idempotency_key"):
            task.apply_async_on_commit((1,), idempotency_keys="k")
        # Then each is refused at once, before the commit; a good one still goes on commit
        task.delay_on_commit(3)
        task.apply_async_on_commit((4,), idempotency_key="order-4")
        assert captured == []
    assert [args for _, args, _ in captured] == [(3,), (4,)]
    assert captured[1][2]["headers"]["grousset_key"] == "order-4"


def test_publishing_inside_a_transaction_warns(
    default_journal: str, temp_task: Any, captured: list[tuple[Any, ...]],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from django.db import transaction

    def ship(self: Any, order: int) -> int:
        return order

    task = temp_task(ship, max_processing_time=60)
    caplog.set_level("WARNING", logger="celery_grousset")

    def warnings() -> list[Any]:
        return [r for r in caplog.records if getattr(r, "grousset_event", "") ==
                "grousset.published_in_transaction"]  # fmt: skip

    # Given a guarded task published with delay() and apply_async() inside atomic()
    with transaction.atomic(using=default_journal):
        task.delay(1)
        with transaction.atomic(using=default_journal):  # a savepoint: still inside
            task.apply_async((2,))
    # Then each publish logs a WARNING naming the task, the database and the fix
    found = warnings()
    assert len(found) == 2 and len(captured) == 2
    message = found[0].getMessage()
    assert found[0].levelname == "WARNING"
    assert f"task={task.name} database={default_journal}" in message
    fix = f"{task.name}.delay_on_commit(...)" if HAS_DJANGO_TASK else "transaction.on_commit("
    assert fix in message
    assert found[0].grousset == {"event": "grousset.published_in_transaction",
                                 "task": task.name, "database": default_journal}  # fmt: skip
    caplog.clear()
    # When it is published outside a transaction, or on commit, or eagerly, or re-published
    # as a retry of a running delivery / Then no warning
    task.delay(3)
    with transaction.atomic(using=default_journal):
        if HAS_DJANGO_TASK:
            task.delay_on_commit(4)
        else:  # Celery 5.3: what delay_on_commit does
            transaction.on_commit(lambda: task.delay(4), using=default_journal)
        task.apply_async((5,), retries=1)
    app.conf.task_always_eager = True
    try:
        with transaction.atomic(using=default_journal):
            task.delay(6)
    finally:
        app.conf.task_always_eager = False
    assert warnings() == []
    # And the atomic block a Django TestCase wraps each test in does not count
    outer = transaction.atomic(using=default_journal)
    outer._from_testcase = True  # type: ignore[attr-defined]
    with outer:
        task.delay(7)
    assert warnings() == []


def test_a_publish_inside_transactions_on_two_databases_names_both(
    default_journal: str, temp_task: Any, captured: list[tuple[Any, ...]],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Under ATOMIC_REQUESTS every database has an open transaction: the warning named
    one of them, not always the one the view wrote to."""
    from django.db import transaction

    from tests import services

    services.require_database("postgresql")

    def ship(self: Any, order: int) -> int:
        return order

    task = temp_task(ship, max_processing_time=60)
    caplog.set_level("WARNING", logger="celery_grousset")
    # Given transactions open on two databases
    with transaction.atomic(using="postgresql"), transaction.atomic(using=default_journal):
        task.delay(1)
    # Then the warning names both
    [found] = [r for r in caplog.records if getattr(r, "grousset_event", "") ==
               "grousset.published_in_transaction"]  # fmt: skip
    assert set(found.grousset["database"].split(",")) == {default_journal, "postgresql"}
    caplog.clear()
    # And inside a transaction on another database than default alone, the fix it names
    # is on_commit on that database (delay_on_commit waits for default's commit)
    with transaction.atomic(using="postgresql"):
        task.delay(2)
    [found] = [r for r in caplog.records if getattr(r, "grousset_event", "") ==
               "grousset.published_in_transaction"]  # fmt: skip
    assert "using='postgresql'" in found.getMessage()
    assert "delay_on_commit" not in found.getMessage()


def test_the_outbox_relay_publishing_in_its_batch_transaction_does_not_warn(
    default_journal: str, captured: list[tuple[Any, ...]], caplog: pytest.LogCaptureFixture
) -> None:
    from django.db import transaction

    from celery_grousset import outbox
    from celery_grousset.models import OutboxMessage
    from tests.tasks import effect

    caplog.set_level("WARNING", logger="celery_grousset")
    with transaction.atomic(using=default_journal):
        row = outbox.enqueue(effect, ("relayed",), using=default_journal, queue="never")
    try:
        # Given the relay's publish of a committed row, inside its batch transaction
        with transaction.atomic(using=default_journal):
            outbox.publish(app, row)
        # Then it is published, without the warning
        assert [name for name, _, _ in captured] == [effect.name]
        assert "grousset.published_in_transaction" not in caplog.text
    finally:
        OutboxMessage.objects.using(default_journal).filter(pk=row.pk).delete()


def test_a_retry_mark_names_the_call_of_its_own_task_id_alone() -> None:
    """A Celery retry's message carries ``grousset_retry_of`` = [task id, the retried
    call's fingerprint, its own arguments' fingerprint]: with that task id and those
    arguments it is the retried call. The header copied onto another task's message (a
    tracing hook forwarding headers), or onto a message of the same task id with other
    arguments (user code re-sending through signature_from_request), is ignored."""
    from types import SimpleNamespace

    from celery_grousset import guard
    from celery_grousset.delivery import RETRY_OF_HEADER
    from tests.tasks import capture_unkeyed

    first = capture_unkeyed.grousset_fingerprint(("o-1", "3.00"))
    args = ("o-1", "3.00", "backup")
    own = capture_unkeyed.grousset_fingerprint(args)
    other = capture_unkeyed.grousset_fingerprint(("o-2", "3.00", "backup"))

    def fingerprint(task_id: str, mark: object) -> str:
        req = SimpleNamespace(id=task_id, headers={RETRY_OF_HEADER: mark}, delivery_info={})
        return guard.fingerprint_of(capture_unkeyed.grousset_call(args, {}, None, req))

    assert own != first
    assert fingerprint("t-1", ["t-1", first, own]) == first
    assert fingerprint("t-2", ["t-1", first, own]) == own
    assert fingerprint("t-1", ["t-1", first, other]) == own
    assert fingerprint("t-1", ["t-1", "X" * 64, own]) == own
    assert fingerprint("t-1", ["t-1", first]) == own


def test_an_eager_retry_with_other_arguments_stays_its_call(journal: str) -> None:
    from tests.tasks import capture_unkeyed

    order = f"o-{uuid.uuid4().hex[:8]}"
    # Given an eager call whose first attempt retries with other arguments
    first = capture_unkeyed.apply((order, "3.00")).get()
    # When the call is applied again
    again = capture_unkeyed.apply((order, "3.00")).get()
    # Then it is answered from the retry's outcome: one effect
    assert first == again == f"captured {order} via backup"
    assert ledger(journal, f"capture-{order}") == 2  # the "down" mark, then the backup


def test_a_copy_sent_again_leaves_the_main_process_claim_and_decision_behind() -> None:
    """Celery copies a request's own fields into the headers of a copy it sends again
    (retry(), signature_from_request, the guard's requeue): the claim and the decision
    the worker's main process put there for its child (with the memo) travelled to the
    broker with it."""
    from celery import Task

    from celery_grousset import preclaim
    from tests.tasks import effect

    # Given a delivery as a pool child sees it under WORKER_CLAIM, with a header of its own
    effect.push_request(id="t-1", args=["k"], kwargs={}, headers={
        preclaim.FIELD: ["token"], preclaim.DECIDED: ["memo" * 10], "x-trace": "abc"})
    try:
        # When the task builds its copy (as retry() does), Then those two stay behind
        sig = effect.signature_from_request()
        plain = Task.signature_from_request(effect)  # (Celery's own, for comparison)
    finally:
        effect.pop_request()
    assert preclaim.DECIDED in plain.options["headers"]  # (what Celery would send)
    assert sig.options["headers"] == {"x-trace": "abc"}


def test_a_retry_not_raised_in_a_guarded_task_is_warned_about(
    journal: str, temp_task: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """self.retry(countdown=1, throw=False), then return: the attempt completed, and its
    retry (the same call) was answered from the memo: a polling task stopped silently."""

    def poll(self: Any, key: str) -> str:
        self.retry(countdown=1, throw=False)
        return "not ready yet"

    def raised(self: Any, key: str) -> str:
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return "ready"

    not_raised = temp_task(poll, max_processing_time=30)
    raising = temp_task(raised, max_processing_time=30)
    # When a guarded task asks for a retry without raising it, and another raises it
    with caplog.at_level(logging.WARNING, logger="celery_grousset"):
        assert not_raised.apply(("k",)).get() == "not ready yet"
        assert raising.apply(("k",)).get() == "ready"
    # Then the first is warned about, naming the fix; the raised retry is not
    lines = [m for m in caplog.messages if m.startswith("grousset.retry_not_raised")]
    assert len(lines) == 1 and f"task={not_raised.name}" in lines[0], caplog.messages
    assert "raise self.retry(...)" in lines[0]
