"""The journal admin's query budget (docs/operations.md, "The admin on a large
journal"): a list whose statements run past ``query_budget`` is shown narrowed to the
claims of the last hour, with a note, instead of keeping the page and a server backend
busy. A filter made slow on purpose (a sleep in the
statement unless the list is narrowed) stands in for a rare status on a huge table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models import QuerySet

from celery_grousset.admin import OutcomeAdmin, StatusFilter
from celery_grousset.models import Outcome
from celery_grousset.store.budget import BudgetExceeded, statement_budget
from tests import services
from tests.test_admin import URL, client_for, journal_on, make_user, put

SLEEP = {"postgresql": "(SELECT 1 FROM pg_sleep(2)) = 1", "mysql": "SLEEP(2) = 0"}

# Pages timed against a 2 s sleep: alone, after `make test`'s parallel run (in one
# parallel run the narrowed page took 6 s on both servers, not reproduced alone)
pytestmark = pytest.mark.serial


@pytest.fixture(params=["postgresql", "mysql"])
def db(request: pytest.FixtureRequest) -> Iterator[str]:
    services.require_database(request.param)
    services.require_database("default")  # users and sessions
    with journal_on(request.param):
        yield request.param


@pytest.fixture
def slow_unless_narrowed(db: str, monkeypatch: Any) -> None:
    """The status filter sleeps 2 s in its statement unless the list is narrowed."""
    plain = StatusFilter.queryset

    def queryset(self: StatusFilter, request: Any, qs: QuerySet[Any]) -> QuerySet[Any]:
        qs = plain(self, request, qs)
        return qs if request.GET.get("started") else qs.extra(where=[SLEEP[db]])

    monkeypatch.setattr(StatusFilter, "queryset", queryset)
    monkeypatch.setattr(OutcomeAdmin, "query_budget", 0.3)


def test_a_list_past_the_budget_is_shown_narrowed_with_a_note(
    db: str, processor: str, slow_unless_narrowed: None
) -> None:
    recent = put(db, processor, status="in_flight")
    old = put(db, processor, status="in_flight")
    Outcome.objects.using(db).filter(pk=old.pk).update(
        started_at=old.started_at - timedelta(hours=3)
    )
    client = client_for(make_user(superuser=True))
    # When the whole-journal filter needs more than the budget
    started = time.monotonic()
    resp = client.get(URL, {"status": "in_flight", "processor": processor})
    took = time.monotonic() - started
    # Then the page answers, narrowed to the last hour, and says so
    assert resp.status_code == 200
    body = resp.content.decode()
    assert 'data-grousset-note="warning"' in body and "last hour" in body
    assert recent.fingerprint[:12] in body and old.fingerprint[:12] not in body
    # (for in-flight claims it does not advise the task or processor filter, which slows
    # a rare status's list: the old stale claims an operator looks for were hidden)
    assert "filter by status alone" in body and "add a task or processor" not in body
    # And the slow statement was stopped, not waited for (2 s sleep per statement)
    assert took < 2.0, took
    # And a list within the budget is shown as asked, without a note
    resp = client.get(URL, {"status": "in_flight", "processor": processor, "started": "24h"})
    body = resp.content.decode()
    assert "data-grousset-note" not in body
    assert recent.fingerprint[:12] in body and old.fingerprint[:12] in body


def test_a_list_past_the_budget_even_narrowed_falls_back_to_the_plain_list(
    db: str, processor: str, monkeypatch: Any
) -> None:
    row = put(db, processor)
    plain = StatusFilter.queryset

    def queryset(self: StatusFilter, request: Any, qs: QuerySet[Any]) -> QuerySet[Any]:
        # slow whenever the status filter is used (MariaDB's SLEEP is per row: the plain
        # list must not run it, or it takes 2 s per row of a journal other tests filled)
        qs = plain(self, request, qs)
        return qs.extra(where=[SLEEP[db]]) if self.value() else qs

    monkeypatch.setattr(StatusFilter, "queryset", queryset)
    monkeypatch.setattr(OutcomeAdmin, "query_budget", 0.3)
    client = client_for(make_user(superuser=True))
    resp = client.get(URL, {"status": "completed"})
    assert resp.status_code == 200
    body = resp.content.decode()
    assert 'data-grousset-note="error"' in body and "unfiltered list is shown" in body
    assert row.fingerprint[:12] in body


def test_the_budget_stops_a_statement_and_puts_the_session_back(db: str) -> None:
    sleep = {"postgresql": "SELECT pg_sleep(%s)", "mysql": "SELECT SLEEP(%s)"}[db]
    # A statement past the budget is stopped by the server
    started = time.monotonic()
    with (
        pytest.raises(BudgetExceeded),
        statement_budget(db, 0.2),
        connections[db].cursor() as cur,
    ):
        cur.execute(sleep, [3])
    assert time.monotonic() - started < 2.5
    # And afterwards the session has no limit left: the sleep is not cut at the budget's
    # 0.2 s (MariaDB's SLEEP(0.5) was seen returning after 0.498 s by the client's clock)
    started = time.monotonic()
    with connections[db].cursor() as cur:
        cur.execute(sleep, [0.5])
    assert time.monotonic() - started >= 0.45


def test_the_budget_puts_back_a_limit_the_caller_set_in_its_own_transaction(db: str) -> None:
    """A budget taken inside the caller's transaction (as under ``ATOMIC_REQUESTS``)
    leaves the caller's own statement limit as it found it, not the server's default."""
    from django.db import transaction

    show = {
        "postgresql": "SHOW statement_timeout",
        "mysql": "SELECT @@SESSION.max_statement_time, @@SESSION.lock_wait_timeout",
    }[db]
    own = {
        "postgresql": "SET LOCAL statement_timeout = '4321ms'",
        "mysql": "SET SESSION max_statement_time = 43.21, lock_wait_timeout = 77",
    }[db]
    with transaction.atomic(using=db), connections[db].cursor() as cur:
        cur.execute(own)
        cur.execute(show)
        set_by_caller = cur.fetchone()
        with statement_budget(db, 0.2):
            cur.execute("SELECT 1")
        cur.execute(show)
        assert cur.fetchone() == set_by_caller
        if db == "mysql":  # a session setting: put the server's default back
            cur.execute("SET SESSION max_statement_time = DEFAULT, lock_wait_timeout = DEFAULT")
