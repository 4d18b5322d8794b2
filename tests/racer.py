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


def run_all(procs: list[Any], out: Any, seconds: float = 600) -> list[Any]:
    """Start ``procs``, collect one result from each off ``out`` (failing early if one of
    them dies), wait for them to exit cleanly; the results."""
    import queue

    for p in procs:
        p.start()
    results: list[Any] = []
    deadline = time.monotonic() + seconds
    while len(results) < len(procs):
        assert time.monotonic() < deadline, f"racers did not finish in {seconds:g} s"
        try:
            results.append(out.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a racer process failed: exit codes {dead}"
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return results
