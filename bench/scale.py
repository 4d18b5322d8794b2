"""Scenario ``scale``: claim latency as the journal grows; purge rate and memory.

PostgreSQL. The journal is filled with completed rows (random-looking
fingerprints, the same processor id as the claims) by one
``INSERT … SELECT generate_series`` statement per step, then ``VACUUM ANALYZE``.
At each size, ``samples`` claims of new fingerprints are timed one by one (each
followed by its completion, not timed). Then ``purge_rows`` expired rows are
purged by ``purge_expired(batch_size=10000)`` in a fresh process whose peak RSS
is read from ``getrusage``.
Targets: p99 at 10M within 1.5 x p99 empty; purge >= 100,000 rows/s; peak RSS < 150 MB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

from bench import harness, report

ALIAS = "postgresql"
PROCESSOR = "bench-scale"
FILL = """
INSERT INTO celery_grousset_outcome (processor_id, fingerprint, task_name, task_id, status,
    fence, claim_token, started_at, completed_at, expires_on, deliveries, takeovers, result,
    result_encoding, error, worker, args_repr, stale_at)
SELECT %(p)s, encode(sha256(('fill-' || %(salt)s || g)::bytea), 'hex'), 'bench.grousset',
    'fill-' || g, 'completed', 1, md5(g::text), now() - interval '2 hours',
    now() - interval '2 hours', now() + %(expires)s * interval '1 second', 1, 0,
    '"ok"'::bytea, 'application/json;utf-8', '', 'bench:1', '(''k'',)', now()
FROM generate_series(%(lo)s, %(hi)s) AS g
"""


def fill(lo: int, hi: int, expires_in: float, salt: str) -> float:
    """Add rows ``lo..hi`` in one statement; returns seconds."""
    from django.db import connections

    t0 = time.perf_counter()
    conn = connections[ALIAS]
    with conn.cursor() as cur:
        cur.execute(FILL, {"p": PROCESSOR, "salt": salt, "expires": expires_in, "lo": lo,
                           "hi": hi})  # fmt: skip
        cur.execute(f"VACUUM ANALYZE {harness.JOURNAL}")
    return time.perf_counter() - t0


def claim_latencies(samples: int) -> list[float]:
    from celery_grousset.claim import ClaimRequest, Kind
    from celery_grousset.store import Completion, get_store

    store = get_store(ALIAS)
    done = Completion("completed", b'"ok"', "application/json;utf-8")
    salt = uuid.uuid4().hex
    times = []
    for i in range(samples + 50):
        from bench.store_micro import fp

        req = ClaimRequest(
            processor_id=PROCESSOR, fingerprint=fp(salt, i), task_name="bench.grousset",
            task_id=uuid.uuid4().hex, token=uuid.uuid4().hex, worker="bench:1",
            args_repr="('k',)", max_processing_time=60.0, expires_after=3600.0,
            max_takeovers=3,
        )  # fmt: skip
        t0 = time.perf_counter()
        res = store.claim(req)
        elapsed = time.perf_counter() - t0
        assert res.kind is Kind.NEW
        store.finish(PROCESSOR, req.fingerprint, req.token, done)
        if i >= 50:  # the first 50 warm up the connection and the prepared statement
            times.append(elapsed)
    return sorted(times)


def pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def purge(rows: int) -> dict[str, float]:
    harness.truncate(ALIAS)
    fill(1, rows, -86400.0, uuid.uuid4().hex[:6])
    out = subprocess.run(
        [sys.executable, "-m", "bench.purge_child", ALIAS, "10000"], cwd=harness.ROOT,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    data: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def run(sizes: list[int], purge_rows: int, samples: int, record: bool) -> dict[str, object]:
    harness.setup_django()
    harness.truncate(ALIAS)
    salt = uuid.uuid4().hex[:6]
    points: list[tuple[int, float, float]] = []
    have = 0
    for target in [0, *sizes]:
        if target > have:
            seconds = fill(have + 1, target, 7 * 86400.0, salt)
            harness.log(f"scale: filled to {target:,} rows in {seconds:.1f}s")
            have = target
        lat = claim_latencies(samples)
        points.append((target, pct(lat, 0.50), pct(lat, 0.99)))
        harness.log(f"scale: {target:>11,} rows: claim p50 {points[-1][1] * 1e3:.3f} ms, "
                    f"p99 {points[-1][2] * 1e3:.3f} ms")  # fmt: skip
    p = purge(purge_rows)
    rate = p["deleted"] / p["seconds"]
    harness.log(f"scale: purged {p['deleted']:,} rows in {p['seconds']:.1f}s "
                f"({rate:,.0f} rows/s), peak RSS {p['rss_peak_mb']:.0f} MB")  # fmt: skip
    harness.truncate(ALIAS)
    base_p99 = points[0][2]
    rows = [[f"{n:,}", f"{p50 * 1e3:.3f}", f"{p99 * 1e3:.3f}", f"{p99 / base_p99:.2f}x"]
            for n, p50, p99 in points]  # fmt: skip
    last = points[-1]
    notes = [
        f"p99 at {last[0]:,} rows = {last[2] / base_p99:.2f}x p99 empty (target <= 1.5x): "
        f"{'met' if last[2] / base_p99 <= 1.5 else 'NOT met'}",
        f"purge_expired(batch_size=10000): {int(p['deleted']):,} rows in {p['seconds']:.2f} s = "
        f"{rate:,.0f} rows/s (target >= 100,000): {'met' if rate >= 100_000 else 'NOT met'}",
        f"purge process RSS: {p['rss_before_mb']:.0f} MB after django.setup(), peak "
        f"{p['rss_peak_mb']:.0f} MB (target < 150 MB): "
        f"{'met' if p['rss_peak_mb'] < 150 else 'NOT met'}",
    ]
    plot = report.line_plot(
        "scale", [n for n, _, _ in points],
        {"claim p50 (ms)": [x[1] * 1e3 for x in points],
         "claim p99 (ms)": [x[2] * 1e3 for x in points]},
        "rows in the journal", "ms",
        f"Claim latency vs journal size (PostgreSQL, {samples} claims per point); "
        f"purge {rate:,.0f} rows/s",
    )  # fmt: skip
    headers = ["rows in journal", "claim p50 ms", "claim p99 ms", "p99 vs empty"]
    params = {"sizes": ", ".join(f"{s:,}" for s in sizes), "claims per size": samples,
              "purged rows": f"{purge_rows:,}"}  # fmt: skip
    report.emit("scale", params, headers, rows, plot, record, notes)
    return {"points": points, "purge": p}
