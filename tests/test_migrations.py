"""The checked-in migrations match the models, whatever DEFAULT_AUTO_FIELD the
project uses (every model declares its primary key explicitly)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "auto_field", ["django.db.models.AutoField", "django.db.models.BigAutoField"]
)
def test_makemigrations_check_is_clean(auto_field: str) -> None:
    # Given the test project under either DEFAULT_AUTO_FIELD
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "GROUSSET_TEST_AUTO_FIELD": auto_field,
        "PYTHONPATH": str(ROOT),
    }
    # When Django is asked for missing migrations of the package
    cmd = [sys.executable, "-m", "django", "makemigrations", "celery_grousset", "--check",
           "--dry-run"]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    # Then there are none
    assert run.returncode == 0, run.stdout + run.stderr
    assert "No changes detected" in run.stdout


def test_a_router_that_keeps_the_journal_on_its_own_database_can_migrate_both(
    tmp_path: Path,
) -> None:
    """The migrations' data steps (RunPython) carried no model hint, so a router that
    refuses the journal's models on ``default`` let them run there: ``migrate`` stopped
    half-way on "no such table: celery_grousset_outcome" (a review, also with the
    journal on PostgreSQL or MariaDB)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.router_settings",
           "ROUTER_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}  # fmt: skip
    tables = {}
    for alias in ("default", "journal"):
        # When each database is migrated
        cmd = [sys.executable, "-m", "django", "migrate", "--database", alias, "-v", "0"]
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        # Then it completes
        assert run.returncode == 0, run.stdout + run.stderr
        with sqlite3.connect(tmp_path / f"{alias}.sqlite3") as conn:
            tables[alias] = {name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE name LIKE 'celery_grousset_%'")}  # fmt: skip
    # And the journal's tables are only on the journal database, the outbox on both
    assert "celery_grousset_outcome" in tables["journal"], tables
    assert "celery_grousset_outcome" not in tables["default"], tables
    assert all("celery_grousset_outboxmessage" in t for t in tables.values()), tables
