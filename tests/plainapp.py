"""A Celery app without any celery-grousset code: no ``install(app)``, no
``GroussetTask``. Its tasks (:mod:`tests.plaintasks`) are guarded only because
``tests.tasks_settings`` lists them in ``GROUSSET["TASKS"]``, which the worker of
tests/test_settings_tasks.py reads (``celery -A tests.plainapp worker``).

Only worker processes import this module.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.tasks_settings")

from celery import Celery

app = Celery("grousset_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    result_expires=3600,
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("GROUSSET_TEST_QUEUE", "grousset-tests"),
)
# As a Django project does it: the task modules are imported when the worker starts.
app.autodiscover_tasks(["tests"], related_name="plaintasks")
