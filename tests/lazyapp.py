"""A Celery app laid out as Celery's Django docs show it: its tasks are discovered
lazily (imported when a worker starts, not when the app is imported)."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from celery import Celery

app = Celery("grousset_tests_lazy")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["tests"], related_name="tasks")
