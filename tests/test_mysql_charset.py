"""A MySQL/MariaDB journal that stores text as utf8mb3 (Django 4.2's default connection
charset, or a table created so): a character outside the BMP (an emoji) in a call's
arguments or in an error is stored escaped, never a reason to refuse or requeue the call,
and the checks say how to store it as it is (``W012``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.core import checks
from django.test import override_settings

from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.models import Outcome
from celery_grousset.store import get_store, reset_stores
from celery_grousset.store.base import Completion
from tests import services
from tests.test_checks import database


@pytest.fixture
def mb3() -> Iterator[str]:
    services.require_database("mysql")
    from django.db import connections

    mysql = connections.settings["mysql"]
    utf8 = {**mysql, "OPTIONS": {**mysql["OPTIONS"], "charset": "utf8"}}  # utf8mb3
    with database("mysql_mb3", **utf8):
        reset_stores()
        yield "mysql_mb3"
    reset_stores()


def test_emoji_in_arguments_and_errors_is_stored_escaped(mb3: str) -> None:
    processor, fp = f"test-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex * 2
    req = ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name="shop.send_receipt",
        task_id="t-1", token="tok", worker="w", args_repr="email='ann\U0001f600@example.com'",
        max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
    )  # fmt: skip
    store = get_store(mb3)
    # Given a utf8mb3 connection / When a call with an emoji in its arguments claims
    assert store.claim(req).kind is Kind.NEW
    # And its body fails with an emoji in the error
    assert store.finish(processor, fp, "tok", Completion("failed", error="bad \U0001f600 input"))
    # Then both are stored, the emoji written as its escape
    row = Outcome.objects.using("mysql").get(processor_id=processor, fingerprint=fp)
    assert row.args_repr == "email='ann\\U0001f600@example.com'"
    assert (row.status, row.error) == ("failed", "bad \\U0001f600 input")


def test_a_task_id_whose_escapes_overflow_the_column_still_runs(mb3: str) -> None:
    import dataclasses

    processor, fp = f"test-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex * 2
    # Given a task id of 250 characters, two of them emoji: within the column, but 268
    # characters once escaped for a utf8mb3 journal
    task_id = "\U0001f600\U0001f4e6" + "t" * 248
    req = ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name="shop.send_receipt",
        task_id=task_id, token="tok", worker="w", args_repr="()",
        max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
    )  # fmt: skip
    store = get_store(mb3)
    # When it claims and completes / Then it is an ordinary call, not a poison delivery
    assert store.claim(req).kind is Kind.NEW
    assert store.finish(processor, fp, "tok", Completion("completed"))
    row = Outcome.objects.using("mysql").get(processor_id=processor, fingerprint=fp)
    assert row.task_id == ("\\U0001f600\\U0001f4e6" + "t" * 248)[:255]
    # And its redelivery (another attempt, the same task id) is answered from the record
    again = store.claim(dataclasses.replace(req, token="tok2"))
    assert again.kind is Kind.COMPLETED and again.task_id == row.task_id


def database_checks(alias: str) -> dict[str, checks.CheckMessage]:
    found = checks.run_checks(databases=[alias], tags=[checks.Tags.database])
    return {m.id: m for m in found if m.id}


def test_a_utf8mb3_journal_is_W012(mb3: str) -> None:
    # Given the journal on a utf8mb3 connection / When its database checks run
    with override_settings(GROUSSET={"DATABASE": mb3}):
        found = database_checks(mb3)
    # Then W012 names the character sets and the fix
    w012 = found["celery_grousset.W012"]
    assert "utf8mb3 (connection)" in w012.msg and "'charset'] = 'utf8mb4'" in (w012.hint or "")
    # And the test settings' utf8mb4 connection is fine
    with override_settings(GROUSSET={"DATABASE": "mysql"}):
        assert "celery_grousset.W012" not in database_checks("mysql")


def test_an_emoji_in_the_admin_search_is_no_error(mb3: str) -> None:
    from tests.test_admin import client_for, make_user

    processor, fp = f"test-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex * 2
    # Given the admin on a utf8mb3 journal holding a row whose task id had an emoji
    with override_settings(GROUSSET={"DATABASE": mb3}):
        get_store(mb3).claim(ClaimRequest(
            processor_id=processor, fingerprint=fp, task_name="shop.t", task_id="t-\U0001f600",
            token="tok", worker="w", args_repr="()", max_processing_time=60.0,
            expires_after=3600.0, max_takeovers=3,
        ))  # fmt: skip
        client = client_for(make_user(superuser=True))
        # When an operator searches for that task id (an emoji in the term)
        page = client.get("/admin/celery_grousset/outcome/", {"q": "t-\U0001f600"})
    # Then the page answers, and finds the row as the journal stored it
    assert page.status_code == 200
    assert fp[:12] in page.content.decode()
