"""The example Django + Celery project of celery-grousset.

``proj`` is the Django project (settings, URLs, the Celery app) and ``shop`` the
app with the guarded tasks. Both are top-level packages on ``sys.path`` — as in
a project created by ``django-admin startproject`` — so ``manage.py`` (at the
repository root) and :mod:`example_project.demo` put this folder first on the
path; ``celery -A proj`` needs it there too (``PYTHONPATH=example_project``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: This folder: the one that holds the ``proj`` and ``shop`` packages.
PROJECT_DIR = Path(__file__).resolve().parent


def use_project_path() -> None:
    """Put :data:`PROJECT_DIR` first on ``sys.path`` and select ``proj.settings``."""
    path = str(PROJECT_DIR)
    if path not in sys.path:
        sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
