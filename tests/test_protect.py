"""protect(): the four cases, configuration errors, fail-closed, and a race of
8 real OS processes over 500 keys on every backend."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.models import F

from celery_grousset import protect
from celery_grousset.claim import PROTECT_NAME
from celery_grousset.exceptions import (
    ClaimInFlight,
    FingerprintError,
    InvalidArgument,
    StoreUnavailable,
)
from celery_grousset.models import Delivery, Outcome
from celery_grousset.store import reset_stores
from tests.ledger.models import Effect
from tests.racer import race, run_racers


def test_runs_once_and_returns_memo(alias: str, processor: str) -> None:
    calls: list[int] = []

    def load(day: str) -> dict[str, Any]:
        calls.append(1)
        return {"day": day, "rows": 42}

    # Given a key never seen / When protect() is called twice
    first = protect(
        "import:2026-11-29",
        load,
        "2026-11-29",
        max_processing_time=60,
        processor_id=processor,
        database=alias,
    )
    second = protect(
        "import:2026-11-29",
        load,
        "2026-11-29",
        max_processing_time=60,
        processor_id=processor,
        database=alias,
    )
    # Then the function ran once and both callers got its value
    assert calls == [1]
    assert first == second == {"day": "2026-11-29", "rows": 42}
    rec = Outcome.objects.using(alias).get(processor_id=processor)
    assert (rec.status, rec.deliveries, rec.task_name) == ("completed", 2, PROTECT_NAME)
    # ... and the second call is counted as a duplicate: a protect() call has no task id,
    # so no call is "the record's own delivery again" (nor listed under Deliveries)
    assert rec.duplicates == 1
    assert not Delivery.objects.using(alias).filter(processor_id=processor).exists()


def test_a_key_that_quotes_a_sensitive_argument_is_stored_with_it_masked(
    alias: str, processor: str
) -> None:
    """protect()'s key was masked by the secret patterns alone: a key built from the call's
    own card token (a sensitive argument, positional or by name) was stored in clear."""

    def charge(card_token: str, amount: int) -> str:
        return "charged"

    # Given keys built from the call's sensitive arguments / When protect() journals them
    protect("charge:tokcard9x8y7z6w", charge, "tokcard9x8y7z6w", 10, max_processing_time=60,
            processor_id=processor, database=alias)  # fmt: skip
    protect("reset:pw-in-kw-1234", lambda password: 1, password="pw-in-kw-1234",
            max_processing_time=60, processor_id=processor, database=alias)  # fmt: skip
    stored = sorted(Outcome.objects.using(alias).filter(processor_id=processor)
                    .values_list("args_repr", flat=True))  # fmt: skip
    # Then the argument's value is masked in the stored key, the rest kept
    assert stored == ["key='charge:***'", "key='reset:***'"], stored


def test_a_key_that_quotes_a_secret_is_stored_redacted_and_cut(alias: str, processor: str) -> None:
    from django.test import override_settings

    # Given keys that quote a token (a password-reset link's, a bearer token)
    reset, bearer = "pwreset:token=RESETTOKEN_9f8e7d", "Bearer PROTECTBEARER123"

    def stored(key: str) -> str:
        protect(key, lambda: 1, max_processing_time=60, processor_id=processor, database=alias)
        return str(Outcome.objects.using(alias).filter(processor_id=processor)
                   .latest("started_at").args_repr)  # fmt: skip

    # When protect() journals them / Then the secrets are not stored, the rest is
    assert stored(reset) == "key='pwreset:token=***'"
    assert stored(bearer) == "key='Bearer ***'"
    # And ARGS_REPR_MAX_LENGTH applies to the key as to any args_repr (0: none stored)
    with override_settings(GROUSSET={"DATABASE": alias, "ARGS_REPR_MAX_LENGTH": 0}):
        assert stored("order:42") == ""


def test_missing_max_processing_time_is_a_configuration_error(alias: str) -> None:
    # Given no max_processing_time anywhere / Then protect() refuses, saying where to set it
    with pytest.raises(ImproperlyConfigured, match="max_processing_time") as err:
        protect("k", lambda: 1, database=alias)
    assert "GROUSSET['MAX_PROCESSING_TIME']" in str(err.value)


def test_in_flight_raises_or_waits(alias: str, processor: str) -> None:
    # Given a fresh claim held by someone else
    from celery_grousset.claim import ClaimRequest
    from celery_grousset.fingerprint import fingerprint
    from celery_grousset.store import get_store

    fp = fingerprint(PROTECT_NAME, idempotency_key="busy")
    store = get_store(alias)
    holder = ClaimRequest(
        processor, fp, PROTECT_NAME, "", uuid.uuid4().hex, "w", "", 60.0, 3600.0, 3
    )
    assert store.claim(holder).owned
    # When another caller asks with on_in_flight="raise" / Then it is told, nothing runs
    with pytest.raises(ClaimInFlight) as err:
        protect(
            "busy",
            lambda: pytest.fail("must not run"),
            max_processing_time=60,
            processor_id=processor,
            database=alias,
            on_in_flight="raise",
        )
    assert 50 < err.value.retry_in <= 60
    # And a waiting caller waits for the holder's own deadline (its stale_at, whatever the
    # caller's max_processing_time), then takes over: age the claim to 0.3 s before it
    t0 = time.monotonic()  # (before the ageing: a pause after it cannot hide the wait)
    Outcome.objects.using(alias).filter(processor_id=processor).update(
        started_at=F("started_at") - timedelta(seconds=59.7),
        stale_at=F("stale_at") - timedelta(seconds=59.7),
    )
    held = Outcome.objects.using(alias).get(processor_id=processor).fence
    value = protect(
        "busy", lambda: "mine", max_processing_time=60, processor_id=processor, database=alias
    )
    waited = time.monotonic() - t0
    assert value == "mine"
    assert 0.1 < waited < 5, f"waited {waited:.2f} s for a claim stale in 0.3 s"
    rec = Outcome.objects.using(alias).get(processor_id=processor)
    assert (rec.status, rec.takeovers) == ("completed", 1) and rec.fence > held


def test_a_caller_that_waits_for_the_holder_is_one_duplicate(alias: str, processor: str) -> None:
    """A waiting caller's claim after the holder finished was counted as one more
    duplicate: a row's ``duplicates`` exceeded its other deliveries (a review: 100
    deliveries of one call, 148 duplicates)."""
    import threading

    from celery_grousset.claim import ClaimRequest
    from celery_grousset.fingerprint import fingerprint
    from celery_grousset.store import Completion, get_store

    fp = fingerprint(PROTECT_NAME, idempotency_key="awaited")
    store = get_store(alias)
    holder = ClaimRequest(
        processor, fp, PROTECT_NAME, "", uuid.uuid4().hex, "w", "", 60.0, 3600.0, 3
    )
    assert store.claim(holder).owned
    got: list[Any] = []
    # Given a caller waiting for the claim another holds
    waiter = threading.Thread(target=lambda: got.append(another_caller(lambda: protect(
        "awaited", lambda: "ran", max_processing_time=60, processor_id=processor,
        database=alias))))  # fmt: skip
    waiter.start()
    deadline = time.monotonic() + 10
    while Outcome.objects.using(alias).get(processor_id=processor).deliveries < 2:
        assert time.monotonic() < deadline, "the waiting caller never claimed"
        time.sleep(0.02)
    # When the holder completes
    memo = Completion("completed", b'"held"', "application/json;utf-8")
    assert store.finish(processor, fp, holder.token, memo)
    waiter.join(10)
    # Then the caller gets its memo, and is counted one duplicate (and two deliveries:
    # its first claim and the one after the wait)
    assert got == ["held"], got
    rec = Outcome.objects.using(alias).get(processor_id=processor)
    assert (rec.deliveries, rec.duplicates) == (3, 1), (rec.deliveries, rec.duplicates)


def test_failure_releases_then_reruns(alias: str, processor: str) -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("first attempt fails")
        return "ok"

    # Given a first attempt that raises
    with pytest.raises(ValueError):
        protect("flaky", flaky, max_processing_time=60, processor_id=processor, database=alias)
    rec = Outcome.objects.using(alias).get(processor_id=processor)
    assert rec.status == "failed" and rec.error == "ValueError: first attempt fails"
    # When called again / Then it runs again (on_failure="release") and completes
    assert (
        protect("flaky", flaky, max_processing_time=60, processor_id=processor, database=alias)
        == "ok"
    )
    assert len(attempts) == 2


def another_caller(call: Any) -> Any:
    """``call()`` made by another caller: a thread of its own (a call of a key made inside
    that key's own run is refused)."""
    import threading

    from django.db import connections

    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert out, "the other caller failed (its error is printed above)"
    return out[0]


@pytest.mark.parametrize("transactional", [False, True])
def test_a_fenced_out_attempt_says_how_long_it_ran_and_the_fix(
    alias: str, processor: str, transactional: bool
) -> None:
    from django.db import connections

    from celery_grousset.exceptions import FencedOut

    if transactional and connections[alias].vendor == "sqlite":
        pytest.skip("SQLite: the attempt's transaction holds the write lock a takeover needs")
    opts = {"processor_id": processor, "database": alias, "transactional": transactional}

    def zombie() -> str:  # runs past max_processing_time: the next call takes it over
        time.sleep(0.5)
        taker = another_caller(lambda: protect("zombie", lambda: "taker",
                                                max_processing_time=0.2, **opts))  # fmt: skip
        assert taker == "taker"
        return "zombie"

    # When an attempt that overran its max_processing_time is fenced out
    with pytest.raises(FencedOut) as fenced:
        protect("zombie", zombie, max_processing_time=0.2, **opts)
    # Then its error says how long it ran against the limit, and what to change
    text = str(fenced.value)
    assert "s after its body started (max_processing_time 0.2s)" in text, text
    assert "raise max_processing_time above the task's longest run" in text, text
    assert ("rolled back" if transactional else "runs the effect too") in text, text


def test_a_failing_attempt_fenced_out_logs_its_own_fence(
    alias: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A failing zombie's grousset.fenced_out line said fence=0, not its own fence."""
    import logging

    opts = {"processor_id": processor, "database": alias}

    def zombie() -> str:  # runs past max_processing_time, taken over, then fails
        time.sleep(0.5)
        taker = another_caller(lambda: protect("zombie-fails", lambda: "taker",
                                               max_processing_time=0.2, **opts))  # fmt: skip
        assert taker == "taker"
        raise RuntimeError("late failure")

    # When an attempt that overran and was taken over then fails
    with caplog.at_level(logging.ERROR, logger="celery_grousset"), pytest.raises(RuntimeError):
        protect("zombie-fails", zombie, max_processing_time=0.2, **opts)
    # Then its fenced-out line names its own fence: one the journal gave a claim, not 0
    [line] = [r for r in caplog.records if r.getMessage().startswith("grousset.fenced_out")]
    fence = line.grousset_fence  # type: ignore[attr-defined]
    assert fence != 0 and fence < Outcome.objects.using(alias).get(processor_id=processor).fence


@pytest.mark.parametrize("transactional", [False, True])
def test_an_attempt_given_up_on_while_it_still_ran_records_its_outcome(
    alias: str, processor: str, transactional: bool
) -> None:
    """max_takeovers=0 and an attempt slower than max_processing_time: the duplicate that
    found its claim stale got GaveUp, then the attempt's completion was refused (FencedOut:
    'the attempt that holds the claim now runs the effect too', though none did), and
    released as GaveUp's text says, the call ran its effect again."""
    import threading

    from django.db import connections

    from celery_grousset.exceptions import GaveUp

    if transactional and connections[alias].vendor == "sqlite":
        pytest.skip("SQLite: the attempt's transaction holds the write lock a give-up needs")
    opts: dict[str, Any] = {"processor_id": processor, "database": alias, "max_takeovers": 0,
                            "max_processing_time": 0.2, "transactional": transactional}  # fmt: skip
    ran: list[int] = []
    seen: list[BaseException] = []

    def duplicate() -> None:
        try:
            protect("slow", lambda: "duplicate", **opts)
        except BaseException as exc:
            seen.append(exc)
        finally:
            connections.close_all()

    def slow() -> str:  # a live attempt past its max_processing_time
        time.sleep(0.5)
        thread = threading.Thread(target=duplicate)
        thread.start()
        thread.join(30)
        ran.append(1)
        return "done"

    # Given a duplicate that found the attempt's claim stale and gave up on it
    # When the attempt then completes / Then its outcome is recorded, not refused
    assert protect("slow", slow, **opts) == "done"
    assert [type(e) for e in seen] == [GaveUp], seen
    [rec] = Outcome.objects.using(alias).filter(processor_id=processor)
    assert (rec.status, bytes(rec.result or b"")) == ("completed", b'"done"'), rec.error
    # And the next call gets its memo: the effect ran once
    assert protect("slow", lambda: "again", **opts) == "done" and ran == [1]


@pytest.mark.parametrize("transactional", [False, True])
def test_an_attempt_released_and_claimed_again_says_it_was_released(
    alias: str, processor: str, transactional: bool
) -> None:
    from django.db import connections

    from celery_grousset import journal
    from celery_grousset.exceptions import FencedOut

    if transactional and connections[alias].vendor == "sqlite":
        pytest.skip("SQLite: the attempt's transaction holds the write lock a release needs")
    opts = {"processor_id": processor, "database": alias, "transactional": transactional}

    def released() -> str:  # an operator releases it mid-run; another call claims it
        [rec] = Outcome.objects.using(alias).filter(processor_id=processor)
        assert journal.release(rec, alias)
        taker = another_caller(lambda: protect("released", lambda: "taker",
                                                max_processing_time=60, **opts))  # fmt: skip
        assert taker == "taker"
        return "first"

    # When an attempt whose fresh claim was released and claimed again completes
    with pytest.raises(FencedOut) as fenced:
        protect("released", released, max_processing_time=60, **opts)
    # Then its error says so, not that it overran its max_processing_time
    text = str(fenced.value)
    assert "It was not stale: it was released" in text, text
    assert "raise max_processing_time" not in text, text


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_stopped_process_keeps_its_claim_for_a_takeover(
    alias: str, processor: str, stop: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    def interrupted() -> None:
        ran.append("effect")
        raise stop()

    opts: dict[str, Any] = {"processor_id": processor, "database": alias}
    # Given an effect interrupted by a stop of the process (Ctrl-C, a pool child's SIGTERM)
    with caplog.at_level("WARNING", logger="celery_grousset"), pytest.raises(stop):
        protect("stopped", interrupted, max_processing_time=60, **opts)
    # Then its claim stays in flight (the effect may have happened) until it is stale,
    # and the log says so
    rec = Outcome.objects.using(alias).get(processor_id=processor)
    assert (rec.status, rec.takeovers, ran) == ("in_flight", 0, ["effect"])
    assert rec.stale_at - rec.started_at == timedelta(seconds=60)
    assert any("grousset.interrupted" in r.getMessage() for r in caplog.records)


def test_a_positional_secret_is_masked_in_the_error_text(alias: str, processor: str) -> None:
    def charge(card_pin: str, password: str | None = None) -> None:
        raise ValueError(f"declined pin {card_pin} password {password}")

    # Given protect() of a function given its secret positionally / When it fails
    with pytest.raises(ValueError):
        protect("charge-1", charge, "PROTPOSPIN1", password="PROTKWPW1",
                max_processing_time=60, processor_id=processor, database=alias)  # fmt: skip
    # Then the stored error masks it, known by its parameter's name
    rec = Outcome.objects.using(alias).get(processor_id=processor)
    assert rec.error == "ValueError: declined pin *** password ***", rec.error


def test_memoized_failure_is_replayed(alias: str, processor: str) -> None:
    def boom() -> None:
        raise KeyError("gone")

    for _ in range(2):
        with pytest.raises(KeyError, match="gone"):
            protect(
                "boom",
                boom,
                max_processing_time=60,
                processor_id=processor,
                database=alias,
                on_failure="memoize",
            )
    assert Outcome.objects.using(alias).get(processor_id=processor).deliveries == 2


def test_a_secret_in_a_dataclass_argument_is_masked_in_the_stored_error(
    alias: str, processor: str
) -> None:
    """An error that quoted a password held in a dataclass argument was stored in clear
    (journal ``error``, the memo's message, the admin and ``grousset_inspect``)."""
    import dataclasses

    @dataclasses.dataclass
    class Creds:
        user: str
        password: str

    def pay(creds: Creds, label: str) -> None:
        raise RuntimeError(f"gateway refused {creds.password} for {label}")

    # Given a body that fails quoting its dataclass argument's password
    with pytest.raises(RuntimeError):
        protect("pay-1", pay, Creds("bob", "DataclassSecretWW"), "L", max_processing_time=60,
                processor_id=processor, database=alias, on_failure="memoize")  # fmt: skip
    # When its failure is memoized / Then the journal keeps the message, masked
    row = Outcome.objects.using(alias).get(processor_id=processor)
    assert row.error == "RuntimeError: gateway refused *** for L", row.error
    assert b"DataclassSecretWW" not in bytes(row.result or b""), row.result


def test_unstorable_result_never_reruns(alias: str, processor: str) -> None:
    from celery_grousset.exceptions import ResultNotStored

    runs: list[int] = []

    def big() -> str:
        runs.append(1)
        return "x" * 2000

    # Given a result over max_result_bytes
    assert (
        protect(
            "big",
            big,
            max_processing_time=60,
            processor_id=processor,
            database=alias,
            max_result_bytes=100,
        )
        == "x" * 2000
    )
    # Then duplicates are told, with what to change and how to run it again, and the
    # effect is not re-run
    with pytest.raises(ResultNotStored, match="max_result_bytes") as told:
        protect("big", big, max_processing_time=60, processor_id=processor, database=alias)
    assert "raise the task's max_result_bytes or return less" in str(told.value), told.value
    assert "grousset_release" in str(told.value) and "--force" in str(told.value), told.value
    assert runs == [1]


def test_nul_in_result_is_stored_and_returned(alias: str, processor: str) -> None:
    value = protect(
        "nul", lambda: "a\x00b", max_processing_time=60, processor_id=processor, database=alias
    )
    again = protect(
        "nul", lambda: "other", max_processing_time=60, processor_id=processor, database=alias
    )
    assert value == again == "a\x00b"


def test_bad_key_is_a_clear_error(alias: str) -> None:
    with pytest.raises(FingerprintError, match="non-empty str key"):
        protect(42, lambda: 1, max_processing_time=5, database=alias)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fn, serializer, error",
    [(str.upper, "jsn", r"serializer=….*json.*got 'jsn'"),
     (str.upper, None, r"serializer=….*got None"),
     ("not callable", "json", r"needs a callable fn, got 'not callable'")],
)  # fmt: skip
def test_protect_refuses_a_serializer_or_function_it_cannot_use_before_it_claims(
    journal: str, fn: Any, serializer: Any, error: str
) -> None:
    """An unknown serializer ran the effect and stored no memo (every duplicate then
    raised ResultNotStored); None stored one no duplicate could read (MemoNotAccepted)."""
    key = f"bad-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidArgument, match=error):
        protect(key, fn, "x", serializer=serializer, max_processing_time=30, database=journal)
    assert not Outcome.objects.using(journal).filter(args_repr__contains=key).exists()


def test_a_misspelt_option_is_refused_not_passed_to_the_function(journal: str) -> None:
    """``memoise=False`` went to ``fn``'s ``**extra`` as an argument: the memo was stored
    and the option silently lost."""
    key, sent = f"typo-{uuid.uuid4().hex[:8]}", []

    def send(to: str, **extra: Any) -> str:
        sent.append(extra)
        return to

    call = {"max_processing_time": 30, "database": journal}
    # When an option is misspelt / Then it is refused before the claim, naming the option
    with pytest.raises(InvalidArgument, match=r"memoise=….*option 'memoize'.*write memoize="):
        protect(key, send, "a@b.c", memoise=False, **call)
    with pytest.raises(InvalidArgument, match=r"option 'on_failure'"):
        protect(key, send, "a@b.c", on_falure="memoize", **call)
    assert sent == [] and not Outcome.objects.using(journal).filter(
        args_repr__contains=key).exists()  # fmt: skip
    # And a keyword the function names, or one that only contains an option's word, is
    # the function's argument
    def named(to: str, memoise: bool) -> str:
        return f"{to} {memoise}"

    assert protect(key, named, "a@b.c", memoise=True, **call) == "a@b.c True"
    assert protect(f"{key}-2", send, "x", processor="p1", **call) == "x"
    assert sent == [{"processor": "p1"}]


def test_protect_takes_the_serializers_that_encode_here_and_refuses_the_others(
    journal: str,
) -> None:
    """kombu lists msgpack and yaml whether or not their libraries are installed: one
    that cannot encode ran the effect and stored no memo (duplicates: ResultNotStored)."""
    from kombu.serialization import dumps, registry

    for name in sorted(registry.name_to_type):
        try:
            dumps(None, serializer=name)
            encodes = True
        except Exception:
            encodes = False
        key, runs = f"ser-{name}-{uuid.uuid4().hex[:8]}", []

        def effect(runs: list[int] = runs) -> dict[str, int]:
            runs.append(1)
            return {"rows": 3}

        call = {"serializer": name, "max_processing_time": 30, "database": journal}
        if not encodes:  # refused before the claim: no effect, no record
            with pytest.raises(InvalidArgument, match=f"got '{name}'"):
                protect(key, effect, **call)
            assert runs == [] and not Outcome.objects.using(journal).filter(
                args_repr__contains=key).exists()  # fmt: skip
            continue
        if name == "pickle":  # (a pickle memo is read where pickle is accepted: test_memo)
            continue
        assert protect(key, effect, **call) == {"rows": 3}
        assert protect(key, effect, **call) == {"rows": 3} and runs == [1]


@pytest.mark.parametrize("on_in_flight", ["wait", "raise"])
def test_a_call_of_the_same_key_inside_its_own_run_is_refused_before_it_claims(
    journal: str, on_in_flight: str
) -> None:
    """The inner call waited for its own claim until it turned stale, took it over and
    ran the effect again, the outer attempt then fenced out ("wait"); or raised
    ClaimInFlight out of the outer body, whose claim was released for a retry to run the
    effect again ("raise")."""
    key, charges, nest = f"nested-{uuid.uuid4().hex[:8]}", [], [True]

    def charge() -> str:
        charges.append(1)
        if nest.pop():  # the same key, called from inside its own run
            return str(protect(key, charge, max_processing_time=5, database=journal,
                               on_in_flight=on_in_flight))  # fmt: skip
        return "charged"

    # When the body calls protect() of its own key / Then that call is refused at once,
    # naming the fix, and the outer attempt fails like any body that raises
    started = time.monotonic()
    with pytest.raises(InvalidArgument, match=r"same key.*call the function directly"):
        protect(key, charge, max_processing_time=5, database=journal)
    assert time.monotonic() - started < 3 and charges == [1]  # ("wait" would wait 5 s)
    # And another key, or the same key after its run, is a call like any other
    nest.append(False)
    assert protect(f"{key}-other", charge, max_processing_time=5, database=journal) == "charged"
    nest.append(False)
    assert protect(key, charge, max_processing_time=5, database=journal) == "charged"
    assert protect(key, charge, max_processing_time=5, database=journal) == "charged"
    assert charges == [1, 1, 1]


def test_closed_port_fails_closed() -> None:
    from django.db import connections

    from celery_grousset import store as base
    from celery_grousset.store.postgresql import PostgresStore

    ran: list[int] = []
    # Given the journal's PostgreSQL is unreachable (nothing listens on port 1)
    closed = {**connections.settings["postgresql"], "PORT": "1"}
    reset_stores()
    base._install("postgresql", PostgresStore("postgresql", closed, timeout=2.0))
    try:
        # When protect() is called / Then it raises StoreUnavailable and fn never ran
        with pytest.raises(StoreUnavailable, match="cannot connect"):
            protect("down", lambda: ran.append(1), max_processing_time=5, database="postgresql")
    finally:
        reset_stores()
    assert ran == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eight_processes_race_on_500_keys(alias: str, processor: str) -> None:
    # Given 8 OS processes behind a barrier, each calling protect() on the same 500 keys
    keys = [f"race-{i}-{uuid.uuid4().hex[:6]}" for i in range(500)]
    results = run_racers(race, 8, alias, keys, processor)
    # Then each key's effect ran exactly once (the ledger has no unique constraint)
    counts = Counter(
        Effect.objects.using(alias).filter(value=processor).values_list("key", flat=True)
    )
    assert set(counts) == set(keys)
    assert max(counts.values()) == 1
    # And all 8 callers of a key received the same value
    for key in keys:
        assert len({r[key] for r in results}) == 1


def test_sqlite_locked_fails_closed() -> None:
    import sqlite3

    from django.db import connections

    from celery_grousset import store as base
    from tests import services

    services.require_database("default")
    from celery_grousset.store.sqlite import SQLiteStore

    ran: list[int] = []
    # Given another process holding SQLite's write lock on the journal file
    holder = sqlite3.connect(str(connections.settings["default"]["NAME"]), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    reset_stores()
    base._install("default", SQLiteStore("default", connections.settings["default"], timeout=0.5))
    try:
        # When protect() claims / Then "database is locked" is StoreUnavailable, never "run it"
        with pytest.raises(StoreUnavailable, match="locked"):
            protect("locked", lambda: ran.append(1), max_processing_time=5, database="default")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        reset_stores()
    assert ran == []


def test_an_in_process_call_inside_the_sqlite_journals_own_transaction_names_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its completion waited for the caller's own write lock, then said 'another process
    holds its write lock'; an eager task's logged 'requeued with its outcome' (nothing
    requeues an eager call)."""
    from django.db import connections, transaction

    from celery_grousset import store as base
    from celery_grousset.store.sqlite import SQLiteStore
    from tests import services
    from tests.tasks import effect

    services.require_database("default")
    reset_stores()
    base._install("default", SQLiteStore("default", connections.settings["default"], timeout=0.5))
    key = f"own-{uuid.uuid4().hex[:8]}"

    def book() -> str:  # the effect writes to the database of the caller's transaction
        return str(Effect.objects.using("default").create(key=key, value="booked").pk)

    try:
        # Given a guarded call run in this process inside a transaction on the journal's
        # SQLite database, whose effect writes there (SQLite's one write lock is then ours)
        for call in (lambda: protect(key, book, max_processing_time=5, database="default"),
                     lambda: effect.apply((key,)).get()):  # fmt: skip
            with caplog.at_level("WARNING", logger="celery_grousset"), \
                    pytest.raises(StoreUnavailable) as raised, transaction.atomic():  # fmt: skip
                call()
            # Then the error names the caller's own transaction and the ways out
            text = str(raised.value)
            assert "this thread's own transaction.atomic() on 'default'" in text, text
            assert "transaction.on_commit" in text and "another" not in text, text
            # (transactional=True is no fix for a call made after the transaction wrote)
            assert "helps only a call made before the transaction's first write" in text
        # And nothing claims an eager call was requeued
        assert not [m for m in caplog.messages if m.startswith("grousset.outcome_carried")]
    finally:
        reset_stores()


@pytest.mark.parametrize("alias", ["default", "postgresql", "mysql"])
def test_a_key_called_twice_transactionally_in_one_transaction_names_it(alias: str) -> None:
    """PostgreSQL and MariaDB said only "did not answer within 0.5 s (STORE_TIMEOUT)",
    which reads as an outage; SQLite advised transactional=True to a transactional call."""
    from django.db import transaction
    from django.test import override_settings

    from tests import services

    services.require_database(alias)
    key = f"twice-{uuid.uuid4().hex[:8]}"

    def book() -> str:
        return str(Effect.objects.using(alias).create(key=key, value="booked").pk)

    short = override_settings(GROUSSET={"DATABASE": alias, "STORE_TIMEOUT": 0.5})
    # Given a transactional call of a key inside a transaction on its journal database
    with short, pytest.raises(StoreUnavailable) as raised, transaction.atomic(using=alias):
        protect(key, book, max_processing_time=30, database=alias, transactional=True)
        # When the same key is called again inside it
        protect(key, book, max_processing_time=30, database=alias, transactional=True)
    # Then the error names the caller's own open transaction and the ways out
    text = str(raised.value)
    assert f"this thread's own transaction.atomic() on {alias!r}" in text, text
    assert "transaction.on_commit" in text, text
    fix = "twice in one transaction" if alias == "default" else "once per transaction"
    assert fix in text, text
    # And nothing ran: the transaction rolled back
    assert not Effect.objects.using(alias).filter(key=key).exists()


def test_an_effect_inside_an_open_transaction_is_warned_about(
    alias: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    from django.db import transaction

    def warned(run: Any) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="celery_grousset"):
            run()
        return [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("grousset.effect_in_transaction")]  # fmt: skip

    opts: dict[str, Any] = {"max_processing_time": 30, "processor_id": processor, "database": alias}
    keys = [f"tx-{uuid.uuid4().hex[:8]}" for _ in range(3)]

    def book() -> str:  # a transactional effect's write, in the caller's transaction
        return str(Effect.objects.using(alias).create(key=keys[1], value="booked").pk)

    def inside(key: str, effect: Any, **more: Any) -> None:
        with transaction.atomic(using=alias):
            protect(key, effect, **opts, **more)

    # When protect() runs an effect inside an open transaction.atomic(): its outcome is
    # journaled at once, while its writes commit (or roll back) with that transaction
    lines = warned(lambda: inside(keys[0], lambda: "sent"))
    # Then it is warned about, naming the database and the fixes
    assert len(lines) == 1 and f"database={alias}" in lines[0], lines
    assert "transaction.on_commit" in lines[0] and "transactional=True" in lines[0]
    # And not when the effect is transactional on that database (its completion commits
    # with the caller's transaction), nor outside a transaction
    assert warned(lambda: inside(keys[1], book, transactional=True)) == []
    assert warned(lambda: protect(keys[2], lambda: "sent", **opts)) == []


def test_an_option_of_the_wrong_type_is_refused_not_guessed(alias: str, processor: str) -> None:
    from celery_grousset.conf import GroussetSettingsError

    runs: list[int] = []
    # When protect() is given transactional="false" (a str, which bool() reads as True)
    with pytest.raises(GroussetSettingsError, match="transactional must be True or False"):
        protect(f"opt-{uuid.uuid4().hex[:8]}", lambda: runs.append(1),
                max_processing_time=30, processor_id=processor, database=alias,
                transactional="false")  # fmt: skip
    # Then nothing ran
    assert runs == []


def test_protect_in_an_event_loop_is_refused_at_once_and_runs_through_sync_to_async(
    alias: str, processor: str
) -> None:
    """protect() called in an event loop's thread blocked the loop, and raised only when
    it met a claim in flight (its wait polls through Django's ORM)."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.core.exceptions import SynchronousOnlyOperation

    key, ran = f"async-{uuid.uuid4().hex[:8]}", []

    async def direct() -> Any:
        return protect(key, lambda: ran.append(1) or "done", max_processing_time=60,
                       processor_id=processor, database=alias)  # fmt: skip

    async def through_a_thread() -> Any:
        return await sync_to_async(protect)(key, lambda: ran.append(1) or "done",
                                            max_processing_time=60, processor_id=processor,
                                            database=alias)  # fmt: skip

    # When called in the loop's thread, it is refused at once, naming the way out
    with pytest.raises(SynchronousOnlyOperation, match="sync_to_async"):
        asyncio.run(direct())
    assert ran == []
    # ... and through sync_to_async it runs, once
    assert asyncio.run(through_a_thread()) == asyncio.run(through_a_thread()) == "done"
    assert ran == [1]


@pytest.mark.parametrize("control", ["retry", "ignore", "reject"])
def test_celery_control_flow_is_never_memoized_as_a_failure(
    alias: str, processor: str, control: str
) -> None:
    from celery.exceptions import Ignore, Reject, Retry

    raised = {"retry": Retry("later"), "ignore": Ignore(), "reject": Reject("no")}[control]
    runs: list[int] = []

    def body() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise raised
        return "done"

    opts: dict[str, Any] = {"processor_id": processor, "database": alias,
                            "max_processing_time": 60, "on_failure": "memoize"}  # fmt: skip
    # Given a body that asks Celery for a retry (or ignores / rejects its message), under
    # on_failure="memoize"
    with pytest.raises(type(raised)):
        protect("control", body, **opts)
    # When the call comes again / Then it runs: that was no failure to replay
    assert protect("control", body, **opts) == "done" and runs == [1, 1]
