"""Regressions of the hostile review (issue 16) that no other file holds: the purge that
deleted a row re-claimed while it waited for the row's lock (PostgreSQL), and a failure
that could not be recorded (an exception whose ``__str__`` raises, a lone surrogate)."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models import F

from celery_grousset import journal, protect
from celery_grousset.claim import ClaimRequest
from celery_grousset.models import Outcome
from celery_grousset.store import Completion, get_store
from celery_grousset.store.pgdriver import driver
from tests import services


def _completed_row(alias: str, processor: str) -> str:
    fp = uuid.uuid4().hex * 2
    req = ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name="tests.effect", task_id="t1",
        token=uuid.uuid4().hex, worker="w", args_repr="", max_processing_time=60.0,
        expires_after=3600.0, max_takeovers=3,
    )  # fmt: skip
    store = get_store(alias)
    store.claim(req)
    assert store.finish(processor, fp, req.token, Completion("completed", b"1", "application/json"))
    return fp


def test_postgresql_purge_spares_a_row_being_reclaimed_without_waiting_for_it() -> None:
    services.require_database("postgresql")
    alias, processor = "postgresql", f"test-{uuid.uuid4().hex[:12]}"
    # Given a completed row whose retention window has passed
    fp = _completed_row(alias, processor)
    rows = Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fp)
    rows.update(expires_on=F("expires_on") - timedelta(hours=2))
    # And another session that locks it and re-claims it (in flight, remembered again)
    params = connections[alias].get_connection_params()
    dsn = {k: params[k] for k in ("host", "port", "user", "dbname") if params.get(k)}
    db = driver()
    other = services.pg_connect(**dsn)
    db.execute(other, "BEGIN")
    db.execute(
        other,
        "UPDATE celery_grousset_outcome SET status = 'in_flight', expires_on = now() + "
        "interval '1 hour' WHERE processor_id = %s AND fingerprint = %s",
        (processor, fp),
    )
    # When the purge runs before the re-claim commits
    purged: list[Any] = []
    purge = threading.Thread(target=lambda: purged.append(journal.purge_expired(alias)))
    purge.start()
    purge.join(5)
    # Then it did not wait for the row's lock (it skipped the row)
    assert purged, "the purge waited for the re-claimed row's lock"
    db.execute(other, "COMMIT")
    other.close()
    # And the re-claimed row survives
    assert rows.get().status == "in_flight"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of this exception raises")


@pytest.mark.parametrize(
    "error",
    [_Unprintable("x"), ValueError("a lone surrogate: \udcff"), KeyError("\ud800")],
    ids=["str-raises", "lone-surrogate", "surrogate-key"],
)
def test_a_failure_that_cannot_describe_itself_is_recorded_and_propagates(
    error: BaseException,
) -> None:
    services.require_database("postgresql")
    key = f"undescribable-{uuid.uuid4().hex[:8]}"

    def boom() -> None:
        raise error

    # When the body raises an exception that cannot be turned into text
    with pytest.raises(type(error)) as raised:
        protect(key, boom, max_processing_time=30, database="postgresql")
    # Then the caller sees the task's own exception, not one from recording it
    assert raised.value is error
    # And the claim was released (failed, nothing memoized): the next call runs again
    row = Outcome.objects.using("postgresql").get(task_name="protect", args_repr__contains=key)
    assert (row.status, row.result_encoding) == ("failed", "")
    assert protect(key, lambda: "ran again", max_processing_time=30, database="postgresql") == (
        "ran again"
    )
