"""Plain ``@app.task`` tasks (no ``GroussetTask``) of :mod:`tests.plainapp`, guarded by
``GROUSSET["TASKS"]`` in ``tests.tasks_settings``: ``receipt`` by its name,
``bulk_receipt`` by the pattern ``tests.plaintasks.bulk_*``; ``untouched`` is listed
nowhere and stays unguarded. Each effect is a row in the effect ledger."""

from __future__ import annotations

import os
import time
import uuid

from tests.plainapp import app


def _effect(key: str, sleep: float) -> str:
    from django.conf import settings

    from tests.ledger.models import Effect

    Effect.objects.using(settings.GROUSSET["DATABASE"]).create(key=key, pid=os.getpid())
    time.sleep(sleep)
    return f"{uuid.uuid4().hex}@{os.getpid()}"  # a value no second run could repeat


@app.task
def receipt(key: str, sleep: float = 0.2) -> str:
    return _effect(key, sleep)


@app.task
def bulk_receipt(key: str, sleep: float = 0.2) -> str:
    return _effect(key, sleep)


@app.task
def untouched(key: str, sleep: float = 0.2) -> str:
    return _effect(key, sleep)
