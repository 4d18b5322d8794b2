"""A/B of the PostgreSQL claim statement: an earlier commit's against the current one, in
one run, in a scratch database, interleaved call by call (``python -m bench.claim_ab REV``).

Used when the ``store`` scenario's ratio moves: it tells a change of the statement from a
change of the machine. The scratch table is the current schema with ``stale_at`` nullable
(statements from before migration 0003 do not write it)."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DSN = "host=127.0.0.1 user=postgres"
SCRATCH = "grousset_claim_ab"


def old_statement(rev: str) -> str:
    src = subprocess.run(["git", "show", f"{rev}:celery_grousset/store/postgresql.py"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    # the claim module's names are supplied below (a one-line or a parenthesized import)
    src = re.sub(r"^from celery_grousset\.claim import (\([^)]*\)|.*)$", "", src, flags=re.M)
    module = types.ModuleType("old_store")
    from celery_grousset import claim

    module.__dict__.update({name: getattr(claim, name) for name in dir(claim)})
    module.__dict__.update(kind_of=None, ENC_GAVE_UP=claim.ENC_GAVE_UP)
    exec(compile(src, f"{rev}:postgresql.py", "exec"), module.__dict__)
    return str(module.CLAIM_SQL)


def main(rev: str, calls: int = 2000) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    import psycopg

    from celery_grousset.claim import ClaimRequest
    from celery_grousset.store import postgresql as pg

    with psycopg.connect(f"{DSN} dbname=postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {SCRATCH}")
        admin.execute(f"CREATE DATABASE {SCRATCH}")
    schema = subprocess.run(["pg_dump", "-h", "127.0.0.1", "-U", "postgres", "-s", "-t",
                             "celery_grousset_outcome", "-t", "celery_grousset_delivery",
                             "grousset_bench"],
                            capture_output=True, text=True, check=True).stdout
    conn = psycopg.connect(f"{DSN} dbname={SCRATCH}", autocommit=True,
                           options="-c plan_cache_mode=force_generic_plan -c TimeZone=UTC")
    ddl = "\n".join(line for line in schema.splitlines() if not line.startswith("\\"))
    conn.execute(ddl)  # type: ignore[arg-type]
    conn.execute("RESET search_path")  # pg_dump's script empties it
    conn.execute("ALTER TABLE celery_grousset_outcome ALTER stale_at DROP NOT NULL, "
                 "ALTER stale_at SET DEFAULT now()")
    store = pg.PostgresStore.__new__(pg.PostgresStore)
    store.claim_commit = "durable"

    def req(fp: str) -> ClaimRequest:
        return ClaimRequest(processor_id="ab", fingerprint=fp, task_name="t", task_id="x",
                            token=uuid.uuid4().hex, worker="w", args_repr="",
                            max_processing_time=60.0, expires_after=3600.0, max_takeovers=3)

    def finish(r: ClaimRequest) -> None:
        conn.execute(pg.FINISH_SQL, {"st": "completed", "res": b"1", "enc": "application/json",
                                     "err": "", "p": "ab", "f": r.fingerprint, "tok": r.token},
                     prepare=True)

    variants = {rev: old_statement(rev), "current": pg.CLAIM_SQL}
    done = {}
    for name, sql in variants.items():
        first = req(uuid.uuid4().hex * 2)
        conn.execute(sql, store.claim_params(first), prepare=True).fetchone()
        finish(first)
        done[name] = first.fingerprint
    dup: dict[str, list[float]] = {k: [] for k in variants}
    full: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(calls):
        for name, sql in variants.items():
            params = store.claim_params(req(done[name]))
            t0 = time.perf_counter()
            conn.execute(sql, params, prepare=True).fetchone()
            dup[name].append(time.perf_counter() - t0)
            fresh = req(uuid.uuid4().hex * 2)
            t0 = time.perf_counter()
            conn.execute(sql, store.claim_params(fresh), prepare=True).fetchone()
            finish(fresh)
            full[name].append(time.perf_counter() - t0)
    conn.close()
    with psycopg.connect(f"{DSN} dbname=postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {SCRATCH}")
    for name in variants:
        print(f"{name:>10}: duplicate claim {statistics.median(dup[name]) * 1e6:7.1f} us, "
              f"claim + complete {statistics.median(full[name]) * 1e6:7.1f} us "
              f"(median of {calls}, interleaved)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "c7122e6")
