"""An outcome whose completion could not be written travels with the requeued delivery
(celery_grousset.carry), on PostgreSQL, SQLite and MariaDB.

The guarded flow runs in this process with a caller that has the task's two carry
hooks; the completion fails for real: another session holds the row's lock longer
than the completion's retries (STORE_TIMEOUT 0.5 s, max_processing_time 2 s).
"""

from __future__ import annotations

import contextlib
import types
import uuid
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest
from django.test import override_settings

from celery_grousset import carry, events, guard
from celery_grousset.claim import ClaimRequest
from celery_grousset.exceptions import FencedOut, StoreUnavailable
from celery_grousset.models import Outcome
from celery_grousset.options import Options
from celery_grousset.store import ClaimResult, get_store


class Requeued(Exception):
    """What the test caller raises instead of re-publishing: the header it would carry."""

    def __init__(self, header: dict[str, Any]) -> None:
        super().__init__("requeued")
        self.header = header


class TaskLikeCaller:
    """A task's hooks, with the requeue caught: ``carry`` raises :class:`Requeued`."""

    def __init__(self, opts: Options, body: Any, carried: Any = None) -> None:
        self.opts, self.body, self.carried, self.runs = opts, body, carried, 0

    def options(self) -> Options:
        return self.opts

    def in_flight_policy(self, opts: Options) -> str:
        return "retry"

    def defer(self, req: ClaimRequest, res: ClaimResult) -> NoReturn:
        raise AssertionError("no other attempt holds the claim here")

    def store_unavailable(self, exc: StoreUnavailable) -> NoReturn:
        raise exc

    def carry(self, outcome: dict[str, Any], exc: StoreUnavailable) -> NoReturn:
        raise Requeued(outcome)

    def run(self, attempt: guard.Attempt) -> Any:
        self.runs += 1
        return self.body()


@pytest.fixture
def short(alias: str) -> Iterator[str]:
    with override_settings(GROUSSET={"DATABASE": alias, "STORE_TIMEOUT": 0.5}):
        yield alias


def _opts(processor: str, alias: str) -> Options:
    return Options.resolve(
        "test", {"processor_id": processor, "max_processing_time": 2, "database": alias},
        default_processor=processor,
    )  # fmt: skip


def _call(key: str) -> guard.Call:
    return guard.Call(name="tests.carry", task_id=f"task-{uuid.uuid4().hex}",
                      idempotency_key=key, args_repr="(key)")  # fmt: skip


@contextlib.contextmanager
def _row_locked(alias: str, processor: str) -> Iterator[None]:
    """Another session writes the journal row in an open transaction (its lock holds
    every completion of it until the block ends; on SQLite: the database's write lock)."""
    from django.db import transaction
    from django.db.models import F

    with transaction.atomic(using=alias):
        Outcome.objects.using(alias).filter(processor_id=processor).update(worker=F("worker"))
        yield
        transaction.set_rollback(True, using=alias)


def _unwritable(
    alias: str, processor: str, key: str, opts: Options | None = None
) -> tuple[dict[str, Any], int]:
    """Run a call whose completion cannot be written; the header it would carry."""
    locked = contextlib.ExitStack()

    def effect() -> dict[str, Any]:
        locked.enter_context(_row_locked(alias, processor))
        return {"receipt": key}

    caller = TaskLikeCaller(opts or _opts(processor, alias), effect)
    with locked, pytest.raises(Requeued) as requeued:
        guard.guarded(caller, _call(key))
    return requeued.value.header, caller.runs


def test_unwritten_completion_is_carried_and_written_by_the_next_delivery(
    short: str, processor: str
) -> None:
    alias, key = short, f"order-{uuid.uuid4().hex}"
    # Given an attempt whose effect ran and whose completion the journal refused
    # through every retry
    header, runs = _unwritable(alias, processor, key)
    # Then its delivery is requeued carrying the outcome and the claim's token; the
    # row is still in flight
    row = Outcome.objects.using(alias).get(processor_id=processor)
    assert runs == 1 and row.status == "in_flight"
    fence = row.fence
    assert header["token"] == row.claim_token and header["status"] == "completed"
    # When the requeued delivery comes back (the journal reachable again)
    again = TaskLikeCaller(_opts(processor, alias), lambda: {"receipt": "again"}, header)
    value = guard.guarded(again, _call(key))
    # Then it writes the carried memo and answers with it, without running the effect
    row.refresh_from_db()
    assert value == {"receipt": key} and again.runs == 0
    assert row.status == "completed" and row.fence == fence  # the carried claim's own
    # And a duplicate of the requeued message (the same header) is answered the same
    dup = TaskLikeCaller(_opts(processor, alias), lambda: {"receipt": "dup"}, header)
    assert guard.guarded(dup, _call(key)) == {"receipt": key} and dup.runs == 0
    # And a later delivery without it gets the memo
    later = TaskLikeCaller(_opts(processor, alias), lambda: {"receipt": "later"})
    assert guard.guarded(later, _call(key)) == {"receipt": key} and later.runs == 0


def _failing_opts(processor: str, alias: str, on_failure: str, mpt: float = 2) -> Options:
    return Options.resolve(
        "test", {"processor_id": processor, "max_processing_time": mpt, "database": alias,
                 "on_failure": on_failure}, default_processor=processor,
    )  # fmt: skip


def test_a_memoized_failure_the_journal_refused_is_carried_and_never_runs_again(
    short: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failure's one write, refused (the journal unreachable), was dropped: the
    delivery was acked, its claim left in flight until stale, and the duplicate that
    took it over ran the failing effect again — a card charged twice (an outage
    review)."""
    alias, key = short, f"order-{uuid.uuid4().hex}"
    locked = contextlib.ExitStack()

    def declined() -> None:
        locked.enter_context(_row_locked(alias, processor))
        raise LookupError(f"card declined for {key}")

    # Given an attempt whose body failed, under on_failure="memoize", and whose failure
    # the journal refused through every retry
    caller = TaskLikeCaller(_failing_opts(processor, alias, "memoize"), declined)
    with locked, pytest.raises(Requeued) as requeued:
        guard.guarded(caller, _call(key))
    # Then its delivery is requeued carrying the memoized failure
    header = requeued.value.header
    assert caller.runs == 1 and header["status"] == "failed" and header["result"]
    # When the requeued delivery comes back (the journal reachable again)
    again = TaskLikeCaller(_failing_opts(processor, alias, "memoize"), declined, header)
    seen: list[str] = []

    class Recorder:  # the completion outcomes a metrics recorder is told
        def finished(self, task: str, outcome: str, seconds: float) -> None:
            seen.append(outcome)

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

    monkeypatch.setattr(events, "recorder", Recorder())
    with pytest.raises(LookupError, match="card declined"):
        guard.guarded(again, _call(key))
    assert seen == ["failed"]  # (its completion counted as the failure it is)
    # Then it wrote the failure without running the body, and a duplicate gets it too
    row = Outcome.objects.using(alias).get(processor_id=processor)
    assert again.runs == 0 and row.status == "failed" and row.takeovers == 0
    dup = TaskLikeCaller(_failing_opts(processor, alias, "memoize"), declined)
    with pytest.raises(LookupError, match="card declined"):
        guard.guarded(dup, _call(key))
    assert dup.runs == 0


def test_a_failure_stopped_while_its_write_waits_is_sent_once_more_before_exit(
    short: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop (a revoke's SIGTERM: SystemExit) during the failure write's retries ended
    the process with the memoized failure unwritten: its claim released or taken over,
    and the failing effect run again (a review of the retries' own change)."""
    import time

    from celery_grousset import completion

    alias, key = short, f"order-{uuid.uuid4().hex}"
    locked = contextlib.ExitStack()

    def declined() -> None:
        locked.enter_context(_row_locked(alias, processor))
        raise LookupError("card declined")

    def stopped(seconds: float) -> None:  # the retries' pause: the lock let go, then a stop
        locked.close()
        raise SystemExit(143)

    monkeypatch.setattr(completion, "time", types.SimpleNamespace(
        perf_counter=time.perf_counter, monotonic=time.monotonic, sleep=stopped))  # fmt: skip
    # Given a memoized failure whose first write met a locked row
    caller = TaskLikeCaller(_failing_opts(processor, alias, "memoize", mpt=30), declined)
    # When the process is stopped while the write waits to be sent again
    with locked, pytest.raises(SystemExit):
        guard.guarded(caller, _call(key))
    # Then the failure was sent once more before the process went: memoized
    row = Outcome.objects.using(alias).get(processor_id=processor)
    assert (row.status, row.result_encoding) == ("failed", "grousset/exception"), row.status


def test_a_failure_of_a_stopping_process_is_tried_once_not_retried(
    short: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body stopped (SystemExit) while the journal was away waited through every retry
    pause of its failure's write (about 8 s) before the process could exit (a review)."""
    import time

    from celery_grousset.completion import fail
    from celery_grousset.exceptions import StoreUnavailable

    alias = short
    opts = _failing_opts(processor, alias, "release")
    req = guard.request(opts, guard.fingerprint_of(_call("k")), "tests.carry", "t-1", "")
    store = get_store(alias)
    fence = store.claim(req).fence
    tries: list[int] = []

    def away(*args: Any) -> bool:  # the journal unreachable
        tries.append(1)
        raise StoreUnavailable("away")

    monkeypatch.setattr(store, "finish", away)
    # When the failure of a stopped body is written / Then it is tried once, at once
    started = time.monotonic()
    assert fail(store, opts, req, SystemExit(143), fence) is False
    assert tries == [1] and time.monotonic() - started < 1.0
    # (and an error of the body's own is retried)
    assert fail(store, opts, req, LookupError("declined"), fence) is False
    assert len(tries) > 2


def test_a_release_refused_for_a_moment_is_written_by_its_retries(
    short: str, processor: str
) -> None:
    """The release's one write, refused by a blip, left the claim in flight: the
    failed call's retry waited until it turned stale and was counted a takeover."""
    import threading

    alias, key = short, f"order-{uuid.uuid4().hex}"
    held, let_go = threading.Event(), threading.Event()

    def holder() -> None:
        from django.db import connections

        try:
            with _row_locked(alias, processor):
                held.set()
                let_go.wait(10)
        finally:
            connections[alias].close()

    def failing() -> None:  # the row's lock taken by another session, let go 0.8 s on
        threading.Thread(target=holder, daemon=True).start()
        held.wait(5)
        threading.Timer(0.8, let_go.set).start()
        raise LookupError("declined")

    # Given an attempt that failed under on_failure="release" while the journal row was
    # locked for a moment (past STORE_TIMEOUT: the first write of the release failed)
    caller = TaskLikeCaller(_failing_opts(processor, alias, "release"), failing)
    with pytest.raises(LookupError):
        guard.guarded(caller, _call(key))
    # Then the release was written: the next call runs at once, no takeover
    row = Outcome.objects.using(alias).get(processor_id=processor)
    assert row.status == "failed", row.status
    nxt = TaskLikeCaller(_failing_opts(processor, alias, "release"), lambda: "ok")
    assert guard.guarded(nxt, _call(key)) == "ok" and nxt.runs == 1
    assert Outcome.objects.using(alias).get(processor_id=processor).takeovers == 0


def test_a_carried_outcome_never_overwrites_a_takeover(short: str, processor: str) -> None:
    alias, key = short, f"order-{uuid.uuid4().hex}"
    header, _ = _unwritable(alias, processor, key)
    first = Outcome.objects.using(alias).get(processor_id=processor).fence
    # Given the claim was taken over meanwhile (it turned stale: another delivery took it)
    Outcome.objects.using(alias).filter(processor_id=processor).update(
        stale_at=get_store(alias).now()
    )
    taker = TaskLikeCaller(_opts(processor, alias), lambda: {"receipt": "taker"})
    assert guard.guarded(taker, _call(key)) == {"receipt": "taker"}
    # When the requeued delivery comes back with the first attempt's outcome
    late = TaskLikeCaller(_opts(processor, alias), lambda: {"receipt": "late"}, header)
    # Then its write matches nothing (another token holds the row): FencedOut, and the
    # new owner's record stands
    with pytest.raises(FencedOut, match="taken over"):
        guard.guarded(late, _call(key))
    row = Outcome.objects.using(alias).get(processor_id=processor)
    assert late.runs == 0 and row.fence > first and row.takeovers == 1
    assert row.status == "completed" and row.claim_token != header["token"]


def test_a_carried_outcome_with_no_memo_stops_its_canvas(short: str, processor: str) -> None:
    """A requeued delivery that carried a ``memoize=False`` outcome answered ``None`` as
    its value: Celery sent its chain's next step and its ``link`` callbacks with it
    (a review: ``b(None)`` ran). The attempt that ran the effect was requeued: nobody
    sent them with the real value."""
    from celery.app.task import Context

    from celery_grousset.delivery import stop_canvas

    alias, key = short, f"order-{uuid.uuid4().hex}"
    opts = Options.resolve("test", {"processor_id": processor, "max_processing_time": 2,
                                    "database": alias, "memoize": False},
                           default_processor=processor)  # fmt: skip
    header, runs = _unwritable(alias, processor, key, opts)
    # Given the requeued delivery of a chain's first step, with a link callback
    request = Context(chain=[{"task": "tests.next_step"}], callbacks=[{"task": "tests.link"}])
    again = TaskLikeCaller(opts, lambda: {"receipt": "again"}, header)
    again.stop_canvas = lambda req, encoding, first: stop_canvas(request, req, encoding, first)
    # When it writes the carried outcome
    value = guard.guarded(again, _call(key))
    # Then it answers None without running the effect, and Celery sends neither the
    # next step nor the callback (its request's canvas is emptied)
    assert (value, runs, again.runs) == (None, 1, 0)
    assert Outcome.objects.using(alias).get(processor_id=processor).status == "completed"
    assert request.chain is None and request.callbacks is None


NOT_FOR_THIS_CALL = [
    None,
    "x",
    {},
    {"token": "t"},
    {"fingerprint": "f", "processor_id": "p", "token": "", "status": "completed"},
]


@pytest.mark.parametrize("header", NOT_FOR_THIS_CALL)
def test_a_header_that_is_not_for_this_call_is_ignored(header: Any, processor: str) -> None:
    req = guard.request(_opts(processor, "default"), "f" * 64, "tests.carry", "t", "")
    assert carry.pending(TaskLikeCaller(_opts(processor, "default"), None, header), req) is None


def test_a_lost_claim_is_settled_by_the_next_delivery(short: str, processor: str) -> None:
    alias, key = short, f"order-{uuid.uuid4().hex}"
    opts = _opts(processor, alias)
    # Given a claim that committed while its answer was lost: its delivery was requeued
    # carrying the claim's token
    lost = guard.request(opts, guard.fingerprint_of(_call(key)), "tests.carry", "t-1", "")
    lost_fence = get_store(alias).claim(lost).fence
    header = carry.lost_claim(lost)
    # When the requeued delivery comes back
    nxt = TaskLikeCaller(opts, lambda: {"receipt": key}, header)
    value = guard.guarded(nxt, _call(key))
    # Then it freed the lost claim (nothing ran under it) and ran at once, without
    # waiting for that claim to turn stale: no takeover
    row = Outcome.objects.using(alias).get(processor_id=processor)
    assert value == {"receipt": key} and nxt.runs == 1
    assert row.status == "completed" and row.fence > lost_fence and row.takeovers == 0
    # And a copy of that message (the same header) never frees the new claim: it gets
    # the memo
    copy = TaskLikeCaller(opts, lambda: {"receipt": "copy"}, header)
    assert guard.guarded(copy, _call(key)) == {"receipt": key} and copy.runs == 0


def test_a_lost_claim_that_cannot_be_settled_is_said_and_counted_as_a_claim_error(
    short: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    alias, key = short, f"order-{uuid.uuid4().hex}"
    opts = _opts(processor, alias)
    lost = guard.request(opts, guard.fingerprint_of(_call(key)), "tests.carry", "t-1", "")
    get_store(alias).claim(lost)
    # Given a requeued delivery carrying a lost claim, and the journal still away (its row
    # locked past STORE_TIMEOUT)
    nxt = TaskLikeCaller(opts, lambda: {"receipt": key}, carry.lost_claim(lost))
    # When it comes back / Then it is requeued again (SQLite, a local file: as an outage,
    # nothing to carry), its body not run
    with (
        caplog.at_level(logging.WARNING, "celery_grousset"),
        _row_locked(alias, processor),
        pytest.raises((Requeued, StoreUnavailable)),
    ):
        guard.guarded(nxt, _call(key))
    # And the journal's trouble is said as a claim's (the outage alert counts it)
    said = [r for r in caplog.records if getattr(r, "grousset_event", "") ==
            "grousset.store_unavailable"]  # fmt: skip
    assert said and said[0].levelno == logging.ERROR, caplog.text
    assert "operation=claim" in said[0].getMessage() and nxt.runs == 0


def test_a_carried_requeue_beats_stale_at_and_never_spins() -> None:
    import time

    now = time.time()
    # A claim 20 s from stale: the backoff, capped at half the time left
    assert carry.countdown({"stale_by": now + 20}, 60.0) == pytest.approx(10.0, abs=0.1)
    assert carry.countdown({"stale_by": now + 20}, 2.0) == 2.0
    # Close to stale: not below the floor (no hot loop of requeues)
    assert carry.countdown({"stale_by": now + 0.2}, 60.0) == carry.MIN_COUNTDOWN
    # Already stale, or not known (an older header): the backoff, no hurry left to win
    assert carry.countdown({"stale_by": now - 5}, 30.0) == 30.0
    assert carry.countdown({}, 30.0) == carry.countdown({"stale_by": None}, 30.0) == 30.0
    # A damaged header is not known either: the backoff, whichever reader asks
    for damaged in ("soon", True, [now + 20]):
        assert carry.countdown({"stale_by": damaged}, 30.0) == 30.0

        class Caller:
            carried = {"stale_by": damaged}

        assert carry.stale_by(Caller()) is None


def test_a_carried_requeue_to_a_quorum_queue_is_not_rounded_past_stale_at() -> None:
    """On a RabbitMQ quorum queue Celery delays in whole seconds: a carried outcome with
    0.8 s left before its claim turns stale was rounded up to 1 s and arrived after it."""
    from celery import Celery

    from celery_grousset.delivery import broker_countdown
    from tests.celeryapp import quorum_queue

    quorum = Celery("quorum", broker="amqp://guest:guest@127.0.0.1:5672//", set_as_current=False)
    quorum.conf.task_queues = [quorum_queue("carried")]
    # Whole seconds, up where there is time for them, down (0: at once) where there is not
    assert broker_countdown(quorum, 0.25) == 1.0
    assert broker_countdown(quorum, 0.5, latest=2.0) == 1.0
    assert broker_countdown(quorum, 0.5, latest=0.8) == 0.0
    assert broker_countdown(quorum, 1.4, latest=1.9) == 1.0
    # A queue that delays in the worker keeps the countdown as it is
    plain = Celery("plain", broker="amqp://guest:guest@127.0.0.1:5672//", set_as_current=False)
    assert broker_countdown(plain, 0.5, latest=0.8) == 0.5
    # The time left is read from the carried header, the same as carry.countdown's
    import time

    assert carry.time_left({"stale_by": time.time() + 0.8}) == pytest.approx(0.8, abs=0.1)
    assert carry.time_left({"stale_by": time.time() - 1}) is None
    assert carry.time_left(None) is None


def test_a_completion_tried_again_warns_per_try_and_errs_once(
    short: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    # Given a completion the journal refuses through every retry
    with caplog.at_level(logging.INFO, logger="celery_grousset"):
        _unwritable(short, processor, f"order-{uuid.uuid4().hex}")
    tries = [r for r in caplog.records if r.getMessage().startswith("grousset.store_unavailable")
             and r.grousset_operation == "complete"]  # type: ignore[attr-defined]  # fmt: skip
    # Then each try that is tried again is a warning, and only the last one an error
    levels = [r.levelno for r in tries]
    assert levels[-1] == logging.ERROR and set(levels[:-1]) <= {logging.WARNING}, levels
    from django.db import connections

    if connections[short].vendor != "mysql":  # (MariaDB's 1 s lock wait: one try fits)
        assert len(levels) >= 2, levels
    assert all(r.grousset_action == "tried again" for r in tries[:-1])  # type: ignore[attr-defined]


def test_a_refused_requeue_waits_within_its_bounds_and_a_soft_limit_ends_only_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery.exceptions import SoftTimeLimitExceeded

    from celery_grousset import delivery

    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        raise SoftTimeLimitExceeded()  # the task's soft time limit, inside the wait

    monkeypatch.setattr(delivery.time, "sleep", sleep)
    monkeypatch.setattr(delivery, "_republish_failures", [0])
    refused = RuntimeError("refused")
    # The first wait: 0.25-0.5 s, or the requeue's own countdown if longer; the soft
    # limit ends the wait and the delivery still goes back (no exception escapes)
    assert 0.25 <= delivery.republish_failed("t", 0.0, refused) <= 0.5
    assert delivery.republish_failed("t", 3.0, refused) == 3.0
    # Doubling while requeues keep failing, never past 5 s
    for _ in range(8):
        delivery.republish_failed("t", 0.0, refused)
    assert slept[-1] == delivery.REPUBLISH_FAILED_WAIT_MAX
    # A carried outcome 2 s from stale waits at most half of that
    assert delivery.republish_failed("t", 3.0, refused, latest=2.0) == 1.0
    # A republish that goes through starts the doubling again
    delivery.republished()
    assert delivery.republish_failed("t", 0.0, refused) <= 0.5


def _stopped_in_completion(
    alias: str, processor: str, stop: BaseException, local: bool = False
) -> tuple[TaskLikeCaller, BaseException, list[str]]:
    """Run a call whose effect ran and whose completion the journal refuses; ``stop`` is
    raised, as billiard raises a time limit (a signal), while the completion waits to be
    tried again. What the guard raised, and where ``stop`` was raised."""
    import signal

    fired: list[str] = []

    def limit(signum: int, frame: Any) -> None:
        if frame is not None and frame.f_code.co_name == "finish_retrying" and not fired:
            fired.append(frame.f_code.co_name)  # (there: waiting to try again)
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise stop

    key, locked = f"order-{uuid.uuid4().hex}", contextlib.ExitStack()

    def effect() -> dict[str, Any]:
        locked.enter_context(_row_locked(alias, processor))
        signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
        return {"receipt": key}

    opts = Options.resolve("test", {"processor_id": processor, "max_processing_time": 20,
                                    "database": alias}, default_processor=processor)  # fmt: skip
    caller, previous = TaskLikeCaller(opts, effect), signal.signal(signal.SIGALRM, limit)
    caller.local = local  # type: ignore[attr-defined]  # (protect(), an eager call: no carry)
    try:
        with override_settings(GROUSSET={"DATABASE": alias, "STORE_TIMEOUT": 0.5}), locked:
            guard.guarded(caller, _call(key))
    except BaseException as exc:  # what the guard raised is the result
        return caller, exc, fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    raise AssertionError("the guarded call returned")


def test_a_soft_time_limit_in_a_completion_retry_carries_the_outcome(
    alias: str, processor: str
) -> None:
    """The task's soft time limit, firing while the completion waited to be tried again,
    escaped: the outcome of the effect that ran was dropped, the claim left in flight,
    and a later delivery ran the effect again."""
    from celery.exceptions import SoftTimeLimitExceeded

    # When the soft time limit fires while the refused completion waits to be tried again
    caller, raised, fired = _stopped_in_completion(alias, processor, SoftTimeLimitExceeded())
    # Then the delivery is requeued carrying the outcome (written by the next delivery)
    assert fired and caller.runs == 1
    assert isinstance(raised, Requeued), repr(raised)
    assert raised.header["status"] == "completed"
    assert Outcome.objects.using(alias).get(processor_id=processor).status == "in_flight"


def test_a_soft_time_limit_in_a_local_calls_completion_is_raised_as_itself(
    alias: str, processor: str
) -> None:
    """A caller that carries no outcome (protect(), an eager call) got StoreUnavailable
    for its own soft time limit: its `except SoftTimeLimitExceeded` cleanup never ran."""
    from celery.exceptions import SoftTimeLimitExceeded

    _, raised, fired = _stopped_in_completion(alias, processor, SoftTimeLimitExceeded(), True)
    assert fired and isinstance(raised, SoftTimeLimitExceeded), repr(raised)


def test_a_process_stopped_while_its_outcome_is_written_says_so(
    alias: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A hard time limit (SystemExit) or a stop landing in the completion, not in the
    body, left the claim in flight without the grousset.interrupted line that says why."""
    import logging

    # When the process is stopped while the completion waits to be tried again
    with caplog.at_level(logging.WARNING, logger="celery_grousset"):
        _, raised, fired = _stopped_in_completion(alias, processor, SystemExit(1))
    # Then the attempt says it was interrupted (its claim stays in flight until stale)
    assert fired and isinstance(raised, SystemExit), repr(raised)
    assert any(r.getMessage().startswith("grousset.interrupted") for r in caplog.records)
    assert Outcome.objects.using(alias).get(processor_id=processor).status == "in_flight"


class Deferred(Exception):
    """What the waiting test caller raises instead of re-queueing."""


class WaitingCaller(TaskLikeCaller):
    """A task with on_in_flight="wait" whose time limit allows 0.3 s of waiting."""

    wait_within = 0.3

    def in_flight_policy(self, opts: Options) -> str:
        return "wait"

    def defer(self, req: ClaimRequest, res: ClaimResult) -> NoReturn:
        raise Deferred()


def test_a_wait_its_time_limit_would_kill_defers_instead(alias: str, processor: str) -> None:
    """on_in_flight="wait" waited up to the holder's stale_at whatever the delivery's own
    time limit: killed waiting (acked), it left nothing to take the claim over."""
    import threading
    import time

    from django.db import connections

    key, release, ran = f"order-{uuid.uuid4().hex}", threading.Event(), []
    opts = Options.resolve("test", {"processor_id": processor, "max_processing_time": 20,
                                    "database": alias}, default_processor=processor)  # fmt: skip

    def hold() -> None:
        try:
            guard.guarded(TaskLikeCaller(opts, lambda: ran.append(release.wait(10))), _call(key))
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        # Given another attempt that holds the call's claim (fresh for 20 s)
        for _ in range(200):
            if Outcome.objects.using(alias).filter(processor_id=processor).exists():
                break
            time.sleep(0.01)
        waiter = WaitingCaller(opts, lambda: "duplicate ran")
        started = time.monotonic()
        # When a delivery that waits, but may wait only 0.3 s, comes
        with pytest.raises(Deferred):
            guard.guarded(waiter, _call(key))
        # Then it defers (re-queued) once its time is up, without running the body
        assert time.monotonic() - started < 5 and waiter.runs == 0
    finally:
        release.set()
        holder.join(15)
    assert ran == [True]


def test_a_deliverys_wait_is_bounded_by_its_shortest_time_limit() -> None:
    from celery import Celery
    from celery.app.task import Context

    from celery_grousset.delivery import wait_within

    app = Celery("limits", set_as_current=False)
    app.conf.task_soft_time_limit = 30

    @app.task(time_limit=50)
    def task() -> None: ...

    # The shortest of the delivery's own, the task's and the app's limits, halved
    assert wait_within(task, Context(timelimit=(None, None))) == 15.0
    assert wait_within(task, Context(timelimit=(8, None))) == 4.0
    other = Celery("nolimits", set_as_current=False)

    @other.task(time_limit=50)
    def limited() -> None: ...

    @other.task
    def plain() -> None: ...

    assert wait_within(limited, Context()) == 25.0
    # ... and no limit: no bound
    assert wait_within(plain, Context()) is None
