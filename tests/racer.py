"""Child process body of the protect() race test (spawned: imports nothing Django at
module level, so the spawned interpreter can set up Django first)."""

from __future__ import annotations

import os
import random
import time
from typing import Any


def race(
    alias: str, keys: list[str], processor: str, barrier: Any, out: Any, env: dict[str, str]
) -> None:
    os.environ.update(env)
    import django

    django.setup()
    from celery_grousset import protect
    from tests.ledger.models import Effect

    def effect(key: str) -> str:
        Effect.objects.using(alias).create(key=key, value=processor, pid=os.getpid())
        time.sleep(0.003)
        return f"{key}@{os.getpid()}"

    order = list(keys)
    random.shuffle(order)
    barrier.wait(timeout=120)
    got = {
        k: protect(k, effect, k, max_processing_time=60, processor_id=processor, database=alias)
        for k in order
    }
    out.put(got)
