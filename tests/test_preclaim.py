"""A claim made by the worker's main process, adopted by the child that runs the body
(celery_grousset.preclaim), on every journal backend: the late-start renewal."""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from types import SimpleNamespace
from typing import Any, NoReturn

import pytest
from django.conf import settings
from django.test import override_settings

from celery_grousset import guard, preclaim
from celery_grousset.claim import ClaimRequest
from celery_grousset.models import Outcome
from celery_grousset.options import Options
from celery_grousset.store import ClaimResult, get_store


class Deferred(Exception):
    pass


class Caller:
    """A task's hooks, with the request the pool child sees."""

    def __init__(self, opts: Options, carried: list[Any] | None) -> None:
        self.opts = opts
        self.request = SimpleNamespace(grousset_claim=carried)
        self.ran: list[guard.Attempt] = []

    def options(self) -> Options:
        return self.opts

    def in_flight_policy(self, opts: Options) -> str:
        return "retry"

    def defer(self, req: ClaimRequest, res: ClaimResult) -> NoReturn:
        raise Deferred(res.kind)

    def store_unavailable(self, exc: Exception) -> NoReturn:
        raise exc

    def run(self, attempt: guard.Attempt) -> Any:
        self.ran.append(attempt)
        return "ran"


def main_process_claim(journal: str, opts: Options, call: guard.Call, age: float) -> list[Any]:
    """Claim ``call`` as the worker's main process does; the carried claim, ``age`` s old."""
    fp, args_repr, payload = guard.identity(call)
    req = guard.request(opts, fp, call.name, call.task_id, args_repr, payload_hash=payload)
    [res] = guard.claim(get_store(journal), [req])
    assert res.owned
    carried: dict[str, Any] = {}
    preclaim.carry(carried, req, res, time.monotonic())
    value = carried[preclaim.FIELD]
    value[7] -= age
    return list(value)


@pytest.fixture
def setup(journal: str) -> tuple[str, Options, guard.Call]:
    opts = Options.resolve(
        "test", {"max_processing_time": 30}, default_processor=f"t-{uuid.uuid4().hex[:8]}"
    )
    call = guard.Call(name="tests.preclaim", task_id=uuid.uuid4().hex, args=(uuid.uuid4().hex,))
    return journal, opts, call


def row(journal: str, opts: Options, call: guard.Call) -> Outcome:
    fp = guard.identify(call)[0]
    return Outcome.objects.using(journal).get(processor_id=opts.processor_id, fingerprint=fp)


def test_a_fresh_carried_claim_runs_the_body_under_it_without_a_second_claim(
    setup: tuple[str, Options, guard.Call],
) -> None:
    journal, opts, call = setup
    carried = main_process_claim(journal, opts, call, age=0.0)
    before = row(journal, opts, call)
    # When the child runs the call with the claim the main process made
    caller = Caller(opts, carried)
    assert guard.guarded(caller, call) == "ran"
    # Then the body ran under that claim (its token and fence), with no claim of its own
    [attempt] = caller.ran
    assert (attempt.token, attempt.fence) == (carried[0], before.fence)
    after = row(journal, opts, call)
    assert after.status == "completed" and after.deliveries == before.deliveries == 1
    assert after.stale_at == before.stale_at  # not renewed: it started in time


def test_a_late_start_renews_the_claim_then_runs(setup: tuple[str, Options, guard.Call]) -> None:
    journal, opts, call = setup
    # Given a claim made 10 s before the child starts (the bound: 3 s, a tenth of 30 s)
    carried = main_process_claim(journal, opts, call, age=10.0)
    before = row(journal, opts, call)
    caller = Caller(opts, carried)
    # When the child runs it
    assert guard.guarded(caller, call) == "ran"
    # Then it renewed the claim (stale_at moved on) before the body ran under it
    assert [a.token for a in caller.ran] == [carried[0]]
    after = row(journal, opts, call)
    assert after.stale_at > before.stale_at
    assert after.status == "completed" and after.fence == before.fence


def taken_meanwhile(
    journal: str, opts: Options, call: guard.Call, carried: list[Any]
) -> ClaimRequest:
    """Another attempt takes the key of a carried claim (released, then claimed again)."""
    store, fp = get_store(journal), guard.identify(call)[0]
    assert store.release(opts.processor_id, fp, carried[0])
    other = guard.request(opts, fp, call.name, "other", "")
    assert guard.claim(store, [other])[0].owned
    return other


def test_a_late_start_whose_claim_was_taken_does_not_run(
    setup: tuple[str, Options, guard.Call],
) -> None:
    journal, opts, call = setup
    carried = main_process_claim(journal, opts, call, age=10.0)
    # Given another attempt took the key meanwhile (the claim released, claimed again)
    other = taken_meanwhile(journal, opts, call, carried)
    # When the late child starts: its renewal fails, and the claim decides (in flight)
    caller = Caller(opts, carried)
    with pytest.raises(Deferred):
        guard.guarded(caller, call)
    # Then the body did not run, and the other attempt still holds the key
    assert caller.ran == []
    rec = row(journal, opts, call)
    assert rec.claim_token == other.token and rec.status == "in_flight"


def test_a_late_start_is_late_whatever_the_wall_clock_says(
    setup: tuple[str, Options, guard.Call], monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, opts, call = setup
    carried = main_process_claim(journal, opts, call, age=10.0)
    # Given a late start whose claim another attempt took meanwhile, and the host's wall
    # clock stepped back an hour since the claim (NTP, a restored VM)
    taken_meanwhile(journal, opts, call, carried)
    wall = time.time
    monkeypatch.setattr(preclaim.time, "time", lambda: wall() - 3600)
    # When the child starts: its claim is still 10 s old, so it renews, which fails
    caller = Caller(opts, carried)
    with pytest.raises(Deferred):
        guard.guarded(caller, call)
    # Then the body did not run (it would have run beside the other attempt's)
    assert caller.ran == []


@pytest.mark.parametrize("renew_after", [60.0, 20.0])
def test_a_renewal_bound_past_half_the_claim_is_taken_as_half(
    setup: tuple[str, Options, guard.Call], renew_after: float
) -> None:
    journal, opts, call = setup
    # Given WORKER_CLAIM_RENEW_AFTER at or past max_processing_time's half (30 s), and a
    # start 20 s after the claim, which another attempt took meanwhile
    carried = main_process_claim(journal, opts, call, age=20.0)
    taken_meanwhile(journal, opts, call, carried)
    caller = Caller(opts, carried)
    bound = {**settings.GROUSSET, "WORKER_CLAIM_RENEW_AFTER": renew_after}
    # When the child starts / Then it renews (at 15 s), fails, and does not run
    with override_settings(GROUSSET=bound), pytest.raises(Deferred):
        guard.guarded(caller, call)
    assert caller.ran == []


def test_an_adopted_claim_that_turned_stale_in_its_body_says_so(journal: str) -> None:
    from celery_grousset.exceptions import FencedOut

    opts = Options.resolve(
        "test", {"max_processing_time": 4}, default_processor=f"t-{uuid.uuid4().hex[:8]}"
    )
    call = guard.Call(name="tests.preclaim", task_id=uuid.uuid4().hex, args=(uuid.uuid4().hex,))
    # Given a claim the main process made 1.2 s before the child started (renewed only
    # after 2 s: half of max_processing_time; 0.8 s to spare), so it turns stale 2.8 s
    # into the body
    carried = main_process_claim(journal, opts, call, age=0.0)
    store, fp = get_store(journal), guard.identify(call)[0]
    time.sleep(1.2)

    class Overran(Caller):
        def run(self, attempt: guard.Attempt) -> Any:  # 3.2 s: another delivery takes over
            time.sleep(3.2)
            assert guard.claim(store, [guard.request(opts, fp, call.name, "next", "")])[0].owned
            return "late"

    bound = {**settings.GROUSSET, "WORKER_CLAIM_RENEW_AFTER": 3.0}
    with override_settings(GROUSSET=bound), pytest.raises(FencedOut) as fenced:
        guard.guarded(Overran(opts, carried), call)
    # Then its error says its claim went stale (not "released"), though its body ran
    # for less than max_processing_time
    text = str(fenced.value)
    assert "raise max_processing_time above the task's longest run" in text, text
    assert "not stale" not in text, text
    said = re.search(r"([\d.]+)s after its body started, ([\d.]+)s after its claim", text)
    assert said is not None, text
    ran, since = said.groups()
    assert float(ran) < 4 <= float(since), text  # (max_processing_time 4 s)


@pytest.mark.parametrize(("age", "left"), [(1.0, (28.0, 29.5)), (10.0, (29.0, 30.0))])
def test_an_adopted_claim_knows_when_it_turns_stale(
    setup: tuple[str, Options, guard.Call], age: float, left: tuple[float, float]
) -> None:
    journal, opts, call = setup
    # Given a claim the main process made `age` s ago (10 s: past the renewal bound)
    carried = main_process_claim(journal, opts, call, age=age)
    fp, args_repr, payload = guard.identity(call)
    req = guard.request(opts, fp, call.name, call.task_id, args_repr, payload_hash=payload)
    # When the child adopts it / Then its result says how long until it turns stale (what a
    # requeue carrying its outcome must beat), not 0
    caller = Caller(opts, carried)
    res = preclaim.adopt(caller, get_store(journal), *preclaim.own(caller, req))
    assert res is not None and left[0] <= res.retry_in <= left[1]


def test_a_claim_in_the_headers_of_a_copy_sent_again_is_not_taken_for_its_own() -> None:
    """The main process puts its claim in the request; a copy of the delivery sent again
    (Celery's retry(), the guard's requeue) can carry it in its headers, released or lost
    by then. Adopted, the copy ran its body under it and was fenced out (an effect lost,
    or run twice after a duplicate claimed the key)."""
    from celery.app.task import Context

    from celery_grousset import preclaim
    from celery_grousset.claim import ClaimRequest, Kind

    req = ClaimRequest(
        processor_id="p", fingerprint="f" * 64, task_name="t", task_id="i", token="tok",
        worker="w", args_repr="", max_processing_time=60.0, expires_after=3600.0,
        max_takeovers=3,
    )  # fmt: skip
    request_dict: dict[str, object] = {"id": "i", "retries": 0}
    # Given the main process's claim for the first delivery
    preclaim.carry(request_dict, req, preclaim._result(req, Kind.NEW, 1, 1, 0, 60.0), 0.0)
    # Then that delivery's child adopts it
    assert preclaim.carried(Context(dict(request_dict))) is not None
    # But a copy sent again with it — by retry() (retries + 1) or by a requeue — does not
    assert preclaim.carried(Context({**request_dict, "retries": 1})) is None
    assert preclaim.carried(Context({**request_dict, "grousset_requeues": 1})) is None
    again = {**request_dict, "headers": {"grousset_requeues": 2}}
    assert preclaim.carried(Context(again)) is None


def test_a_claim_carried_for_another_key_is_not_adopted(
    setup: tuple[str, Options, guard.Call], caplog: pytest.LogCaptureFixture
) -> None:
    journal, opts, call = setup
    # Given a request carrying the claim the main process made for another call's key
    # (its options resolved otherwise there)
    carried = main_process_claim(journal, opts, call, age=0.0)
    mine = guard.Call(name=call.name, task_id=uuid.uuid4().hex, args=(uuid.uuid4().hex,))
    caller = Caller(opts, carried)
    # When the child runs its own call / Then it claims its own key and runs under that
    with caplog.at_level("WARNING", logger="celery_grousset"):
        assert guard.guarded(caller, mine) == "ran"
    [attempt] = caller.ran
    assert attempt.token != carried[0] and row(journal, opts, mine).status == "completed"
    assert row(journal, opts, call).status == "in_flight"  # the other's, untouched
    assert "grousset.claim_not_adopted" in caplog.text


def test_a_claim_stamped_later_than_now_is_renewed(
    setup: tuple[str, Options, guard.Call],
) -> None:
    journal, opts, call = setup
    # Given a carried claim whose time reads as later than now (not this host's clock)
    carried = main_process_claim(journal, opts, call, age=-1000.0)
    before = row(journal, opts, call)
    # When the child runs it / Then it renews first: its age cannot be trusted
    assert guard.guarded(Caller(opts, carried), call) == "ran"
    assert row(journal, opts, call).stale_at > before.stale_at


def test_a_renewal_never_touches_a_settled_row(setup: tuple[str, Options, guard.Call]) -> None:
    journal, opts, call = setup
    carried = main_process_claim(journal, opts, call, age=0.0)
    assert guard.guarded(Caller(opts, carried), call) == "ran"
    done = row(journal, opts, call)
    # When a renewal comes with the token of the claim that completed the row
    fp, args_repr, payload = guard.identity(call)
    req = guard.request(opts, fp, call.name, call.task_id, args_repr, payload_hash=payload)
    renewed = preclaim.renew(get_store(journal), dataclasses.replace(req, token=carried[0]))
    # Then it fails, and the completed row keeps its deadline
    assert not renewed and row(journal, opts, call).stale_at == done.stale_at


def decided_by_the_main_process(
    journal: str, opts: Options, call: guard.Call, age: float
) -> SimpleNamespace:
    """The main process's claim of a completed ``call``, not acted on there (its
    decision handed to the child, as a duplicate with callbacks is): the child's request,
    the decision ``age`` s old."""
    fp, args_repr, payload = guard.identity(call)
    req = guard.request(opts, fp, call.name, uuid.uuid4().hex, args_repr, payload_hash=payload)
    [res] = guard.claim(get_store(journal), [req], report=False)
    assert res.kind.value == "duplicate"
    request_dict: dict[str, Any] = {}
    preclaim.carry_decided(request_dict, req, res, 0.001)
    value = request_dict[preclaim.DECIDED]
    value[4] -= age
    return SimpleNamespace(grousset_claim=None, grousset_decided=value)


def test_a_decision_carried_from_the_main_process_is_acted_on_without_a_second_claim(
    setup: tuple[str, Options, guard.Call],
) -> None:
    journal, opts, call = setup
    # Given a call completed once, and a duplicate the main process claimed, handing its
    # decision to the child
    assert guard.guarded(Caller(opts, None), call) == "ran"
    caller = Caller(opts, None)
    caller.request = decided_by_the_main_process(journal, opts, call, age=0.0)
    # When the child runs the duplicate, Then it answers from the memo, claiming nothing
    assert guard.guarded(caller, call) == "ran" and caller.ran == []
    rec = row(journal, opts, call)
    assert (rec.deliveries, rec.duplicates) == (2, 1)


def test_a_late_decision_is_not_acted_on_the_child_claims_itself(
    setup: tuple[str, Options, guard.Call],
) -> None:
    """An operator may release the key while the duplicate waits for a free child
    (grousset_release --force: the next delivery runs again): a decision older than an
    owned claim's renewal bound is not used."""
    journal, opts, call = setup
    assert guard.guarded(Caller(opts, None), call) == "ran"
    caller = Caller(opts, None)
    # Given the main process's decision made 10 s before the child starts (bound: 3 s),
    # and the key released meanwhile (its record forgotten)
    caller.request = decided_by_the_main_process(journal, opts, call, age=10.0)
    row(journal, opts, call).delete(using=journal)
    # When the child runs it, Then it claims the key itself and the body runs again
    assert guard.guarded(caller, call) == "ran"
    assert len(caller.ran) == 1
    assert row(journal, opts, call).status == "completed"


@pytest.mark.parametrize("interrupt", ["unavailable", "soft_time_limit"])
def test_a_renewal_that_fails_requeues_carrying_the_main_process_token(
    setup: tuple[str, Options, guard.Call], monkeypatch: pytest.MonkeyPatch, interrupt: str
) -> None:
    """A late start's renewal interrupted by the soft time limit (or unanswered) sent
    the delivery again carrying the token of a request that never claimed: the next
    delivery could not settle the main process's claim, bounced until it turned stale,
    and counted a takeover (a review, on MariaDB: 17 s, takeovers=1)."""
    from billiard.exceptions import SoftTimeLimitExceeded

    from celery_grousset.exceptions import StoreUnavailable

    journal, opts, call = setup
    # Given a claim made 10 s before the child starts (past the renewal bound)
    carried = main_process_claim(journal, opts, call, age=10.0)
    store = get_store(journal)
    error = StoreUnavailable("gone") if interrupt == "unavailable" else SoftTimeLimitExceeded()

    def renew(req: ClaimRequest) -> bool:
        raise error

    monkeypatch.setattr(store, "renew", renew)
    # When the renewal fails / Then the delivery is sent again carrying the main
    # process's token, and the next delivery settles that claim at once: it runs
    value, after = requeued_then_settled(journal, opts, call, carried, monkeypatch)
    assert value["token"] == carried[0]
    assert (after.status, after.takeovers) == ("completed", 0)


def requeued_then_settled(
    journal: str, opts: Options, call: guard.Call, carried: list[Any] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[dict[str, Any], Outcome]:
    """Run ``call`` (sent again, its failure patched in), then the copy sent again; the
    value that copy carried, and the key's record after it ran."""
    requeued: list[dict[str, Any]] = []

    class Requeuing(Caller):
        def carry(self, value: dict[str, Any], exc: BaseException) -> NoReturn:
            requeued.append(value)
            raise Deferred("requeued")

    with pytest.raises(Deferred):
        guard.guarded(Requeuing(opts, carried), call)
    monkeypatch.undo()
    assert row(journal, opts, call).status == "in_flight"
    [value] = requeued
    nxt = Caller(opts, None)
    nxt.carried = value  # type: ignore[attr-defined]  # (a task reads it from its headers)
    assert guard.guarded(nxt, call) == "ran"
    return value, row(journal, opts, call)


def test_a_claim_interrupted_after_its_commit_is_settled_by_the_next_delivery(
    setup: tuple[str, Options, guard.Call], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A soft time limit whose signal came as the claim's commit returned (a slow fsync,
    a busy SQLite) raised after the claim had committed; on a local journal (SQLite) the
    delivery was sent again without the claim's token, so the next one found the claim
    in flight and waited until it turned stale."""
    from billiard.exceptions import SoftTimeLimitExceeded

    journal, opts, call = setup
    store = get_store(journal)
    real_all, real_one = store.claim_all, store.claim

    def committed_then_interrupted(real: Any) -> Any:
        def claim(arg: Any) -> Any:
            real(arg)
            raise SoftTimeLimitExceeded()

        return claim

    monkeypatch.setattr(store, "claim_all", committed_then_interrupted(real_all))
    monkeypatch.setattr(store, "claim", committed_then_interrupted(real_one))
    # When the claim commits and its delivery is interrupted before it hears so / Then
    # the delivery sent again carries the claim's token, and settles it: it runs
    value, after = requeued_then_settled(journal, opts, call, None, monkeypatch)
    assert value["token"] and (after.status, after.takeovers) == ("completed", 0)
