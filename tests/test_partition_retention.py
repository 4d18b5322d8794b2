"""Retention on the partitioned journal while claims run (docs/scale.md, "Retention:
drop a generation"): the check of a generation blocks no claim, and a row made live
between that check and the detach (a late renewal) keeps its generation. Both ways of
checking: one probe of the "abandoned after" index (the layout ``convert`` builds), and
the scan it falls back to when the index is missing. Completions stay HOT updates."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models import F
from django.utils import timezone

from celery_grousset.claim import Kind
from celery_grousset.models import Outcome
from celery_grousset.store import get_store, pgpartops, pgpartretire
from tests.test_partition import DONE, exists, into_generation, part, req  # noqa: F401

CHECKS = ["index", "scan"]


@pytest.fixture(params=CHECKS)
def check(request: pytest.FixtureRequest, part: str) -> Iterator[str]:  # noqa: F811
    """Retention checks with the index (as converted), or by a scan (index dropped)."""
    if request.param == "index":
        yield part
        return
    with connections[part].cursor() as cur:
        cur.execute(f"DROP INDEX {pgpartops.ABANDON_INDEX}")
    try:
        yield part
    finally:
        with connections[part].cursor() as cur:
            cur.execute(
                f"CREATE INDEX {pgpartops.ABANDON_INDEX} ON celery_grousset_outcome "
                f"({pgpartops.ABANDON})"
            )


def expired_generation(alias: str, processor: str, gen: int) -> None:
    """A past generation holding two expired, completed rows."""
    store = get_store(alias)
    for _ in range(2):
        r = req(processor)
        store.claim(r)
        assert store.finish(processor, r.fingerprint, r.token, DONE)
    Outcome.objects.using(alias).filter(processor_id=processor).update(
        expires_on=F("expires_on") - timedelta(days=2),
        started_at=F("started_at") - timedelta(days=2),
        stale_at=F("stale_at") - timedelta(days=2),
    )  # as if claimed two days ago
    into_generation(alias, gen, processor_id=processor)


def past_generation(alias: str, processor: str) -> int:
    """A past generation of this test's own (tests share the journal)."""
    return pgpartops.current_generation(alias) - 30 - int(processor[-6:], 16) % 5000


def test_claims_go_on_while_retention_checks_a_generation(
    check: str, processor: str, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    part = check  # noqa: F811
    old = past_generation(part, processor)
    expired_generation(part, processor, old)
    store, seen = get_store(part), []
    clear = pgpartretire._clear

    def claim_meanwhile(*args: Any) -> Any:
        if not seen:  # the first check of the generation: a claim runs right now
            seen.append(store.claim(req(f"{processor}-new")).kind)
        return clear(*args)

    monkeypatch.setattr(pgpartretire, "_clear", claim_meanwhile)
    # When retention scans the expired generation and a claim is made meanwhile
    # (same thread: a claim that waited for retention's lock would time out)
    with caplog.at_level("INFO", logger="celery_grousset"):
        dropped = pgpartretire.retire(part, timezone.now())
    # Then the claim went through, and the generation was dropped with its rows
    assert seen == [Kind.NEW]
    assert dropped >= 2 and not exists(part, old)
    assert not Outcome.objects.using(part).filter(processor_id=processor).exists()
    # And the log says how long its checks and detach, and its DROP TABLE, took
    retired = [r.grousset for r in caplog.records  # type: ignore[attr-defined]
               if getattr(r, "grousset", {}).get("generation") == old]  # fmt: skip
    assert len(retired) == 1, retired
    assert retired[0]["event"] == "grousset.generation_retired" and retired[0]["rows"] >= 2
    assert retired[0]["detach_seconds"] >= 0 and retired[0]["drop_seconds"] >= 0


def test_a_row_made_live_before_the_detach_keeps_its_generation(
    check: str, processor: str, monkeypatch: Any
) -> None:
    part = check  # noqa: F811
    store, now = get_store(part), timezone.now()
    old = past_generation(part, processor)
    expired_generation(part, processor, old)
    # Given, in that generation, a claim abandoned long ago (stale, past its expiry
    # plus its max_processing_time): purgeable
    late = req(processor)
    store.claim(late)
    Outcome.objects.using(part).filter(fingerprint=late.fingerprint).update(
        started_at=now - timedelta(days=3, seconds=60),
        stale_at=now - timedelta(days=3),
        expires_on=now - timedelta(days=2),
    )
    into_generation(part, old, processor_id=processor)
    clear, renewed = pgpartretire._clear, []

    def renews_meanwhile(*args: Any) -> Any:
        verdict = clear(*args)
        if not renewed:  # its owner (a pre-made claim starting late) renews it after
            # retention found the generation clear, in place: as an earlier version did
            # (a worker not yet upgraded; this one moves the row into the current
            # generation: tests/test_partition.py)
            renewed.append(Outcome.objects.using(part).filter(
                fingerprint=late.fingerprint, claim_token=late.token,
            ).update(stale_at=timezone.now() + timedelta(seconds=60)) == 1)  # fmt: skip
        return verdict

    monkeypatch.setattr(pgpartretire, "_clear", renews_meanwhile)
    # When retention runs across that renewal
    pgpartretire.retire(part, timezone.now())  # (other tests' generations may go)
    # Then the generation is back, with the live claim and the other rows
    assert renewed == [True] and exists(part, old)
    row = Outcome.objects.using(part).get(fingerprint=late.fingerprint)
    assert row.status == "in_flight" and row.stale_at > timezone.now()
    assert Outcome.objects.using(part).filter(processor_id=processor).count() == 3
    # And a duplicate of it finds the claim in flight, not a new key
    assert store.claim(req(processor, late.fingerprint)).kind is Kind.IN_FLIGHT


def test_the_admin_estimate_counts_the_partitions(part: str, processor: str) -> None:  # noqa: F811
    """The unfiltered admin list shows the planner's estimate instead of counting a
    large journal: on the partitioned layout that is the partitions' estimates (the
    parent's own stays -1 until an ANALYZE of the parent, which autovacuum never runs)."""
    from django.db import connections

    store = get_store(part)
    for _ in range(3):
        store.claim(req(processor))
    with connections[part].cursor() as cur:
        cur.execute("SELECT count(*) FROM celery_grousset_outcome")
        rows = cur.fetchone()[0]
        for _gen, name, _pending, _n in pgpartops.partitions(part):
            cur.execute(f"ANALYZE {name}")
    assert store.estimated_count() == rows


@pytest.mark.serial  # other tests' updates in the current generation use up its pages'
# free space (then an update cannot stay on its page: not HOT, whatever its columns)
def test_completions_and_duplicates_stay_hot_updates(part: str, processor: str) -> None:  # noqa: F811
    """The "abandoned after" index reads only columns a completion or a duplicate never
    changes: PostgreSQL writes both without touching an index."""
    store = get_store(part)
    reqs = [req(processor) for _ in range(50)]
    for r in reqs:
        store.claim(r)
    gen = pgpartops.current_generation(part)
    table = f"celery_grousset_outcome_g{gen}"

    def updates(at_least: int = 0) -> tuple[int, int]:
        """The partition's updates and HOT updates, once the store's backend reported
        at least ``at_least`` updates (it reports when idle)."""
        store._conn.execute("SELECT pg_stat_force_next_flush()")
        deadline = time.monotonic() + 15
        while True:
            with connections[part].cursor() as cur:
                cur.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                            "WHERE relname = %s", [table])  # fmt: skip
                upd, hot = cur.fetchone()
            if upd >= at_least or time.monotonic() > deadline:
                return int(upd), int(hot)
            time.sleep(0.2)

    upd0, hot0 = updates()
    for r in reqs:  # each completed, then delivered again
        assert store.finish(processor, r.fingerprint, r.token, DONE)
        store.claim(req(processor, r.fingerprint))
    upd1, hot1 = updates(upd0 + 100)
    assert upd1 - upd0 >= 100 and hot1 - hot0 == upd1 - upd0, (upd1 - upd0, hot1 - hot0)


def _hold(alias: str, sql: str, held: threading.Event, done: threading.Event) -> None:
    """Another session: run ``sql`` in a transaction (``BEGIN`` for a row lock) or not,
    and keep it until ``done``."""
    from django.db import transaction

    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cur:
            cur.execute(sql)
            held.set()
            done.wait(30)
    finally:
        connections[alias].close()


def test_a_transaction_left_open_on_the_journal_keeps_a_generation_for_the_next_run(
    part: str, processor: str, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """Retention's barrier waited STORE_TIMEOUT for a transaction that wrote to the
    journal and stayed open (a psql session, a long protect() inside atomic()), every
    claim queued behind its lock request, then the purge failed (and skipped the
    generations ahead)."""
    old = past_generation(part, processor)
    expired_generation(part, processor, old)
    past = sum(1 for g, *_ in pgpartops.partitions(part) if g < pgpartops.current_generation(part))
    held, done = threading.Event(), threading.Event()
    sql = "UPDATE celery_grousset_outcome SET status = status WHERE fingerprint = 'none'"
    holder = threading.Thread(target=_hold, args=(part, sql, held, done))
    holder.start()
    try:
        assert held.wait(10)
        # When retention runs while that transaction holds on
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="celery_grousset"):
            pgpartretire.retire(part, timezone.now())
        took = time.monotonic() - started
    finally:
        done.set()
        holder.join()
    # Then it waited at most BARRIER_MS per past generation, and kept this one, saying so
    assert took < past * pgpartops.BARRIER_MS / 1000 + 3, (took, past)
    assert exists(part, old)
    busy = [r.grousset for r in caplog.records  # type: ignore[attr-defined]
            if getattr(r, "grousset", {}).get("generation") == old]  # fmt: skip
    assert busy and busy[0]["event"] == "grousset.generation_busy", busy
    # And the next run, the transaction gone, drops it
    pgpartretire.retire(part, timezone.now())
    assert not exists(part, old)


def test_one_retention_run_at_a_time(
    part: str, processor: str, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """Two purges at once (the beat task and a manual run) raced on the same
    generations: 'already pending detach', 'does not exist', 'is not a partition'."""
    from django.core.management import call_command

    old = past_generation(part, processor)
    expired_generation(part, processor, old)
    held, done = threading.Event(), threading.Event()
    sql = f"SELECT pg_advisory_xact_lock({pgpartops.DDL_LOCK})"
    holder = threading.Thread(target=_hold, args=(part, sql, held, done))
    holder.start()
    out = io.StringIO()
    try:
        assert held.wait(10)
        # When retention runs while another DDL run holds the lock (the command too)
        with caplog.at_level("WARNING", logger="celery_grousset"):
            dropped = pgpartretire.retire(part, timezone.now())
            call_command("grousset_purge", "--no-outbox", database=part, stdout=out)
    finally:
        done.set()
        holder.join()
    # Then it drops nothing, and says so (it said "purged 0" and nothing else)
    assert dropped == 0 and exists(part, old)
    skipped = [m for m in caplog.messages if m.startswith("grousset.retention_skipped")]
    assert len(skipped) == 2 and "holds the journal's DDL lock" in skipped[0], caplog.messages
    # and the command's line says how this layout purges
    assert "partitioned layout: a run drops whole generations" in out.getvalue(), out.getvalue()
    # And the next run does
    assert pgpartretire.retire(part, timezone.now()) >= 2 and not exists(part, old)


def test_the_generations_ahead_are_made_whatever_became_of_retention(
    part: str, monkeypatch: Any  # noqa: F811
) -> None:
    made: list[str] = []

    def fails(*args: Any) -> int:
        raise RuntimeError("retention failed")

    monkeypatch.setattr(pgpartretire, "retire", fails)
    monkeypatch.setattr(pgpartops, "create_ahead", lambda alias, *a: made.append(alias))
    # When retention fails / Then the generations ahead were made all the same
    with pytest.raises(RuntimeError, match="retention failed"):
        get_store(part).purge_expired()
    assert made == [part]


def test_a_detach_held_up_by_an_old_reader_is_finished_by_the_next_run(
    part: str, processor: str, monkeypatch: Any, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """DETACH … CONCURRENTLY waited, without a bound, for any transaction open on the
    journal; a detach cut short (or killed) was then finished and dropped unchecked and
    uncounted, and a run killed after its detach left the table for good."""
    old = past_generation(part, processor)
    expired_generation(part, processor, old)
    expired_generation(part, f"{processor}-next", old + 1)  # (one partition may be pending)
    name = f"celery_grousset_outcome_g{old}"
    monkeypatch.setattr(pgpartretire, "DETACH_MS", 300)
    # Given a report left open on the journal (a transaction that has read it)
    reader = connections.create_connection(part)
    reader.set_autocommit(False)
    try:
        with reader.cursor() as cur:
            cur.execute("SELECT count(*) FROM celery_grousset_outcome")
        # When retention runs
        with caplog.at_level("WARNING", logger="celery_grousset"):
            pgpartretire.retire(part, timezone.now())
        # Then its detach waits no longer than its bound: said, and left pending
        busy = [r.grousset for r in caplog.records  # type: ignore[attr-defined]
                if getattr(r, "grousset", {}).get("generation") == old]  # fmt: skip
        assert busy and busy[0]["event"] == "grousset.generation_busy", busy
        assert [p for g, _, p, _ in pgpartops.partitions(part) if g == old] == [True]
        # ... and the run stops there: the next generation is kept for the next run (its
        # detach failed: only one partition may be pending), and so is a run meanwhile
        # (its FINALIZE bounded as the detach is)
        assert exists(part, old + 1)
        pgpartretire.retire(part, timezone.now())
        assert exists(part, old + 1)
    finally:
        reader.rollback()
        reader.close()
    # When the next run comes, the reader gone / Then it finishes the detach, checks the
    # rows again and drops them, counted, and the next generation too
    assert pgpartretire.retire(part, timezone.now()) >= 4 and not exists(part, old)
    assert not exists(part, old + 1)
    # And a generation a killed run detached but did not drop is found and dropped too
    expired_generation(part, f"{processor}-2", old)
    with connections[part].cursor() as cur:
        cur.execute(f"ALTER TABLE celery_grousset_outcome DETACH PARTITION {name}")
    assert pgpartretire.retire(part, timezone.now()) >= 2
    with connections[part].cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", [name])
        assert cur.fetchone()[0] is None
