"""A project's own tests, run by Django's test runner (``manage.py test``) on a
PostgreSQL journal: the journal's own connection to the test database must not keep
Django from dropping it at the end (docs/testing.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests import services

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = """
import os
SECRET_KEY = "x"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "celery_grousset"]
DATABASES = {{"default": {{
    "ENGINE": "django.db.backends.postgresql", "NAME": {name!r},
    "USER": {user!r}, "HOST": {host!r}, "PORT": {port!r},
    "TEST": {{"NAME": {test_name!r}}},
}}}}
GROUSSET = {{"MAX_PROCESSING_TIME": 30}}
"""

APP = """
from celery import Celery
from celery_grousset import GroussetTask

app = Celery("runnerproj", set_as_current=True)
app.conf.task_always_eager = False
CALLS = []

@app.task(base=GroussetTask, name="runnerproj.charge")
def charge(order_id):
    CALLS.append(order_id)
    return {"order": order_id}
"""

TESTS = """
from django.conf import settings
from django.test import TestCase, TransactionTestCase, override_settings

from runnerproj.app import CALLS, charge


class Committed(TransactionTestCase):
    def test_a_duplicate_gets_the_memo(self):
        del CALLS[:]
        first, second = charge.apply((7,)).get(), charge.apply((7,)).get()
        self.assertEqual(first, second)
        self.assertEqual(CALLS, [7])


@override_settings(GROUSSET={**settings.GROUSSET, "BYPASS": True})
class KeptTestCase(TestCase):  # a test of something else: the guard off, no journal
    def test_a_guarded_call_runs_on_every_call(self):
        del CALLS[:]
        self.assertEqual(charge.apply((8,)).get(), charge.apply((8,)).get())
        self.assertEqual(CALLS, [8, 8])
"""


def test_manage_py_test_drops_its_postgresql_test_database(tmp_path: Path) -> None:
    services.require_database("postgresql")
    from django.conf import settings
    from django.db import connections

    user = os.environ.get("GROUSSET_TEST_PG_USER", "postgres")
    host = os.environ.get("GROUSSET_TEST_PG_HOST", "127.0.0.1")
    port = os.environ.get("GROUSSET_TEST_PG_PORT", "5432")
    test_name = f"grousset_runner_{uuid.uuid4().hex[:10]}"
    # Given a project whose journal is its PostgreSQL database, a TransactionTestCase that
    # makes guarded calls, and a TestCase that turns the guard off for its own tests
    pkg = tmp_path / "runnerproj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "settings.py").write_text(
        SETTINGS.format(user=user, host=host, port=port, test_name=test_name,
                        name=settings.DATABASES["postgresql"]["NAME"])
    )
    (pkg / "app.py").write_text(textwrap.dedent(APP))
    (pkg / "tests.py").write_text(textwrap.dedent(TESTS))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "runnerproj.settings",
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}  # fmt: skip
    # When Django's test runner runs it
    run = subprocess.run(
        [sys.executable, "-m", "django", "test", "runnerproj.tests", "--noinput", "-v", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = run.stdout + run.stderr
    # Then the test passed, the run exits 0, and the test database is gone
    with connections["postgresql"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [test_name])
        exists = cursor.fetchone()[0]
        if exists:
            cursor.execute(f'DROP DATABASE "{test_name}" WITH (FORCE)')
    assert "Ran 2 tests" in out and "OK" in out and run.returncode == 0, out[-3000:]
    assert exists == 0, out[-3000:]


WORKER_SETTINGS = """
SECRET_KEY = "x"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "celery_grousset"]
DATABASES = {{
    "default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {default!r}}},
    "journal": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {real!r},
                 "TEST": {{"NAME": {test!r}}}}},
}}
GROUSSET = {{"DATABASE": "journal", "MAX_PROCESSING_TIME": 30}}
"""

WORKER_APP = """
from celery import Celery
from celery_grousset import GroussetTask

app = Celery("workerproj", broker="memory://", backend="cache+memory://", set_as_current=True)

@app.task(base=GroussetTask, name="workerproj.send")
def send(n):
    return n
"""

WORKER_TESTS = """
from celery.contrib.testing.worker import start_worker
from django.test import TestCase, TransactionTestCase

from workerproj.app import app, send


class InProcessWorker:  # as Celery's documentation shows it for Django's test cases
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.celery_worker = start_worker(app, perform_ping_check=False)
        cls.celery_worker.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.celery_worker.__exit__(None, None, None)
        super().tearDownClass()


class NotListed(InProcessWorker, TransactionTestCase):
    databases = {"default"}

    def test_not_listed(self):
        send.delay(1).get(timeout=20)


class RolledBack(InProcessWorker, TestCase):
    databases = {"default", "journal"}

    def test_rolled_back(self):
        send.delay(2).get(timeout=20)


class Listed(InProcessWorker, TransactionTestCase):
    databases = {"default", "journal"}

    def test_listed(self):
        self.assertEqual(send.delay(4).get(timeout=20), 4)
        self.assertEqual(send.delay(4).get(timeout=20), 4)


class ZAfterTheWorkers(TransactionTestCase):  # (runs last: the classes run by name)
    databases = {"default"}

    def test_the_check_ended_with_the_workers(self):
        from celery_grousset import guard

        self.assertIsNone(guard.test_database_check)
"""


def test_manage_py_test_refuses_an_in_process_workers_leaking_delivery(tmp_path: Path) -> None:
    """Celery's in-process worker (``start_worker`` in ``setUpClass``, as Celery's docs show
    for Django) runs deliveries in a thread no test case marks: their claims went to the
    database in the settings, or outlived a rolled-back TestCase."""
    import sqlite3

    # Given a project whose journal is a database of its own (migrated: the one in its
    # settings, which a test must never write to), and test cases that publish to an
    # in-process worker
    pkg = tmp_path / "workerproj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    real = tmp_path / "real-journal.sqlite3"
    (pkg / "settings.py").write_text(WORKER_SETTINGS.format(
        default=str(tmp_path / "default.sqlite3"), real=str(real),
        test=str(tmp_path / "test-journal.sqlite3"),
    ))  # fmt: skip
    (pkg / "app.py").write_text(textwrap.dedent(WORKER_APP))
    (pkg / "tests.py").write_text(textwrap.dedent(WORKER_TESTS))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "workerproj.settings",
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}  # fmt: skip
    django = [sys.executable, "-m", "django"]
    subprocess.run([*django, "migrate", "--database", "journal", "-v", "0"], cwd=tmp_path,
                   env=env, check=True, timeout=120)  # fmt: skip
    # When Django's test runner runs them
    run = subprocess.run(
        [*django, "test", "workerproj.tests", "--noinput", "-v", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = run.stdout + run.stderr
    # Then the two whose claims would leak fail with the reason; the listed one passes
    assert "FAILED (failures=2)" in out, out[-4000:]
    assert "test_listed (workerproj.tests.Listed" in out and "ok" in out, out[-4000:]
    assert "test_the_check_ended_with_the_workers" in out and "Ran 4 tests" in out, out[-4000:]
    assert "'journal', which this test may not use" in out, out[-4000:]
    assert "rolled-back test transaction" in out, out[-4000:]
    for name in ("test_not_listed", "test_rolled_back"):
        assert f"FAIL: {name}" in out, out[-4000:]
    # And nothing was written to the database in the settings
    with sqlite3.connect(real) as conn:
        assert conn.execute("SELECT count(*) FROM celery_grousset_outcome").fetchone() == (0,)
