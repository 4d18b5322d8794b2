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
from django.test import TransactionTestCase

from runnerproj.app import CALLS, charge


class Committed(TransactionTestCase):
    def test_a_duplicate_gets_the_memo(self):
        first, second = charge.apply((7,)).get(), charge.apply((7,)).get()
        self.assertEqual(first, second)
        self.assertEqual(CALLS, [7])
"""


def test_manage_py_test_drops_its_postgresql_test_database(tmp_path: Path) -> None:
    services.require_database("postgresql")
    from django.conf import settings
    from django.db import connections

    user = os.environ.get("GROUSSET_TEST_PG_USER", "postgres")
    host = os.environ.get("GROUSSET_TEST_PG_HOST", "127.0.0.1")
    port = os.environ.get("GROUSSET_TEST_PG_PORT", "5432")
    test_name = f"grousset_runner_{uuid.uuid4().hex[:10]}"
    # Given a project whose journal is its PostgreSQL database, and a
    # TransactionTestCase that makes guarded calls
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
    assert "OK" in out and run.returncode == 0, out[-3000:]
    assert exists == 0, out[-3000:]
