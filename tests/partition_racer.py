"""Child process bodies of the partitioned journal's race tests (spawned: they import
nothing Django at module level, so the spawned interpreter can set up Django first)."""

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

    from celery_grousset.store.pgdriver import driver
    from celery_grousset.store.pgpartition import PartitionedStore

    class InGeneration(PartitionedStore):
        def _connect(self) -> Any:
            conn = super()._connect()
            sql = "SELECT set_config('grousset.test_generation', %s, false)"
            driver().execute(conn, sql, (str(gen),))
            return conn

    store = InGeneration(alias, connections.settings[alias], 30.0)
    _claim_each(store, keys, processor, f"w:{gen}", barrier, out)


def race_store(
    alias: str,
    keys: list[str],
    processor: str,
    lockstep: bool,
    barrier: Any,
    out: Any,
    env: dict[str, str],
) -> None:
    """The same on the store the settings give ``alias`` (``JOURNAL_LAYOUT`` from the
    environment); with ``lockstep``, every process in the same order, so first claims of
    a key meet as often as they can. Puts (owned keys, errors)."""
    os.environ.update(env)
    import django

    django.setup()
    from celery_grousset.store import get_store

    _claim_each(get_store(alias), keys, processor, "w", barrier, out, shuffle=not lockstep)


def _claim_each(store: Any, keys: list[str], processor: str, worker: str, barrier: Any,
                out: Any, *, shuffle: bool = True) -> None:  # fmt: skip
    from celery_grousset.claim import ClaimRequest
    from celery_grousset.store.base import Completion

    done = Completion("completed", b'"ok"', "application/json;utf-8")
    owned: list[str] = []
    errors: list[str] = []
    order = list(keys)
    if shuffle:
        random.shuffle(order)
    barrier.wait(timeout=120)
    for key in order:
        req = ClaimRequest(
            processor_id=processor, fingerprint=key, task_name="tests.race",
            task_id=f"{key[:8]}-{os.getpid()}", token=os.urandom(16).hex(), worker=worker,
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

