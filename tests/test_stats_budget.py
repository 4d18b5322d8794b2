"""``grousset_stats``' default window on a large journal (docs/operations.md): when a
statement of the last 24 hours needs more than ``STATS_BUDGET``, the default narrows to
the last hour and says so; an explicit ``--since`` is counted whatever it takes. A
sleep in the 24-hour count stands in for a day of millions of rows."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.models import F

from celery_grousset.claim import ClaimRequest
from celery_grousset.management.commands import grousset_stats
from celery_grousset.models import Outcome
from celery_grousset.store import get_store
from tests import services

SLEEP = {"postgresql": "SELECT pg_sleep(2)", "mysql": "SELECT SLEEP(2)"}


@pytest.fixture(params=["postgresql", "mysql"])
def server(request: pytest.FixtureRequest) -> str:
    """A server journal: the budget is a server's statement timeout."""
    services.require_database(request.param)
    return str(request.param)


def slower(monkeypatch: pytest.MonkeyPatch, name: str, alias: str, when: Any = None) -> None:
    """``grousset_stats.<name>`` takes 2 s more (when ``when(args)``)."""
    real = getattr(grousset_stats, name)

    def slow(alias: str, *args: Any) -> dict[str, Any]:
        if when is None or when(args):
            with connections[alias].cursor() as cur:
                cur.execute(SLEEP[connections[alias].vendor])
        return dict(real(alias, *args))

    monkeypatch.setattr(grousset_stats, name, slow)


@pytest.fixture
def db(server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A server journal whose 24-hour statistics take 2 s more than the others."""
    # (counts' arguments: alias, processor_id, stale_seconds, since_seconds, now)
    slower(monkeypatch, "counts", server, lambda args: args[-2] == 86400.0)
    yield server


def claim(alias: str, processor: str, hours_ago: float) -> None:
    fp = uuid.uuid4().hex * 2
    get_store(alias).claim(ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name="tests.stats", task_id="t",
        token=uuid.uuid4().hex, worker="w:1", args_repr="()", max_processing_time=60.0,
        expires_after=3600.0, max_takeovers=3,
    ))  # fmt: skip
    Outcome.objects.using(alias).filter(fingerprint=fp).update(
        started_at=F("started_at") - timedelta(hours=hours_ago)
    )


def stats(*args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command("grousset_stats", *args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def test_the_default_window_narrows_when_a_day_needs_more_than_the_budget(
    db: str, processor: str
) -> None:
    claim(db, processor, 0)
    claim(db, processor, 3)
    # When the default window's statements need more than the budget
    data = json.loads(stats(json=True, processor_id=processor, database=db))
    # Then the last hour is counted, and the output says from what it was narrowed
    assert data["since_seconds"] == 3600.0 and data["narrowed_from_seconds"] == 86400.0
    assert data["entries"] == 1
    text = stats(processor_id=processor, database=db)
    assert "the entries started in the last 1 h" in text
    assert "the default 1 d needs more than 0.25 s on this journal" in text
    assert "--since 1d counts it anyway" in text
    # And an explicit --since counts its whole window, whatever it takes
    data = json.loads(stats("--since", "1d", json=True, processor_id=processor, database=db))
    assert data["since_seconds"] == 86400.0 and data["entries"] == 2
    assert "narrowed_from_seconds" not in data


def test_expired_entries_that_take_more_than_the_budget_are_not_counted(
    server: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = server
    claim(db, processor, 0)
    # When counting the expired entries needs more than the budget (on a journal whose
    # expired rows sit behind millions of dead index entries, say)
    slower(monkeypatch, "_expired", db)
    data = json.loads(stats("--since", "1h", json=True, processor_id=processor, database=db))
    assert data["expired"] == 0  # (an explicit window counts them, whatever it takes)
    data = json.loads(stats(json=True, processor_id=processor, database=db))
    # Then the default's window is counted all the same, not narrowed for them
    assert data["since_seconds"] == 86400.0 and data["narrowed_from_seconds"] is None
    assert data["entries"] == 1
    # And they are left uncounted, and the report says so and how to count them
    assert data["expired"] is None
    text = stats(processor_id=processor, database=db)
    assert "expired      not counted: more than 0.25 s on this journal (--since" in text


def test_a_window_the_planner_expects_to_be_too_large_is_not_started(
    server: str, processor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim(server, processor, 0)
    started: list[float] = []
    counts = grousset_stats.counts

    def spy(alias: str, *args: Any) -> dict[str, Any]:
        started.append(args[-2])  # (processor_id, stale_seconds, since_seconds, now)
        return dict(counts(alias, *args))

    monkeypatch.setattr(grousset_stats, "counts", spy)
    # When the planner expects more entries in every window than the budget reads
    # (a journal of millions of rows a day; here: a threshold of 0)
    monkeypatch.setattr(grousset_stats, "STATS_ROWS", 0)
    data = json.loads(stats(json=True, processor_id=processor, database=server))
    assert data["entries"] == 1
    # Then the day and the hour are skipped without a statement started for them, and
    # the report says from what it narrowed
    assert started == [600.0]
    assert data["since_seconds"] == 600.0 and data["narrowed_from_seconds"] == 86400.0
