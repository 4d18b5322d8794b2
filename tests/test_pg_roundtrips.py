"""The PostgreSQL claim is ONE statement and ONE round trip in every case, on
either driver (psycopg 3: Bind/Execute/Sync; psycopg2: one ``EXECUTE`` query).

Counted on the wire: the store connects through a tap (tests/pgwire.py) that
records every message the client sends; a round trip ends with ``Sync`` (extended
protocol) or is a simple ``Query``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.db.models import F
from django.test import override_settings

from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.models import Outcome
from celery_grousset.store.base import Completion, Store
from celery_grousset.store.pgdriver import driver
from celery_grousset.store.pgpartition import PartitionedStore
from celery_grousset.store.postgresql import PostgresStore
from tests import services
from tests.pgwire import WireTap, tapped


@pytest.fixture
def tap() -> Iterator[WireTap]:
    services.require_database("postgresql")
    s = connections.settings["postgresql"]
    with tapped(str(s["HOST"]), int(s["PORT"])) as wire:
        yield wire


def tapped_store(
    tap: WireTap, claim_commit: str = "durable", alias: str = "postgresql"
) -> PostgresStore:
    """The journal's store, connected through ``tap`` (plain protocol, no TLS); on the
    partitioned journal's alias, the partitioned store."""
    s = connections.settings[alias]
    options = {**s["OPTIONS"], "sslmode": "disable", "gssencmode": "disable"}
    conf = {**s, "HOST": "127.0.0.1", "PORT": str(tap.port), "OPTIONS": options}
    timeout = float(settings.GROUSSET.get("STORE_TIMEOUT", 5))
    kind = PartitionedStore if alias == services.PARTITIONED else PostgresStore
    return kind(alias, conf, timeout, claim_commit)


@pytest.fixture(params=["postgresql", "pg-partitioned"])
def journal(request: pytest.FixtureRequest) -> str:
    """The single table's alias, or the partitioned journal's (converted)."""
    return "postgresql" if request.param == "postgresql" else services.require_partitioned()


@pytest.fixture
def pg_store(tap: WireTap) -> Iterator[PostgresStore]:
    store = tapped_store(tap)
    yield store
    store.close()


def traced(tap: WireTap, fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``fn``'s value and the protocol messages the client sent for it."""
    value, sent, _rows = tap.during(fn)
    if driver().name == "psycopg2":  # the statement prepared once, not re-planned per call
        assert all(q.startswith("EXECUTE grousset_") for q in tap.last_queries), tap.last_queries
    return value, sent


def statements(sent: list[str]) -> int:
    """Statements sent: an extended-protocol Execute or a simple Query each."""
    return sum(1 for message in sent if message in ("Execute", "Query"))


def round_trips(sent: list[str]) -> int:
    return sum(1 for message in sent if message in ("Sync", "Query"))


def make(fp: str, processor: str = "rt") -> ClaimRequest:
    return ClaimRequest(
        processor, fp, "t", uuid.uuid4().hex, uuid.uuid4().hex, "w", "", 60.0, 3600.0, 3
    )


def test_claim_is_one_round_trip_in_every_case(tap: WireTap, pg_store: Store) -> None:
    fp = uuid.uuid4().hex * 2
    warm = make(uuid.uuid4().hex * 2)
    pg_store.claim(warm)  # connect and prepare outside the trace
    cases = {}
    # new
    first = make(fp)
    res, sent = traced(tap, lambda: pg_store.claim(first))
    cases[res.kind] = sent
    # in flight
    res, sent = traced(tap, lambda: pg_store.claim(make(fp)))
    cases[res.kind] = sent
    # takeover
    Outcome.objects.using("postgresql").filter(fingerprint=fp).update(
        started_at=F("started_at") - timedelta(seconds=120),
        stale_at=F("stale_at") - timedelta(seconds=120),
    )
    taker = make(fp)
    res, sent = traced(tap, lambda: pg_store.claim(taker))
    cases[res.kind] = sent
    # duplicate of a completed record, memo returned in the same round trip
    pg_store.finish("rt", fp, taker.token, Completion("completed", b"7", "application/json;utf-8"))
    res, sent = traced(tap, lambda: pg_store.claim(make(fp)))
    cases[res.kind] = sent
    assert res.result == b"7"
    assert set(cases) == {Kind.NEW, Kind.IN_FLIGHT, Kind.TAKEOVER, Kind.COMPLETED}
    for kind, messages in cases.items():
        # one statement: a single Execute (psycopg 3) or Query (psycopg2); one round
        # trip: a single Sync or Query; no BEGIN/COMMIT
        assert statements(messages) == 1, (kind, messages)
        assert round_trips(messages) == 1, (kind, messages)


def test_completion_is_one_round_trip(tap: WireTap, pg_store: Store) -> None:
    warm = make(uuid.uuid4().hex * 2)  # connect and prepare outside the trace
    pg_store.claim(warm)
    pg_store.finish("rt", warm.fingerprint, warm.token, Completion("completed", b"1", "x"))
    r = make(uuid.uuid4().hex * 2)
    pg_store.claim(r)
    done, sent = traced(
        tap,
        lambda: pg_store.finish(
            r.processor_id,
            r.fingerprint,
            r.token,
            Completion("completed", b"1", "application/json;utf-8"),
        ),
    )
    assert done is True
    assert statements(sent) == 1 and round_trips(sent) == 1


def durability(tap: WireTap, fn: Callable[[], Any]) -> str:
    """What the claim statement set ``synchronous_commit`` to for its own commit: the
    last column of the row the server sent back (``'on'``: the commit waited for the
    WAL flush)."""
    _, _sent, rows = tap.during(fn)
    assert len(rows) == 1, rows
    return (rows[0][-1] or b"").decode()


@pytest.mark.parametrize(
    ("claim_commit", "owning", "duplicate"),
    [("durable", "on", "off"), ("async", "off", "off")],
)
def test_claim_commit_decides_which_claims_wait_for_the_wal_flush(
    tap: WireTap, claim_commit: str, owning: str, duplicate: str
) -> None:
    from celery_grousset.store import get_store

    grousset = {**settings.GROUSSET, "DATABASE": "postgresql", "CLAIM_COMMIT": claim_commit}
    with override_settings(GROUSSET=grousset):
        assert get_store("postgresql").claim_commit == claim_commit
    store = tapped_store(tap, claim_commit)
    store.claim(make(uuid.uuid4().hex * 2))  # connect and prepare outside the trace
    fp = uuid.uuid4().hex * 2
    first = make(fp)
    # Given the default, a claim that takes the row waits for the flush; "async"
    # (opt-in) does not. A claim that takes nothing never waits.
    assert durability(tap, lambda: store.claim(first)) == owning
    assert durability(tap, lambda: store.claim(make(fp))) == duplicate
    # Whatever the setting, the completion commits durably: a plain autocommit
    # UPDATE on a session whose synchronous_commit is PostgreSQL's default.
    assert store.finish("rt", fp, first.token, Completion("completed", b"1", "x"))
    show = driver().execute(store._conn, "SHOW synchronous_commit").fetchone()
    assert tuple(show) == ("on",)
    assert durability(tap, lambda: store.claim(make(fp))) == duplicate
    store.close()


def test_the_store_runs_on_the_driver_djangos_connection_uses(pg_store: PostgresStore) -> None:
    # Given Django's PostgreSQL connection, on psycopg 3 or psycopg2 (whichever
    # GROUSSET_TEST_PG_DRIVER leaves importable: the compat stack `pg2` has only psycopg2)
    django_conn = connections["postgresql"]
    django_conn.ensure_connection()
    raw = type(django_conn.connection)
    expected = settings.PG_DRIVER or "psycopg"
    assert raw.__module__.split(".")[0] == expected
    # When the store claims / Then its private connection is on that same driver
    assert pg_store.claim(make(uuid.uuid4().hex * 2)).kind is Kind.NEW
    assert driver().name == expected
    assert isinstance(pg_store._conn, raw)


def test_a_batch_is_one_statement_one_round_trip_one_transaction(
    tap: WireTap, journal: str
) -> None:
    pg_store = tapped_store(tap, alias=journal)
    pg_store.claim_all([make(uuid.uuid4().hex * 2) for _ in range(3)])  # connect, prepare
    held, done = make(uuid.uuid4().hex * 2), make(uuid.uuid4().hex * 2)
    pg_store.claim_all([held, done])
    pg_store.finish("rt", done.fingerprint, done.token, Completion("completed", b"7", "x"))
    # Given a batch of 50: new keys, a key held by a fresh claim, a completed key
    batch = [make(uuid.uuid4().hex * 2) for _ in range(48)]
    batch += [make(held.fingerprint), make(done.fingerprint)]
    # When it is claimed
    results, sent = traced(tap, lambda: pg_store.claim_all(batch))
    # Then each key got its decision, in ONE statement and ONE round trip (no BEGIN/COMMIT)
    assert [r.kind for r in results] == [Kind.NEW] * 48 + [Kind.IN_FLIGHT, Kind.COMPLETED]
    assert results[-1].result == b"7"
    assert statements(sent) == 1 and round_trips(sent) == 1, sent
    # and ONE transaction wrote every row: one commit for the batch
    with connections[journal].cursor() as cur:
        cur.execute(
            "SELECT count(DISTINCT xmin::text) FROM celery_grousset_outcome "
            "WHERE processor_id = 'rt' AND fingerprint = ANY(%s)",
            [[r.fingerprint for r in batch]],
        )
        assert cur.fetchone()[0] == 1
    pg_store.close()


@pytest.mark.parametrize(("claim_commit", "owning"), [("durable", "on"), ("async", "off")])
def test_a_batch_waits_for_the_wal_flush_when_any_claim_takes_a_row(
    tap: WireTap, claim_commit: str, owning: str, journal: str
) -> None:
    store = tapped_store(tap, claim_commit, journal)
    store.claim_all([make(uuid.uuid4().hex * 2) for _ in range(2)])  # connect, prepare
    held = [make(uuid.uuid4().hex * 2) for _ in range(2)]
    store.claim_all(held)
    again = [make(r.fingerprint) for r in held]

    def durability(batch: list[ClaimRequest]) -> set[str]:
        _, _sent, rows = tap.during(lambda: store.claim_all(batch))
        return {(r[-1] or b"").decode() for r in rows}

    # A batch of claims that only count a delivery never waits; one new key in it does
    # (unless CLAIM_COMMIT is "async")
    assert durability(again) == {"off"}
    assert durability([make(held[0].fingerprint), make(uuid.uuid4().hex * 2)]) == {owning}
    store.close()


def test_a_batch_key_whose_first_insert_another_claim_won_is_sent_again(
    tap: WireTap, pg_store: PostgresStore
) -> None:
    import threading

    from celery_grousset.store.pgclaim import CLAIM_SQL

    pg_store.claim_all([make(uuid.uuid4().hex * 2) for _ in range(2)])  # connect, prepare
    db, raced, alone = driver(), make(uuid.uuid4().hex * 2), make(uuid.uuid4().hex * 2)
    other = PostgresStore("postgresql", connections.settings["postgresql"], 10.0)
    conn = other._connect()
    # Given another claim's first insert of a key, not committed yet
    db.execute(conn, "BEGIN")
    db.execute(conn, CLAIM_SQL, other.claim_params(raced)).fetchone()
    # When a batch with that key runs (its lookup finds no row; its insert waits)
    late = [make(raced.fingerprint), alone]
    done: dict[str, Any] = {}
    batch = threading.Thread(target=lambda: done.update(got=tap.during(
        lambda: pg_store.claim_all(late))))  # fmt: skip
    batch.start()
    with connections["postgresql"].cursor() as cur:
        for _ in range(500):
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE %s",
                ["%WITH ORDINALITY%" if driver().name == "psycopg" else "EXECUTE grousset_%"],
            )
            if cur.fetchone()[0]:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the batch never waited for the other claim's insert")
    # and the other claim commits
    db.execute(conn, "COMMIT")
    batch.join(30)
    other.close()
    results, sent, _rows = done["got"]
    # Then the key is sent again and decided on the winner's row; the other key is new
    assert [r.kind for r in results] == [Kind.IN_FLIGHT, Kind.NEW]
    assert statements(sent) == 2 and round_trips(sent) == 2, sent
