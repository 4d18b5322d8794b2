"""The partitioned PROTOTYPE's boundary race, with and without the key lock.

    BENCH_PG_NAME=grousset_scale_race .venv/bin/python -m bench.partition_race

8 processes claim the same 500 new keys at once; half of them claim in generation
G, half in G + 1, as two workers on either side of a generation boundary would. Each
key must be claimed (``NEW``) exactly once and own exactly one row. Run twice: with the
prototype's claim (advisory lock on the key first) and with the same function minus
the lock, which shows why it is there. Scratch database only (dropped first).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import uuid
from typing import Any

from bench import harness
from bench import partition_proto as proto
from bench import scale_layouts as sl

KEYS = 500
PROCS = 8
GEN = 1005
NOLOCK = proto.FUNCTION.replace("grousset_proto_claim(", "grousset_proto_claim_nolock(").replace(
    "PERFORM pg_advisory_xact_lock", "-- PERFORM pg_advisory_xact_lock"
)


class NoLockStore(proto.ProtoStore):
    call = proto.CALL.replace("grousset_proto_claim(", "grousset_proto_claim_nolock(")


def worker(n: int, salt: str, lock: bool, barrier: Any, out: Any) -> None:
    harness.setup_django()
    from celery_grousset.store import Completion, get_store

    base = get_store(sl.ALIAS)
    store = proto.ProtoStore(sl.ALIAS, dict(base.settings_dict), base.timeout, base.claim_commit)
    store.cur_gen = sl.TODAY
    if not lock:
        store = NoLockStore(store.alias, store.settings_dict, store.timeout)
    store.cur_gen = GEN + n % 2
    done = Completion("completed", b'"ok"', "application/json;utf-8")
    kinds: dict[str, int] = {}
    barrier.wait()
    for i in range(KEYS):
        key = f"{salt}-{i:04d}".ljust(64, "0")
        req = sl.request(key)
        for step in ("claim", "finish"):
            try:
                if step == "claim":
                    kind = store.claim(req).kind.name
                elif kind == "NEW":
                    store.finish(sl.PROCESSOR, key, req.token, done)
            except Exception as exc:  # counted: a store error is a finding, not a crash
                kind = f"{step} error: {str(exc.__cause__ or exc).splitlines()[0][:70]}"
            if step == "claim" or "error" in kind:
                kinds[kind] = kinds.get(kind, 0) + 1
    out.put(kinds)


def main() -> None:
    harness.setup_django()
    sl.fresh_database()
    harness.truncate(sl.ALIAS)
    from django.db import connections

    with connections[sl.ALIAS].cursor() as cur:
        proto.convert(cur, range(GEN - 3, GEN + 3))
        proto.create_indexes(cur, True)
        cur.execute(NOLOCK)
    connections[sl.ALIAS].close()
    ctx = mp.get_context("spawn")
    report = {}
    for lock in (True, False):
        salt = uuid.uuid4().hex[:8]
        barrier, out = ctx.Barrier(PROCS), ctx.Queue()
        procs = [ctx.Process(target=worker, args=(n, salt, lock, barrier, out))
                 for n in range(PROCS)]  # fmt: skip
        for p in procs:
            p.start()
        totals: dict[str, int] = {}
        for _ in procs:
            for k, v in out.get(timeout=600).items():
                totals[k] = totals.get(k, 0) + v
        for p in procs:
            p.join()
        with connections[sl.ALIAS].cursor() as cur:
            cur.execute(
                f"SELECT count(*) FROM (SELECT fingerprint FROM {proto.TABLE} WHERE fingerprint "
                "LIKE %s GROUP BY fingerprint HAVING count(*) > 1) AS d",
                [salt + "%"],
            )
            twice = cur.fetchone()[0]
        report["with lock" if lock else "WITHOUT lock"] = {
            "claims by kind": totals, "keys": KEYS, "keys with two rows": twice,
            "ok": totals.get("NEW", 0) == KEYS and twice == 0}  # fmt: skip
        harness.log(f"race: {json.dumps(report)}")


if __name__ == "__main__":
    main()
