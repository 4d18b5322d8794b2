"""A project whose database router (the one docs/configuration.md shows) keeps the
journal's tables on the journal database and the outbox on both
(tests/test_migrations.py): two SQLite files in ROUTER_DIR."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_DIR = os.environ.get("ROUTER_DIR", ".")
_SPEC = importlib.util.spec_from_file_location(
    "grousset_docs_router", Path(__file__).resolve().parent.parent / "docs/snippets/router.py"
)
assert _SPEC is not None and _SPEC.loader is not None
_ROUTER = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_ROUTER)

SECRET_KEY = "router-test"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "celery_grousset"]
DATABASES = {
    alias: {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{_DIR}/{alias}.sqlite3"}
    for alias in ("default", "journal")
}
DATABASE_ROUTERS = [_ROUTER.JournalRouter()]
GROUSSET = {"DATABASE": "journal"}
