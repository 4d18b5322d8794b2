"""Where a day's retention on the partitioned journal spends its time (docs/scale.md).

    BENCH_PG_NAME=grousset_scale .venv/bin/python -m bench.scale_retire \
        --rows-per-day 5555555 --live-per-day 300000

A scratch partitioned journal (alias ``pgpart``, database ``${BENCH_PG_NAME}_part``,
one generation a day, converted by the product's code) gets ``--rows-per-day`` expired
rows in each of days 0 and 1 (the size of one day of the 50M-row run) and
``--live-per-day`` live rows in each of days 2-8, so a claim probes 9 non-empty
partitions as it does there. Then the product's ``purge_expired`` retires day 0 with
nothing else running, and day 1 while this process claims and completes new keys in
another thread. Every statement of the retention is timed through Django's
``execute_wrapper``; every claim is stamped with its start, so each slow claim is
placed against the statement that ran meanwhile. ``--again`` fills days 0 and 1 once
more (the generations re-created) and repeats both retentions. Writes
``bench/.work/scale-retire.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench import harness
from bench import scale_ab as ab
from bench import scale_layouts as sl

ALIAS = "pgpart"


def fill(state: dict[str, Any], days: list[int], per_day: int) -> float:
    """``per_day`` rows into each of ``days``; seconds taken."""
    from django.db import connections

    t0 = time.perf_counter()
    with ab.cursor(ALIAS) as cur:
        sl.fill_days(cur, ALIAS, state, days, per_day)
    connections[ALIAS].close()
    return time.perf_counter() - t0


def prepare(rows_per_day: int, live_per_day: int, tablespace: str | None = None) -> dict[str, Any]:
    """The scratch journal: converted, 9 past generations, filled (indexes dropped for
    the load and built after, as ``bench.scale_ab`` does); the partitioned journal's
    tables and indexes in ``tablespace`` when given (the WAL stays where it is)."""
    from django.db import connections

    from celery_grousset.store import pgpartconvert, pgpartops

    sl.fresh_database(ALIAS)
    harness.truncate(ALIAS)
    if tablespace:
        with connections[ALIAS].cursor() as cur:
            name = connections.settings[ALIAS]["NAME"]
            cur.execute(f'ALTER DATABASE "{name}" SET default_tablespace = %s', [tablespace])
        connections[ALIAS].close()  # (the setting applies to the sessions opened after)
    harness.prepare_database("postgresql")  # WAL positions are read through it
    with connections[ALIAS].cursor() as cur:  # 2 minutes back: day 1's claims (60 s
        cur.execute("SELECT (now() - interval '2 minutes')::text")  # max_processing_time)
        t0 = cur.fetchone()[0]  # are abandoned by retention time even after a small fill
    pgpartconvert.convert(ALIAS, seconds=ab.DAY)
    first = pgpartops.current_generation(ALIAS) - 9
    with connections[ALIAS].cursor() as cur:
        for gen in range(first, first + 9):
            pgpartops.add_generation(cur, gen)
    state = {"t0": t0, "salt": uuid.uuid4().hex[:6], "first_gen": first}
    ddl = ab.index_ddl(ALIAS)
    with ab.cursor(ALIAS) as cur:
        ab.drop_indexes(cur, ddl)
    state["fill_s"] = fill(state, [0, 1], rows_per_day) + fill(
        state, list(range(2, 9)), live_per_day
    )
    t1 = time.perf_counter()
    with ab.cursor(ALIAS) as cur:
        ab.build_indexes(cur, ddl)
        cur.execute("VACUUM ANALYZE celery_grousset_outcome")
    state["index_s"] = time.perf_counter() - t1
    connections[ALIAS].close()
    return state


def timed_retire(store: Any, day: int, t0: str, base: float) -> dict[str, Any]:
    """The product's retention of day ``day``, each statement timed (seconds from
    ``base``)."""
    from django.db import connections

    steps: list[list[Any]] = []
    cutoff = dt.datetime.fromisoformat(t0) - dt.timedelta(days=1 - day, microseconds=1)
    cutoff += dt.timedelta(seconds=60)  # the fill's claims: max_processing_time 60 s
    lsn = sl.wal_lsn()
    part = type(store)(store.alias, store.settings_dict, store.timeout, store.claim_commit)
    start = time.perf_counter()
    with connections[ALIAS].execute_wrapper(sl.statement_timer(steps, base)):
        rows = part.purge_expired(batch_size=10_000, before=cutoff)
    out = {"day": day, "rows": rows, "start": start - base,
           "seconds": time.perf_counter() - start, "wal_bytes": sl.wal_since(lsn),
           "steps": steps}  # fmt: skip
    connections[ALIAS].close()
    connections["postgresql"].close()
    return out


def claims_against(store: Any, job: Any) -> dict[str, Any]:
    """``job(base)`` in a thread; claim + complete new keys meanwhile, each claim
    stamped ``[start, seconds]`` from ``base``."""
    from celery_grousset.store import Completion

    box: dict[str, Any] = {}
    base = time.perf_counter()
    worker = threading.Thread(target=lambda: box.update(job(base)))
    done = Completion("completed", b'"ok"', "application/json;utf-8")
    claims: list[list[float]] = []
    salt = uuid.uuid4().hex
    worker.start()
    while worker.is_alive():
        req = sl.request(hashlib.sha256(f"{salt}-{len(claims)}".encode()).hexdigest())
        start = time.perf_counter()
        store.claim(req)
        claims.append([start - base, time.perf_counter() - start])
        store.finish(sl.PROCESSOR, req.fingerprint, req.token, done)
    worker.join()
    during = [d for s, d in claims if box["start"] <= s <= box["start"] + box["seconds"]]
    return box | {"claims": claims, "claim_during": sl.stats(during or [float("nan")])}


def slow_claims(run: dict[str, Any], over_ms: float) -> list[dict[str, Any]]:
    """Each claim slower than ``over_ms``, with the retention statements it overlapped."""
    out = []
    for start, secs in run.get("claims", []):
        if secs * 1e3 < over_ms:
            continue
        overlap = [s[0][:48] for s in run["steps"] if s[1] < start + secs and s[1] + s[2] > start]
        out.append({"at_s": round(start - run["start"], 4), "ms": round(secs * 1e3, 2),
                     "during": overlap})  # fmt: skip
    return out


def summary(run: dict[str, Any]) -> dict[str, Any]:
    steps = sorted(run["steps"], key=lambda s: -s[2])[:6]
    return {"rows": run["rows"], "seconds": round(run["seconds"], 3),
            "wal_mb": round(run["wal_bytes"] / 1e6, 3),
            "top_statements_ms": [[s[0][:60], round(s[2] * 1e3, 1)] for s in steps],
            "claim_during": run.get("claim_during")}  # fmt: skip


def round_of(store: Any, state: dict[str, Any], samples: int) -> dict[str, Any]:
    out: dict[str, Any] = {"day0": timed_retire(store, 0, state["t0"], time.perf_counter())}
    out["claim_idle"] = sl.latencies(store, {"rows": 0}, samples)["claim"]
    out["day1"] = claims_against(store, lambda base: timed_retire(store, 1, state["t0"], base))
    idle = out["claim_idle"]["p99_ms"]
    out["day1"]["slow_claims"] = slow_claims(out["day1"], max(2 * idle, 10.0))
    for day in ("day0", "day1"):
        harness.log(f"retire: {day}: {json.dumps(summary(out[day]))}")
    harness.log(f"retire: idle claim {out['claim_idle']}; slow: {out['day1']['slow_claims']}")
    return out


def unlink_probe(gigabytes: float, where: Path | None = None) -> dict[str, Any]:
    """The file system alone, no PostgreSQL: write ``gigabytes`` in 1 GB files (as a
    table's segments), flush them, then remove them while another thread appends 8 kB
    and ``fdatasync``s in a loop (as a commit flushes WAL): the removal's time and the
    flushes' p50 / p99 / max before and during it."""
    import os

    where = (where or harness.WORK) / "unlink-probe"
    where.mkdir(parents=True, exist_ok=True)
    block, left, files = os.urandom(1 << 20), int(gigabytes * 1024), []
    while left > 0:
        path = where / f"seg{len(files)}"
        with open(path, "wb") as f:
            for _ in range(min(1024, left)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        files.append(path)
        left -= 1024

    def flushes(stop: threading.Event, out: list[float]) -> None:
        fd = os.open(where / "wal", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        while not stop.is_set():
            start = time.perf_counter()
            os.write(fd, block[:8192])
            os.fdatasync(fd)
            out.append(time.perf_counter() - start)
        os.close(fd)

    result: dict[str, Any] = {"gigabytes": gigabytes, "mount": mount_options(where)}
    for phase in ("idle", "during"):
        stop, times = threading.Event(), []
        t = threading.Thread(target=flushes, args=(stop, times))
        t.start()
        start = time.perf_counter()
        if phase == "idle":
            time.sleep(1.0)
        else:
            for path in files:
                path.unlink()
        result[f"{phase}_seconds"] = time.perf_counter() - start
        stop.set()
        t.join()
        found = sl.stats(times or [float("nan")])  # (a tiny removal may beat every flush)
        result[f"flush_{phase}"] = found | {"max_ms": max(times, default=float("nan")) * 1e3}
    (where / "wal").unlink()
    harness.log(f"retire: unlink probe {json.dumps(result)}")
    return result


def mount_options(path: Path | None = None) -> str:
    """The options of the file system that holds ``path`` (``bench/.work``; Linux)."""
    import os

    best = ("", "")
    target = os.path.realpath(path or harness.WORK)
    with open("/proc/mounts") as f:
        for line in f:
            _, point, kind, options, *_ = line.split()
            if target.startswith(point) and len(point) > len(best[0]):
                best = (point, f"{kind} {options}")
    return best[1]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    p.add_argument("--rows-per-day", type=int, default=5_555_555)
    p.add_argument("--live-per-day", type=int, default=300_000)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--out", default=str(harness.WORK / "scale-retire.json"))
    p.add_argument("--again", type=int, default=0,
                   help="fill days 0 and 1 again and repeat, this many times")  # fmt: skip
    p.add_argument("--unlink-probe", type=float, default=0.0, metavar="GB",
                   help="only time removing GB of files on this file system")  # fmt: skip
    p.add_argument("--where", type=Path, default=None,
                   help="the unlink probe's directory (default bench/.work)")  # fmt: skip
    p.add_argument("--tablespace", default=None,
                   help="put the partitioned journal in this tablespace (another file system)")
    args = p.parse_args(argv)
    if args.unlink_probe:
        return unlink_probe(args.unlink_probe, args.where)
    harness.setup_django()
    state = prepare(args.rows_per_day, args.live_per_day, args.tablespace)
    harness.log(f"retire: filled {json.dumps(state)}")
    store = ab.stores()[1]
    result = {"layout": "retire", "commit": sl.commit(), "args": vars(args), **state,
              "rounds": [round_of(store, state, args.samples)]}  # fmt: skip
    sl.save(result, Path(args.out))
    for _ in range(args.again):
        with ab.cursor(ALIAS) as cur:
            sl.refill_expired(cur, ALIAS, state, args.rows_per_day)
        result["rounds"].append(round_of(store, state, args.samples))
        sl.save(result, Path(args.out))
    return result


if __name__ == "__main__":
    main()
