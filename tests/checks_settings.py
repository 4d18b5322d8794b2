"""Misconfigured settings for ``manage.py check`` (tests/test_checks.py, in a subprocess):
the test settings plus ``tests.badapp`` (a Celery app with misconfigured guarded
tasks) and a MySQL journal at REPEATABLE READ."""

from __future__ import annotations

import copy

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _DATABASES
from tests.settings import GROUSSET as _GROUSSET
from tests.settings import INSTALLED_APPS as _INSTALLED_APPS

INSTALLED_APPS = [*_INSTALLED_APPS, "tests.badapp.apps.BadAppConfig"]

DATABASES = copy.deepcopy(_DATABASES)
DATABASES["mysql"]["OPTIONS"]["isolation_level"] = "repeatable read"

GROUSSET = {**_GROUSSET, "DATABASE": "mysql"}
