"""The online conversion of a large single-table journal to the partitioned layout
(``grousset_partition prepare`` then ``convert``; docs/scale.md, "Converting a large
table"), with claims running.

    BENCH_PG_NAME=grousset_scale .venv/bin/python -m bench.scale_convert --rows 10000000

A scratch single-table journal (alias ``postgresql``, database ``${BENCH_PG_NAME}``)
filled with ``--rows`` of the scale benches' rows (``bench.scale_layouts``). Then:

1. claim latencies on it, idle (``--samples``);
2. ``prepare`` in a thread while this process claims and completes new keys: its time,
   each statement's, the WAL it wrote and the claims' p50 / p99 meanwhile;
3. claim latencies on the prepared table (its four more indexes written by every new
   row until the conversion);
4. ``convert`` (nothing else running, as with the workers stopped): its time and WAL,
   and that it copied nothing (the table's file is the same before and after);
5. claim latencies on the partitioned journal, the old rows' duplicates moving out of
   the attached generation;
6. with ``--revert``: ``revert`` back to the single table (one transaction, the rows
   copied: claims would wait for all of it; nothing else running), its time and WAL,
   then claim latencies on the single table again.

Sizes (heap, indexes) after each step. ``--prewarm``: the single table's hot indexes read
into the OS cache first. Writes ``bench/.work/scale-convert.json``
(``--out``).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any

from bench import harness
from bench import scale_ab as ab
from bench import scale_layouts as sl

ALIAS = "postgresql"
TABLE = "celery_grousset_outcome"


def filenode(relation: str) -> int:
    from django.db import connections

    with connections[ALIAS].cursor() as cur:
        cur.execute("SELECT pg_relation_filenode(%s::regclass)", [relation])
        return int(cur.fetchone()[0])


def timed_statements(job: Any) -> Any:
    """``job()`` with every statement it sends on this thread's Django connection timed:
    ``(its result, seconds, [[statement, seconds], …] of those over 50 ms, WAL bytes)``."""
    from django.db import connections

    steps: list[list[Any]] = []
    lsn = sl.wal_lsn()
    start = time.perf_counter()
    with connections[ALIAS].execute_wrapper(sl.statement_timer(steps, start)):
        out = job()
    seconds = time.perf_counter() - start
    slow = [[sql, round(secs, 4)] for sql, _, secs in steps if secs >= 0.05]
    return out, seconds, slow, sl.wal_since(lsn)


def prepare_during_claims(store: Any) -> dict[str, Any]:
    from django.db import connections

    from celery_grousset.store import pgpartconvert

    def job() -> dict[str, Any]:
        (g0, done), seconds, steps, wal = timed_statements(
            lambda: pgpartconvert.prepare(ALIAS, seconds=ab.DAY)
        )
        connections.close_all()
        return {"g0": g0, "done": done, "seconds": seconds, "steps": steps, "wal_bytes": wal}

    return sl.claims_during(store, job)


def convert() -> dict[str, Any]:
    from django.db import connections

    from celery_grousset.store import pgpartconvert, pgpartops

    before = filenode(TABLE)
    (rows, copied), seconds, steps, wal = timed_statements(lambda: pgpartconvert.convert(ALIAS))
    g0 = min(g for g, *_ in pgpartops.partitions(ALIAS))
    kept = filenode(f"{TABLE}_g{g0}") == before
    connections[ALIAS].close()
    return {"rows": rows, "copied": copied, "seconds": seconds, "steps": steps,
            "wal_bytes": wal, "same_file": kept}  # fmt: skip


def revert() -> dict[str, Any]:
    from django.db import connections

    from celery_grousset.store import pgpartrevert

    copied, seconds, steps, wal = timed_statements(
        lambda: pgpartrevert.revert(ALIAS, max_rows=10**9)  # the bench's own quiet hour
    )
    connections[ALIAS].close()
    return {"rows": copied, "seconds": seconds, "steps": steps, "wal_bytes": wal}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--prewarm", action="store_true",
                   help="first read the single table's hot indexes into the OS cache "
                   "(bench.scale_probe.prewarm): idle figures not of a cold cache")  # fmt: skip
    p.add_argument("--revert", action="store_true",
                   help="then revert to the single table (the rows copied in one "
                   "transaction: a journal of up to about a million rows)")  # fmt: skip
    args = p.parse_args(argv)
    harness.setup_django()
    from django.db import connections

    from celery_grousset.store import get_store
    from celery_grousset.store.pgpartition import PartitionedStore

    sl.fresh_database(ALIAS)
    harness.truncate(ALIAS)
    with connections[ALIAS].cursor() as cur:
        cur.execute("SELECT now()::text")
        state: dict[str, Any] = {"t0": cur.fetchone()[0], "salt": uuid.uuid4().hex[:6]}
    result: dict[str, Any] = {"commit": sl.commit(), "rows": args.rows}
    result["load"] = ab.load(ALIAS, ab.index_ddl(ALIAS), state, args.rows)
    result["sizes_single"] = ab.sizes(ALIAS)
    if args.prewarm:
        from bench import scale_probe

        result["prewarm_bytes"] = scale_probe.prewarm(("single",))["single"]
    store = get_store(ALIAS)
    point = {"rows": args.rows, "salt": state["salt"]}
    result["idle_single"] = sl.latencies(store, point, args.samples)
    harness.log(f"convert: single, idle {json.dumps(result['idle_single'])}")
    result["prepare"] = prepare_during_claims(store)
    harness.log(f"convert: prepare {json.dumps(result['prepare'], default=str)}")
    result["sizes_prepared"] = ab.sizes(ALIAS)
    result["idle_prepared"] = sl.latencies(store, point | {"shift": 1}, args.samples)
    harness.log(f"convert: prepared, idle {json.dumps(result['idle_prepared'])}")
    store.close()
    result["convert"] = convert()
    harness.log(f"convert: convert {json.dumps(result['convert'], default=str)}")
    part = PartitionedStore(ALIAS, connections.settings[ALIAS], store.timeout, store.claim_commit)
    result["idle_partitioned"] = sl.latencies(part, point | {"shift": 2}, args.samples)
    harness.log(f"convert: partitioned, idle {json.dumps(result['idle_partitioned'])}")
    result["sizes_partitioned"] = ab.sizes(ALIAS)
    part.close()
    if args.revert:
        result["revert"] = revert()
        harness.log(f"convert: revert {json.dumps(result['revert'], default=str)}")
        single = get_store(ALIAS)
        result["idle_reverted"] = sl.latencies(single, point | {"shift": 3}, args.samples)
        harness.log(f"convert: reverted, idle {json.dumps(result['idle_reverted'])}")
        single.close()
    sl.save(result, args.out or harness.WORK / "scale-convert.json")
    return result


if __name__ == "__main__":
    main()
