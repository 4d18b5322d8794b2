"""The partitioned journal's probe index, A/B: claim latency with the hash index on
``fingerprint`` (``grousset_outcome_probe``, docs/scale.md) dropped, then created again,
in alternating rounds on the same journal.

    BENCH_PG_NAME=grousset_scale .venv/bin/python -m bench.scale_ab --sizes 50000000
    BENCH_PG_NAME=grousset_scale .venv/bin/python -m bench.scale_probe --rounds 2

Runs on the partitioned journal ``bench.scale_ab`` filled (its ``bench/.work/
scale-ab.json`` names the fill): each round drops or creates the index (on the parent:
every generation at once), runs ``ANALYZE``, then takes ``--samples`` claim, claim +
complete and duplicate samples (``bench.scale_layouts``; a fresh part of the fill's old
rows each round). Leaves the index in place.

``--empty NAME`` (a pair of empty journals made by ``BENCH_PG_NAME=NAME python -m
bench.scale_ab --sizes 0``): then the claims of both layouts at the fill's size and of
both empty ones, the four stores taking turns sample by sample, for the ratio to the
empty journal measured at the same moments. ``--layouts`` keeps it to some layouts (the
others are not touched); ``--prewarm`` first reads the indexes a claim reads at random
into the OS cache (``--rounds 0``: the comparison alone).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench import harness
from bench import scale_layouts as sl
from bench.scale_report import OPS, pq

LAYOUTS = ("single", "partitioned")


def toggle(create: bool) -> float:
    """Create or drop the probe index on the partitioned journal; the seconds it took."""
    from django.db import connections

    from celery_grousset.store.pgpartops import PROBE_INDEX, PROBE_INDEX_SQL

    t0 = time.perf_counter()
    with connections["pgpart"].cursor() as cur:
        cur.execute(PROBE_INDEX_SQL if create else f"DROP INDEX IF EXISTS {PROBE_INDEX}")
        cur.execute("ANALYZE celery_grousset_outcome")
    return time.perf_counter() - t0


#: the indexes a new key's claim reads at random (the others it touches at their newest
#: end): the single table's unique key and task-id index; on the partitioned journal,
#: every generation's probe index and the current generation's indexes
HOT_INDEXES = {
    "single": ("postgresql", "SELECT indexrelid FROM pg_index WHERE indexrelid IN "
               "('grousset_outcome_key'::regclass, 'grousset_outcome_task_id'::regclass)"),
    "partitioned": ("pgpart", "SELECT i.indexrelid FROM pg_index AS i JOIN pg_class AS c ON "
                    "c.oid = i.indexrelid WHERE c.relname LIKE 'celery_grousset_outcome_g%' "
                    "AND (c.relname LIKE '%fingerprint_idx' OR i.indrelid = "
                    "format('celery_grousset_outcome_g%s', grousset_generation())::regclass)"),
}  # fmt: skip


def prewarm(layouts: tuple[str, ...]) -> dict[str, int]:
    """Read each layout's :data:`HOT_INDEXES` into the OS cache (``pg_prewarm(…, 'read')``):
    a journal server with memory for them, as docs/scale.md sizes it. Bytes read."""
    from django.db import connections

    read = {}
    for layout in layouts:
        alias, sql = HOT_INDEXES[layout]
        with connections[alias].cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
            cur.execute(f"SELECT sum(pg_prewarm(x.indexrelid, 'read')) FROM ({sql}) AS x")
            read[layout] = int(cur.fetchone()[0] or 0) * 8192
        harness.log(f"prewarm {layout}: {read[layout] / 1e9:.2f} GB of indexes read")
    return read


def against_empty(
    big: list[Any], name: str, samples: int, layouts: tuple[str, ...] = LAYOUTS
) -> list[list[Any]]:
    """``layouts`` at the fill's size and empty (database ``name``/``name_part``), the
    stores in turns (fresh keys only: the empty journals have no old rows). A layout
    left out is not touched: the other one has the machine's memory to itself."""
    from django.db import connections

    from celery_grousset.store.pgpartition import PartitionedStore
    from celery_grousset.store.postgresql import PostgresStore

    full, empty = [], []
    kinds = {"single": (PostgresStore, "postgresql", name, big[0]),
             "partitioned": (PartitionedStore, "pgpart", f"{name}_part", big[1])}  # fmt: skip
    for layout in layouts:
        kind, alias, db, store = kinds[layout]
        conf = dict(connections.settings[alias]) | {"NAME": db}
        connections.settings[f"empty_{alias}"] = conf
        full.append(store)
        empty.append(kind(f"empty_{alias}", conf, big[0].timeout, big[0].claim_commit))
    res = sl.interleaved([*full, *empty], {"rows": 0, "salt": "empty"}, samples)
    labels = [f"{layout}, {size}" for size in ("full", "empty") for layout in layouts]
    rows = [[label, *(pq(r[k]) for k in OPS[:3])]
            for label, r in zip(labels, res, strict=True)]  # fmt: skip
    n = len(layouts)
    for i in range(n):
        rows[i].append(f"{res[i]['claim']['p99_ms'] / res[n + i]['claim']['p99_ms']:.2f}x")
        rows[n + i].append("-")
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="pairs of rounds (without, with)")
    p.add_argument("--samples", type=int, default=800)
    p.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    p.add_argument("--empty", default=None, help="the empty pair of journals to compare with")
    p.add_argument("--layouts", default=",".join(LAYOUTS),
                   help="the layouts --empty compares (the others are left untouched)")  # fmt: skip
    p.add_argument("--prewarm", action="store_true",
                   help="first read the indexes a claim reads at random into the OS cache")
    args = p.parse_args(argv)
    harness.setup_django()
    layouts = tuple(args.layouts.split(","))
    read = prewarm(layouts) if args.prewarm else {}
    from bench import report, scale_ab

    fill = json.loads((harness.WORK / "scale-ab.json").read_text())
    rows = max(point["rows"] for point in fill["points"])
    big = scale_ab.stores()
    part = big[1]
    out: dict[str, Any] = {"rows": rows, "rounds": []}
    for i in range(2 * args.rounds):
        create = bool(i % 2)
        seconds = toggle(create)
        state = {"rows": rows, "salt": fill["salt"], "shift": 1000 + 97 * i}
        sample = sl.latencies(part, state, args.samples)
        out["rounds"].append({"probe_index": create, "toggle_s": seconds, **sample})
        harness.log(f"probe index {'on' if create else 'off'}: {json.dumps(sample)}")
    if not out["rounds"]:
        toggle(True)  # (the comparison below is of the product's layout)
    else:
        table = [
            [i + 1, "hash on fingerprint" if r["probe_index"] else "unique key's B-tree only",
             *(pq(r[k]) for k in OPS if k in r)]
            for i, r in enumerate(out["rounds"])
        ]  # fmt: skip
        kinds = [k for k in OPS if k in out["rounds"][0]]
        report.emit(
            "scale-probe (the partitioned journal's probe index, A/B)",
            {"rows": f"{rows:,}", "samples": args.samples, "commit of the fill": fill["commit"]},
            ["round", "past generations probed through", *(f"{k} p50 / p99 ms" for k in kinds)],
            table, None, args.record,
        )  # fmt: skip
    if args.empty:
        report.emit(
            "scale-probe (full journal vs empty, interleaved)",
            {"rows": f"{rows:,}", "samples": args.samples, "empty": args.empty,
             "layouts": args.layouts, "commit of the fill": fill["commit"],
             **({"prewarmed": ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in read.items())}
                if read else {})},
            ["journal", *(f"{k} p50 / p99 ms" for k in OPS[:3]), "claim p99 vs empty"],
            against_empty(big, args.empty, args.samples, layouts),
            None, args.record,
        )  # fmt: skip
    return out


if __name__ == "__main__":
    main()
