"""The PostgreSQL claim is ONE statement and ONE round trip in every case.

Counted on the wire: libpq's protocol trace of the store's own connection lists
every message the client sends; a round trip ends with ``Sync`` (extended
protocol) or is a simple ``Query``.
"""

from __future__ import annotations

import tempfile
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models import F
from django.test import override_settings

from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.models import Outcome
from celery_grousset.store.base import Completion, Store
from tests import services


@pytest.fixture
def pg_store() -> Store:
    services.require_database("postgresql")
    from celery_grousset.store import get_store

    return get_store("postgresql")


def trace(store: Store, fn: object) -> tuple[object, list[str]]:
    """Run ``fn`` with libpq's protocol trace on; its value and the trace's lines."""
    from psycopg.pq import Trace

    conn = store._conn
    assert conn is not None
    with tempfile.TemporaryFile("w+") as fh:
        conn.pgconn.trace(fh.fileno())
        conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        try:
            value = fn()  # type: ignore[operator]
        finally:
            conn.pgconn.untrace()
        fh.seek(0)
        return value, fh.read().splitlines()


def traced(store: Store, fn: object) -> tuple[object, list[str]]:
    """``fn``'s value and the protocol messages the client sent for it."""
    value, lines = trace(store, fn)
    return value, [line.split("\t")[2].split()[0] for line in lines if line.startswith("F\t")]


def round_trips(sent: list[str]) -> int:
    return sum(1 for message in sent if message in ("Sync", "Query"))


def make(fp: str, processor: str = "rt") -> ClaimRequest:
    return ClaimRequest(
        processor, fp, "t", uuid.uuid4().hex, uuid.uuid4().hex, "w", "", 60.0, 3600.0, 3
    )


def test_claim_is_one_round_trip_in_every_case(pg_store: Store) -> None:
    fp = uuid.uuid4().hex * 2
    warm = make(uuid.uuid4().hex * 2)
    pg_store.claim(warm)  # connect and prepare outside the trace
    cases = {}
    # new
    first = make(fp)
    res, sent = traced(pg_store, lambda: pg_store.claim(first))
    cases[res.kind] = sent  # type: ignore[attr-defined]
    # in flight
    res, sent = traced(pg_store, lambda: pg_store.claim(make(fp)))
    cases[res.kind] = sent  # type: ignore[attr-defined]
    # takeover
    Outcome.objects.using("postgresql").filter(fingerprint=fp).update(
        started_at=F("started_at") - timedelta(seconds=120),
        stale_at=F("stale_at") - timedelta(seconds=120),
    )
    taker = make(fp)
    res, sent = traced(pg_store, lambda: pg_store.claim(taker))
    cases[res.kind] = sent  # type: ignore[attr-defined]
    # duplicate of a completed record, memo returned in the same round trip
    pg_store.finish("rt", fp, taker.token, Completion("completed", b"7", "application/json;utf-8"))
    res, sent = traced(pg_store, lambda: pg_store.claim(make(fp)))
    cases[res.kind] = sent  # type: ignore[attr-defined]
    assert res.result == b"7"  # type: ignore[attr-defined]
    assert set(cases) == {Kind.NEW, Kind.IN_FLIGHT, Kind.TAKEOVER, Kind.COMPLETED}
    for kind, messages in cases.items():
        # one statement: a single Bind/Execute; one round trip: a single Sync; no BEGIN/COMMIT
        assert messages.count("Execute") == 1, (kind, messages)
        assert round_trips(messages) == 1, (kind, messages)


def test_completion_is_one_round_trip(pg_store: Store) -> None:
    r = make(uuid.uuid4().hex * 2)
    pg_store.claim(r)
    done, sent = traced(
        pg_store,
        lambda: pg_store.finish(
            r.processor_id,
            r.fingerprint,
            r.token,
            Completion("completed", b"1", "application/json;utf-8"),
        ),
    )
    assert done is True
    assert sent.count("Execute") == 1 and round_trips(sent) == 1


def durability(store: Store, fn: object) -> str:
    """What the claim statement set ``synchronous_commit`` to for its own commit: the
    last column of the row the server sent back (``'on'``: the commit waited for the
    WAL flush)."""
    _, lines = trace(store, fn)
    rows = [line for line in lines if line.startswith("B\t") and "\tDataRow\t" in line]
    assert len(rows) == 1, lines
    return rows[0].rsplit(" ", 1)[1].strip("'")


@pytest.mark.parametrize(
    ("claim_commit", "owning", "duplicate"),
    [("durable", "on", "off"), ("async", "off", "off")],
)
def test_claim_commit_decides_which_claims_wait_for_the_wal_flush(
    claim_commit: str, owning: str, duplicate: str
) -> None:
    services.require_database("postgresql")
    from celery_grousset.store import get_store

    grousset = {**settings.GROUSSET, "DATABASE": "postgresql", "CLAIM_COMMIT": claim_commit}
    with override_settings(GROUSSET=grousset):
        store = get_store("postgresql")
        assert store.claim_commit == claim_commit
        store.claim(make(uuid.uuid4().hex * 2))  # connect and prepare outside the trace
        fp = uuid.uuid4().hex * 2
        first = make(fp)
        # Given the default, a claim that takes the row waits for the flush; "async"
        # (opt-in) does not. A claim that takes nothing never waits.
        assert durability(store, lambda: store.claim(first)) == owning
        assert durability(store, lambda: store.claim(make(fp))) == duplicate
        # Whatever the setting, the completion commits durably: a plain autocommit
        # UPDATE on a session whose synchronous_commit is PostgreSQL's default.
        assert store.finish("rt", fp, first.token, Completion("completed", b"1", "x"))
        assert store._conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert durability(store, lambda: store.claim(make(fp))) == duplicate
