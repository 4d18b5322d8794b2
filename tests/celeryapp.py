"""The Celery app the worker tests start (``celery -A tests.celeryapp worker``)."""

from __future__ import annotations

import os
from typing import Any

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


def quorum_queue(name: str) -> Any:
    """A RabbitMQ quorum queue on a topic exchange, delivery limit 5 (RabbitMQ 4's default
    is 20): Celery 5.5+ delays its messages in the broker, in whole seconds."""
    from kombu import Exchange, Queue

    arguments = {"x-queue-type": "quorum", "x-delivery-limit": 5}
    return Queue(name, Exchange(name, type="topic"), routing_key=name, queue_arguments=arguments)


if os.environ.get("GROUSSET_TEST_QUORUM"):
    app.conf.task_queues = [quorum_queue(app.conf.task_default_queue)]
app.autodiscover_tasks(["tests"], related_name="tasks", force=True)
