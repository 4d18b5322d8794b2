"""Misconfigured settings for ``manage.py check`` (tests/test_checks.py, in a subprocess):
the test settings plus ``tests.badapp`` (a Celery app with misconfigured guarded
tasks) and a MySQL journal at REPEATABLE READ; ``GROUSSET_CHECKS_GROUSSET`` (a Python
literal) replaces ``GROUSSET``."""

from __future__ import annotations

import ast
import copy
import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _DATABASES
from tests.settings import GROUSSET as _GROUSSET
from tests.settings import INSTALLED_APPS as _INSTALLED_APPS

INSTALLED_APPS = [*_INSTALLED_APPS, "tests.badapp.apps.BadAppConfig"]

DATABASES = copy.deepcopy(_DATABASES)
DATABASES["mysql"]["OPTIONS"]["isolation_level"] = "repeatable read"

GROUSSET = {**_GROUSSET, "DATABASE": "mysql"}

# A GROUSSET of the test's choosing (tests/test_checks.py), as a Python literal.
if os.environ.get("GROUSSET_CHECKS_GROUSSET"):
    GROUSSET = ast.literal_eval(os.environ["GROUSSET_CHECKS_GROUSSET"])
