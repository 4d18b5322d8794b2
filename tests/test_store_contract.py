"""The store contract, written once, run on PostgreSQL, SQLite and MariaDB.

Every row of the decision table (docs/how-it-works.md), fencing, expiry, counters, and the
purge that never touches an unexpired or in-flight row. Ageing is done by moving
the row's timestamps back (no sleeps).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import F

from celery_grousset import journal
from celery_grousset.claim import ENC_EXCEPTION, ENC_GAVE_UP, ClaimRequest, Kind, clock_fence
from celery_grousset.models import Outcome
from celery_grousset.store.base import Completion, Store
from tests import services
from tests.conftest import BACKENDS

#: the PostgreSQL journal in its partitioned layout (docs/scale.md), besides the three backends
LAYOUTS = {**BACKENDS, "pg-partitioned": services.PARTITIONED}


@pytest.fixture(params=list(LAYOUTS), scope="session")
def alias(request: pytest.FixtureRequest) -> str:
    """Each contract test runs on every backend, and on the partitioned PostgreSQL journal."""
    if request.param == "pg-partitioned":
        return services.require_partitioned()
    services.require_database(LAYOUTS[request.param])
    return LAYOUTS[request.param]


@pytest.fixture(autouse=True)
def _layout(alias: str, settings: pytest.FixtureRequest) -> None:
    """Every store of the partitioned journal's alias is the partitioned one."""
    if alias == services.PARTITIONED:
        settings.GROUSSET = {**settings.GROUSSET, "JOURNAL_LAYOUT": "partitioned"}


def req(processor: str, fp: str, token: str | None = None, **over: object) -> ClaimRequest:
    values: dict[str, object] = dict(
        processor_id=processor,
        fingerprint=fp,
        task_name="tests.effect",
        task_id=f"task-{uuid.uuid4().hex[:8]}",
        token=token or uuid.uuid4().hex,
        worker="w:1",
        args_repr="(1,)",
        max_processing_time=60.0,
        expires_after=3600.0,
        max_takeovers=3,
    )
    values.update(over)
    return ClaimRequest(**values)  # type: ignore[arg-type]


def row(alias: str, processor: str, fp: str) -> Outcome:
    return Outcome.objects.using(alias).get(processor_id=processor, fingerprint=fp)


def age(alias: str, processor: str, fp: str, seconds: float, field: str = "started_at") -> None:
    """Move a row's times back; ageing the claim moves its stale_at and first claim with it."""
    fields = ("started_at", "stale_at", "first_claimed_at") if field == "started_at" else (field,)
    Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fp).update(
        **{f: F(f) - timedelta(seconds=seconds) for f in fields}
    )
    if alias == services.PARTITIONED and field == "expires_on":
        if row(alias, processor, fp).status != "in_flight":
            # a settled row that expired was claimed as long before: its stale_at (which
            # the partitioned retention's index also waits for) is long past too
            Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fp).update(
                stale_at=F("stale_at") - timedelta(seconds=seconds)
            )
        into_past_generation(alias, processor, fp)


def into_past_generation(alias: str, processor: str, fp: str) -> None:
    """On the partitioned journal, retention drops whole past generations: an expired
    row is one whose generation has passed. Each goes into a past generation of its own,
    older than every partition, so it never shares one with another test's live row
    (with a fixed offset from the current generation, a generation that held one test's
    live claim became another's "two back" when the clock crossed a generation
    boundary mid-session, and that row kept the generation from being dropped)."""
    from django.db import connections

    from celery_grousset.store import pgpartops

    rec = row(alias, processor, fp)
    gens = [g for g, *_ in pgpartops.partitions(alias)]
    gen = min([*gens, pgpartops.current_generation(alias)]) - 1
    with connections[alias].cursor() as cur:
        pgpartops.add_generation(cur, gen)
        cur.execute("UPDATE celery_grousset_outcome SET gen = %s WHERE id = %s", [gen, rec.pk])


def completed(value: bytes = b"42") -> Completion:
    return Completion("completed", value, "application/json;utf-8")


def test_new_fingerprint_is_claimed(store: Store, alias: str, processor: str, fp: str) -> None:
    # Given nothing in the journal / When a claim arrives
    r = req(processor, fp)
    res = store.claim(r)
    # Then the caller owns a fresh in-flight record, fenced by the claim's moment
    assert res.kind is Kind.NEW and res.owned
    assert (res.deliveries, res.takeovers, res.status) == (1, 0, "in_flight")
    rec = row(alias, processor, fp)
    assert res.fence == rec.fence == clock_fence(rec.started_at)
    assert rec.claim_token == r.token and rec.task_id == r.task_id and rec.worker == "w:1"
    assert rec.expires_on - rec.started_at == timedelta(seconds=3600)


def test_fresh_in_flight_claim_is_not_taken(store: Store, processor: str, fp: str) -> None:
    # Given a fresh claim
    fence = store.claim(req(processor, fp)).fence
    # When another delivery claims
    res = store.claim(req(processor, fp))
    # Then it does not own it, is told when the claim turns stale, and is counted
    assert res.kind is Kind.IN_FLIGHT and not res.owned
    assert 55 < res.retry_in <= 60
    assert res.deliveries == 2 and res.fence == fence


def test_resent_claim_with_own_token_is_recognised(store: Store, processor: str, fp: str) -> None:
    # Given a claim whose answer was lost (connection dropped)
    first = req(processor, fp)
    fence = store.claim(first).fence
    # When the same claim (same token) is sent again
    res = store.claim(first)
    # Then the caller still owns it and no delivery is added
    assert res.kind is Kind.RESUMED and res.owned
    assert res.deliveries == 1 and res.fence == fence


def test_completed_returns_memo(store: Store, alias: str, processor: str, fp: str) -> None:
    # Given a completed record
    first = req(processor, fp)
    store.claim(first)
    assert store.finish(processor, fp, first.token, completed(b'{"id": 7}'))
    # When a duplicate claims
    res = store.claim(req(processor, fp))
    # Then it gets the memo in the same round trip and is counted
    assert res.kind is Kind.COMPLETED and not res.owned
    assert res.result == b'{"id": 7}' and res.result_encoding == "application/json;utf-8"
    assert res.deliveries == 2 and res.task_id == first.task_id
    assert res.completed_at is not None
    assert row(alias, processor, fp).status == "completed"


def test_stale_claim_is_taken_over_and_zombie_fenced(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given an in-flight claim older than max_processing_time
    zombie = req(processor, fp)
    fence = store.claim(zombie).fence
    age(alias, processor, fp, 61)
    # When another delivery claims
    taker = req(processor, fp)
    res = store.claim(taker)
    # Then it takes over with a higher fence
    assert res.kind is Kind.TAKEOVER and res.owned
    assert res.fence > fence and (res.takeovers, res.deliveries) == (1, 2)
    # And the zombie's completion is refused while the taker's lands
    assert not store.finish(processor, fp, zombie.token, completed(b"1"))
    assert store.finish(processor, fp, taker.token, completed(b"2"))
    assert not store.finish(processor, fp, zombie.token, completed(b"1"))
    rec = row(alias, processor, fp)
    assert bytes(rec.result) == b"2" and rec.fence == res.fence and rec.takeovers == 1
    # And the new epoch's window is measured from one clock reading
    assert rec.expires_on - rec.started_at == timedelta(seconds=3600)


@pytest.mark.parametrize("left", [-60.0, 15.0], ids=["takeover", "claim-again"])
def test_a_claim_by_a_0_1_0_worker_is_judged_by_the_claimants_time(
    store: Store, alias: str, processor: str, fp: str, left: float
) -> None:
    # Given a row claimed just now by a 0.1.0 worker (a fleet upgraded without a full
    # stop, docs/operations.md): 0.1.0 writes started_at and the fence + 1, and leaves
    # the stale_at of the claim before (made 2 minutes ago): `left` s from now (a
    # takeover of a stale claim: in the past; a claim again of a released row: ahead)
    store.claim(req(processor, fp))
    Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fp).update(
        fence=F("fence") - 120_000_000 + 1, stale_at=F("started_at") + timedelta(seconds=left),
        claim_token="held-by-0.1.0",
    )
    age(alias, processor, fp, 20)  # 20 s into the 0.1.0 attempt
    # When a delivery of this version claims it (max_processing_time 60 s)
    res = store.claim(req(processor, fp))
    # Then the claim is live, as 0.1.0 judges it: stale max_processing_time after its
    # started_at (not at the stale_at left in the row), and nobody runs the effect beside
    # the 0.1.0 worker
    assert res.kind is Kind.IN_FLIGHT and not res.owned
    if alias not in (services.PARTITIONED, BACKENDS["postgresql"]):
        assert 30 < res.retry_in <= 40  # (PostgreSQL's own claims always write stale_at)
    # ... and a release of stale claims leaves it to its holder (its deadline is unknown)
    rec = row(alias, processor, fp)
    assert journal.release_plan(rec, journal.now(alias))[0] is False
    # ... and a claimant with a longer max_processing_time waits for its own
    age(alias, processor, fp, 41)
    assert store.claim(req(processor, fp, max_processing_time=600.0)).kind is Kind.IN_FLIGHT
    # Then, past started_at + its max_processing_time, the next delivery takes it over
    res = store.claim(req(processor, fp))
    assert res.kind is Kind.TAKEOVER and res.owned
    rec = row(alias, processor, fp)
    assert rec.stale_at - rec.started_at == timedelta(seconds=60)
    assert rec.fence == clock_fence(rec.started_at)


def test_a_takeover_adds_one_to_a_fence_ahead_of_the_clock(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a stale claim whose fence is ahead of the database clock (issued before the
    # clock stepped back)
    store.claim(req(processor, fp))
    ahead = clock_fence(journal.now(alias)) + 10**12
    Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fp).update(fence=ahead)
    age(alias, processor, fp, 61)
    # When another delivery takes it over
    res = store.claim(req(processor, fp))
    # Then the fence still grows, by one
    assert res.kind is Kind.TAKEOVER and res.fence == ahead + 1


def test_max_takeovers_gives_up(store: Store, alias: str, processor: str, fp: str) -> None:
    # Given a task whose every attempt dies (claims go stale twice, max_takeovers=2)
    store.claim(req(processor, fp, max_takeovers=2))
    for _ in range(2):
        age(alias, processor, fp, 61)
        assert store.claim(req(processor, fp, max_takeovers=2)).kind is Kind.TAKEOVER
    age(alias, processor, fp, 61)
    # When the next delivery finds it stale again
    res = store.claim(req(processor, fp, max_takeovers=2))
    # Then the record is marked failed with a clear error, and stays so
    assert res.kind is Kind.GAVE_UP and not res.owned
    assert res.status == "failed" and "max_takeovers" in res.error
    again = store.claim(req(processor, fp, max_takeovers=2))
    assert again.kind is Kind.FAILED and not again.owned and "max_takeovers" in again.error
    assert row(alias, processor, fp).result_encoding == ENC_GAVE_UP


def test_released_failure_is_claimed_again(store: Store, processor: str, fp: str) -> None:
    # Given an attempt that failed and released its claim
    first = req(processor, fp)
    fence = store.claim(first).fence
    assert store.finish(processor, fp, first.token, Completion("failed", None, "", "E: x"))
    # When the next delivery claims
    res = store.claim(req(processor, fp))
    # Then it owns the record again with a higher fence; takeovers unchanged
    assert res.kind is Kind.RECLAIM and res.owned
    assert res.fence > fence and res.takeovers == 0


def test_memoized_failure_is_replayed(store: Store, processor: str, fp: str) -> None:
    # Given a failure memoized (on_failure="memoize")
    first = req(processor, fp)
    store.claim(first)
    fail = Completion("failed", b'{"exc_type": "ValueError"}', ENC_EXCEPTION, "ValueError: x")
    assert store.finish(processor, fp, first.token, fail)
    # When a duplicate claims / Then it gets the failure, it does not run
    res = store.claim(req(processor, fp))
    assert res.kind is Kind.FAILED and not res.owned and res.error == "ValueError: x"


def test_expired_record_is_claimed_with_counters_reset(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a completed record whose retention window has passed, after duplicates
    first = req(processor, fp)
    fence = store.claim(first).fence
    store.claim(req(processor, fp))
    store.finish(processor, fp, first.token, completed())
    age(alias, processor, fp, 3601, "expires_on")
    # When it is delivered again
    res = store.claim(req(processor, fp))
    # Then it runs again: a new epoch, but the fence keeps counting up
    assert res.kind is Kind.EXPIRED and res.owned
    assert (res.deliveries, res.takeovers) == (1, 0) and res.fence > fence
    assert res.result is None


def test_in_flight_record_never_expires(store: Store, alias: str, processor: str, fp: str) -> None:
    # Given a fresh in-flight record whose expires_on passed (expires_after < runtime)
    store.claim(req(processor, fp))
    age(alias, processor, fp, 3601, "expires_on")
    # When another delivery claims / Then it may not run concurrently
    assert store.claim(req(processor, fp)).kind is Kind.IN_FLIGHT


def test_release_frees_an_in_flight_claim(store: Store, processor: str, fp: str) -> None:
    # Given a fresh claim / When it is released (revoke, operator)
    holder = req(processor, fp)
    store.claim(holder)
    assert not store.release(processor, fp, token="someone-else")
    assert store.release(processor, fp, token=holder.token)
    # Then the next delivery owns it at once, and the old holder is fenced out
    assert store.claim(req(processor, fp)).kind is Kind.RECLAIM
    assert not store.finish(processor, fp, holder.token, completed())


def test_a_claim_that_waited_for_the_rows_lock_is_dated_after_the_wait(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    """MariaDB read its clock in the statement that waited for the lock, as the statement
    began: a claim that waited w seconds wrote started_at and stale_at w seconds early,
    and its holder had w seconds less before another delivery could take it over."""
    import threading
    import time

    store.claim(first := req(processor, fp))
    assert store.release(processor, fp, token=first.token)
    held, done, released = threading.Event(), threading.Event(), []

    def hold() -> None:  # another transaction holds the row (a write: SQLite's lock too)
        try:
            with transaction.atomic(using=alias):
                Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fp).update(
                    duplicates=F("duplicates"))  # fmt: skip
                held.set()
                time.sleep(1.5)
                released.append(journal.now(alias))  # (the database's clock, as it lets go)
        finally:
            done.set()
            from django.db import connections

            connections[alias].close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    # When a claim waits for the row's lock, which another transaction holds (1.5 s)
    res = store.claim(req(processor, fp))
    holder.join()
    # Then it is dated when it got the row: after the lock was let go, not when it began
    # waiting (to the column's precision)
    assert res.kind is Kind.RECLAIM
    started = row(alias, processor, fp).started_at
    assert started >= released[0] - timedelta(milliseconds=2), (released, started)


def test_a_released_claims_late_completion_is_written_unless_claimed_since(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a claim released (an operator, a revoke) while its attempt still ran
    holder = req(processor, fp)
    store.claim(holder)
    assert store.release(processor, fp, token=holder.token)
    # When that attempt completes before anyone claims the key again
    assert store.finish(processor, fp, holder.token, completed())
    # Then its outcome is recorded (the effect ran), and a duplicate gets it
    assert row(alias, processor, fp).status == "completed"
    assert not store.claim(req(processor, fp)).owned
    # And so is a transactional attempt's, in its transaction
    third = req(processor, uuid.uuid4().hex * 2)
    store.claim(third)
    assert store.release(processor, third.fingerprint, token=third.token)
    with transaction.atomic(using=alias):
        assert store.finish_in_transaction(third, completed())
    assert row(alias, processor, third.fingerprint).status == "completed"
    # Given another key released, then claimed again by another delivery
    other = uuid.uuid4().hex * 2
    first = req(processor, other)
    store.claim(first)
    assert store.release(processor, other, token=first.token)
    assert store.claim(req(processor, other)).kind is Kind.RECLAIM
    # Then the first attempt's late completion is fenced out, on both paths
    assert not store.finish(processor, other, first.token, completed())
    with transaction.atomic(using=alias):
        assert not store.finish_in_transaction(first, completed())
    assert row(alias, processor, other).status == "in_flight"


def test_completion_resend_is_idempotent(store: Store, processor: str, fp: str) -> None:
    # Given a completion whose answer was lost / When it is sent again
    r = req(processor, fp)
    store.claim(r)
    assert store.finish(processor, fp, r.token, completed())
    # Then it matches its own row instead of reporting a fence-out
    assert store.finish(processor, fp, r.token, completed())


def test_processors_deduplicate_separately(store: Store, fp: str) -> None:
    # Given two services consuming the same message / Then each acts once
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    assert store.claim(req(a, fp)).owned
    assert store.claim(req(b, fp)).owned
    assert not store.claim(req(a, fp)).owned


def test_claim_commits_outside_callers_transaction(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a caller inside transaction.atomic() on the journal's database
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        assert store.claim(req(processor, fp)).owned
        raise RuntimeError("caller rolls back")
    # Then the claim survived the caller's rollback
    assert row(alias, processor, fp).status == "in_flight"


def test_purge_deletes_only_expired_terminal_rows(store: Store, alias: str, processor: str) -> None:
    # Given expired completed and failed rows, an unexpired row and an expired in-flight one
    fps = {name: uuid.uuid4().hex * 2 for name in ("done", "failed", "fresh", "flight")}
    for name, fp in fps.items():
        r = req(processor, fp)
        store.claim(r)
        if name in ("done", "fresh"):
            store.finish(processor, fp, r.token, completed())
        if name == "failed":
            store.finish(processor, fp, r.token, Completion("failed", None, "", "E: x"))
        if name != "fresh":
            age(alias, processor, fp, 3601, "expires_on")
    # When purged in batches of one
    deleted = journal.purge_expired(alias, batch_size=1)
    # Then exactly the two expired terminal rows are gone
    left = set(
        Outcome.objects.using(alias)
        .filter(processor_id=processor)
        .values_list("fingerprint", flat=True)
    )
    assert deleted >= 2  # (and any other test's expired rows)
    assert left == {fps["fresh"], fps["flight"]}


def test_fences_keep_growing_across_a_purge(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a key whose claim was taken over twice (a zombie may still hold the last
    # fence but one), then completed, expired and purged
    first = store.claim(req(processor, fp)).fence
    age(alias, processor, fp, 61)
    second = store.claim(req(processor, fp)).fence
    age(alias, processor, fp, 61)
    last = req(processor, fp)
    highest = store.claim(last).fence
    assert first < second < highest
    assert store.finish(processor, fp, last.token, completed())
    age(alias, processor, fp, 3601, "expires_on")
    journal.purge_expired(alias)
    assert not Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fp)
    # When the key is claimed again (a new row)
    res = store.claim(req(processor, fp))
    # Then its fence is above every fence issued for the key before the purge, so an
    # external system that remembers the highest fence refuses the old attempts
    assert res.kind is Kind.NEW and res.fence > highest
    assert row(alias, processor, fp).fence == res.fence


def test_duplicates_are_counted_apart_from_redeliveries(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a claim held by delivery A
    a = req(processor, fp, task_id=f"{fp[:16]}-a")
    store.claim(a)
    # When A is delivered again (a broker redelivery: same task id, new attempt), a requeue
    # of another delivery bounces on it, and another delivery B arrives twice (B, then B's
    # in-flight requeue)
    again = [
        store.claim(req(processor, fp, task_id=f"{fp[:16]}-a")),
        store.claim(req(processor, fp, task_id=f"{fp[:16]}-c", bounce=True)),
        store.claim(req(processor, fp, task_id=f"{fp[:16]}-b")),
        store.claim(req(processor, fp, task_id=f"{fp[:16]}-b", bounce=True)),
    ]
    assert {r.kind for r in again} == {Kind.IN_FLIGHT}
    # Then only B's first delivery is a duplicate; the others are redeliveries
    rec = row(alias, processor, fp)
    assert (rec.deliveries, rec.duplicates) == (5, 1)
    # And each delivery that is not the row's own can be found by its task id
    assert [d.decision for d in journal.deliveries_of(alias, f"{fp[:16]}-b")] == ["i", "i"]
    assert [r.pk for r in journal.find(alias, f"{fp[:16]}-b")] == [rec.pk]
    assert journal.deliveries_of(alias, f"{fp[:16]}-a") == []  # the row's own: on the row
    # When A completes and B is answered from the memo
    assert store.finish(processor, fp, a.token, completed())
    assert store.claim(req(processor, fp, task_id=f"{fp[:16]}-d")).kind is Kind.COMPLETED
    assert store.claim(req(processor, fp, task_id=f"{fp[:16]}-a")).kind is Kind.COMPLETED
    rec = row(alias, processor, fp)
    assert (rec.deliveries, rec.duplicates) == (7, 2)
    assert [d.decision for d in journal.deliveries_of(alias, f"{fp[:16]}-d")] == ["c"]


def test_a_takeover_keeps_the_first_claim_time_and_records_the_displaced_delivery(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a stale claim of delivery A
    store.claim(req(processor, fp, task_id=f"{fp[:16]}-a"))
    age(alias, processor, fp, 61)
    first = row(alias, processor, fp).started_at
    assert row(alias, processor, fp).first_claimed_at == first
    # When delivery B takes it over
    res = store.claim(req(processor, fp, task_id=f"{fp[:16]}-b"))
    assert res.kind is Kind.TAKEOVER
    # Then the row keeps its first claim time beside the current attempt's start
    rec = row(alias, processor, fp)
    assert rec.first_claimed_at == first < rec.started_at
    assert (rec.task_id, rec.deliveries, rec.duplicates) == (f"{fp[:16]}-b", 2, 0)
    # And A, no longer on the row, is found by its task id: taken over
    assert [d.decision for d in journal.deliveries_of(alias, f"{fp[:16]}-a")] == ["t"]
    assert "took it over" in journal.delivery_fate("t")
    assert [r.pk for r in journal.find(alias, f"{fp[:16]}-a")] == [rec.pk]


def test_an_expired_key_starts_its_counts_and_first_claim_again(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a completed row with a duplicate, past its retention window
    first = req(processor, fp)
    store.claim(first)
    store.claim(req(processor, fp))
    assert store.finish(processor, fp, first.token, completed())
    age(alias, processor, fp, 3601, "expires_on")
    # When it is claimed again
    assert store.claim(req(processor, fp)).kind is Kind.EXPIRED
    # Then it is a new life: one delivery, no duplicate, first claim = this claim
    rec = row(alias, processor, fp)
    assert (rec.deliveries, rec.duplicates) == (1, 0)
    assert rec.first_claimed_at == rec.started_at


def test_recorded_deliveries_are_purged_with_their_row(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a completed row that answered a duplicate, expired
    first = req(processor, fp)
    store.claim(first)
    dup = req(processor, fp)
    store.claim(dup)
    assert store.finish(processor, fp, first.token, completed())
    assert len(journal.deliveries_of(alias, dup.task_id)) == 1
    age(alias, processor, fp, 3601, "expires_on")
    # When the journal is purged
    journal.purge_expired(alias)
    # Then the duplicate's record went with the row
    assert journal.deliveries_of(alias, dup.task_id) == []


def test_times_come_from_the_database_clock(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    from celery_grousset.journal import now as _db_now

    # Given the database's clock / When a claim is written
    before = _db_now(alias)
    store.claim(req(processor, fp))
    after = _db_now(alias)
    # Then started_at lies between two readings of that clock
    started = row(alias, processor, fp).started_at
    assert before - timedelta(milliseconds=5) <= started <= after + timedelta(milliseconds=5)


def test_an_overlong_task_id_is_a_permanent_error(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    from celery_grousset.exceptions import PoisonDelivery, StoreUnavailable

    # Given a claim whose task id is longer than the journal's column (255)
    poison = req(processor, fp, task_id="t" * 300)
    # When it is sent to the store / Then the store says the data is refused for good:
    # PoisonDelivery, never StoreUnavailable (which would re-queue it forever)
    with pytest.raises(PoisonDelivery) as err:
        store.claim(poison)
    assert not isinstance(err.value, StoreUnavailable)
    assert not Outcome.objects.using(alias).filter(processor_id=processor).exists()
    # And the store's connection is still good: the next claim goes through
    assert store.claim(req(processor, fp)).kind is Kind.NEW


def test_a_completion_the_database_refuses_is_a_permanent_error(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    from celery_grousset.exceptions import PoisonDelivery

    if alias == "default":
        pytest.skip("SQLite does not enforce column lengths")
    first = req(processor, fp)
    store.claim(first)
    # Given a completion whose result_encoding is longer than its column (64)
    refused = Completion("completed", b"1", "x" * 100)
    # When it is written / Then the driver's data error is the permanent error
    with pytest.raises(PoisonDelivery, match="refused the data"):
        store.finish(processor, fp, first.token, refused)
    # And a completion that fits still lands on the same connection
    assert store.finish(processor, fp, first.token, completed(b"7"))


# -- the payload hash beside the key (same key, different payload) -----------------------

A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


def test_claim_returns_the_rows_payload_hash(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a new claim with a payload hash / Then it is written and returned
    first = req(processor, fp, payload_hash=A)
    res = store.claim(first)
    assert res.kind is Kind.NEW and res.payload_hash == A
    assert row(alias, processor, fp).payload_hash == A
    # When calls with another payload find it in flight, re-sent, or completed
    assert store.claim(req(processor, fp, payload_hash=B)).payload_hash == A
    assert store.claim(first).kind is Kind.RESUMED
    assert store.finish(processor, fp, first.token, completed())
    dup = store.claim(req(processor, fp, payload_hash=B))
    # Then each gets the row's hash (not its own), and the row keeps it
    assert dup.kind is Kind.MISMATCH and dup.payload_hash == A
    assert row(alias, processor, fp).payload_hash == A


def test_a_claim_of_other_arguments_never_takes_the_row_until_it_expires(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a stale claim with payload A / When B finds it / Then refused, nothing taken
    store.claim(req(processor, fp, payload_hash=A))
    age(alias, processor, fp, 61)
    res = store.claim(req(processor, fp, payload_hash=B))
    assert res.kind is Kind.MISMATCH and not res.owned and res.payload_hash == A
    assert (row(alias, processor, fp).payload_hash, row(alias, processor, fp).takeovers) == (A, 0)
    # When A comes again / Then it takes the claim over
    taker = req(processor, fp, payload_hash=A)
    assert store.claim(taker).kind is Kind.TAKEOVER
    # And a released failure: refused to C, reclaimed by A
    assert store.finish(processor, fp, taker.token, Completion("failed", None, "", "E: x"))
    assert store.claim(req(processor, fp, payload_hash=C)).kind is Kind.MISMATCH
    again = req(processor, fp, payload_hash=A)
    res = store.claim(again)
    assert res.kind is Kind.RECLAIM and res.payload_hash == A
    # And an expired record is claimed anew by D, whose hash it then carries
    assert store.finish(processor, fp, again.token, completed())
    age(alias, processor, fp, 3601, "expires_on")
    res = store.claim(req(processor, fp, payload_hash=D))
    assert res.kind is Kind.EXPIRED and res.payload_hash == D
    assert row(alias, processor, fp).payload_hash == D
    # A claim without a hash (validation off) compares nothing, and writes ''
    age(alias, processor, fp, 61)
    res = store.claim(req(processor, fp))
    assert res.kind is Kind.TAKEOVER and res.payload_hash == ""
    assert row(alias, processor, fp).payload_hash == ""


def test_a_give_up_keeps_the_rows_payload_hash(
    store: Store, alias: str, processor: str, fp: str
) -> None:
    # Given a claim with payload A taken over until max_takeovers (0) is reached
    store.claim(req(processor, fp, payload_hash=A, max_takeovers=0))
    age(alias, processor, fp, 61)
    # When another payload's claim finds it / Then refused before any give-up
    res = store.claim(req(processor, fp, payload_hash=B, max_takeovers=0))
    assert res.kind is Kind.MISMATCH and row(alias, processor, fp).status == "in_flight"
    # When its own payload's claim gives up / Then the row's hash is returned and kept
    res = store.claim(req(processor, fp, payload_hash=A, max_takeovers=0))
    assert res.kind is Kind.GAVE_UP and res.payload_hash == A
    assert row(alias, processor, fp).payload_hash == A
