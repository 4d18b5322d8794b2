"""The partitioned journal (``GROUSSET["JOURNAL_LAYOUT"] = "partitioned"``, PostgreSQL):
the setting, the conversion command, retention by generation, the race across a
generation boundary, and the admin and ``grousset_stats`` on it (docs/scale.md). The
store contract suite runs on it too (tests/test_store_contract.py, ``pg-partitioned``)."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django.db.models import F
from django.test import override_settings

from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.conf import GroussetSettingsError, validate_setting
from celery_grousset.exceptions import ConfigurationError, StoreUnavailable
from celery_grousset.models import Outcome
from celery_grousset.store import get_store, pgpartconvert, pgpartops, reset_stores
from celery_grousset.store.base import Completion
from celery_grousset.store.pgpartition import PartitionedStore
from celery_grousset.store.postgresql import PostgresStore
from tests import services
from tests.partition_racer import race
from tests.racer import run_all

DONE = Completion("completed", b'"ok"', "application/json;utf-8")


def layout(alias: str, value: str = "partitioned") -> Any:
    return override_settings(
        GROUSSET={**settings.GROUSSET, "DATABASE": alias, "JOURNAL_LAYOUT": value}
    )


@pytest.fixture
def part() -> Iterator[str]:
    """The partitioned journal, its stores the partitioned ones."""
    alias = services.require_partitioned()
    with layout(alias):
        yield alias


def req(processor: str, fp: str | None = None) -> ClaimRequest:
    return ClaimRequest(
        processor_id=processor, fingerprint=fp or uuid.uuid4().hex * 2, task_name="tests.effect",
        task_id=f"task-{uuid.uuid4().hex[:8]}", token=uuid.uuid4().hex, worker="w:1",
        args_repr="(1,)", max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
    )  # fmt: skip


def three_keys(store: Any, processor: str) -> tuple[Any, ClaimRequest, ...]:
    """Two completed keys and an in-flight one: ``(first claim's answer, done, flying,
    idle)``."""
    done, flying, idle = req(processor), req(processor), req(processor)
    first = store.claim(done)
    assert store.finish(processor, done.fingerprint, done.token, DONE)
    store.claim(idle)
    assert store.finish(processor, idle.fingerprint, idle.token, DONE)
    store.claim(flying)
    return first, done, flying, idle


def run(*args: Any, **options: Any) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def exists(alias: str, gen: int) -> bool:
    return any(g == gen for g, *_ in pgpartops.partitions(alias))


def into_generation(alias: str, gen: int, **where: Any) -> None:
    """Move rows into an older generation, as if their last claim had been then."""
    ids = list(Outcome.objects.using(alias).filter(**where).values_list("id", flat=True))
    with connections[alias].cursor() as cur:
        pgpartops.add_generation(cur, gen)
        cur.execute("UPDATE celery_grousset_outcome SET gen = %s WHERE id = ANY(%s)", [gen, ids])


# -- the setting ---------------------------------------------------------------------------


def test_the_layout_setting_is_validated_and_chooses_the_store() -> None:
    # A value that is not a layout is refused, naming both
    with pytest.raises(GroussetSettingsError, match="'table' or 'partitioned'"):
        validate_setting("JOURNAL_LAYOUT", "sharded")
    services.require_database("postgresql")
    # The default is the single table; "partitioned" gives the partitioned store
    reset_stores()
    assert type(get_store("postgresql")) is PostgresStore
    with layout("postgresql"):
        assert isinstance(get_store("postgresql"), PartitionedStore)
    reset_stores()


def test_partitioned_on_another_vendor_is_a_check_error_and_refused() -> None:
    from celery_grousset.checks import _check_database

    services.require_database("default")
    with layout("default"):
        # Then `manage.py check` names the problem and the fix
        [error] = [m for m in _check_database([]) if m.id == "celery_grousset.E015"]
        assert "not PostgreSQL" in error.msg and "'table'" in (error.hint or "")
        # And no store is made for it (fails closed)
        with pytest.raises(ConfigurationError, match="only PostgreSQL"):
            get_store("default")
        # And `check --database` says no more than E015 (its store probe does not fail)
        from django.core import checks

        found = checks.run_checks(databases=["default"], tags=[checks.Tags.database])
        assert "celery_grousset.E014" not in {m.id for m in found}


def test_an_unconverted_journal_fails_closed_naming_the_command() -> None:
    services.require_database("postgresql")
    with layout("postgresql"), pytest.raises(StoreUnavailable, match="partition convert --data"):
        get_store("postgresql").claim(req("unconverted"))


def test_check_database_names_a_layout_that_is_not_the_journals(processor: str) -> None:
    from django.core import checks

    def w010(alias: str) -> list[Any]:
        found = checks.run_checks(databases=[alias], tags=[checks.Tags.database])
        return [m for m in found if m.id == "celery_grousset.W010"]

    services.require_database("postgresql")
    part = services.require_partitioned()
    # Given JOURNAL_LAYOUT "partitioned" on a single-table journal
    with layout("postgresql"):
        # Then `check --database` names the mismatch and `convert`
        [single] = w010("postgresql")
        assert "is the single table" in single.msg and "convert" in (single.hint or "")
    # Given JOURNAL_LAYOUT "table" on a partitioned journal
    reset_stores()
    try:
        with layout(part, "table"):
            # Then the check names it too, and a claim there fails closed, naming the fix
            [partitioned] = w010(part)
            assert "partitioned layout" in partitioned.msg
            assert "'partitioned'" in (partitioned.hint or "")
            with pytest.raises(StoreUnavailable, match="set JOURNAL_LAYOUT to 'partitioned'"):
                get_store(part).claim(req(processor))
    finally:
        reset_stores()
    # And each layout on its own journal is silent
    with layout(part):
        assert w010(part) == []
    with layout("postgresql", "table"):
        assert w010("postgresql") == []


# -- the command ---------------------------------------------------------------------------


def test_migrate_refreshes_the_claim_function_of_a_partitioned_journal(part: str) -> None:
    from django.core.management import call_command

    from celery_grousset.store.pgpartsql import FUNCTION_SQL

    def body() -> str:
        with connections[part].cursor() as cur:
            cur.execute("SELECT prosrc FROM pg_proc WHERE proname = 'grousset_claim'")
            return str(cur.fetchone()[0])

    # Given a journal converted by an earlier version (its claim function another one)
    with connections[part].cursor() as cur:
        cur.execute(FUNCTION_SQL.replace("$fn$\n", "$fn$\n-- an earlier version\n", 1))
    assert "an earlier version" in body()
    # When `migrate` runs after the upgrade / Then the function is this version's
    call_command("migrate", "celery_grousset", database=part, verbosity=0)
    assert "an earlier version" not in body()
    assert body().strip() == FUNCTION_SQL.split("$fn$")[1].strip()


def test_convert_status_and_create_ahead(part: str) -> None:
    # Given the converted journal: converting again is refused
    with pytest.raises(CommandError, match="partitioned already"):
        run("grousset_partition", "convert", database=part)
    # status names the width and the current generation
    now = pgpartops.current_generation(part)
    text = run("grousset_partition", "status", database=part)
    assert f"generations of {services.GENERATION_SECONDS} s, current {now}" in text
    assert f"celery_grousset_outcome_g{now} " in text
    # create-ahead makes the missing ones (and says which)
    with connections[part].cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS celery_grousset_outcome_g{now + 5}")
    assert f"{now + 5}]" in run("grousset_partition", "create-ahead", "--ahead", "5", database=part)
    assert exists(part, now + 5)


def test_convert_keeps_the_rows_and_their_decisions(processor: str) -> None:
    # Given a single-table journal with a completed key and an in-flight one
    services.require_database("pgconvert")
    reset_stores()
    store = get_store("pgconvert")
    done, flying = req(processor), req(processor)
    first = store.claim(done)
    assert store.finish(processor, done.fingerprint, done.token, DONE)
    store.claim(flying)
    top = Outcome.objects.using("pgconvert").order_by("-id").values_list("id", flat=True)[0]
    # And another schema of the database with a journal of its own (a schema per tenant:
    # its indexes have the same names; convert took them for this one's)
    with connections["pgconvert"].cursor() as cur:
        cur.execute("DROP SCHEMA IF EXISTS tenant_b CASCADE; CREATE SCHEMA tenant_b; "
                    "CREATE TABLE tenant_b.celery_grousset_outcome "
                    "(LIKE public.celery_grousset_outcome)")  # fmt: skip
        cur.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' "
                    "AND tablename = 'celery_grousset_outcome'")  # fmt: skip
        for (sql,) in cur.fetchall():
            cur.execute(sql.replace(" ON public.", " ON tenant_b."))
    try:
        # When it is converted (generations of a minute)
        text = run("grousset_partition", "convert", "--generation", "60", database="pgconvert")
    finally:
        with connections["pgconvert"].cursor() as cur:
            cur.execute("DROP SCHEMA tenant_b CASCADE")
    assert "(2 rows copied)" in text
    # Then, on the partitioned store, the completed key answers its memo, same fence
    with layout("pgconvert"):
        store = get_store("pgconvert")
        memo = store.claim(req(processor, done.fingerprint))
        assert memo.kind is Kind.COMPLETED and memo.fence == first.fence and memo.result == b'"ok"'
        # And the in-flight one is still held; a new key gets the next id
        assert store.claim(req(processor, flying.fingerprint)).kind is Kind.IN_FLIGHT
        new = req(processor)
        assert store.claim(new).kind is Kind.NEW
        assert Outcome.objects.using("pgconvert").get(fingerprint=new.fingerprint).pk > top
        # When the generations ahead run out, a claim fails closed, naming the fix
        now = pgpartops.current_generation("pgconvert")
        with connections["pgconvert"].cursor() as cur:
            for gen, name, *_ in pgpartops.partitions("pgconvert"):
                if gen >= now:
                    cur.execute(f"DROP TABLE {name}")
        with pytest.raises(StoreUnavailable, match="grousset_partition create-ahead"):
            store.claim(req(processor))
        run("grousset_partition", "create-ahead", database="pgconvert")
        assert store.claim(req(processor)).kind is Kind.NEW
    reset_stores()


def test_a_completion_that_meets_a_moving_row_is_sent_again(part: str, processor: str) -> None:
    import threading

    from celery_grousset.store.pgdriver import driver

    store, now = get_store(part), pgpartops.current_generation(part)
    r = req(processor)
    store.claim(r)
    into_generation(part, now - 30, fingerprint=r.fingerprint)
    s = connections[part].settings_dict
    other = services.pg_connect(
        host=s["HOST"], port=int(s["PORT"]), user=s["USER"], dbname=s["NAME"]
    )
    db = driver()
    try:
        # Given another transaction moving the row into the current generation (as a claim
        # of the key does), not yet committed
        db.execute(other, "BEGIN")
        db.execute(
            other,
            "UPDATE celery_grousset_outcome SET gen = %s WHERE fingerprint = %s",
            (now, r.fingerprint),
        )
        # When the completion arrives on a new connection (the store's reconnect-and-resend
        # of a stale one does not apply), waits for that row, and the move commits
        store.close()
        landed: list[bool] = []
        worker = threading.Thread(
            target=lambda: landed.append(store.finish(processor, r.fingerprint, r.token, DONE))
        )
        worker.start()
        deadline = time.monotonic() + 30
        while not waiting_for_a_lock(part):
            assert time.monotonic() < deadline and worker.is_alive(), "the completion never waited"
            time.sleep(0.01)
        db.execute(other, "COMMIT")
        worker.join(30)
    finally:
        other.close()
    # Then it lands on the moved row (PostgreSQL answered 40001 the first time)
    assert landed == [True]
    assert Outcome.objects.using(part).get(fingerprint=r.fingerprint).status == "completed"


def waiting_for_a_lock(alias: str) -> bool:
    with connections[alias].cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND application_name = 'celery-grousset'"
        )
        return bool(cur.fetchone()[0])


def test_a_batch_waits_for_a_key_holding_no_partition(part: str, processor: str) -> None:
    """A batch takes every key's lock before it touches the journal: a batch that waited
    for a key while holding the partitions its first claims locked would deadlock with
    a claim of that key queued behind retention's barrier (docs/scale.md)."""
    import threading

    from celery_grousset.store.pgdriver import driver
    from celery_grousset.store.pgpartsql import LOCK_KEY

    store, first, second = get_store(part), req(processor, "0" * 64), req(processor, "f" * 64)
    s = connections[part].settings_dict
    other = services.pg_connect(
        host=s["HOST"], port=int(s["PORT"]), user=s["USER"], dbname=s["NAME"]
    )
    db, got = driver(), []
    try:
        # Given another transaction holding the lock of the batch's second key (in key order)
        db.execute(other, "BEGIN")
        lock = LOCK_KEY.format(p="%s::text", f="%s::text")
        db.execute(other, f"SELECT pg_advisory_xact_lock({lock})", (processor, second.fingerprint))
        # When the batch runs, and waits for that key
        batch = threading.Thread(target=lambda: got.extend(store.claim_all([first, second])))
        batch.start()
        deadline = time.monotonic() + 30
        with connections[part].cursor() as cur:
            while True:
                cur.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event = 'advisory' AND application_name = 'celery-grousset'"
                )
                waiting = [pid for (pid,) in cur.fetchall()]
                if waiting:
                    break
                assert time.monotonic() < deadline and batch.is_alive(), "the batch never waited"
                time.sleep(0.01)
            # Then it holds no lock on the journal's table or any of its partitions
            cur.execute(
                "SELECT c.relname FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation "
                "WHERE l.pid = %s AND c.relname LIKE 'celery_grousset_outcome%%'",
                [waiting[0]],
            )
            assert cur.fetchall() == []
        db.execute(other, "COMMIT")
        batch.join(30)
    finally:
        other.close()
    # and, the key released, claims both
    assert [r.kind for r in got] == [Kind.NEW, Kind.NEW]


def test_convert_refuses_a_large_table_and_other_vendors() -> None:
    services.require_database("postgresql")
    store = get_store("postgresql")
    for _ in range(2):
        store.claim(req("convert-refusal"))
    refusal = r"run `manage.py grousset_partition prepare --database postgresql` first"
    with pytest.raises(CommandError, match=refusal):
        run("grousset_partition", "convert", "--max-rows", "1", database="postgresql")
    assert not pgpartops.is_partitioned("postgresql")  # rolled back, nothing changed
    with pytest.raises(CommandError, match="only PostgreSQL"):
        run("grousset_partition", "convert", database="default")
    with pytest.raises(CommandError, match="is not partitioned"):
        run("grousset_partition", "create-ahead", database="postgresql")
    # ... and status reports the single table as the layout it is (exit 0)
    shown = run("grousset_partition", "status", database="postgresql")
    assert "single table (not partitioned)" in shown and "convert" in shown


# -- retention -----------------------------------------------------------------------------


def test_retention_drops_whole_generations_never_one_with_a_live_claim(
    part: str, processor: str
) -> None:
    store, now = get_store(part), pgpartops.current_generation(part)
    old, held = now - 20, now - 19
    # Given a generation of expired, completed rows only
    for _ in range(3):
        r = req(processor)
        store.claim(r)
        assert store.finish(processor, r.fingerprint, r.token, DONE)
    aged(part, processor_id=processor)
    into_generation(part, old, processor_id=processor)
    # And a generation with an expired row and a live in-flight claim past its expiry
    # (a claim that outlived expires_after: the purge never takes a live claim)
    expired, live = req(f"{processor}-b"), req(f"{processor}-b")
    store.claim(expired)
    assert store.finish(expired.processor_id, expired.fingerprint, expired.token, DONE)
    store.claim(live)
    aged(part, fingerprint=expired.fingerprint)
    Outcome.objects.using(part).filter(fingerprint=live.fingerprint).update(
        expires_on=F("expires_on") - timedelta(days=2)
    )
    into_generation(part, held, processor_id=f"{processor}-b")
    # And a generation ahead is missing
    with connections[part].cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS celery_grousset_outcome_g{now + 3}")
    # When grousset_purge runs
    text = run("grousset_purge", "--no-outbox", database=part)
    # Then the first generation is gone whole, its rows with it
    assert not exists(part, old) and "purged" in text
    assert not Outcome.objects.using(part).filter(processor_id=processor).exists()
    # And the one holding the live claim stays, both rows in it
    assert exists(part, held)
    assert Outcome.objects.using(part).filter(processor_id=f"{processor}-b").count() == 2
    # And the generations ahead exist again
    assert exists(part, now + 3)
    # When the claim completes and expires, the beat task drops its generation too
    from celery_grousset.tasks import purge_expired

    assert store.finish(live.processor_id, live.fingerprint, live.token, DONE)
    aged(part, fingerprint=live.fingerprint, days=0)
    assert purge_expired(database=part, outbox=False) >= 2
    assert not exists(part, held)


def test_a_renewed_claim_moves_into_the_current_generation(part: str, processor: str) -> None:
    """WORKER_CLAIM's late-start renewal updated stale_at in place: a claim left in a past
    generation became live there, where retention may have checked it and be detaching
    it (a duplicate then claimed it NEW, and the effect ran twice)."""
    import dataclasses

    from celery_grousset import preclaim

    store, now = get_store(part), pgpartops.current_generation(part)
    # Given an in-flight claim whose row was left in a past generation
    flying = req(processor)
    store.claim(flying)
    into_generation(part, now - 5, processor_id=processor)
    # When its holder renews it
    assert preclaim.renew(store, flying)
    # Then its row is in the current generation, and a renewal by another token changes
    # nothing
    with connections[part].cursor() as cur:
        cur.execute("SELECT gen FROM celery_grousset_outcome WHERE processor_id = %s", [processor])
        assert [row[0] for row in cur.fetchall()] == [now]
    assert not preclaim.renew(store, dataclasses.replace(flying, token=uuid.uuid4().hex))


def aged(alias: str, days: int = 2, **where: Any) -> None:
    """Rows as if claimed ``days`` days earlier (and their stale_at, 60 s after the
    claim, long past): a day's generation as retention meets it."""
    Outcome.objects.using(alias).filter(**where).update(
        expires_on=F("expires_on") - timedelta(days=days),
        started_at=F("started_at") - timedelta(days=2),
        stale_at=F("stale_at") - timedelta(days=2),
    )


TABLE_CLOCK = (
    "CREATE OR REPLACE FUNCTION grousset_generation() RETURNS int LANGUAGE sql VOLATILE "
    "AS $$ SELECT g FROM grousset_test_clock $$"
)


def test_a_claim_that_waited_for_retention_writes_to_the_newer_generation(
    part: str, processor: str
) -> None:
    import threading

    from celery_grousset.store.pgdriver import driver

    store, now = get_store(part), pgpartops.current_generation(part)
    s = connections[part].settings_dict
    other = services.pg_connect(
        host=s["HOST"], port=int(s["PORT"]), user=s["USER"], dbname=s["NAME"]
    )
    db, claimed = driver(), []
    try:
        # Given a generation clock the test moves (a table), at the previous generation
        with connections[part].cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS grousset_test_clock (g int)")
            cur.execute("DELETE FROM grousset_test_clock")
            cur.execute("INSERT INTO grousset_test_clock VALUES (%s)", [now - 1])
            cur.execute(TABLE_CLOCK)
            pgpartops.add_generation(cur, now - 1)
        # And retention holding that generation's partition (its check, step 1)
        db.execute(other, "BEGIN")
        db.execute(other, f"LOCK TABLE celery_grousset_outcome_g{now - 1} IN SHARE MODE")
        # When a claim of a new key reads that generation and waits for the partition
        r = req(processor)
        worker = threading.Thread(target=lambda: claimed.append(store.claim(r)))
        worker.start()
        deadline = time.monotonic() + 30
        while not waiting_for_a_lock(part):
            assert time.monotonic() < deadline and worker.is_alive(), "the claim never waited"
            time.sleep(0.01)
        # And the generation turns while retention finishes
        with connections[part].cursor() as cur:
            cur.execute("UPDATE grousset_test_clock SET g = %s", [now])
        db.execute(other, "COMMIT")
        worker.join(30)
    finally:
        other.close()
        with connections[part].cursor() as cur:
            for sql in pgpartconvert.generation_functions(services.GENERATION_SECONDS):
                cur.execute(sql)
            cur.execute("DROP TABLE IF EXISTS grousset_test_clock")
    # Then the claim is written to the new generation, never to the one retention checked
    assert [c.kind for c in claimed] == [Kind.NEW]
    with connections[part].cursor() as cur:
        cur.execute(
            "SELECT gen FROM celery_grousset_outcome WHERE fingerprint = %s", [r.fingerprint]
        )
        assert cur.fetchall() == [(now,)]


# -- the race across a generation boundary -------------------------------------------------

TEST_GENERATION = (
    "CREATE OR REPLACE FUNCTION grousset_generation() RETURNS int LANGUAGE sql VOLATILE AS $$ "
    "SELECT coalesce(nullif(current_setting('grousset.test_generation', true), '')::int, "
    "floor(extract(epoch FROM clock_timestamp()) / {w})::int) $$"
)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eight_processes_race_on_500_keys_across_a_generation_boundary(
    part: str, processor: str
) -> None:
    store, g = get_store(part), pgpartops.current_generation(part)
    keys = [uuid.uuid4().hex * 2 for _ in range(500)]
    # Given 250 keys whose expired rows sit in the previous generation, 250 new keys
    for key in keys[:250]:
        r = req(processor, key)
        store.claim(r)
        assert store.finish(processor, key, r.token, DONE)
    Outcome.objects.using(part).filter(processor_id=processor).update(
        expires_on=F("expires_on") - timedelta(days=2)
    )
    into_generation(part, g - 1, processor_id=processor)
    # And 8 processes behind a barrier, half claiming in generation g, half in g + 1
    with connections[part].cursor() as cur:
        cur.execute(TEST_GENERATION.format(w=services.GENERATION_SECONDS))
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(8), ctx.Queue()
    env = {k: v for k, v in os.environ.items() if k.startswith(("GROUSSET_", "DJANGO_"))}
    procs = [
        ctx.Process(target=race, args=(part, keys, processor, g + n % 2, barrier, out, env))
        for n in range(8)
    ]
    try:
        results = run_all(procs, out)
    finally:
        with connections[part].cursor() as cur:
            for sql in pgpartconvert.generation_functions(services.GENERATION_SECONDS):
                cur.execute(sql)
    # Then each key was owned exactly once, and no claim or completion failed
    owners = Counter(k for owned, _ in results for k in owned)
    assert set(owners) == set(keys) and set(owners.values()) == {1}, Counter(owners.values())
    errors = [e for _, errs in results for e in errs]
    assert errors == []
    # And each key has one row, in g or g + 1 (none left in the previous generation)
    with connections[part].cursor() as cur:
        cur.execute(
            "SELECT fingerprint, count(*), min(gen), max(gen) FROM celery_grousset_outcome "
            "WHERE processor_id = %s GROUP BY fingerprint",
            [processor],
        )
        rows = cur.fetchall()
    assert len(rows) == 500 and {n for _, n, _, _ in rows} == {1}
    assert {lo for _, _, lo, _ in rows} <= {g, g + 1} and {hi for *_, hi in rows} <= {g, g + 1}


# -- the admin and grousset_stats ----------------------------------------------------------


def test_admin_changelist_and_grousset_stats_on_the_partitioned_journal(
    part: str, processor: str
) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    store = get_store(part)
    for status in ("in_flight", "completed"):
        r = req(processor)
        store.claim(r)
        if status == "completed":
            assert store.finish(processor, r.fingerprint, r.token, DONE)
    rec = Outcome.objects.using(part).filter(processor_id=processor).first()
    assert rec is not None
    name = f"u-{uuid.uuid4().hex[:10]}"
    user = User.objects.db_manager("default").create_superuser(name, f"{name}@x.test", "pw")
    client = Client()
    client.force_login(user)
    url = "/admin/celery_grousset/outcome/"
    for params in ({}, {"processor": processor}, {"status": "in_flight"}, {"q": rec.fingerprint}):
        resp = client.get(url, params)
        assert resp.status_code == 200, params
    assert rec.fingerprint[:12] in client.get(url, {"processor": processor}).content.decode()
    assert client.get(f"{url}{rec.pk}/change/").status_code == 200
    text = run("grousset_stats", processor_id=processor, database=part)
    assert "tests.effect" in text


# -- real workers --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_workers_on_the_partitioned_journal_run_each_key_once() -> None:
    from tests.ledger.models import Effect
    from tests.tasks import effect
    from tests.workers import workers

    redis = services.require_redis()
    part = services.require_partitioned()
    queue_name = f"q-{uuid.uuid4().hex[:10]}"
    keys = [f"part-{uuid.uuid4().hex[:8]}-{i}" for i in range(10)]
    # Given two real workers whose journal is the partitioned one
    env = {"GROUSSET_TEST_LAYOUT": "partitioned"}
    with workers(queue_name, 2, database=part, broker=redis, concurrency=2, env=env):
        # When each key is delivered 5 times
        results = [effect.apply_async((k,), queue=queue_name) for k in keys for _ in range(5)]
        for r in results:
            r.get(timeout=120)
    # Then each effect ran once and each key has one completed row, in the current generation
    now = pgpartops.current_generation(part)
    for key in keys:
        assert Effect.objects.using(part).filter(key=key).count() == 1
        fp = effect.grousset_fingerprint((key,), {})
        with connections[part].cursor() as cur:
            cur.execute(
                "SELECT status, deliveries, gen FROM celery_grousset_outcome "
                "WHERE fingerprint = %s",
                [fp],
            )
            [(status, deliveries, gen)] = cur.fetchall()
        assert status == "completed" and now - 1 <= gen <= now and deliveries >= 5


def test_the_claim_probes_past_generations_through_the_hash_index(
    part: str, processor: str
) -> None:
    import re

    from celery_grousset.store.pgpartsql import MOVE_SQL

    # Given 20,000 rows left in a past generation (on a handful, a B-tree of one page is
    # the cheaper probe, and the planner rightly takes it)
    first = req(processor)
    get_store(part).claim(first)
    now = pgpartops.current_generation(part)
    into_generation(part, now - 1, processor_id=processor)
    past = f"celery_grousset_outcome_g{now - 1}"
    cols = [f.column for f in Outcome._meta.concrete_fields if f.column not in ("id",)]
    copy = ", ".join("md5(g::text) || md5(%s || g::text)" if c == "fingerprint" else c
                     for c in cols)  # fmt: skip
    with connections[part].cursor() as cur:
        cur.execute(f"INSERT INTO celery_grousset_outcome (gen, {', '.join(cols)}) SELECT gen, "
                    f"{copy} FROM celery_grousset_outcome, generate_series(1, 20000) AS g "
                    "WHERE fingerprint = %s", [processor, first.fingerprint])  # fmt: skip
        cur.execute(f"ANALYZE {past}")
        cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef LIKE "
                    "'%%USING hash (fingerprint)%%'", [past])  # fmt: skip
        hashed = [row[0] for row in cur.fetchall()]
        # When the claim's step 2 (the move of the key's row) is planned, with the plain
        # scans ruled out as a table of millions of rows rules them out
        sql = re.sub(r"\b_(cur|f|p)\b", "%s", MOVE_SQL)
        with transaction.atomic(using=part):
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute("SET LOCAL enable_bitmapscan = off")
            cur.execute("EXPLAIN " + sql, [now, uuid.uuid4().hex * 2, processor, now])
            plan = "\n".join(row[0] for row in cur.fetchall())
    # Then every past generation is probed through its hash index on fingerprint (a
    # quarter of the unique key's size: it stays in memory on a large journal)
    assert len(hashed) == 1, hashed
    assert f"Index Scan using {hashed[0]} on {past}" in plan, plan
