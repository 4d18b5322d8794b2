"""The journal at scale: the single table vs the partitioned PROTOTYPE (docs/scale.md).

    BENCH_PG_NAME=grousset_scale .venv/bin/python -m bench.scale_layouts \\
        --layout single --sizes 10000000,50000000

One layout per run, on a scratch database (``BENCH_PG_NAME``; the journal there is
emptied and refilled). Rows are the product's rows (one processor, 40 task names,
completed, 7-day retention) spread over 9 days of claims: days 0 and 1 are expired,
days 2-8 live; on the partitioned layout each day is one generation (partition). Each
step loads with the indexes dropped (``INSERT … SELECT generate_series``), then builds
them. At every size: claim, claim + complete, duplicate claim of a fresh key and of a
5-day-old key (p50/p99 of ``--samples``, through the store). At the largest size:
retention of day 0 alone, then of day 1 with claims running (single: the product's
batched ``purge_expired``; partitioned: ``DETACH … CONCURRENTLY`` + ``DROP``): seconds,
WAL bytes (``pg_current_wal_lsn`` difference; the server's WAL is shared, so the
background rate measured just before is given too), sizes and dead rows after.
Writes ``bench/.work/scale-<layout>.json``; ``--report`` appends both to RESULTS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import threading
import time
import uuid
from typing import Any

from bench import harness
from bench import partition_proto as proto

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


def fill_fp(salt: str, g: int) -> str:
    return hashlib.sha256(f"fill-{salt}{g}".encode()).hexdigest()


def renice(pid: int) -> None:
    subprocess.run(["renice", "-n", "10", "-p", str(pid)], capture_output=True, check=False)


def django_cursor() -> Any:
    from django.db import connections

    cur = connections[ALIAS].cursor()
    cur.execute("SELECT pg_backend_pid()")
    renice(int(cur.fetchone()[0]))
    cur.execute("SET maintenance_work_mem = '512MB'")
    return cur


def load(state: dict[str, Any], hi: int, chunk: int = 1_000_000) -> dict[str, float]:
    """Grow the journal to ``hi`` rows: drop the indexes, fill in committed chunks (a
    re-run resumes after the last one: the server here is restarted by others' tests),
    rebuild the indexes, analyze."""
    from django.db import transaction

    part = state["layout"] == "partitioned"
    schema = state.get("schema", "public")
    cur = django_cursor()
    cur.execute(f"SET search_path = {schema}, public")
    cur.execute("CREATE TABLE IF NOT EXISTS public.bench_scale_progress (layout text PRIMARY KEY,"
                " rows bigint NOT NULL)")  # fmt: skip
    cur.execute("SELECT rows FROM public.bench_scale_progress WHERE layout = %s", [schema])
    have = (cur.fetchone() or [0])[0]
    sql = FILL.format(gcol=", gen" if part else "",
                      gval=f", {BASE_GEN} + g %% 9" if part else "")  # fmt: skip
    t0 = time.perf_counter()
    if have < hi:
        proto.drop_indexes(cur, schema)
    while have < hi:
        top = min(hi, have + chunk)
        with transaction.atomic(using=ALIAS):
            cur.execute(sql, {"p": PROCESSOR, "salt": state["salt"], "lo": have + 1, "hi": top,
                              "t0": state["t0"]})  # fmt: skip
            cur.execute("INSERT INTO public.bench_scale_progress VALUES (%s, %s) ON CONFLICT"
                        " (layout) DO UPDATE SET rows = EXCLUDED.rows", [schema, top])  # fmt: skip
        have = top
    t1 = time.perf_counter()
    cur.execute("SELECT count(*) FROM pg_indexes WHERE schemaname = %s AND indexname = ANY(%s)",
                [schema, proto.index_names()])  # fmt: skip
    if cur.fetchone()[0] < len(proto.index_names()):
        proto.drop_indexes(cur, schema)
        proto.create_indexes(cur, part)
    t2 = time.perf_counter()
    cur.execute(f"VACUUM ANALYZE {proto.TABLE}")
    t3 = time.perf_counter()
    cur.execute("SET search_path = public")
    n = hi - state["rows"]
    state["rows"] = hi
    return {"rows": n, "insert_s": t1 - t0, "index_s": t2 - t1, "vacuum_s": t3 - t2,
            "insert_rows_per_s": n / max(t1 - t0, 1e-9)} | sizes(schema)  # fmt: skip


def sizes(schema: str = "public") -> dict[str, float]:
    from django.db import connections

    with connections[ALIAS].cursor() as cur:
        cur.execute(
            "SELECT coalesce(sum(pg_table_size(c.oid)), 0),"
            " coalesce(sum(pg_indexes_size(c.oid)), 0), coalesce(sum(s.n_dead_tup), 0),"
            " coalesce(sum(s.n_live_tup), 0) FROM pg_class c"
            " LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid"
            " WHERE c.relname ~ '^celery_grousset_outcome(_g[0-9]+)?$' AND c.relkind = 'r'"
            " AND c.relnamespace = %s::regnamespace",
            [schema],
        )
        heap, idx, dead, live = cur.fetchone()
        cur.execute("SELECT pg_database_size(current_database())")
        db = cur.fetchone()[0]
    return {"heap_bytes": int(heap), "index_bytes": int(idx), "dead_rows": int(dead),
            "live_rows": int(live), "db_bytes": db}  # fmt: skip


def new_store(layout: str, schema: str | None = None) -> Any:
    from celery_grousset.store import get_store

    base = get_store(ALIAS)
    if layout == "single":
        return base
    settings = dict(base.settings_dict)
    if schema:
        settings["OPTIONS"] = {**settings.get("OPTIONS", {}),
                               "options": f"-c search_path={schema},public"}  # fmt: skip
    store = proto.ProtoStore(ALIAS, settings, base.timeout, base.claim_commit)
    store.cur_gen = TODAY
    return store


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
            old = fill_fp(state["salt"], 9 * (day - i * 997 % day) + 3) if day > 0 else None
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


def retire(layout: str, day: int, t0: str, schema: str = "public") -> dict[str, Any]:
    """Retention of one day (in this thread, its own connection)."""
    from django.db import connections

    from celery_grousset import journal

    lsn = wal_lsn()
    start = time.perf_counter()
    if layout == "single":
        import datetime as dt

        cutoff = (
            dt.datetime.fromisoformat(t0)
            - dt.timedelta(days=1 - day)
            - dt.timedelta(microseconds=1)
        )
        n = journal.purge_expired(ALIAS, batch_size=10_000, before=cutoff)
    else:
        with connections[ALIAS].cursor() as cur:
            cur.execute(f"SET search_path = {schema}, public")
            cur.execute(f"SELECT count(*) FROM {proto.TABLE}_g{BASE_GEN + day}")
            n = cur.fetchone()[0]
            # in-flight rows must not be dropped: a scan of the partition finds them
            t = time.perf_counter()
            cur.execute(f"SELECT count(*) FROM {proto.TABLE}_g{BASE_GEN + day} "
                        "WHERE status = 'in_flight'")  # fmt: skip
            inflight = (cur.fetchone()[0], time.perf_counter() - t)
            lsn = wal_lsn()
            start = time.perf_counter()
            proto.drop_partition(cur, BASE_GEN + day)
    seconds = time.perf_counter() - start
    out = {"day": day, "rows": n, "seconds": seconds, "wal_bytes": wal_since(lsn)}
    if layout != "single":
        out["in_flight_rows"], out["in_flight_scan_s"] = inflight
    connections[ALIAS].close()
    return out


def retention(store: Any, layout: str, t0: str, samples: int) -> dict[str, Any]:
    lsn = wal_lsn()
    time.sleep(10)
    background = wal_since(lsn) / 10
    alone = retire(layout, 0, t0) | sizes()
    idle = latencies(store, {"rows": 0}, samples)["claim"]
    during = claims_during(store, lambda: retire(layout, 1, t0))
    return {"background_wal_bytes_per_s": background, "day0": alone,
            "day1_with_claims": during | sizes(), "claim_idle": idle}  # fmt: skip


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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layout", choices=("single", "partitioned"), required=True)
    p.add_argument("--sizes", default="10000000,50000000")
    p.add_argument("--samples", type=int, default=2000)
    args = p.parse_args(argv)
    harness.setup_django()
    fresh_database()
    harness.truncate(ALIAS)
    from django.db import connections

    with connections[ALIAS].cursor() as cur:
        cur.execute("SELECT now()::text")
        t0 = cur.fetchone()[0]
        if args.layout == "partitioned":
            proto.convert(cur, range(BASE_GEN, TODAY + 2))
            proto.create_indexes(cur, True)
    state: dict[str, Any] = {"layout": args.layout, "rows": 0, "salt": uuid.uuid4().hex[:6],
                             "t0": t0}  # fmt: skip
    store = new_store(args.layout)
    result: dict[str, Any] = {"layout": args.layout, "commit": commit(), "points": []}
    for size in [0, *(int(float(s)) for s in args.sizes.split(","))]:
        point: dict[str, Any] = {"rows": size}
        if size:
            point["load"] = load(state, size)
            harness.log(f"{args.layout}: loaded {size:,}: {point['load']}")
        point |= latencies(store, state, args.samples)
        harness.log(f"{args.layout}: {size:,} rows: {json.dumps(point, default=str)}")
        result["points"].append(point)
        save(result)
    renice(store._conn.info.backend_pid)
    result["retention"] = retention(store, args.layout, t0, args.samples)
    harness.log(f"{args.layout}: retention {json.dumps(result['retention'], default=str)}")
    save(result)


def fresh_database(alias: str = ALIAS) -> None:
    """Drop and re-create the scratch database (never one the tests use)."""
    import psycopg
    from django.db import connections

    name = connections.settings[alias]["NAME"]
    if "scale" not in name:
        raise SystemExit(f"BENCH_PG_NAME={name!r}: use a scratch database named *scale*")
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres",
                         autocommit=True) as c:  # fmt: skip
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, cwd=harness.ROOT, check=False)  # fmt: skip
    return out.stdout.strip()


def save(result: dict[str, Any]) -> None:
    harness.WORK.mkdir(parents=True, exist_ok=True)
    path = harness.WORK / f"scale-{result['layout']}.json"
    path.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
