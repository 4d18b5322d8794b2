"""WAL written by the journal itself, per operation, both layouts (docs/scale.md).

    BENCH_PG_NAME=grousset_scale .venv/bin/python -m bench.scale_wal

Runs after ``bench.scale_ab`` on the databases it left (both layouts filled, one
database each). The server's WAL is shared with every other database on it, so the LSN
difference alone counts other people's writes too; here ``pg_walinspect`` reads the
WAL records of the interval and sums those that touch the layout's database
(``block_ref`` names its oid) or belong to a transaction that did (its commit record).
Measures, per layout: 1,000 claims + completions of new keys, 1,000 duplicate claims.
(Retention's WAL: ``bench.scale_ab``.)
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from bench import harness, scale_ab
from bench import scale_layouts as sl

SLOT = "grousset_scale_wal"
OWN = """
WITH r AS (SELECT * FROM pg_get_wal_records_info(%(lsn)s, pg_current_wal_flush_lsn())),
mine AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE %(db)s AND xid <> 0)
SELECT count(*), coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) FROM r
WHERE block_ref LIKE %(db)s OR xid IN (SELECT xid FROM mine)
"""


def start(alias: str) -> str:
    from django.db import connections

    with connections[alias].cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        cur.execute("CHECKPOINT")  # the next writes start after one: the FPI upper bound
        # the server recycles WAL fast under other people's writes: a slot keeps this
        # interval's segments until own_wal() has read them (and drops it, always)
        cur.execute("SELECT pg_create_physical_replication_slot(%s, true)", [SLOT])
        cur.execute("SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                    [SLOT])  # fmt: skip
        return str(cur.fetchone()[0])


def own_wal(alias: str, lsn: str) -> dict[str, int]:
    from django.db import connections

    with connections[alias].cursor() as cur:
        try:
            cur.execute("SELECT pg_switch_wal()")  # flush what is written so far
            cur.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
            oid = cur.fetchone()[0]
            cur.execute(OWN, {"lsn": lsn, "db": f"%/{oid}/%"})
            records, total, fpi = cur.fetchone()
        finally:
            cur.execute("SELECT pg_drop_replication_slot(%s)", [SLOT])
    return {"records": int(records), "bytes": int(total), "fpi_bytes": int(fpi)}


def claims(store: Any, n: int) -> dict[str, Any]:
    from celery_grousset.store import Completion

    done = Completion("completed", b'"ok"', "application/json;utf-8")
    salt = uuid.uuid4().hex
    keys = [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(n)]
    lsn = start(store.alias)
    for key in keys:
        req = sl.request(key)
        store.claim(req)
        store.finish(sl.PROCESSOR, key, req.token, done)
    new = own_wal(store.alias, lsn)
    lsn = start(store.alias)
    for key in keys:
        store.claim(sl.request(key))
    return {"claim_complete_per_call": new["bytes"] / n, "claim_complete": new,
            "duplicate_per_call": own_wal(store.alias, lsn)["bytes"] / n}  # fmt: skip


def main() -> None:
    harness.setup_django()
    out: dict[str, Any] = {"layout": "wal", "commit": sl.commit()}
    for store, layout in zip(scale_ab.stores(), scale_ab.LAYOUTS, strict=True):
        out[layout] = claims(store, 1000)
        harness.log(f"wal: {layout}: {json.dumps(out[layout])}")
    harness.WORK.mkdir(parents=True, exist_ok=True)
    (harness.WORK / "scale-wal.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
