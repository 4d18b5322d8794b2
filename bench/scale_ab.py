"""The two journal layouts side by side in one run (docs/scale.md).

    BENCH_PG_NAME=grousset_scale .venv/bin/python -m bench.scale_ab --sizes 5000000

The single table (schema ``public``, the product) and the partitioned PROTOTYPE
(:mod:`bench.partition_proto`, schema ``proto``) live in one scratch database and are
filled with the same rows. Claims alternate between them sample by sample, so machine
load (other processes on a shared machine) hits both alike: the ratios between the two
layouts are the result, not the absolute times. At the largest size: retention of one
day on each (the product's batched ``purge_expired`` vs ``DETACH … CONCURRENTLY`` +
``DROP``), then of another day with claims running. Writes
``bench/.work/scale-ab.json``.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from bench import harness
from bench import partition_proto as proto
from bench import scale_layouts as sl

SCHEMA = "proto"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="5000000")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--resume", action="store_true",
                   help="continue the run recorded in bench/.work/scale-ab.json")  # fmt: skip
    args = p.parse_args(argv)
    harness.setup_django()
    path = harness.WORK / "scale-ab.json"
    if args.resume and path.exists():
        result: dict[str, Any] = json.loads(path.read_text())
    else:
        result = {"layout": "ab", "commit": sl.commit(), "points": [], **prepare()}
        sl.save(result)
    salt, t0 = result["salt"], result["t0"]
    stores = [sl.new_store("single"), sl.new_store("partitioned", SCHEMA)]
    done = {point["rows"] for point in result["points"]}
    for size in [0, *(int(float(s)) for s in args.sizes.split(","))]:
        states = [{"layout": "single", "rows": 0, "salt": salt, "t0": t0},
                  {"layout": "partitioned", "rows": 0, "salt": salt, "t0": t0,
                   "schema": SCHEMA}]  # fmt: skip
        if size in done:
            continue
        point: dict[str, Any] = {"rows": size}
        if size:
            point["load"] = [sl.load(state, size) for state in states]
        point["single"], point["partitioned"] = sl.interleaved(stores, states[0], args.samples)
        harness.log(f"ab: {size:,} rows: {json.dumps(point, default=str)}")
        result["points"].append(point)
        sl.save(result)
    if "retention" not in result:
        result["retention"] = retention(stores, t0, args.samples)
        harness.log(f"ab: retention {json.dumps(result['retention'], default=str)}")
        sl.save(result)


def prepare() -> dict[str, Any]:
    """A fresh scratch database with both layouts, empty."""
    from django.db import connections

    sl.fresh_database()
    harness.truncate(sl.ALIAS)
    with connections[sl.ALIAS].cursor() as cur:
        cur.execute("SELECT now()::text")
        t0 = cur.fetchone()[0]
        proto.convert(cur, range(sl.BASE_GEN, sl.TODAY + 2), schema=SCHEMA)
        proto.create_indexes(cur, True)
    connections[sl.ALIAS].close()
    return {"t0": t0, "salt": uuid.uuid4().hex[:6]}


def retention(stores: list[Any], t0: str, samples: int) -> dict[str, Any]:
    out: dict[str, Any] = {"day0": {}, "day1_with_claims": {}}
    for layout, schema in (("single", "public"), ("partitioned", SCHEMA)):
        out["day0"][layout] = sl.retire(layout, 0, t0, schema) | sl.sizes(schema)
    idle = sl.interleaved(stores, {"rows": 0}, samples)
    layouts = (("single", "public"), ("partitioned", SCHEMA))
    for store, (layout, schema) in zip(stores, layouts, strict=True):
        during = sl.claims_during(store, lambda la=layout, sc=schema: sl.retire(la, 1, t0, sc))
        out["day1_with_claims"][layout] = during | sl.sizes(schema)
    out["claim_idle"] = {"single": idle[0]["claim"], "partitioned": idle[1]["claim"]}
    return out


if __name__ == "__main__":
    main()
