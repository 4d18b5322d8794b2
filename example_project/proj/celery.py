"""The Celery app of the example project: ``celery -A proj worker``."""

from __future__ import annotations

import os

from celery import Celery

from celery_grousset.worker import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# Every CELERY_* Django setting configures the app (CELERY_BROKER_URL -> broker_url …).
app.config_from_object("django.conf:settings", namespace="CELERY")
if str(app.conf.broker_url).startswith("filesystem"):
    from proj import fsbroker  # noqa: F401  (whole message files only: see its docstring)
# Finds shop/tasks.py and celery_grousset's own tasks (purge_expired).
app.autodiscover_tasks()
# The --grousset-* worker flags and the worker bootstep (must run where the app is built).
install(app)
