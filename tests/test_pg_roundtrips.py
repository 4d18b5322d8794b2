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
from django.db.models import F

from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.models import Outcome
from celery_grousset.store.base import Completion, Store
from tests import services


@pytest.fixture
def pg_store() -> Store:
    services.require_database("postgresql")
    from celery_grousset.store import get_store

    return get_store("postgresql")


def traced(store: Store, fn: object) -> tuple[object, list[str]]:
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
        sent = [
            line.split("\t")[2].split()[0]
            for line in fh.read().splitlines()
            if line.startswith("F\t")
        ]
    return value, sent


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
        started_at=F("started_at") - timedelta(seconds=120)
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
