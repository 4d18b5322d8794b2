"""The pytest plugin of docs/testing.md, ``celery_grousset.contrib.pytest``: installed
with the package (a ``pytest11`` entry point), no ``pytest_plugins`` line needed.

Its fixtures run against the tests' own Celery app (``tests.celeryapp``) and the
SQLite journal (``default`` alias); effects are counted in the effect ledger.
"""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests import services
from tests.ledger.models import Effect

if TYPE_CHECKING:
    from pytest_django.fixtures import Settings

    from celery_grousset.contrib.pytest import Journal

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def sqlite_journal(settings: Settings) -> None:
    services.require_database("default")
    settings.GROUSSET = {**settings.GROUSSET, "DATABASE": "default"}


def effects(key: str) -> int:
    return Effect.objects.using("default").filter(key=key).count()


def test_eager_duplicate_returns_the_memo_and_runs_once(
    grousset_eager: object, grousset_journal: Journal
) -> None:
    from tests.tasks import effect

    key = f"eager-{uuid.uuid4().hex[:8]}"
    # Given a guarded task run eagerly once
    first = effect.apply((key,)).get()
    # When the same call is delivered again (a new task id)
    second = effect.apply((key,)).get()
    # Then the body ran once, the duplicate got the memo, both deliveries were counted
    assert effects(key) == 1
    assert second == first and second["key"] == key
    assert grousset_journal.deliveries(effect, key) == 2
    record = grousset_journal.get(effect, key)
    assert record.status == "completed" and record.fence == first["fence"]
    assert grousset_journal.memo(effect, key) == first


def test_eager_applies_to_delay(grousset_eager: object, grousset_journal: Journal) -> None:
    from tests.tasks import effect

    key = f"delay-{uuid.uuid4().hex[:8]}"
    # Given the eager fixture / When .delay() is called three times
    values = [effect.delay(key).get() for _ in range(3)]
    # Then it ran in-process, once, and every call returned the same value
    assert effects(key) == 1
    assert values[1] == values[2] == values[0]
    assert grousset_journal.deliveries(effect, key) == 3


def test_journal_uses_the_tasks_key_selection(
    grousset_eager: object, grousset_journal: Journal
) -> None:
    from tests.tasks import charge

    order = int(uuid.uuid4().int % 10**9)
    # Given a task keyed on order_id only
    first = charge.apply((order, "10.00")).get()
    # When it is called again for the same order (another amount would be refused:
    # PayloadMismatch, tests/test_payload.py)
    again = charge.apply((order, "10.00")).get()
    # Then it is the same record, found from any call of the order
    assert again == first and effects(f"charge-{order}") == 1
    assert grousset_journal.get(charge, order, "99.00").deliveries == 2
    assert grousset_journal.fingerprint(charge, order, "10.00") == grousset_journal.fingerprint(
        charge, order, amount="1.00"
    )


def test_journal_reports_a_call_that_never_ran(grousset_journal: Journal) -> None:
    from tests.tasks import effect

    key = f"never-{uuid.uuid4().hex[:8]}"
    # Given a call that never ran / When it is looked up / Then 0 deliveries, and get() fails
    assert grousset_journal.find(effect, key) is None
    assert grousset_journal.deliveries(effect, key) == 0
    with pytest.raises(pytest.fail.Exception, match=r"no journal entry for tests\.tasks\.effect"):
        grousset_journal.get(effect, key)


def test_memo_of_a_released_failure_says_a_duplicate_runs_again(
    grousset_eager: object, grousset_journal: Journal
) -> None:
    from celery_grousset import GroussetTask
    from tests.celeryapp import app

    name = f"tests.contrib.boom_{uuid.uuid4().hex[:8]}"

    def boom(n: int) -> None:
        raise ValueError(f"boom {n}")

    task = app.task(base=GroussetTask, shared=False, name=name, max_processing_time=30)(boom)
    # Given a call that failed (on_failure="release", the default)
    with pytest.raises(ValueError, match="boom 3"):
        task.apply((3,)).get()
    assert grousset_journal.get(task, 3).status == "failed"
    # When its memo is asked for / Then the test fails saying there is none and why
    with pytest.raises(pytest.fail.Exception, match=r"no memo.*released.*runs the task again"):
        grousset_journal.memo(task, 3)


def test_journal_finds_a_call_by_its_idempotency_key(
    grousset_eager: object, grousset_journal: Journal
) -> None:
    from celery_grousset import GroussetTask
    from tests.celeryapp import app

    name = f"tests.contrib.keyed_{uuid.uuid4().hex[:8]}"

    def charge(order_id: int) -> int:
        return order_id * 2

    task = app.task(base=GroussetTask, shared=False, name=name, max_processing_time=30)(charge)
    # Given a call made with an idempotency key
    assert task.apply((4,), idempotency_key="k-4").get() == 8
    # When the test looks it up by its key / Then it finds its record, and none for another
    record = grousset_journal.keyed(task, "k-4")
    assert record.status == "completed" and record.task_name == name
    assert record.fingerprint != grousset_journal.fingerprint(task, 4)
    with pytest.raises(pytest.fail.Exception, match=r"no journal entry.*idempotency_key='k-5'"):
        grousset_journal.keyed(task, "k-5")


def test_journal_count_clear_and_protect(grousset_journal: Journal) -> None:
    from celery_grousset import protect

    key = f"import-{uuid.uuid4().hex[:8]}"
    # Given a protect() call that ran
    assert protect(key, lambda: 7, max_processing_time=10) == 7
    assert grousset_journal.protected(key).status == "completed"
    assert grousset_journal.count(task_name="protect") >= 1
    # When the journal is cleared
    removed = grousset_journal.clear()
    # Then it is empty
    assert removed >= 1
    assert grousset_journal.count() == 0
    assert grousset_journal.database == "default"


def test_eager_restores_config_and_refuses_rollback_only_db(pytester: pytest.Pytester) -> None:
    # Given a project that still names the plugin in pytest_plugins (loaded once, with the
    # entry point's) and has a Celery app of its own
    pytester.makeconftest(textwrap.dedent("""
        import pytest
        from celery import Celery

        pytest_plugins = ["celery_grousset.contrib.pytest"]
        APP = Celery("inner", set_as_current=False)

        @pytest.fixture
        def grousset_celery_app():
            return APP
    """))
    pytester.makepyfile(textwrap.dedent("""
        import pytest
        from conftest import APP

        def test_eager_on(grousset_eager):
            assert grousset_eager is APP
            assert APP.conf.task_always_eager and APP.conf.task_eager_propagates

        def test_eager_off_again():
            assert not APP.conf.task_always_eager and not APP.conf.task_eager_propagates

        @pytest.mark.django_db
        def test_rollback_only(grousset_journal):
            pass

        @pytest.mark.django_db(transaction=True)
        def test_transactional(grousset_journal):
            pass
    """))
    env = {"PYTHONPATH": os.pathsep.join([str(pytester.path), str(ROOT)]),
           "DJANGO_SETTINGS_MODULE": "tests.settings"}  # fmt: skip
    for name, value in env.items():
        pytester._monkeypatch.setenv(name, value)
    # When its tests run (in order: eager on, then off)
    result = pytester.runpytest_subprocess(
        "-p", "no:django", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning"
    )
    # Then the configuration was restored, and a rollback-only database is refused
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*test_rollback_only*django_db(transaction=True)*"])


def test_the_entry_point_provides_the_fixtures_with_no_pytest_plugins_line(
    pytester: pytest.Pytester,
) -> None:
    # Given a project with no conftest.py (no pytest_plugins line), on pytest-django
    pytester.makepyfile(textwrap.dedent("""
        import pytest
        from celery_grousset.contrib.pytest import Journal

        @pytest.mark.django_db(transaction=True)
        def test_fixtures(grousset_eager, grousset_journal):
            assert grousset_eager.conf.task_always_eager
            assert isinstance(grousset_journal, Journal)

        def test_no_test_database(grousset_eager):
            pass  # refused: its claims would go to the settings' database
    """))
    pytester._monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(ROOT)]))
    pytester._monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.settings")
    # (a SQLite file of its own: pytest-django creates and destroys the marked test's DB)
    pytester._monkeypatch.setenv("GROUSSET_TEST_SQLITE", str(pytester.path / "journal.sqlite3"))
    # When its tests run, and its fixtures are listed
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    listed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fixtures")
    # Then the plugin's fixtures are there, from the installed package's entry point, and
    # a test with no test database (no django_db mark) is refused, naming the mark
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_no_test_database*no test database*transaction=True*"])
    listed.stdout.fnmatch_lines(["*fixtures defined from celery_grousset.contrib.pytest*",
                                 "grousset_eager*", "*grousset_journal*"])  # fmt: skip
    # And with the plugin switched off by its entry point's name, they are gone
    off = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                        "-p", "no:celery_grousset.contrib.pytest")  # fmt: skip
    off.assert_outcomes(errors=2)
    off.stdout.fnmatch_lines(["*fixture 'grousset_eager' not found*"])


def test_the_entry_point_plugin_loads_in_a_project_without_django_settings(
    pytester: pytest.Pytester,
) -> None:
    # Given a project with no Django settings at all (celery-grousset merely installed)
    pytester._monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    pytester.makepyfile(textwrap.dedent("""
        import sys

        def test_plain():
            assert "celery_grousset.models" not in sys.modules
    """))
    # When its tests run (the plugin is loaded, importing none of the Django parts)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:django",
                                           "--trace-config")  # fmt: skip
    # Then they pass, with the plugin registered
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*celery_grousset.contrib.pytest*"])


def test_a_guarded_call_without_the_fixtures_is_refused_where_its_claims_would_leak(
    pytester: pytest.Pytester,
) -> None:
    # Given a project whose tests call a guarded task in-process without the plugin's
    # fixtures: inside a rolled-back test transaction, with no test database, and right
    pytester.makepyfile(textwrap.dedent("""
        import pytest
        from django.test import TestCase, TransactionTestCase
        from celery_grousset import GroussetTask
        from tests.celeryapp import app

        @app.task(base=GroussetTask, bind=True, max_processing_time=30, name="inner.send")
        def send(self, n):
            return n

        @pytest.mark.django_db
        def test_rollback_only():
            send.apply((1,)).get()

        def test_no_test_database():
            send.apply((2,)).get()

        @pytest.mark.django_db(transaction=True)
        def test_transactional():
            assert send.apply((3,)).get() == 3

        class DjangoTestCase(TestCase):
            def test_in_a_testcase(self):
                send.apply((4,)).get()

        class DjangoTransactionTestCase(TransactionTestCase):
            def test_in_a_transactiontestcase(self):
                assert send.apply((5,)).get() == 5

        @pytest.mark.django_db
        def test_transactional_db_fixture(transactional_db, grousset_journal):
            assert send.apply((6,)).get() == 6

        @pytest.mark.django_db(reset_sequences=True)
        def test_reset_sequences(grousset_journal):
            assert send.apply((9,)).get() == 9

        @pytest.mark.django_db(transaction=True, available_apps=["tests.ledger"])
        def test_available_apps_without_the_journal():
            send.apply((7,)).get()

        class DjangoAvailableApps(TransactionTestCase):
            available_apps = ["tests.ledger"]

            def test_in_a_testcase_of_some_apps(self):
                send.apply((8,)).get()
    """))
    pytester._monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(ROOT)]))
    pytester._monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.settings")
    pytester._monkeypatch.setenv("GROUSSET_TEST_SQLITE", str(pytester.path / "journal.sqlite3"))
    # When they run
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    # Then the two whose claims would outlive the test (or go to the settings' database)
    # fail, each naming the mark to use (a Django TestCase is one too); the transactional
    # ones pass
    # (a test that asks for transactional_db, or resets sequences, is transactional whatever
    # its mark's transaction=; one whose
    # available_apps leave the journal's app out would leave its rows to the next test)
    result.assert_outcomes(passed=4, failed=5)
    for line in (  # each its own line, in whatever order pytest lists the failures
        "*test_rollback_only*rolled-back test transaction*django_db(transaction=True)*",
        "*test_no_test_database*no test database*django_db(transaction=True)*",
        "*test_in_a_testcase*rolled-back test transaction*",
        "*test_available_apps_without_the_journal*available_apps*leave out 'celery_grousset'*",
        "*test_in_a_testcase_of_some_apps*available_apps*leave out 'celery_grousset'*",
    ):
        result.stdout.fnmatch_lines([line])
    # And each refusal says so once (it was printed twice: "During handling of the
    # above exception, another exception occurred")
    assert "During handling of the above exception" not in result.stdout.str()


def _journal_of_its_own(pytester: pytest.Pytester, tmp_path: Path) -> Path:
    """An inner project (``settings_journal``) whose journal is the database ``journal``:
    a migrated file, the database in its settings, which a test must never write to."""
    from django.core.management import call_command

    real = tmp_path / "real-journal.sqlite3"
    with services.extra_database("real_journal", ENGINE="django.db.backends.sqlite3",
                                 NAME=str(real)):  # fmt: skip
        call_command("migrate", "celery_grousset", database="real_journal", verbosity=0)
    pytester.makepyfile(settings_journal=textwrap.dedent(f"""
        from tests.settings import *  # noqa: F403
        DATABASES = {{"default": DATABASES["default"], "journal": {{
            "ENGINE": "django.db.backends.sqlite3", "NAME": {str(real)!r},
            "TEST": {{"NAME": {str(tmp_path / "test-journal.sqlite3")!r}}}}}}}
        GROUSSET = {{**GROUSSET, "DATABASE": "journal"}}
    """))
    pytester._monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(ROOT)]))
    pytester._monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "settings_journal")
    pytester._monkeypatch.setenv("GROUSSET_TEST_SQLITE", str(tmp_path / "default.sqlite3"))
    return real


def test_a_test_that_may_not_use_the_journal_database_is_refused_not_leaked(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    import sqlite3

    # Given a project whose journal has a database of its own
    real = _journal_of_its_own(pytester, tmp_path)
    pytester.makepyfile(test_leaks=textwrap.dedent("""
        import pytest
        from django.test import TestCase, TransactionTestCase
        from celery_grousset import protect

        def once(key):
            return protect(key, lambda: 1, max_processing_time=5)

        @pytest.mark.django_db(transaction=True)
        def test_not_listed():
            once("a")

        @pytest.mark.django_db(transaction=True, databases="__all__")
        def test_listed():
            assert once("b") == 1

        class NotListed(TransactionTestCase):
            databases = {"default"}
            def test_protect(self):
                once("c")

        class RolledBack(TestCase):
            databases = {"default", "journal"}
            def test_protect(self):
                once("d")

        class Listed(TransactionTestCase):
            databases = {"default", "journal"}
            def test_protect(self):
                assert once("e") == 1
    """))
    # When its tests run
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf")
    # Then the two that may not use the journal, and the rolled-back one, fail and say why
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines(["*test_not_listed*'journal', which this test may not use*"])
    result.stdout.fnmatch_lines(["*NotListed*'journal', which this test may not use*"])
    result.stdout.fnmatch_lines(["*RolledBack*rolled-back test transaction*"])
    # And nothing was written to the database in the settings
    with sqlite3.connect(real) as conn:
        assert conn.execute("SELECT count(*) FROM celery_grousset_outcome").fetchone() == (0,)


def test_a_delivery_to_an_in_process_worker_is_refused_where_its_claims_would_leak(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """Celery's in-process worker runs deliveries in a thread of the test's process: the
    test's database rules are on the test thread's connections, not the worker's. Its
    claims went to the database in the settings, or outlived a rolled-back test."""
    import sqlite3

    # Given a project whose journal has a database of its own
    real = _journal_of_its_own(pytester, tmp_path)
    # ... and tests that publish to Celery's in-process worker, as docs/testing.md shows
    pytester.makepyfile(test_worker_leaks=textwrap.dedent("""
        import pytest
        from celery import shared_task
        from celery.contrib import pytest as celery_fixtures
        from celery_grousset import GroussetTask

        celery_worker = celery_fixtures.celery_worker

        @shared_task(base=GroussetTask, bind=True, max_processing_time=30, name="inner.send")
        def send(self, n):
            return n

        @pytest.mark.django_db(transaction=True)
        def test_not_listed(celery_app, celery_worker):
            send.delay(1).get(timeout=20)

        @pytest.mark.django_db(databases="__all__")
        def test_rolled_back(celery_app, celery_worker):
            send.delay(2).get(timeout=20)

        def test_no_mark(celery_app, celery_worker):
            send.delay(3).get(timeout=20)

        @pytest.mark.django_db(transaction=True, databases="__all__")
        def test_listed(celery_app, celery_worker):
            assert send.delay(4).get(timeout=20) == 4
            assert send.delay(4).get(timeout=20) == 4
    """))
    # When its tests run (--tb=line: formatting a traceback's source parses it, which on
    # CPython 3.11 can fail with "AST constructor recursion depth mismatch" while the
    # in-process worker's thread runs: an INTERNALERROR of the inner run, not a result)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "celery.contrib.pytest",
                                           "-rf", "--tb=line")  # fmt: skip
    # Then the three whose claims would leak fail and say why; the listed one passes
    result.assert_outcomes(passed=1, failed=3)
    for line in (  # the worker's failure reaches the test through the task's result
        "FAILED *::test_not_listed - *",
        "FAILED *::test_rolled_back - *",
        "FAILED *::test_no_mark - *",
        "*DatabaseOperationForbidden: *'journal', which this test may not use*",
        "*DatabaseOperationForbidden: *rolled-back test transaction*",
        "*DatabaseOperationForbidden: *no test database*django_db(transaction=True)*",
    ):
        result.stdout.fnmatch_lines([line])
    # And nothing was written to the database in the settings
    with sqlite3.connect(real) as conn:
        assert conn.execute("SELECT count(*) FROM celery_grousset_outcome").fetchone() == (0,)
