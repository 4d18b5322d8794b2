"""A batch of claims (``Store.claim_all``, the worker's main-process claim) on both
PostgreSQL journal layouts, against the same claims sent one by one.

    .venv/bin/python -m bench.claim_batch --sizes 10,100 --rounds 30

The bench's PostgreSQL journal (alias ``postgresql``) and the partitioned one (alias
``pgpart``, converted here once if it is not: one generation a day; not emptied, every
key is new). Each round claims a batch of new keys on each (journal, way) in turn, the order
alternating: ``claim_all`` (one statement, one commit) and ``claim`` per request (one
each). Reports the median milliseconds per claim, and per batch.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

from bench import harness, report, scale_ab
from bench.scale_ab import LAYOUTS


def stores() -> dict[str, Any]:
    """The single table's store and the partitioned journal's (converted if needed: a
    journal of up to ``pgpartops.MAX_COPY_ROWS`` rows)."""
    from django.db import connections

    from celery_grousset.store import pgpartconvert

    for alias in LAYOUTS.values():
        harness.prepare_database(alias)
    with connections["pgpart"].cursor() as cur:
        cur.execute("SELECT to_regproc('grousset_claim') IS NOT NULL")
        converted = bool(cur.fetchone()[0])
    if not converted:
        pgpartconvert.convert("pgpart", seconds=86400)
    return dict(zip(LAYOUTS, scale_ab.stores(), strict=True))


def batch(size: int) -> list[Any]:
    from celery_grousset.claim import ClaimRequest

    return [
        ClaimRequest("bench-batch", uuid.uuid4().hex * 2, "bench.batch", uuid.uuid4().hex,
                     uuid.uuid4().hex, "w:1", "()", 60.0, 3600.0, 3)
        for _ in range(size)
    ]  # fmt: skip


def run(sizes: list[int], rounds: int) -> dict[tuple[str, str, int], list[float]]:
    """Seconds per batch for each (layout, way, size), the variants in turns."""
    both = stores()
    ways = {"batch": lambda s, reqs: s.claim_all(reqs),
            "one by one": lambda s, reqs: [s.claim(r) for r in reqs]}  # fmt: skip
    variants = [(layout, way) for layout in both for way in ways]
    times: dict[tuple[str, str, int], list[float]] = {}
    for size in sizes:
        for i in range(rounds + 3):  # 3 to warm up (connect, prepare)
            for layout, way in variants if i % 2 else variants[::-1]:
                reqs = batch(size)
                t0 = time.perf_counter()
                results = ways[way](both[layout], reqs)
                seconds = time.perf_counter() - t0
                if not all(r.owned for r in results):
                    raise SystemExit(f"{layout} {way}: a new key was not owned")
                if i >= 3:
                    times.setdefault((layout, way, size), []).append(seconds)
    return times


def main(argv: list[str] | None = None) -> list[list[Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10,100")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    args = p.parse_args(argv)
    harness.setup_django()
    times = run([int(s) for s in args.sizes.split(",")], args.rounds)
    rows = []
    for (layout, way, size), values in times.items():
        med = statistics.median(values)
        alone = statistics.median(times[(layout, "one by one", size)])
        rows.append([layout, size, way, f"{1000 * med / size:.3f}", f"{1000 * med:.1f}",
                     f"{med / alone:.2f}x"])  # fmt: skip
    report.emit(
        "claim-batch (claim_all on both PostgreSQL layouts vs one by one)",
        {"rounds": args.rounds, "sizes": args.sizes},
        ["layout", "batch size", "sent", "ms per claim (median)", "ms per batch",
         "vs one by one"],
        rows, None, args.record,
    )  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
