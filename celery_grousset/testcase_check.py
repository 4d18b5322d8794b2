"""A guarded call run in a test's own process (eager, direct, ``protect()``) whose claims
would leak out of the test is refused, under Django's test runner and pytest-django
alike (docs/testing.md).

The journal store claims on a private connection of its own and commits at once, so
two kinds of test cannot contain its writes:

* a test that may not use the journal's database (Django's ``databases``: not listed
  there, that database is not a test database; the claim would be written to the
  database in your settings), and
* a ``TestCase`` (pytest-django's ``django_db`` without ``transaction=True``): it rolls
  its transaction back at the end, but not the journal's commits, so a later test
  meets the memo of an earlier one; and
* a test whose ``available_apps`` leave ``celery_grousset`` out: the tables emptied
  after it are those of the apps listed, so the journal's rows outlive it too.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps

from celery_grousset.publish_check import from_testcase

NOT_THIS_TESTS = (
    "guarded tasks write the journal in database {alias!r}, which this test may not use: "
    "its claims would be written to the database in your settings. List it in the test's "
    "databases (pytest: @pytest.mark.django_db(transaction=True, databases=[..., "
    "{alias!r}]); Django: databases = {{..., {alias!r}}} on the TransactionTestCase)."
)
ROLLED_BACK = (
    "guarded tasks claim on the journal's own connection and commit at once, which a "
    "rolled-back test transaction cannot contain (a later test would meet this test's "
    "memos). Use TransactionTestCase (Django's runner) or "
    "@pytest.mark.django_db(transaction=True) (pytest). A test of something else can keep "
    "its TestCase with the guard off: @override_settings(GROUSSET={**settings.GROUSSET, "
    "'BYPASS': True}) (no journal; the body runs on every call)."
)
HIDDEN = (
    "this test's available_apps (or INSTALLED_APPS override) leave out 'celery_grousset', "
    "so the journal's table is not emptied after it, and a later test would meet this "
    "test's memos: add 'celery_grousset' to them."
)


def refuse_leaks(alias: str, conn: Any = None) -> None:
    """Raise Django's ``DatabaseOperationForbidden`` (a test failure) when the journal
    database ``alias`` is one the running test may not use, or is inside the
    transaction of a ``TestCase``, as ``conn`` (default: this thread's connection to
    ``alias``) says. Outside tests: two attribute reads."""
    from django.db import connections

    if conn is None:
        if alias not in connections.settings:
            return  # not a database at all: the store says so, naming the setting and fix
        conn = connections[alias]
    failure = conn.__dict__.get("cursor")  # Django's test cases replace it when forbidden
    if type(failure).__name__ == "_DatabaseFailure":
        raise forbidden(NOT_THIS_TESTS.format(alias=alias))
    if conn.atomic_blocks and any(from_testcase(b) for b in conn.atomic_blocks):
        raise forbidden(ROLLED_BACK)
    if apps.stored_app_configs and not apps.is_installed("celery_grousset"):
        raise forbidden(HIDDEN)  # (stored_app_configs: set_available_apps in force)


def this_threads_connections() -> dict[str, Any]:
    """This thread's Django connection objects, by alias (opened or not: a test's setup
    marks them as it goes, forbidden or inside its transaction). A worker thread judges a
    delivery by the connections of the test thread it runs for."""
    from django.db import connections

    held = {}
    for alias in connections.settings:
        try:
            held[alias] = connections[alias]
        except Exception:  # a misconfigured alias: the checks report it
            continue
    return held


def forbidden(message: str) -> Any:
    from django.test.testcases import (  # type: ignore[attr-defined]
        DatabaseOperationForbidden,
    )

    return DatabaseOperationForbidden(f"celery-grousset: {message}")
