"""The checked-in migrations match the models, whatever DEFAULT_AUTO_FIELD the
project uses (every model declares its primary key explicitly)."""

from __future__ import annotations

import os
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
