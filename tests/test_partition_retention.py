"""Retention on the partitioned journal while claims run (docs/scale.md, "Retention:
drop a generation"): the scan of a generation blocks no claim, and a row made live
between that scan and the detach (a late renewal) keeps its generation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import F
from django.utils import timezone

from celery_grousset import preclaim
from celery_grousset.claim import Kind
from celery_grousset.models import Outcome
from celery_grousset.store import get_store, pgpartops
from tests.test_partition import DONE, exists, into_generation, part, req  # noqa: F401


def expired_generation(alias: str, processor: str, gen: int) -> None:
    """A past generation holding two expired, completed rows."""
    store = get_store(alias)
    for _ in range(2):
        r = req(processor)
        store.claim(r)
        assert store.finish(processor, r.fingerprint, r.token, DONE)
    Outcome.objects.using(alias).filter(processor_id=processor).update(
        expires_on=F("expires_on") - timedelta(days=2)
    )
    into_generation(alias, gen, processor_id=processor)


def test_claims_go_on_while_retention_scans_a_generation(
    part: str, processor: str, monkeypatch: Any  # noqa: F811
) -> None:
    old = pgpartops.current_generation(part) - 20
    expired_generation(part, processor, old)
    store, seen = get_store(part), []
    census = pgpartops._census

    def claim_meanwhile(alias: str, cur: Any, name: str, cutoff: Any) -> tuple[int, int]:
        if not seen:  # the first scan of the generation: a claim runs right now
            seen.append(store.claim(req(f"{processor}-new")).kind)
        return census(alias, cur, name, cutoff)

    monkeypatch.setattr(pgpartops, "_census", claim_meanwhile)
    # When retention scans the expired generation and a claim is made meanwhile
    # (same thread: a claim that waited for retention's lock would time out)
    dropped = pgpartops.retire(part, timezone.now())
    # Then the claim went through, and the generation was dropped with its rows
    assert seen == [Kind.NEW]
    assert dropped == 2 and not exists(part, old)


def test_a_row_made_live_before_the_detach_keeps_its_generation(
    part: str, processor: str, monkeypatch: Any  # noqa: F811
) -> None:
    store, now = get_store(part), timezone.now()
    old = pgpartops.current_generation(part) - 20
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
    settled = pgpartops._settled_generation

    def completes_meanwhile(*args: Any) -> bool:
        clear = settled(*args)
        # its owner (a pre-made claim starting late) renews it after retention found
        # the generation clear
        assert preclaim.renew(store, late)
        return clear

    monkeypatch.setattr(pgpartops, "_settled_generation", completes_meanwhile)
    # When retention runs across that renewal
    assert pgpartops.retire(part, timezone.now()) == 0
    # Then the generation is back, with the live claim and the other rows
    assert exists(part, old)
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
