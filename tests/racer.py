"""Child process body of the protect() race test (spawned: imports nothing Django at
module level, so the spawned interpreter can set up Django first)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import time
from collections.abc import Callable
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


def claim_batches(
    alias: str, keys: list[str], processor: str, barrier: Any, out: Any, env: dict[str, str]
) -> None:
    """Claim ``keys`` in a random order, in batches of 50 (``Store.claim_all``); put the
    keys this process owns."""
    os.environ.update(env)
    import django

    django.setup()
    from celery_grousset.claim import ClaimRequest
    from celery_grousset.store import get_store

    store = get_store(alias)
    order = list(keys)
    random.shuffle(order)
    barrier.wait(timeout=120)
    owned = []
    for start in range(0, len(order), 50):
        batch = [
            ClaimRequest(processor, fp, "t", f"{os.getpid()}-{fp}", os.urandom(8).hex(), "w",
                         "", 60.0, 3600.0, 3)
            for fp in order[start : start + 50]
        ]  # fmt: skip
        owned += [
            r.fingerprint for r, res in zip(batch, store.claim_all(batch), strict=True) if res.owned
        ]
    out.put(owned)


def run_racers(target: Callable[..., None], n: int, *args: Any, limit: float = 600) -> list[Any]:
    """Start ``n`` spawned processes of ``target(*args, barrier, out, env)`` and return what
    each put on ``out``; fail when one dies or they take more than ``limit`` seconds."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    env = {k: v for k, v in os.environ.items() if k.startswith(("GROUSSET_", "DJANGO_"))}
    procs = [ctx.Process(target=target, args=(*args, barrier, out, env)) for _ in range(n)]
    return run_all(procs, out, limit)


def run_all(procs: list[Any], out: Any, seconds: float = 600) -> list[Any]:
    """Start ``procs``, collect one result from each off ``out`` (failing early if one of
    them dies), wait for them to exit cleanly; the results."""
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
