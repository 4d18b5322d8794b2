"""``python -m bench.publish_unique``: ``task.publish_unique(calls)`` against publishing
every call, on the producer side (PostgreSQL journal, Redis broker).

N calls (default 100,000): 30 % are in-batch duplicates, 20 % (of N) are keys the
journal already holds as completed. "publish all" calls ``apply_async`` for every
call; ``publish_unique`` fingerprints, queries the journal once per chunk and
publishes the rest. Both publish to Redis queues nobody consumes (deleted
afterwards) with ``ignore_result=True``. Reported: wall time, calls read per second,
messages published, journal queries. Settings: ``bench.settings``
(``GROUSSET_TEST_PG_NAME`` / ``BENCH_PG_NAME`` picks the database, ``BENCH_BROKER``
the Redis broker URL).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

DUPLICATES = 0.30
COMPLETED = 0.20


def setup() -> Any:
    """Django (bench settings), a migrated journal, and a Celery app on the bench broker."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ.setdefault("BENCH_GROUSSET_DB", "postgresql")
    from bench import harness

    harness.setup_django()
    harness.prepare_database("postgresql")
    from celery import Celery

    app = Celery("bench-publish-unique", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    return app


def make_calls(n: int, seed: int) -> tuple[list[str], set[str]]:
    """``n`` keys with 30 % in-batch duplicates, and the 20 % (of n) already completed."""
    rng = random.Random(seed)
    distinct = [f"k{i}" for i in range(n - int(n * DUPLICATES))]
    keys = distinct + [rng.choice(distinct) for _ in range(int(n * DUPLICATES))]
    rng.shuffle(keys)
    return keys, set(rng.sample(distinct, int(n * COMPLETED)))


def seed_completed(task: Any, processor: str, done: set[str]) -> None:
    from celery_grousset.journal import now as _db_now
    from celery_grousset.models import Outcome

    now = _db_now("postgresql")
    rows = (Outcome(processor_id=processor, fingerprint=task.grousset_fingerprint((k,), {}),
                    task_name=task.name, task_id=uuid.uuid4().hex, status="completed", fence=1,
                    claim_token="t", started_at=now, stale_at=now, completed_at=now,
                    expires_on=now + timedelta(hours=1), result=b"1",
                    result_encoding="application/json") for k in done)  # fmt: skip
    Outcome.objects.using("postgresql").bulk_create(rows, batch_size=5000)


def drop_queue(app: Any, queue: str) -> int:
    """Delete the queue's Redis keys; return how many messages it held."""
    import redis

    client = redis.Redis.from_url(app.conf.broker_url)
    keys = list(client.scan_iter(match=f"{queue}*"))
    held = sum(int(client.llen(k)) for k in keys if client.type(k) == b"list")
    client.delete(*keys, *client.scan_iter(match=f"_kombu.binding*.{queue}"))
    return held


def echo(key: str) -> str:
    """The benchmark's task body (never run: nobody consumes the queues)."""
    return key


def publish_all(app: Any, task: Any, keys: list[str], queue: str) -> int:
    with app.producer_or_acquire() as producer:
        for key in keys:
            task.apply_async((key,), queue=queue, ignore_result=True, producer=producer)
    return len(keys)


def run(n: int, chunk_sizes: list[int], rounds: int, seed: int) -> list[list[str]]:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from celery_grousset import GroussetTask

    app = setup()
    rows: list[list[str]] = []
    keys, done = make_calls(n, seed)
    for r in range(rounds):
        processor = f"bench-pu-{uuid.uuid4().hex[:8]}"
        task = app.task(base=GroussetTask, shared=False, max_processing_time=60,
                        processor_id=processor, database="postgresql",
                        name=f"bench.pu.{processor}")(echo)  # fmt: skip
        t0 = time.perf_counter()
        seed_completed(task, processor, done)
        print(f"round {r + 1}: seeded {len(done)} completed rows in "
              f"{time.perf_counter() - t0:.1f}s", flush=True)  # fmt: skip
        queue = f"bench-pu-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        sent = publish_all(app, task, keys, queue)
        wall = time.perf_counter() - t0
        held = drop_queue(app, queue)
        rows.append(["publish all", "-", f"{wall:.2f}", f"{n / wall:,.0f}", f"{sent:,}",
                     f"{held:,}", "0"])  # fmt: skip
        for chunk in chunk_sizes:
            queue = f"bench-pu-{uuid.uuid4().hex[:8]}"
            calls: Iterator[Any] = (((k,), {}) for k in keys)
            with CaptureQueriesContext(connections["postgresql"]) as ctx:
                t0 = time.perf_counter()
                report = task.publish_unique(calls, chunk_size=chunk, queue=queue,
                                             ignore_result=True, keep_results=False)  # fmt: skip
                wall = time.perf_counter() - t0
            held = drop_queue(app, queue)
            rows.append(["publish_unique", f"{chunk}", f"{wall:.2f}", f"{n / wall:,.0f}",
                         f"{report.published:,}", f"{held:,}",
                         f"{len(ctx.captured_queries)}"])  # fmt: skip
            print(f"  chunk {chunk}: {report}", flush=True)
        print(f"round {r + 1} done", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.publish_unique",
                                description=__doc__.split("\n\n")[1])  # fmt: skip
    p.add_argument("--n", type=int, default=100_000, help="calls (default 100000)")
    p.add_argument("--chunk-sizes", default="1000,5000",
                   help="publish_unique chunk sizes, comma-separated (default 1000,5000)")
    p.add_argument("--rounds", type=int, default=1, help="rounds (default 1)")
    p.add_argument("--seed", type=int, default=8)
    args = p.parse_args(argv)
    chunks = [int(c) for c in args.chunk_sizes.split(",") if c.strip()]
    rows = run(args.n, chunks, args.rounds, args.seed)
    headers = ["variant", "chunk", "wall s", "calls/s", "published", "in Redis",
               "journal queries"]  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print()
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    base = float(rows[0][2])
    for row in rows[1:]:
        print(f"publish_unique chunk {row[1]}: {base / float(row[2]):.2f}x the rate of "
              f"publishing everything (wall {row[2]} s vs {rows[0][2]} s)")  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak:.0f} MB (the call list itself is held in memory)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
