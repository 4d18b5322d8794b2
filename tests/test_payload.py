"""Same key, different payload (issue 16, "Also"): a reused ``idempotency_key`` /
``grousset_key`` with other arguments is refused with ``PayloadMismatch`` — it never
returns the first call's memo and never runs — unless ``validate_payload`` is off
(docs/configuration.md, "What identifies a call"). Eager tasks, on every backend."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from django.test import override_settings

from celery_grousset import GroussetTask
from celery_grousset.claim import ClaimRequest
from celery_grousset.exceptions import GroussetError, PayloadMismatch
from celery_grousset.fingerprint import bind_arguments, payload_hash
from celery_grousset.models import Outcome
from celery_grousset.store import get_store
from tests.celeryapp import app
from tests.ledger.models import Effect
from tests.tasks import record

KEY = "order-42"


@pytest.fixture
def make_task() -> Iterator[Any]:
    """A throw-away ``pay(order_id, amount)`` task on the test app, options as given."""
    made: list[str] = []

    def make(**options: Any) -> Any:
        name = f"tests.payload.pay.{uuid.uuid4().hex[:8]}"
        made.append(name)

        def pay(self: Any, order_id: int, amount: Any, note: str = "") -> str:
            record(f"{self.name}:{order_id}:{amount}")
            if options.get("on_failure") == "memoize":
                raise ValueError(f"declined {amount}")
            return f"paid {amount} for {order_id}"

        options.setdefault("max_processing_time", 30)
        options.setdefault("base", GroussetTask)
        return app.task(bind=True, name=name, **options)(pay)

    yield make
    for name in made:
        app.tasks.pop(name, None)


def keyed(task: Any, amount: Any, key: str = KEY, **kwargs: Any) -> Any:
    """An eager call with a per-call idempotency key (as apply_async sends it)."""
    return task.apply(kwargs={"order_id": 42, "amount": amount, **kwargs},
                      headers={"grousset_key": key})  # fmt: skip


def effects(alias: str, task: Any, amount: Any) -> int:
    return Effect.objects.using(alias).filter(key=f"{task.name}:42:{amount}").count()


def row(alias: str, task: Any, key: str | None = KEY, **kwargs: Any) -> Outcome:
    fp = task.grousset_fingerprint((), {"order_id": 42, **kwargs}, key)
    return Outcome.objects.using(alias).get(fingerprint=fp, task_name=task.name)


def claim_request(task: Any, fp: str, payload: str) -> ClaimRequest:
    """A claim of ``fp`` by another attempt of ``task``, for the payload hash ``payload``."""
    return ClaimRequest(
        task.grousset_options().processor_id, fp, task.name, "other", uuid.uuid4().hex, "w",
        "", 30.0, 3600.0, 3, payload_hash=payload,
    )  # fmt: skip


def test_same_key_other_payload_is_refused(
    journal: str, make_task: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pay = make_task()
    # Given a call keyed "order-42" for amount 10, completed
    assert keyed(pay, 10).get() == "paid 10 for 42"
    # When the same key comes with amount 20
    with caplog.at_level(logging.INFO, logger="celery_grousset"), pytest.raises(
        PayloadMismatch
    ) as err:
        keyed(pay, 20).get()
    # Then it is refused: not run, and the first call's memo is not its answer
    assert isinstance(err.value, GroussetError)
    assert effects(journal, pay, 10) == 1 and effects(journal, pay, 20) == 0
    rec = row(journal, pay)
    text = str(err.value)
    assert pay.name in text and rec.fingerprint[:16] in text
    assert "validate_payload" in text and "paid 10" not in text
    assert err.value.fingerprint == rec.fingerprint
    # And the record keeps the first call's payload hash and memo
    assert rec.status == "completed" and rec.deliveries == 2
    assert rec.payload_hash == err.value.stored_hash != err.value.given_hash
    # And it was logged as an event of its own
    [line] = [r for r in caplog.records if getattr(r, "grousset_event", "") ==
              "grousset.payload_mismatch"]  # fmt: skip
    assert line.levelno == logging.ERROR and line.grousset_fingerprint == rec.fingerprint
    # And a third call with the first payload still gets the memo
    assert keyed(pay, 10).get() == "paid 10 for 42"


def test_same_key_same_payload_gets_the_memo(journal: str, make_task: Any) -> None:
    pay = make_task()
    # Given a keyed call / When it comes again, positionally bound the same way
    first = keyed(pay, 10).get()
    again = pay.apply((42, 10), headers={"grousset_key": KEY}).get()
    # Then the memo, one effect
    assert again == first == "paid 10 for 42"
    assert effects(journal, pay, 10) == 1
    rec = row(journal, pay)
    bound = bind_arguments(pay._signature(), (), {"order_id": 42, "amount": 10})
    assert rec.payload_hash == payload_hash(pay.name, bound) and len(rec.payload_hash) == 64


def test_validation_off_by_task_option_returns_the_memo(journal: str, make_task: Any) -> None:
    # Given a task whose key is meant to cover varying payloads
    pay = make_task(validate_payload=False)
    assert pay.grousset_options().validate_payload is False
    keyed(pay, 10).get()
    # When the key comes with another amount / Then the memo (documented), one effect
    assert keyed(pay, 20).get() == "paid 10 for 42"
    assert effects(journal, pay, 20) == 0
    assert row(journal, pay).payload_hash == ""  # nothing to compare, nothing stored


def test_validation_off_by_setting_and_the_task_option_wins(alias: str, make_task: Any) -> None:
    loose, strict = make_task(), make_task(validate_payload=True)
    with override_settings(GROUSSET={"DATABASE": alias, "VALIDATE_PAYLOAD": False}):
        # Given GROUSSET["VALIDATE_PAYLOAD"] = False
        keyed(loose, 10).get()
        keyed(strict, 10).get()
        # Then a task without the option returns the memo
        assert keyed(loose, 20).get() == "paid 10 for 42"
        # And a task with validate_payload=True still refuses
        with pytest.raises(PayloadMismatch):
            keyed(strict, 20).get()


def test_grousset_key_other_argument_is_refused(journal: str, make_task: Any) -> None:
    pay = make_task(grousset_key=("order_id",))
    # Given a charge keyed on order_id only
    assert pay.apply((42, 10)).get() == "paid 10 for 42"
    # When the same order comes with another amount, or another note
    with pytest.raises(PayloadMismatch, match="set validate_payload=False on the task"):
        pay.apply((42, 20)).get()
    with pytest.raises(PayloadMismatch):
        pay.apply((42, 10), {"note": "again"}).get()
    # Then neither ran; the same call still gets the memo
    assert effects(journal, pay, 20) == 0 and effects(journal, pay, 10) == 1
    assert pay.apply(kwargs={"order_id": 42, "amount": 10}).get() == "paid 10 for 42"


@pytest.mark.parametrize("options", [
    {"idempotency_keys": KEY}, {"idempotencyKey": KEY}, {"idempotent_key": KEY},
    {"grousset_key": KEY}, {"grousset_keys": KEY},
    {"headers": {"grousset-key": KEY}}, {"headers": {"Grousset_Key": KEY}},
    {"headers": {"grousset_keys": KEY}}, {"headers": {"idempotency_key": KEY}},
])  # fmt: skip
def test_a_misspelt_key_is_refused_before_the_call(
    journal: str, make_task: Any, options: dict[str, Any]
) -> None:
    from django.db import transaction

    from celery_grousset import outbox
    from celery_grousset.models import OutboxMessage

    pay = make_task()
    # Given a call's key under a name nothing reads: it would be keyed by all arguments
    call = {"kwargs": {"order_id": 42, "amount": 10}, **options}
    # When it is applied, published or enqueued / Then it is refused, naming the option
    with pytest.raises((TypeError, ValueError), match="idempotency_key") as applied:
        pay.apply(**call)
    if applied.type is TypeError:  # an option: the error names the call that was made
        assert f"{pay.name}.apply() got the option" in str(applied.value)
    with pytest.raises((TypeError, ValueError), match="idempotency_key"):
        pay.apply_async(**call)
    with (
        pytest.raises((TypeError, ValueError), match="idempotency_key"),
        transaction.atomic(using=journal),
    ):
        outbox.enqueue(pay, using=journal, **call)
    # And nothing ran, nothing was written
    assert effects(journal, pay, 10) == 0
    assert not OutboxMessage.objects.using(journal).filter(task_name=pay.name).exists()
    # While the names that work are taken
    assert keyed(pay, 10).get() == "paid 10 for 42"


def test_a_delivery_sent_again_keeps_the_headers_it_came_with() -> None:
    from celery_grousset.publish_check import refuse_misspelt_key

    # Given a delivery whose message came with a header of another producer's
    headers = {"Idempotency-Key": "from-elsewhere"}
    # When Celery's retry() or the guard's requeue sends it again (they pass retries)
    # Then it is not refused: the message would be lost
    refuse_misspelt_key("t", {"headers": headers, "retries": 1})
    # And a plain task's own headers are its own (outbox.enqueue of a name)
    refuse_misspelt_key("t", {"headers": headers}, guarded=False)
    # While a caller's own publish of it is refused
    with pytest.raises(ValueError, match="idempotency_key"):
        refuse_misspelt_key("t", {"headers": headers})


def test_a_celery_once_option_left_on_a_call_is_refused_before_the_call(
    journal: str, make_task: Any
) -> None:
    from django.db import transaction

    from celery_grousset import outbox
    from celery_grousset.models import OutboxMessage
    from celery_grousset.publish_check import refuse_misspelt_key

    pay = make_task()
    # Given a caller left as it was under celery-once, which read a per-call timeout
    call = {"kwargs": {"order_id": 42, "amount": 10}, "once": {"timeout": 60, "graceful": True}}
    # When it is applied, published, published after the commit or enqueued
    # Then it is refused, naming the option and what governs here instead
    with pytest.raises(TypeError, match=r"once=.*max_processing_time.*Remove once="):
        pay.apply(**call)
    with pytest.raises(TypeError, match="celery-once's per-call option"):
        pay.apply_async(**call)
    with pytest.raises(TypeError, match="celery-once"), transaction.atomic(using=journal):
        pay.apply_async_on_commit(**call)
    with pytest.raises(TypeError, match="celery-once"), transaction.atomic(using=journal):
        outbox.enqueue(pay, using=journal, **call)
    # And nothing ran, nothing was written
    assert effects(journal, pay, 10) == 0
    assert not OutboxMessage.objects.using(journal).filter(task_name=pay.name).exists()
    # While a task that is not guarded keeps its own options (celery-once's own base)
    refuse_misspelt_key("t", {"once": {"timeout": 60}}, guarded=False)
    # And the same call without the option runs
    assert pay.apply(kwargs={"order_id": 42, "amount": 10}).get() == "paid 10 for 42"
    assert effects(journal, pay, 10) == 1


@functools.cache
def cached_order_of(order_id: int, amount: Any, note: str = "") -> int:
    return order_id


def test_a_key_method_or_a_cached_key_function_keeps_working(
    journal: str, make_task: Any
) -> None:
    class Keyed(GroussetTask):  # a def in a class body is the method it is written as
        abstract = True

        def grousset_key(task, order_id: int, **_: Any) -> str:
            return f"{task.name}:{order_id}"

    for options in ({"base": Keyed}, {"grousset_key": cached_order_of}):
        pay = make_task(validate_payload=False, **options)
        # When the same order comes twice, with another note the second time
        assert pay.apply((42, 10)).get() == "paid 10 for 42"
        assert pay.apply((42, 10), {"note": "again"}).get() == "paid 10 for 42"
        # Then the key saw the arguments, and the body ran once
        assert effects(journal, pay, 10) == 1


def order_of(order_id: int, **_: Any) -> int:
    """A key function: called with the bound arguments as keywords."""
    return order_id


def test_a_callable_grousset_key_gets_the_bound_arguments(journal: str, make_task: Any) -> None:
    # Given a charge keyed by a function of its arguments, given to the decorator as
    # docs/configuration.md shows (Celery makes it a class attribute of the task)
    pay = make_task(grousset_key=order_of, validate_payload=False)
    # When the same order comes twice, with another note the second time
    assert pay.apply((42, 10)).get() == "paid 10 for 42"
    assert pay.apply((42, 10), {"note": "again"}).get() == "paid 10 for 42"
    # Then the function was called with the arguments alone (not the task), and the
    # body ran once
    assert effects(journal, pay, 10) == 1


def test_a_plain_call_stores_no_payload_hash(journal: str, make_task: Any) -> None:
    pay = make_task()
    # Given a call without a key: its fingerprint already covers every argument
    pay.apply((42, 10)).get()
    # Then no payload hash is stored beside it
    assert row(journal, pay, None, amount=10).payload_hash == ""


def test_an_in_flight_claim_of_another_payload_is_refused_at_once(
    journal: str, make_task: Any
) -> None:
    pay = make_task()
    fp = pay.grousset_fingerprint((), {"order_id": 42, "amount": 10}, KEY)
    # Given a fresh claim on the key, held by a call with another payload
    holder = claim_request(pay, fp, "f" * 64)
    assert get_store(journal).claim(holder).owned
    # When this call arrives (eager: it would wait for the holder up to 30 s)
    with pytest.raises(PayloadMismatch, match="in_flight"):
        keyed(pay, 10).get()
    # Then it was refused without waiting, and did not run
    assert effects(journal, pay, 10) == 0


def test_a_memoized_failure_of_another_payload_is_refused(journal: str, make_task: Any) -> None:
    pay = make_task(on_failure="memoize")
    # Given a failure memoized for amount 10
    with pytest.raises(ValueError, match="declined 10"):
        keyed(pay, 10).get()
    # When the key comes with amount 20 / Then PayloadMismatch, not the other call's error
    with pytest.raises(PayloadMismatch):
        keyed(pay, 20).get()
    with pytest.raises(ValueError, match="declined 10"):
        keyed(pay, 10).get()
    assert effects(journal, pay, 20) == 0


def test_a_stale_claim_of_another_payload_is_not_taken_over(
    journal: str, make_task: Any
) -> None:
    pay = make_task()
    fp = pay.grousset_fingerprint((), {"order_id": 42, "amount": 10}, KEY)
    store = get_store(journal)
    # Given a dead attempt's stale claim of the key, for other arguments
    store.claim(claim_request(pay, fp, "f" * 64))
    Outcome.objects.using(journal).filter(fingerprint=fp).update(
        started_at=F("started_at") - timedelta(seconds=31),
        stale_at=F("stale_at") - timedelta(seconds=31),
    )
    # When this call finds it / Then it is refused, does not run, and takes nothing over
    with pytest.raises(PayloadMismatch):
        keyed(pay, 10).get()
    rec = row(journal, pay)
    assert (rec.status, rec.takeovers, rec.payload_hash) == ("in_flight", 0, "f" * 64)
    assert effects(journal, pay, 10) == 0
    # A call of the record's own arguments takes it over, and writes its own hash
    Outcome.objects.using(journal).filter(fingerprint=fp).update(payload_hash="")
    assert keyed(pay, 10).get() == "paid 10 for 42"
    rec = row(journal, pay)
    assert rec.takeovers == 1 and rec.payload_hash not in ("", "f" * 64)


def test_a_released_failure_of_another_payload_is_not_reclaimed(
    journal: str, make_task: Any
) -> None:
    pay = make_task()
    fp = pay.grousset_fingerprint((), {"order_id": 42, "amount": 10}, KEY)
    # Given the key's attempt for other arguments failed and released its claim
    req = claim_request(pay, fp, "f" * 64)
    store = get_store(journal)
    store.claim(req)
    assert store.release(req.processor_id, fp, req.token)
    assert row(journal, pay).status == "failed"
    # When the key comes with amount 10 / Then refused, and it did not run
    with pytest.raises(PayloadMismatch):
        keyed(pay, 10).get()
    assert effects(journal, pay, 10) == 0
    # The record's own arguments may retry (here: a record without a hash)
    Outcome.objects.using(journal).filter(fingerprint=fp).update(payload_hash="")
    assert keyed(pay, 10).get() == "paid 10 for 42"


def test_a_record_without_payload_hash_is_not_validated(journal: str, make_task: Any) -> None:
    pay = make_task()
    keyed(pay, 10).get()
    # Given a record written before payload hashes existed (or with validation off)
    Outcome.objects.using(journal).filter(task_name=pay.name).update(payload_hash="")
    # When the key comes with another amount / Then nothing to compare: the memo
    assert keyed(pay, 20).get() == "paid 10 for 42"


def test_arguments_that_cannot_be_hashed_are_not_validated(journal: str, make_task: Any) -> None:
    pay = make_task()
    # Given a keyed call whose argument has no canonical encoding (the key names the call)
    assert keyed(pay, {1, 2}).get() == "paid {1, 2} for 42"
    # Then it ran as before, stored no payload hash, and its duplicates get the memo
    assert row(journal, pay).payload_hash == ""
    assert keyed(pay, {3}).get() == "paid {1, 2} for 42"


def test_validate_payload_must_be_a_bool(make_task: Any) -> None:
    from celery_grousset.conf import GroussetSettingsError

    # Given validate_payload="false" (a str: it would read as on) / Then it is refused
    with pytest.raises(GroussetSettingsError, match="validate_payload"):
        make_task(validate_payload="false").grousset_options()
    with override_settings(GROUSSET={"VALIDATE_PAYLOAD": 0}), pytest.raises(
        GroussetSettingsError, match="VALIDATE_PAYLOAD"
    ):
        make_task().grousset_options()


# -- protect(): the arguments it passes to fn are the payload -----------------------------


def test_protect_refuses_the_same_key_with_other_arguments(journal: str) -> None:
    from celery_grousset import protect

    key = f"refund-{uuid.uuid4().hex[:8]}"
    ran: list[Any] = []

    def refund(order_id: int, amount: str) -> str:
        ran.append(amount)
        return f"refunded {amount}"

    # Given a protect() call that ran for amount 10
    assert protect(key, refund, 42, amount="10", max_processing_time=30) == "refunded 10"
    # When the key comes with amount 20 / Then PayloadMismatch, and nothing ran; the
    # message names protect()'s own switch, not a task's
    with pytest.raises(PayloadMismatch, match="other arguments") as refused:
        protect(key, refund, 42, amount="20", max_processing_time=30)
    assert "claimed by another protect() call" in str(refused.value)
    assert "pass validate_payload=False to protect()" in str(refused.value)
    assert "on the task" not in str(refused.value)
    # The same arguments still get the memo; validation off gets it whatever they are
    assert protect(key, refund, 42, amount="10", max_processing_time=30) == "refunded 10"
    assert protect(key, refund, 42, amount="20", max_processing_time=30,
                   validate_payload=False) == "refunded 10"  # fmt: skip
    assert ran == ["10"]


def test_protect_without_arguments_stores_no_payload_hash(journal: str) -> None:
    from celery_grousset import protect

    key = f"import-{uuid.uuid4().hex[:8]}"
    assert protect(key, lambda: 1, max_processing_time=30) == 1
    # A closure's values are invisible: nothing to compare, the memo as before
    rec = Outcome.objects.using(journal).get(task_name="protect", args_repr=f"key={key!r}")
    assert rec.payload_hash == ""
    assert protect(key, lambda: 2, max_processing_time=30) == 1
