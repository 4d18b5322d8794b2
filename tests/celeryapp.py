"""The Celery app the worker tests start (``celery -A tests.celeryapp worker``)."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from celery import Celery

from celery_grousset.worker import install

app = Celery("grousset_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
install(app)  # the --grousset-* worker flags and the bootstep
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    result_expires=3600,
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("GROUSSET_TEST_QUEUE", "grousset-tests"),
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("GROUSSET_TEST_VISIBILITY", "3600")),
        # scan for unacked messages to restore every second (short-visibility tests)
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)
app.autodiscover_tasks(["tests"], related_name="tasks", force=True)
