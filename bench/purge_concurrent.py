"""Purge a large expired journal while claims keep arriving (PostgreSQL).

    .venv/bin/python -m bench.purge_concurrent --rows 1000000

Fills the ``postgresql`` journal (``tests.settings``, database
``GROUSSET_TEST_PG_NAME``) with ``--rows`` expired, completed rows in one
``INSERT … SELECT generate_series``; then runs ``purge_expired(batch_size=10000)``
while a thread claims and completes new fingerprints through the claim store as
fast as it can. Reports the purge rate, the longest batch, and the claim latency
(p50 / p99 / max): the check is that no claim waited longer than one batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILL = """
INSERT INTO celery_grousset_outcome (processor_id, fingerprint, task_name, task_id, status,
    fence, claim_token, started_at, completed_at, expires_on, deliveries, takeovers, result,
    result_encoding, error, worker, args_repr, stale_at)
SELECT 'old', md5(i::text) || md5((i + 1)::text), 'app.tasks.t', 'task-' || i, 'completed',
       1, md5('t' || i::text), now() - interval '8 days', now() - interval '8 days',
       now() - interval '1 day', 1, 0, NULL, 'grousset/not-memoized', '', 'w', '', now()
FROM generate_series(1, %s) AS i
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from celery_grousset.claim import ClaimRequest
    from celery_grousset.store import Completion, get_store

    call_command("migrate", database="postgresql", verbosity=0, interactive=False)
    with connections["postgresql"].cursor() as cur:
        cur.execute("TRUNCATE celery_grousset_outcome")
        cur.execute(FILL, [args.rows])
    connections["postgresql"].close()
    with connections["postgresql"].cursor() as cur:
        cur.execute("VACUUM ANALYZE celery_grousset_outcome")

    store = get_store("postgresql")
    latencies: list[float] = []
    done = threading.Event()

    def claimer() -> None:
        while not done.is_set():
            fp = uuid.uuid4().hex * 2
            req = ClaimRequest("live", fp, "app.tasks.live", "t", uuid.uuid4().hex, "w", "",
                               60.0, 3600.0, 3)  # fmt: skip
            t0 = time.perf_counter()
            store.claim(req)
            latencies.append(time.perf_counter() - t0)
            store.finish(
                "live", fp, req.token, Completion("completed", b"1", "application/json;utf-8")
            )

    batches: list[float] = []
    last = [time.perf_counter()]

    def progress(total: int) -> None:
        now = time.perf_counter()
        batches.append(now - last[0])
        last[0] = now

    thread = threading.Thread(target=claimer, daemon=True)
    thread.start()
    time.sleep(0.5)
    started = time.perf_counter()
    from celery_grousset import journal

    deleted = journal.purge_expired(
        "postgresql", batch_size=args.batch_size, progress=progress
    )
    elapsed = time.perf_counter() - started
    done.set()
    thread.join(10)
    lat = sorted(latencies)
    p99 = lat[int(len(lat) * 0.99) - 1] if lat else 0.0
    longest = max(batches) if batches else 0.0
    print(f"purged {deleted:,} rows in {elapsed:.2f} s = {deleted / elapsed:,.0f} rows/s "
          f"(batch {args.batch_size:,}; longest batch {longest * 1000:.0f} ms)")  # fmt: skip
    print(f"concurrent claims: {len(lat):,}; p50 {statistics.median(lat) * 1000:.2f} ms, "
          f"p99 {p99 * 1000:.2f} ms, max {lat[-1] * 1000:.2f} ms")  # fmt: skip
    ok = bool(lat) and lat[-1] <= longest
    print("no claim waited longer than one batch:", "yes" if ok else "NO")
    return 0 if ok and deleted == args.rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
