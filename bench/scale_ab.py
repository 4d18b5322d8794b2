"""The product's two journal layouts side by side in one run (docs/scale.md).

    BENCH_PG_NAME=grousset_scale .venv/bin/python -m bench.scale_ab --sizes 10000000,50000000

The single table (alias ``postgresql``, database ``$BENCH_PG_NAME``) and the
partitioned layout (alias ``pgpart``, database ``${BENCH_PG_NAME}_part``, converted by
the product's ``grousset_partition convert`` code, one generation a day) are filled with
the same rows (scale_layouts.FILL: completed, 7-day retention, spread over 9 days of
claims: days 0-1 expired, 2-8 live; on the partitioned layout day *d* is generation
``today - 9 + d``). The two fills run at once (one thread, one server backend each);
each loads with the journal's indexes dropped and builds them after. Claims then
alternate between the layouts sample by sample, through the product's stores
(``PostgresStore``, ``PartitionedStore``), so machine load hits both alike. At the
largest size: retention of day 0 alone, then of day 1 with claims running, each by the
store's ``purge_expired`` (single: batched ``DELETE``; partitioned: the product's
``retire``): seconds, server WAL bytes, sizes after, claim p99 idle and during. Writes
``bench/.work/scale-ab.json`` (``--resume`` continues it); ``--record`` appends the
tables and plots to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import threading
import time
import uuid
from typing import Any

from bench import harness
from bench import scale_layouts as sl

LAYOUTS = {"single": "postgresql", "partitioned": "pgpart"}
DAY = 86400


def cursor(alias: str) -> Any:
    from django.db import connections

    cur = connections[alias].cursor()
    cur.execute("SELECT pg_backend_pid()")
    sl.renice(int(cur.fetchone()[0]))
    cur.execute("SET maintenance_work_mem = '512MB'")
    return cur


def index_ddl(alias: str) -> dict[str, list[list[str]]]:
    """The journal's unique constraints (but the primary key) and plain indexes: what a
    load drops and builds again."""
    with cursor(alias) as cur:
        cur.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE "
                    "conrelid = 'celery_grousset_outcome'::regclass AND contype = 'u'")  # fmt: skip
        uniques = [list(r) for r in cur.fetchall()]
        cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
                    "AND tablename = 'celery_grousset_outcome' AND indexname NOT IN (SELECT "
                    "conname FROM pg_constraint WHERE conrelid = "
                    "'celery_grousset_outcome'::regclass)")  # fmt: skip
        return {"unique": uniques, "index": [list(r) for r in cur.fetchall()]}


def load(alias: str, ddl: dict[str, list[list[str]]], state: dict[str, Any], hi: int,
         chunk: int = 1_000_000) -> dict[str, float]:  # fmt: skip
    """Grow the journal of ``alias`` to ``hi`` rows (committed chunks, resumable)."""
    from django.db import connections, transaction

    cur = cursor(alias)
    cur.execute("CREATE TABLE IF NOT EXISTS bench_scale_progress (rows bigint NOT NULL)")
    cur.execute("SELECT coalesce(max(rows), 0) FROM bench_scale_progress")
    have = start = cur.fetchone()[0]
    gen = state.get("first_gen")
    sql = sl.FILL.format(gcol=", gen" if gen else "", gval=f", {gen} + g %% 9" if gen else "")
    t0 = time.perf_counter()
    if have < hi:
        drop_indexes(cur, ddl)
    while have < hi:
        top = min(hi, have + chunk)
        with transaction.atomic(using=alias):
            cur.execute(sql, {"p": sl.PROCESSOR, "salt": state["salt"], "lo": have + 1,
                              "hi": top, "t0": state["t0"]})  # fmt: skip
            cur.execute("DELETE FROM bench_scale_progress")
            cur.execute("INSERT INTO bench_scale_progress VALUES (%s)", [top])
        have = top
    t1 = time.perf_counter()
    build_indexes(cur, ddl)
    t2 = time.perf_counter()
    cur.execute("VACUUM ANALYZE celery_grousset_outcome")
    t3 = time.perf_counter()
    cur.close()
    connections[alias].close()
    return {"rows": hi, "insert_s": t1 - t0, "index_s": t2 - t1, "vacuum_s": t3 - t2,
            "insert_rows_per_s": (hi - start) / max(t1 - t0, 1e-9)}  # fmt: skip


def drop_indexes(cur: Any, ddl: dict[str, list[list[str]]]) -> None:
    """Drop the journal's indexes of :func:`index_ddl` (a load goes faster without)."""
    for name, _ in ddl["unique"]:
        cur.execute(f"ALTER TABLE celery_grousset_outcome DROP CONSTRAINT IF EXISTS {name}")
    for name, _ in ddl["index"]:
        cur.execute(f"DROP INDEX IF EXISTS {name}")


def build_indexes(cur: Any, ddl: dict[str, list[list[str]]]) -> None:
    """Build the indexes of :func:`index_ddl` that are missing."""
    cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'celery_grousset_outcome'")
    present = {r[0] for r in cur.fetchall()}
    for name, definition in ddl["unique"]:
        if name not in present:
            cur.execute(f"ALTER TABLE celery_grousset_outcome ADD CONSTRAINT {name} {definition}")
    for name, definition in ddl["index"]:
        if name not in present:  # a partitioned index: on the partitions too
            cur.execute(definition.replace(" ON ONLY ", " ON ", 1))


def sizes(alias: str) -> dict[str, float]:
    from django.db import connections

    with connections[alias].cursor() as cur:
        cur.execute(
            "SELECT coalesce(sum(pg_table_size(c.oid)), 0),"
            " coalesce(sum(pg_indexes_size(c.oid)), 0), coalesce(sum(s.n_dead_tup), 0),"
            " coalesce(sum(s.n_live_tup), 0), count(*) FROM pg_class c"
            " LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid"
            " WHERE c.relname ~ '^celery_grousset_outcome(_g[0-9]+)?$' AND c.relkind = 'r'"
        )
        heap, idx, dead, live, tables = cur.fetchone()
        cur.execute("SELECT pg_database_size(current_database())")
        db = cur.fetchone()[0]
    return {"heap_bytes": int(heap), "index_bytes": int(idx), "dead_rows": int(dead),
            "live_rows": int(live), "tables": int(tables), "db_bytes": db}  # fmt: skip


def stores() -> list[Any]:
    from django.db import connections

    from celery_grousset.store import get_store
    from celery_grousset.store.pgpartition import PartitionedStore

    base = get_store("postgresql")
    part = PartitionedStore("pgpart", connections.settings["pgpart"], base.timeout,
                            base.claim_commit)  # fmt: skip
    return [base, part]


def prepare() -> dict[str, Any]:
    """Fresh scratch databases: the single table, and the partitioned one converted
    with one generation a day and the 9 past generations of the fill."""
    from django.db import connections

    from celery_grousset.store import pgpartconvert, pgpartops

    for alias in LAYOUTS.values():
        sl.fresh_database(alias)
        harness.truncate(alias)
    with connections["postgresql"].cursor() as cur:
        cur.execute("SELECT now()::text")
        t0 = cur.fetchone()[0]
    pgpartconvert.convert("pgpart", seconds=DAY)
    today = pgpartops.current_generation("pgpart")
    with connections["pgpart"].cursor() as cur:
        for gen in range(today - 9, today):
            pgpartops.add_generation(cur, gen)
    return {"t0": t0, "salt": uuid.uuid4().hex[:6], "first_gen": today - 9,
            "ddl": {layout: index_ddl(alias) for layout, alias in LAYOUTS.items()}}  # fmt: skip


def grow(result: dict[str, Any], size: int) -> list[dict[str, float]]:
    """Both layouts to ``size`` rows, at once (a thread each: own connections)."""
    out: dict[str, Any] = {}

    def one(layout: str) -> None:
        state = {"salt": result["salt"], "t0": result["t0"],
                 "first_gen": result["first_gen"] if layout == "partitioned" else None}  # fmt: skip
        out[layout] = load(LAYOUTS[layout], result["ddl"][layout], state, size)
        out[layout] |= sizes(LAYOUTS[layout])
        harness.log(f"ab: {layout} at {size:,}: {out[layout]}")

    threads = [threading.Thread(target=one, args=(layout,)) for layout in LAYOUTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if set(out) != set(LAYOUTS):
        raise SystemExit("a load failed (see above); re-run with --resume")
    return [out["single"], out["partitioned"]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="10000000,50000000")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--resume", action="store_true",
                   help="continue the run recorded in bench/.work/scale-ab.json")  # fmt: skip
    p.add_argument("--prewarm", action="store_true",
                   help="then read every index into the OS cache (pg_prewarm) and sample the "
                   "largest size again: the journal's indexes in memory")  # fmt: skip
    p.add_argument("--retention-again", action="store_true",
                   help="then fill days 0 and 1 of the partitioned journal again and measure "
                   "its retention once more (after a change to it)")  # fmt: skip
    p.add_argument("--record", action="store_true",
                   help="append the tables and plots to bench/RESULTS.md")  # fmt: skip
    args = p.parse_args(argv)
    harness.setup_django()
    path = harness.WORK / "scale-ab.json"
    if args.resume and path.exists():
        result: dict[str, Any] = json.loads(path.read_text())
    else:
        result = {"layout": "ab", "commit": sl.commit(), "points": [], **prepare()}
        sl.save(result)
    both = stores()
    done = {point["rows"] for point in result["points"]}
    for size in [0, *(int(float(s)) for s in args.sizes.split(","))]:
        if size in done:
            continue
        point: dict[str, Any] = {"rows": size}
        if size:
            point["load"] = grow(result, size)
        point["single"], point["partitioned"] = sl.interleaved(
            both, {"rows": size, "salt": result["salt"]}, args.samples
        )
        harness.log(f"ab: {size:,} rows: {json.dumps(point, default=str)}")
        result["points"].append(point)
        sl.save(result)
    if "retention" not in result:
        result["retention"] = retention(both, result["t0"], args.samples)
        harness.log(f"ab: retention {json.dumps(result['retention'], default=str)}")
        sl.save(result)
    if args.prewarm and "warm" not in result:
        result["warm"] = warm(both, result)
        harness.log(f"ab: warm {json.dumps(result['warm'], default=str)}")
        sl.save(result)
    if args.retention_again and "retention_again" not in result:
        result["retention_again"] = retention_again(both[1], result)
        harness.log(f"ab: retention again {json.dumps(result['retention_again'], default=str)}")
        sl.save(result)
    if args.record:
        from bench import scale_report

        scale_report.record(result)
    return result


def warm(both: list[Any], result: dict[str, Any]) -> dict[str, Any]:
    """The latencies again after every index of both journals was read into the OS
    cache (``pg_prewarm(…, 'read')``; shared_buffers is far smaller): what memory for
    the indexes buys, at the size left after retention."""
    from django.db import connections

    read = {}
    for layout, alias in LAYOUTS.items():
        with connections[alias].cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
            cur.execute("SELECT sum(pg_prewarm(i.indexrelid, 'read')) FROM pg_index AS i "
                        "JOIN pg_class AS c ON c.oid = i.indrelid WHERE c.relname ~ "
                        "'^celery_grousset_outcome(_g[0-9]+)?$' AND c.relkind = 'r'")  # fmt: skip
            read[layout] = int(cur.fetchone()[0] or 0) * 8192
        connections[alias].close()
    rows = result["points"][-1]["rows"]
    state = {"rows": rows, "salt": result["salt"], "shift": 1_000_003}
    lat = sl.interleaved(both, state, 2000)
    return {"index_bytes_read": read, "single": lat[0], "partitioned": lat[1]}


def retention_again(store: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Days 0 and 1 of the partitioned journal filled again (their generations
    re-created; the indexes stay), then retention of each as in :func:`retention`."""
    from django.db import connections

    t0 = result["t0"]
    with cursor("pgpart") as cur:
        sl.refill_expired(cur, "pgpart", result, result["points"][-1]["rows"] // 9)
    connections["pgpart"].close()
    out: dict[str, Any] = {"day0": retire(store, "partitioned", 0, t0) | sizes("pgpart")}
    out["claim_idle"] = sl.interleaved([store], {"rows": 0}, 2000)[0]["claim"]
    during = sl.claims_during(store, lambda: retire(store, "partitioned", 1, t0))
    out["day1_with_claims"] = during | sizes("pgpart")
    return out


def retire(store: Any, layout: str, day: int, t0: str) -> dict[str, Any]:
    """Retention of day ``day`` (0 or 1) by the store's purge, on its own connection."""
    from django.db import connections

    cutoff = dt.datetime.fromisoformat(t0) - dt.timedelta(days=1 - day, microseconds=1)
    if layout == "partitioned":  # its index rule waits for each row's stale_at too (the
        cutoff += dt.timedelta(seconds=60)  # fill's claims: max_processing_time 60 s)
    lsn = sl.wal_lsn()
    start = time.perf_counter()
    n = type(store)(store.alias, store.settings_dict, store.timeout, store.claim_commit
                    ).purge_expired(batch_size=10_000, before=cutoff)  # fmt: skip
    out = {"day": day, "rows": n, "seconds": time.perf_counter() - start,
           "wal_bytes": sl.wal_since(lsn)}  # fmt: skip
    connections[LAYOUTS[layout]].close()
    connections["postgresql"].close()
    return out


def retention(both: list[Any], t0: str, samples: int) -> dict[str, Any]:
    out: dict[str, Any] = {"day0": {}, "day1_with_claims": {}}
    lsn = sl.wal_lsn()
    time.sleep(10)
    out["background_wal_bytes_per_s"] = sl.wal_since(lsn) / 10
    for store, layout in zip(both, LAYOUTS, strict=True):
        out["day0"][layout] = retire(store, layout, 0, t0) | sizes(LAYOUTS[layout])
    idle = sl.interleaved(both, {"rows": 0}, samples)
    for store, layout in zip(both, LAYOUTS, strict=True):
        during = sl.claims_during(store, lambda s=store, la=layout: retire(s, la, 1, t0))
        out["day1_with_claims"][layout] = during | sizes(LAYOUTS[layout])
    out["claim_idle"] = {"single": idle[0]["claim"], "partitioned": idle[1]["claim"]}
    return out


if __name__ == "__main__":
    main()
