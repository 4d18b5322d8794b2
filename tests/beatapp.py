"""The Celery app the periodic tests run ``celery beat`` with: tests.celeryapp plus one
schedule entry, ``tests.tasks.periodic_effect(GROUSSET_TEST_BEAT_KEY)`` every
``GROUSSET_TEST_BEAT_EVERY`` seconds."""

from __future__ import annotations

import os

from tests.celeryapp import app

app.conf.beat_schedule = {
    "grousset-periodic-effect": {
        "task": "tests.tasks.periodic_effect",
        "schedule": float(os.environ.get("GROUSSET_TEST_BEAT_EVERY", "1")),
        "args": (os.environ.get("GROUSSET_TEST_BEAT_KEY", "beat"),),
        # long enough that one beat's copy of a slot often finds the other's in flight
        "kwargs": {"sleep": float(os.environ.get("GROUSSET_TEST_BEAT_SLEEP", "0.3"))},
    }
}
