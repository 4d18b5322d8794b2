"""The online conversion of a large journal (``grousset_partition prepare`` then
``convert``, PostgreSQL; docs/scale.md, "Converting a large table"): claims go on while
the table is prepared, the conversion copies and rewrites nothing, every key keeps its
one row and its decision across it, and retention drops the old table as one past
generation."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models import F
from django.utils import timezone

from celery_grousset.claim import Kind
from celery_grousset.models import Outcome
from celery_grousset.store import get_store, pgpartconvert, pgpartops, reset_stores
from celery_grousset.store.pgdriver import driver
from celery_grousset.store.postgresql import PostgresStore
from tests import services
from tests.partition_racer import race_store
from tests.racer import run_racers
from tests.test_partition import DONE, layout, req, run, three_keys

ALIAS = services.CONVERTED
TABLE = "celery_grousset_outcome"


def filenodes(*relations: str) -> list[int]:
    with connections[ALIAS].cursor() as cur:
        cur.execute(
            "SELECT pg_relation_filenode(r) FROM unnest(%s::regclass[]) AS r", [list(relations)]
        )
        return [n for (n,) in cur.fetchall()]


def waiting(query: str) -> bool:
    with connections[ALIAS].cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s",
            [query],
        )
        return bool(cur.fetchone()[0])


def test_prepare_then_convert_attaches_the_table_as_it_is(single: str, processor: str) -> None:
    # Given a single-table journal: two completed keys, an in-flight one
    store = get_store(single)
    first, done, flying, idle = three_keys(store, processor)
    # When it is prepared (generations of an hour)
    text = run("grousset_partition", "prepare", "--generation", "3600", database=single)
    g0 = pgpartops.current_generation(single) - 1
    assert f"(its rows: generation {g0})" in text and "grousset_outcome_gen_key" in text
    # Then the single-table claims go on, the rows in generation g0
    new = req(processor)
    assert store.claim(new).kind is Kind.NEW
    assert store.claim(req(processor, done.fingerprint)).kind is Kind.COMPLETED
    assert set(Outcome.objects.using(single).values_list("processor_id", flat=True)) == {processor}
    with connections[single].cursor() as cur:
        cur.execute(f"SELECT DISTINCT gen FROM {TABLE}")
        assert cur.fetchall() == [(g0,)]
    # And a second prepare has nothing left to do; one of another width is refused
    assert "nothing left to do" in run("grousset_partition", "prepare", database=single)
    with pytest.raises(Exception, match="prepared with generations of 3600 s"):
        run("grousset_partition", "prepare", "--generation", "60", database=single)
    # When the conversion runs, what the table and its indexes are on disk is kept as is
    kept = [TABLE, *pgpartconvert.PREPARED]
    before = filenodes(*kept)
    text = run("grousset_partition", "convert", database=single)
    assert "none copied" in text and "generations of 3600 s" in text
    assert filenodes(f"{TABLE}_g{g0}", *pgpartconvert.PREPARED) == before
    assert f"{TABLE}_g{g0} " in run("grousset_partition", "status", database=single)
    # Then, on the partitioned store, each key keeps its decision and its fence
    with layout(single):
        reset_stores()
        part = get_store(single)
        memo = part.claim(req(processor, done.fingerprint))
        assert memo.kind is Kind.COMPLETED and memo.fence == first.fence
        assert part.claim(req(processor, flying.fingerprint)).kind is Kind.IN_FLIGHT
        assert part.claim(req(processor, new.fingerprint)).kind is Kind.IN_FLIGHT
        later = req(processor)
        assert part.claim(later).kind is Kind.NEW
        ids = Outcome.objects.using(single).values_list("id", flat=True)
        assert len(set(ids)) == 5 == len(ids)
        assert Outcome.objects.using(single).get(fingerprint=later.fingerprint).id == max(ids)
        # And a retention run drops the old table as a generation once its rows expire
        Outcome.objects.using(single).update(
            expires_on=F("expires_on") - timedelta(days=2),
            stale_at=timezone.now() - timedelta(days=2),
        )
        with connections[single].cursor() as cur:
            cur.execute(f"SELECT fingerprint FROM {TABLE}_g{g0}")
            assert cur.fetchall() == [(idle.fingerprint,)]  # the others moved on their claims
        part.purge_expired()
        assert g0 not in [g for g, *_ in pgpartops.partitions(single)]
    reset_stores()


def test_convert_refuses_a_half_prepared_table_and_prepare_finishes_it(single: str) -> None:
    get_store(single).claim(req("half"))
    run("grousset_partition", "prepare", database=single)
    # Given a prepare interrupted before its last index
    with connections[single].cursor() as cur:
        cur.execute("DROP INDEX grousset_outcome_gen_abandoned")
    # Then convert refuses, naming what is missing and the command that finishes it
    with pytest.raises(Exception, match=r"still to do: grousset_outcome_gen_abandoned\).*prepare"):
        run("grousset_partition", "convert", database=single)
    assert not pgpartops.is_partitioned(single)
    # And a conversion of a large unprepared table names prepare
    # (prepare again builds only what is missing)
    assert "generation" in run("grousset_partition", "prepare", database=single)
    assert "none copied" in run("grousset_partition", "convert", database=single)


def test_claims_go_on_while_prepare_waits_to_build_an_index(single: str, processor: str) -> None:
    # Given a prepared table whose last index is to be built again
    store = get_store(single)
    run("grousset_partition", "prepare", database=single)
    with connections[single].cursor() as cur:
        cur.execute("DROP INDEX grousset_outcome_gen_key")
    # And a transaction writing the table, which CREATE INDEX CONCURRENTLY waits for
    s = connections[single].settings_dict
    blocker = services.pg_connect(host=s["HOST"], port=int(s["PORT"]), user=s["USER"],
                                  dbname=s["NAME"])  # fmt: skip
    db = driver()
    db.execute(blocker, "BEGIN")
    db.execute(blocker, f"LOCK TABLE {TABLE} IN ROW EXCLUSIVE MODE")
    out: dict[str, Any] = {}

    def prepare() -> None:
        try:
            out["done"] = pgpartconvert.prepare(single)
        finally:
            connections.close_all()

    thread = threading.Thread(target=prepare)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not waiting("CREATE UNIQUE INDEX CONCURRENTLY%"):
            assert time.monotonic() < deadline and thread.is_alive(), "prepare never waited"
            time.sleep(0.01)
        # When a claim and its completion run meanwhile, they do not wait for it
        r = req(processor)
        started = time.monotonic()
        assert store.claim(r).kind is Kind.NEW
        assert store.finish(processor, r.fingerprint, r.token, DONE)
        assert time.monotonic() - started < 2
        assert thread.is_alive()  # still waiting
    finally:
        db.execute(blocker, "COMMIT")
        blocker.close()
        thread.join(60)
    # Then prepare finished, with the index built
    assert out["done"][1] == ["grousset_outcome_gen_key"]


SLOW_INDEX = (
    "CREATE FUNCTION grousset_test_slow(fp text) RETURNS text LANGUAGE sql IMMUTABLE AS "
    "$$ SELECT fp FROM pg_sleep(CASE WHEN fp LIKE 'slow%' THEN 1 ELSE 0 END) $$; "
    f"CREATE INDEX grousset_test_slow ON {TABLE} (grousset_test_slow(fingerprint)); "
    # the claim's arbiter made again, so a row's entry goes into it after the slow index
    f"ALTER TABLE {TABLE} DROP CONSTRAINT grousset_outcome_key; "
    f"ALTER TABLE {TABLE} ADD CONSTRAINT grousset_outcome_key UNIQUE (fingerprint, processor_id)"
)


def test_two_first_claims_of_a_key_on_a_prepared_table_both_decide(
    single: str, processor: str
) -> None:
    # Given a prepared table where a row's index entries go into the prepared key, then
    # (slowly, for keys named slow…) into the claim's arbiter: the window in which two
    # first claims of one key both pass ON CONFLICT's check, held open
    run("grousset_partition", "prepare", database=single)
    with connections[single].cursor() as cur:
        cur.execute(SLOW_INDEX)
    key = ("slow" + uuid.uuid4().hex * 2)[:64]
    s = connections[single].settings_dict
    first, second = (PostgresStore(single, s, 30.0) for _ in range(2))
    got: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: got.update(first=first.claim(req(processor, key))))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not sleeping(single):
            assert time.monotonic() < deadline and thread.is_alive(), "the claim never slept"
            time.sleep(0.01)
        # When the second claim of the key arrives meanwhile
        other = second.claim(req(processor, key))
    finally:
        thread.join(30)
        first.close()
        second.close()
    # Then the first owns it and the second finds it in flight (before the store sent a
    # claim once more on a unique violation, it failed: "duplicate key value violates
    # unique constraint grousset_outcome_gen_key")
    assert got["first"].kind is Kind.NEW and other.kind is Kind.IN_FLIGHT


def sleeping(alias: str) -> bool:
    with connections[alias].cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
        return bool(cur.fetchone()[0])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eight_processes_claim_900_keys_once_across_an_online_conversion(
    single: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [uuid.uuid4().hex * 2 for _ in range(900)]
    # Given 8 processes claiming 600 new keys in the same order (their first claims of a
    # key meet as often as they can) on a prepared single table
    run("grousset_partition", "prepare", database=single)
    before = run_racers(race_store, 8, single, keys[:600], processor, True)
    # When the journal is converted (the workers stopped) and 8 processes race on all
    # 900 keys, the first 600 now duplicates, on the partitioned store
    run("grousset_partition", "convert", database=single)
    monkeypatch.setenv("GROUSSET_TEST_LAYOUT", "partitioned")
    after = run_racers(race_store, 8, single, keys, processor, False)
    # Then each key was owned exactly once, and no claim or completion failed (before the
    # prepared key, a unique index that is not ON CONFLICT's arbiter, was handled, a few
    # of the lockstep's first claims failed closed on it: "duplicate key value")
    owners = Counter(k for owned, _ in before + after for k in owned)
    assert set(owners) == set(keys) and set(owners.values()) == {1}, Counter(owners.values())
    assert [e for _, errs in before + after for e in errs] == []
    # And each key has one row
    with connections[single].cursor() as cur:
        cur.execute(
            f"SELECT count(*), count(DISTINCT fingerprint) FROM {TABLE} WHERE processor_id = %s",
            [processor],
        )
        assert cur.fetchone() == (900, 900)
