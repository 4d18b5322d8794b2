"""Child process body of the partitioned journal's race test (spawned: imports nothing
Django at module level, so the spawned interpreter can set up Django first)."""

from __future__ import annotations

import os
import random
from typing import Any


def race(
    alias: str,
    keys: list[str],
    processor: str,
    gen: int,
    barrier: Any,
    out: Any,
    env: dict[str, str],
) -> None:
    """Claim every key once, in this process's generation ``gen`` (read by the test's
    ``grousset_generation()``); finish what it owns. Puts (owned keys, errors)."""
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connections

    from celery_grousset.claim import ClaimRequest
    from celery_grousset.store.base import Completion
    from celery_grousset.store.pgdriver import driver
    from celery_grousset.store.pgpartition import PartitionedStore

    class InGeneration(PartitionedStore):
        def _connect(self) -> Any:
            conn = super()._connect()
            sql = "SELECT set_config('grousset.test_generation', %s, false)"
            driver().execute(conn, sql, (str(gen),))
            return conn

    store = InGeneration(alias, connections.settings[alias], 30.0)
    done = Completion("completed", b'"ok"', "application/json;utf-8")
    owned: list[str] = []
    errors: list[str] = []
    order = list(keys)
    random.shuffle(order)
    barrier.wait(timeout=120)
    for key in order:
        req = ClaimRequest(
            processor_id=processor, fingerprint=key, task_name="tests.race",
            task_id=f"{key[:8]}-{os.getpid()}", token=os.urandom(16).hex(), worker=f"w:{gen}",
            args_repr="()", max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
        )  # fmt: skip
        try:
            res = store.claim(req)
            if res.owned:
                owned.append(key)
                if not store.finish(processor, key, req.token, done):
                    errors.append(f"finish refused: {key}")
        except Exception as exc:  # counted: a store error is a finding, not a crash
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    store.close()
    out.put((owned, errors))
