"""``python -m bench [SCENARIO ...] [options]`` — the benchmarks' one entry point.

Scenarios (default: all but ``profile``):

* ``throughput`` — N distinct deliveries, one ``celery worker -P prefork -c 2``:
  plain Celery, GroussetTask on PostgreSQL (durable and CLAIM_COMMIT=async) and SQLite,
  a raw psycopg claim,
  celery-once, Powertools; no-op and 5 ms bodies; ratios to plain Celery.
* ``duplicates`` — every key delivered 5x (20 ms body): wall time and effects.
* ``store`` — the claim store per call (claim + complete, duplicate claim) on
  PostgreSQL, SQLite and MariaDB against raw-driver floors; statements per call.
* ``scale`` — claim latency with 0 / 1M / 10M rows in the journal; purge rate and RSS.
  With ``--scale-layouts``: the single table and the partitioned journal side by side
  (``bench.scale_ab``: 0 / 10M / 50M rows, retention of a day, WAL; docs/scale.md).
* ``cost`` — CPU per task by process (pool children, worker parent, PostgreSQL,
  Redis) and the pool child's wall time per task, plain vs GroussetTask (per-task
  claim and WORKER_CLAIM) vs the raw claim; the round trips a guard cannot avoid and
  the ratio they bound it to.
* ``profile`` — py-spy on a worker child of the GroussetTask (PostgreSQL) variant.

Every scenario prints its table, appends it to bench/RESULTS.md and draws a PNG
under bench/plots/ (the latest also goes to docs/img/bench/).
"""

from __future__ import annotations

import argparse
import sys
import time

SCENARIOS = ("throughput", "duplicates", "store", "scale", "cost", "profile")
DEFAULT = ("throughput", "duplicates", "store", "scale", "cost")


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _ints(text: str) -> list[int]:
    return [int(float(part)) for part in _csv(text)]


def parser() -> argparse.ArgumentParser:
    from bench.throughput import BODIES, VARIANTS

    p = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.split("\n\n", 1)[1].split("\n\nEvery")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help=f"one of {', '.join(SCENARIOS)} (default: all but profile)")
    p.add_argument("--quick", action="store_true",
                   help="a small version of every scenario (< 3 minutes; checks the plumbing)")
    p.add_argument("--n", type=int, default=None,
                   help="throughput, cost: deliveries per variant and round "
                   "(default 20000; cost 10000, at least 2000)")
    p.add_argument("--rounds", type=int, default=None, help="rounds; medians reported (default 3)")
    p.add_argument("--variants", type=_csv, default=list(VARIANTS),
                   help=f"throughput variants, comma-separated (default: {','.join(VARIANTS)})")
    p.add_argument("--bodies", type=_csv, default=list(BODIES),
                   help=f"throughput, cost: task bodies (default: {','.join(BODIES)})")
    p.add_argument("--concurrency", type=int, default=2,
                   help="throughput, cost: the worker's -c (default 2, the targets' setting)")
    p.add_argument("--prefetch", type=int, default=4,
                   help="worker_prefetch_multiplier, the same for every variant (default 4)")
    p.add_argument("--dup-keys", type=int, default=None,
                   help="duplicates: distinct keys, each delivered 5x (default 2000)")
    p.add_argument("--dup-variants", type=_csv, default=["grousset-pg"],
                   help="duplicates: guarded variants beside plain Celery (default grousset-pg;"
                   " e.g. grousset-pg,grousset-pg-batch)")
    p.add_argument("--store-iterations", type=int, default=None,
                   help="store: calls per measurement (default 3000)")
    p.add_argument("--scale-rows", type=_ints, default=None,
                   help="scale: journal sizes after empty (default 1000000,10000000)")
    p.add_argument("--scale-layouts", action="store_true",
                   help="scale: the single table vs the partitioned journal side by side "
                   "(bench.scale_ab; BENCH_PG_NAME must name a *scale* scratch database; "
                   "default sizes 10000000,50000000)")
    p.add_argument("--purge-rows", type=int, default=None,
                   help="scale: expired rows to purge (default 1000000)")
    p.add_argument("--profile-seconds", type=int, default=15,
                   help="profile: py-spy duration (default 15)")
    p.add_argument("--no-record", action="store_true",
                   help="print only: do not append to RESULTS.md")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    quick = args.quick
    n = args.n or (400 if quick else 20_000)
    rounds = args.rounds or (1 if quick else 3)
    record = not args.no_record
    from bench import report

    report.RECORD = record
    report.TAG = " (--quick)" if quick else ""
    scenarios = args.scenarios or list(DEFAULT)
    # One run at a time: every run empties the bench's Redis databases and tables.
    import fcntl

    from bench.harness import WORK

    WORK.mkdir(parents=True, exist_ok=True)
    lock = open(WORK / "lock", "w")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        p.error("another `python -m bench` is running on this checkout (bench/.work/lock)")
    started = time.monotonic()
    for scenario in scenarios:
        t0 = time.monotonic()
        if scenario == "throughput":
            from bench import throughput

            throughput.run(n, rounds, args.variants, args.bodies, args.prefetch, record,
                           args.concurrency)
        elif scenario == "duplicates":
            from bench import duplicates

            keys = args.dup_keys or (100 if quick else 2000)
            duplicates.run(keys, rounds, args.prefetch, record, args.dup_variants)
        elif scenario == "store":
            from bench import store_micro

            store_micro.run(args.store_iterations or (300 if quick else 3000), record)
        elif scenario == "scale":
            from bench import scale, scale_ab

            samples = 300 if quick else 2000
            if args.scale_layouts:
                sizes = args.scale_rows or ([100_000] if quick else [10_000_000, 50_000_000])
                scale_ab.main(["--sizes", ",".join(map(str, sizes)), "--samples", str(samples),
                               *(["--record"] if record else [])])  # fmt: skip
            else:
                sizes = args.scale_rows or ([10_000, 100_000] if quick else [1_000_000, 10_000_000])
                purge = args.purge_rows or (50_000 if quick else 1_000_000)
                scale.run(sizes, purge, samples, record)
        elif scenario == "cost":
            from bench import cost

            cost.run(args.n or (2000 if quick else 10_000), rounds, args.bodies,
                     args.concurrency, args.prefetch, record)
        elif scenario == "profile":
            from bench import profile

            profile.run(args.n or 12_000, args.profile_seconds, args.prefetch)
        print(f"  ({scenario}: {time.monotonic() - t0:.0f} s)", flush=True)
    print(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
