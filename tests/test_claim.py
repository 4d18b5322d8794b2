"""The claim's decision table, row by row, in its two forms: the Python ``decide()`` the
locking stores call and the SQL ``CASE`` the PostgreSQL statement evaluates. Both are
fed the same rows; they must give the same decision, and the one each row names."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from celery_grousset.claim import (
    ENC_EXCEPTION,
    ENC_GAVE_UP,
    RULES,
    WRITES,
    ClaimRequest,
    Kind,
    Prev,
    Write,
    clock_fence,
    decide,
    decision_sql,
    is_duplicate,
    recorded,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
LATER, EARLIER = NOW + timedelta(seconds=30), NOW - timedelta(seconds=30)
REQ = ClaimRequest(
    processor_id="p", fingerprint="f" * 64, task_name="t", task_id="id", token="mine",
    worker="w", args_repr="", max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
    payload_hash="a" * 64,
)  # fmt: skip
OTHER = "b" * 64  #: the payload hash of another call of the same key


def prev(**over: Any) -> Prev:
    values: dict[str, Any] = dict(
        status="in_flight", stale_at=LATER, expires_on=NOW + timedelta(hours=1),
        result_encoding="", takeovers=0, claim_token="theirs",
    )  # fmt: skip
    values.update(over)
    # a claim of this version: started max_processing_time before its stale_at, fenced
    # at its start on the clock
    values.setdefault("started_at", values["stale_at"] - timedelta(seconds=60))
    values.setdefault("fence", clock_fence(values["started_at"]))
    return Prev(**values)


def by_010(started: timedelta, stale: timedelta) -> Prev:
    """A claim by a 0.1.0 worker, ``started`` ago: it counts the fence of the claim before
    (made a minute before it) up by one and leaves that claim's stale_at, ``stale`` ago
    (negative: still ahead)."""
    return prev(started_at=NOW - started, stale_at=NOW - stale,
                fence=clock_fence(NOW - started - timedelta(minutes=1)) + 1)  # fmt: skip


#: (case, the row found, the decision it must give)
CASES: list[tuple[str, Prev, Kind]] = [
    ("own claim re-sent", prev(claim_token="mine"), Kind.RESUMED),
    ("own claim re-sent, even when stale", prev(claim_token="mine", stale_at=EARLIER),
     Kind.RESUMED),
    ("fresh claim of another attempt", prev(), Kind.IN_FLIGHT),
    ("stale claim", prev(stale_at=EARLIER), Kind.TAKEOVER),
    ("stale claim at the very deadline", prev(stale_at=NOW), Kind.TAKEOVER),
    ("stale, max_takeovers reached", prev(stale_at=EARLIER, takeovers=3), Kind.GAVE_UP),
    ("fresh, max_takeovers reached", prev(takeovers=3), Kind.IN_FLIGHT),
    ("in flight past expires_on, fresh", prev(expires_on=EARLIER), Kind.IN_FLIGHT),
    ("completed", prev(status="completed", result_encoding="application/json"),
     Kind.COMPLETED),
    ("completed, expired", prev(status="completed", expires_on=EARLIER), Kind.EXPIRED),
    ("completed, expiring this very instant", prev(status="completed", expires_on=NOW),
     Kind.EXPIRED),
    # a claim renewed (the worker's main process made it; its child started late): fresh
    # by its stale_at, though older than max_processing_time
    ("renewed claim, fresh by its stale_at",
     prev(started_at=NOW - timedelta(seconds=90), stale_at=LATER), Kind.IN_FLIGHT),
    ("released failure", prev(status="failed"), Kind.RECLAIM),
    ("released failure, expired", prev(status="failed", expires_on=EARLIER), Kind.EXPIRED),
    ("memoized failure", prev(status="failed", result_encoding=ENC_EXCEPTION), Kind.FAILED),
    ("given up", prev(status="failed", result_encoding=ENC_GAVE_UP), Kind.FAILED),
    ("given up, expired", prev(status="failed", result_encoding=ENC_GAVE_UP,
                               expires_on=EARLIER), Kind.EXPIRED),
    # the same key, claimed for other arguments (a keyed call: payload validation)
    ("stale claim, other payload", prev(stale_at=EARLIER, payload_hash=OTHER), Kind.MISMATCH),
    ("stale, other payload, max_takeovers reached",
     prev(stale_at=EARLIER, takeovers=3, payload_hash=OTHER), Kind.MISMATCH),
    ("stale claim, same payload", prev(stale_at=EARLIER, payload_hash="a" * 64), Kind.TAKEOVER),
    ("fresh claim, other payload", prev(payload_hash=OTHER), Kind.MISMATCH),
    ("fresh claim past expires_on, other payload",
     prev(payload_hash=OTHER, expires_on=EARLIER), Kind.IN_FLIGHT),
    ("stale claim past expires_on, other payload",
     prev(stale_at=EARLIER, payload_hash=OTHER, expires_on=EARLIER), Kind.TAKEOVER),
    ("own claim re-sent, other payload", prev(claim_token="mine", payload_hash=OTHER),
     Kind.RESUMED),
    ("released failure, other payload", prev(status="failed", payload_hash=OTHER),
     Kind.MISMATCH),
    ("released failure, other payload, expired",
     prev(status="failed", payload_hash=OTHER, expires_on=EARLIER), Kind.EXPIRED),
    ("completed, other payload", prev(status="completed", result_encoding="application/json",
                                      payload_hash=OTHER), Kind.MISMATCH),
    ("memoized failure, other payload",
     prev(status="failed", result_encoding=ENC_EXCEPTION, payload_hash=OTHER), Kind.MISMATCH),
    # the row's own delivery again (a Celery retry keeps its task id), other arguments
    ("released failure, other payload, its own task id retried",
     prev(status="failed", payload_hash=OTHER, task_id="id"), Kind.RECLAIM),
    ("completed, other payload, its own task id",
     prev(status="completed", result_encoding="application/json", payload_hash=OTHER,
          task_id="id"), Kind.COMPLETED),
    ("fresh claim, other payload, its own task id", prev(payload_hash=OTHER, task_id="id"),
     Kind.IN_FLIGHT),
    # a claim by a 0.1.0 worker (upgrade without a full stop): started_at and the fence
    # + 1 written, stale_at left from the claim before; judged by the claimant's
    # max_processing_time (60 s)
    ("0.1.0 takeover, fresh by the claimant's time",
     by_010(timedelta(seconds=30), timedelta(minutes=2)), Kind.IN_FLIGHT),
    ("0.1.0 takeover, stale by the claimant's time",
     by_010(timedelta(seconds=90), timedelta(minutes=3)), Kind.TAKEOVER),
    ("0.1.0 takeover at the claimant's deadline",
     by_010(timedelta(seconds=60), timedelta(minutes=3)), Kind.TAKEOVER),
    ("0.1.0 claim of a released row, past the stale_at left before it",
     by_010(timedelta(seconds=16), timedelta(seconds=1)), Kind.IN_FLIGHT),
    ("0.1.0 claim of a released row, before the stale_at left", by_010(
        timedelta(seconds=90), timedelta(seconds=-10)), Kind.TAKEOVER),
    ("a fence ahead of the clock (it stepped back) is this version's",
     prev(stale_at=EARLIER, fence=clock_fence(NOW) + 10**9), Kind.TAKEOVER),
]  # fmt: skip


@pytest.mark.parametrize(("case", "row", "kind"), CASES, ids=[c[0] for c in CASES])
def test_decide(case: str, row: Prev, kind: Kind) -> None:
    # Given a row / When the Python table decides / Then it names the expected decision
    assert decide(row, NOW, REQ) is kind


def test_protect_has_no_task_id_and_keeps_its_payload_check() -> None:
    # Given protect()'s claims (no task id) of one key with other arguments
    req = dataclasses.replace(REQ, task_id="")
    # Then the record's arguments still refuse them: '' is no delivery of its own
    assert decide(prev(status="failed", payload_hash=OTHER), NOW, req) is Kind.MISMATCH
    assert decide(prev(status="completed", result_encoding="application/json",
                       payload_hash=OTHER), NOW, req) is Kind.MISMATCH  # fmt: skip


def test_a_protect_call_again_is_a_duplicate_not_a_redelivery() -> None:
    # Given a protect() record (no task id) answered to another protect() call of its key
    req, done = dataclasses.replace(REQ, task_id=""), prev(status="completed")
    # Then the call counts as a duplicate, with no task id to list under Deliveries
    assert is_duplicate(Kind.COMPLETED, done, req)
    assert recorded(Kind.COMPLETED, done, req) is None
    # ... while a task's own task id again is a redelivery, and another one a duplicate
    assert not is_duplicate(Kind.COMPLETED, dataclasses.replace(done, task_id="id"), REQ)
    assert is_duplicate(Kind.COMPLETED, dataclasses.replace(done, task_id="other"), REQ)
    assert recorded(Kind.COMPLETED, dataclasses.replace(done, task_id="other"), REQ) == "id"


def test_no_row_is_a_new_claim() -> None:
    assert decide(None, NOW, REQ) is Kind.NEW


def test_every_rule_is_exercised_and_every_decision_has_a_write() -> None:
    # The cases cover every rule of the table (a rule nobody reaches is a dead copy)
    reached = {decide(row, NOW, REQ) for _, row, _ in CASES}
    assert {kind for _, kind in RULES} <= reached
    # And every decision a store can return says what it writes, and whether it owns
    assert set(WRITES) == set(Kind) - {Kind.BYPASSED}
    owning = {k for k in WRITES if k.owned}
    assert owning == {Kind.NEW, Kind.EXPIRED, Kind.RECLAIM, Kind.TAKEOVER, Kind.RESUMED}
    assert all(WRITES[k] in (Write.INSERT, Write.CLAIM, Write.CLAIM_RESET, Write.NOTHING)
               for k in owning)  # fmt: skip


def test_codes_round_trip() -> None:
    for kind in Kind:
        assert Kind.from_code(kind.code) is kind
    assert len({kind.code for kind in Kind}) == len(Kind)


def test_sql_form_decides_every_row_as_the_python_form(pg_cursor: Any) -> None:
    # Given the CASE generated from the same rules, evaluated by PostgreSQL on each row
    sql = (
        "SELECT " + decision_sql("%(now)s::timestamptz") + " FROM (SELECT %(status)s::text "
        "AS status, %(tok_row)s::text AS claim_token, %(stale_at)s::timestamptz AS stale_at, "
        "%(expires_on)s::timestamptz AS expires_on, %(enc)s::text AS result_encoding, "
        "%(takeovers)s::int AS takeovers, %(row_ph)s::text AS payload_hash, "
        "%(row_tid)s::text AS task_id, %(started_at)s::timestamptz AS started_at, "
        "%(fence)s::int8 AS fence) AS o"
    )
    for case, row, kind in CASES:
        params = {
            "now": NOW, "status": row.status, "tok_row": row.claim_token,
            "stale_at": row.stale_at, "expires_on": row.expires_on,
            "enc": row.result_encoding, "takeovers": row.takeovers,
            "tok": REQ.token, "maxt": REQ.max_takeovers, "row_ph": row.payload_hash,
            "ph": REQ.payload_hash, "row_tid": row.task_id, "tid": REQ.task_id,
            "started_at": row.started_at, "mpt": timedelta(seconds=REQ.max_processing_time),
            "fence": row.fence,
        }  # fmt: skip
        pg_cursor.execute(sql, params)
        (code,) = pg_cursor.fetchone()
        # Then both forms agree, and agree with the case
        assert Kind.from_code(code) is decide(row, NOW, REQ) is kind, case
        # ... and for a claim without a task id (protect())
        pg_cursor.execute(sql, {**params, "tid": ""})
        (code,) = pg_cursor.fetchone()
        assert Kind.from_code(code) is decide(row, NOW, dataclasses.replace(REQ, task_id="")), case


@pytest.fixture
def pg_cursor() -> Any:
    from tests import services

    services.require_database("postgresql")
    from django.db import connections

    with connections["postgresql"].cursor() as cur:
        yield cur


def test_a_gave_up_answer_to_another_delivery_counts_as_a_duplicate() -> None:
    # the GaveUp a delivery gets for a key whose attempts all died is a duplicate's answer
    # (docs/operations.md, "Deliveries, duplicates and redeliveries")
    assert is_duplicate(Kind.GAVE_UP, prev(stale_at=EARLIER, takeovers=3), REQ)
