"""The test settings plus django-celery-beat, with ``PERIODIC_SLOT`` off: the W008
database check on its ``PeriodicTask`` rows (tests/test_checks.py, in a subprocess)."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import GROUSSET as _GROUSSET
from tests.settings import INSTALLED_APPS as _INSTALLED_APPS

INSTALLED_APPS = [*_INSTALLED_APPS, "django_celery_beat"]

GROUSSET = {**_GROUSSET, "DATABASE": "default", "PERIODIC_SLOT": False}
