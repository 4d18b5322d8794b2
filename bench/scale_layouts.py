"""What the journal-at-scale benches share (``bench.scale_ab``, ``bench.scale_wal``,
``bench.partition_race``; docs/scale.md): the fill, the claim requests, latency samples
taken in turns, claims during a retention, WAL positions, the scratch database.

Rows are the product's rows (one processor, 40 task names, completed, 7-day retention)
spread over 9 days of claims: days 0 and 1 are expired, days 2-8 live. At every size:
claim, claim + complete, duplicate claim of a fresh key and of a 5-day-old key (p50/p99
of the samples, through the store, the stores taking turns).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench import harness

ALIAS = "postgresql"
PROCESSOR = "bench-scale"
DAYS = 9
BASE_GEN = 1000
TODAY = BASE_GEN + DAYS - 1
FILL = """
INSERT INTO celery_grousset_outcome (processor_id, fingerprint, task_name, task_id, status,
    fence, claim_token, started_at, completed_at, expires_on, deliveries, takeovers, result,
    result_encoding, error, worker, args_repr, stale_at{gcol})
SELECT %(p)s, encode(sha256(('fill-' || %(salt)s || g)::bytea), 'hex'),
    'bench.task_' || (g %% 40), 'fill-' || g, 'completed', 1, md5(g::text), s.t,
    s.t + interval '1 second', s.t + interval '7 days', 1, 0, '"ok"'::bytea,
    'application/json;utf-8', '', 'bench:1', '(''k'',)', s.t + interval '60 seconds'{gval}
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g,
LATERAL (SELECT %(t0)s::timestamptz - (9 - g %% 9) * interval '1 day'
    + (g * 7919 %% 86400) * interval '1 second' AS t) AS s
"""

#: FILL restricted to some days (``%(days)s``, of 0-8): ``lo..hi`` rows into each of them
FILL_DAYS = FILL.replace(
    "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g,",
    "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g0, "
    "LATERAL (SELECT g0 * 9 + d AS g FROM unnest(%(days)s::int[]) AS v(d)) AS gg,",
)


def fill_days(cur: Any, alias: str, state: dict[str, Any], days: list[int], per_day: int) -> None:
    """``per_day`` rows into each of ``days`` of the partitioned journal (``state``:
    ``salt``, ``t0``, ``first_gen``), in committed chunks of 500,000."""
    from django.db import transaction

    sql = FILL_DAYS.format(gcol=", gen", gval=f", {state['first_gen']} + g %% 9")
    for lo in range(0, per_day, 500_000):
        with transaction.atomic(using=alias):
            cur.execute(sql, {"p": PROCESSOR, "salt": state["salt"], "lo": lo, "days": days,
                              "hi": min(per_day, lo + 500_000) - 1, "t0": state["t0"]})  # fmt: skip


def refill_expired(cur: Any, alias: str, state: dict[str, Any], per_day: int) -> None:
    """Days 0 and 1 (the expired ones) of the partitioned journal again, after a
    retention dropped them: their generations re-created, filled, analysed."""
    from celery_grousset.store import pgpartops

    first = state["first_gen"]
    for gen in (first, first + 1):
        pgpartops.add_generation(cur, gen)
    fill_days(cur, alias, state, [0, 1], per_day)
    for gen in (first, first + 1):
        cur.execute(f"VACUUM ANALYZE celery_grousset_outcome_g{gen}")


def fill_fp(salt: str, g: int) -> str:
    return hashlib.sha256(f"fill-{salt}{g}".encode()).hexdigest()


def renice(pid: int) -> None:
    subprocess.run(["renice", "-n", "10", "-p", str(pid)], capture_output=True, check=False)


def request(fingerprint: str) -> Any:
    from celery_grousset.claim import ClaimRequest

    return ClaimRequest(
        processor_id=PROCESSOR, fingerprint=fingerprint, task_name="bench.grousset",
        task_id=uuid.uuid4().hex, token=uuid.uuid4().hex, worker="bench:1",
        args_repr="('k',)", max_processing_time=60.0, expires_after=7 * 86400.0,
        max_takeovers=3,
    )  # fmt: skip


def stats(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {"n": len(v), "p50_ms": v[len(v) // 2] * 1e3, "p99_ms": v[int(len(v) * 0.99)] * 1e3}


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def latencies(store: Any, state: dict[str, Any], samples: int) -> dict[str, Any]:
    return interleaved([store], state, samples)[0]


def interleaved(stores: list[Any], state: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    """Claim, claim + complete and duplicate claims (a fresh key; a 5-day-old key) on
    each store, the stores taking turns sample by sample (the order alternates)."""
    times: list[dict[str, list[float]]] = [
        {"claim": [], "claim_complete": [], "duplicate": [], "duplicate_old_row": []}
        for _ in stores
    ]
    salt = uuid.uuid4().hex
    day = state["rows"] // 9 - 1
    for i in range(samples + 50):
        order = list(enumerate(stores))
        for k, store in order if i % 2 else order[::-1]:
            key = hashlib.sha256(f"{salt}-{i}".encode()).hexdigest()
            # a row of day 3 (g % 9 == 3): five days old, live; on the partitioned layout
            # the first touch moves the row into today's generation
            # (``shift``: another run on the same fill touches other rows)
            g = 9 * (day - (i * 997 + state.get("shift", 0)) % day) + 3
            old = fill_fp(state["salt"], g) if day > 0 else None
            sample = one_sample(store, key, old)
            if i >= 50:  # the first 50 warm up the connection and the prepared statements
                for name, value in sample.items():
                    times[k][name].append(value)
    return [{name: stats(v) for name, v in t.items() if v} for t in times]


def one_sample(store: Any, key: str, old: str | None) -> dict[str, float]:
    from celery_grousset.claim import Kind
    from celery_grousset.store import Completion

    req = request(key)
    t0 = time.perf_counter()
    assert store.claim(req).kind is Kind.NEW
    t1 = time.perf_counter()
    assert store.finish(
        PROCESSOR, key, req.token, Completion("completed", b'"ok"', "application/json;utf-8")
    )
    t2 = time.perf_counter()
    assert store.claim(request(key)).kind is Kind.COMPLETED
    out = {"claim": t1 - t0, "claim_complete": t2 - t0, "duplicate": time.perf_counter() - t2}
    if old is not None:
        t3 = time.perf_counter()
        res = store.claim(request(old))
        out["duplicate_old_row"] = time.perf_counter() - t3
        assert res.kind is Kind.COMPLETED, (old, res)
    return out


def wal_lsn() -> str:
    from django.db import connections

    with connections[ALIAS].cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()")
        return str(cur.fetchone()[0])


def wal_since(lsn: str) -> int:
    from django.db import connections

    with connections[ALIAS].cursor() as cur:
        cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [lsn])
        return int(cur.fetchone()[0])


def claims_during(store: Any, job: Any) -> dict[str, Any]:
    """Run ``job`` in a thread and claim + complete new keys on ``store`` meanwhile;
    only the claims that started while it ran are counted."""
    from celery_grousset.store import Completion

    box: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.update(job()))
    done = Completion("completed", b'"ok"', "application/json;utf-8")
    during: list[float] = []
    worker.start()
    salt = uuid.uuid4().hex
    while worker.is_alive():
        req = request(hashlib.sha256(f"{salt}-{len(during)}".encode()).hexdigest())
        during.append(timed(lambda r=req: store.claim(r)))
        store.finish(PROCESSOR, req.fingerprint, req.token, done)
    worker.join()
    return box | {"claim_during": stats(during or [float("nan")])}


def statement_timer(steps: list[list[Any]], base: float) -> Any:
    """A Django ``execute_wrapper`` that appends ``[statement, start, seconds]`` (the
    statement's first 90 characters, its start in seconds from ``base``) to ``steps``."""

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            end = time.perf_counter()
            steps.append([" ".join(sql.split())[:90], start - base, end - start])

    return wrapper


def fresh_database(alias: str = ALIAS) -> None:
    """Drop and re-create the scratch database (never one the tests use)."""
    import psycopg
    from django.db import connections

    conf = connections.settings[alias]
    name = conf["NAME"]
    if "scale" not in name:
        raise SystemExit(f"BENCH_PG_NAME={name!r}: use a scratch database named *scale*")
    with psycopg.connect(host=conf["HOST"], port=conf["PORT"], user=conf["USER"],
                         dbname="postgres", autocommit=True) as c:  # fmt: skip
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, cwd=harness.ROOT, check=False)  # fmt: skip
    return out.stdout.strip()


def save(result: dict[str, Any], path: Path | None = None) -> None:
    """``result`` as JSON, by default to ``bench/.work/scale-<layout>.json``."""
    path = path or harness.WORK / f"scale-{result['layout']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
