"""Scenario ``throughput``: N distinct deliveries drained by one prefork worker (-c 2 by default).

Every variant runs in the same round on the same Celery app config and the same
Django setup; the order of the variants alternates between rounds; medians of
tasks/s and of the ratio to plain Celery in the same round are reported.
"""

from __future__ import annotations

import math
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from bench import harness, report


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    task: str
    #: database alias to empty before a run (None: nothing to empty)
    alias: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: SQL counting the claims that completed (checked against N)
    check: str | None = None


JOURNAL_DONE = (
    f"SELECT count(*) FROM {harness.JOURNAL} WHERE status = 'completed' "
    "AND processor_id = 'bench' AND task_name = 'bench.grousset'"
)

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("plain", "plain Celery", "bench.plain"),
        Variant("grousset-pg", "GroussetTask (PostgreSQL)", "bench.grousset", "postgresql",
                {"BENCH_GROUSSET_DB": "postgresql"}, JOURNAL_DONE),
        # The opt-in knob, for comparison only: the targets use the default ("durable").
        Variant("grousset-pg-async", "GroussetTask (PostgreSQL, CLAIM_COMMIT=async)",
                "bench.grousset", "postgresql",
                {"BENCH_GROUSSET_DB": "postgresql", "BENCH_CLAIM_COMMIT": "async"}, JOURNAL_DONE),
        # The opt-in main-process claim (GROUSSET["WORKER_CLAIM"], first version).
        Variant("grousset-pg-batch", "GroussetTask (PostgreSQL, WORKER_CLAIM)",
                "bench.grousset", "postgresql",
                {"BENCH_GROUSSET_DB": "postgresql", "BENCH_WORKER_CLAIM": "1"}, JOURNAL_DONE),
        # ... with the claim thread waiting up to 2 ms for more requests before a pass
        Variant("grousset-pg-batch-2ms",
                "GroussetTask (PostgreSQL, WORKER_CLAIM, flush delay 2 ms)",
                "bench.grousset", "postgresql",
                {"BENCH_GROUSSET_DB": "postgresql", "BENCH_WORKER_CLAIM": "1",
                 "BENCH_WORKER_CLAIM_FLUSH_DELAY": "0.002"}, JOURNAL_DONE),
        Variant("grousset-sqlite", "GroussetTask (SQLite)", "bench.grousset", "default",
                {"BENCH_GROUSSET_DB": "default"}, JOURNAL_DONE),
        Variant("raw-pg", "raw psycopg INSERT…ON CONFLICT + UPDATE", "bench.raw_pg",
                "postgresql", {}, "SELECT count(*) FROM bench_raw_claim WHERE status = 'done'"),
        Variant("celery-once", "celery-once QueueOnce (Redis)", "bench.once"),
        Variant("powertools", "Powertools idempotent_function (Redis)", "bench.powertools"),
    )
}  # fmt: skip

BODIES = {"noop": 0.0, "sleep5ms": 0.005}


def run_variant(variant: Variant, n: int, sleep: float, prefetch: int,
                record_keys: bool = False, concurrency: int = 2,
                watch: Callable[[harness.Worker], object] | None = None,
                ) -> harness.RunStats:  # fmt: skip
    """Pre-publish ``n`` messages, drain them with a fresh worker, return its stats.

    ``watch`` is called with the worker once it has started, while it drains (the
    ``cost`` scenario reads CPU counters from it)."""
    slow = harness.SlowSteps(variant.name)
    with slow("emptying Redis and the journal"):
        harness.reset_redis()
        if variant.alias:
            harness.truncate(variant.alias)
    run = uuid.uuid4().hex[:8]
    with slow("publishing"):
        harness.publish(variant.task, (f"{run}-{i}" for i in range(n)), sleep)
    env = {**variant.env, "BENCH_PREFETCH": str(prefetch)}
    if record_keys:
        env["BENCH_RECORD_KEYS"] = "1"
    commits = harness.xact_commits(variant.alias) if variant.alias else None
    worker = harness.Worker(env, concurrency)
    try:
        if watch is not None:
            watch(worker)
        stats = worker.wait(n, timeout=120 + n * (sleep + 0.02))
    finally:
        with slow("stopping the worker"):
            worker.stop()
    if commits is not None:  # the worker's sessions have ended: their counts are flushed
        stats.commits_per_task = (harness.xact_commits(variant.alias) - commits) / n
    if worker.final["statements"]:
        stats.statements_per_task = worker.final["statements"] / n
    if worker.final["passes"]:
        stats.average_batch = worker.final["claimed"] / worker.final["passes"]
    if stats.fail:
        raise RuntimeError(f"{variant.name}: {stats.fail} deliveries failed: {worker.tail()}")
    if variant.check and variant.alias:
        done = harness.count_rows(variant.alias, variant.check)
        if done != n:
            raise RuntimeError(f"{variant.name}: {done} completed records for {n} deliveries")
    return stats


def run(n: int, rounds: int, variants: list[str], bodies: list[str], prefetch: int,
        record: bool, concurrency: int = 2) -> dict[str, object]:  # fmt: skip
    """Run the scenario; print the table; append it to RESULTS.md."""
    harness.setup_django()
    chosen = [VARIANTS["plain"]] + [VARIANTS[v] for v in variants if v != "plain"]
    rates: dict[tuple[str, str], list[float]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    commits: dict[tuple[str, str], list[float]] = {}
    statements: dict[tuple[str, str], list[float]] = {}
    batches: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        order = chosen if r % 2 == 0 else list(reversed(chosen))
        for body in bodies:
            by_name: dict[str, float] = {}
            for variant in order:
                t0 = time.monotonic()
                try:
                    stats = run_variant(variant, n, BODIES[body], prefetch,
                                        concurrency=concurrency)
                    rate = stats.ok / stats.seconds
                    for into, value in ((commits, stats.commits_per_task),
                                        (statements, stats.statements_per_task),
                                        (batches, stats.average_batch)):  # fmt: skip
                        if value is not None:
                            into.setdefault((body, variant.name), []).append(value)
                except RuntimeError as exc:  # reported, the other variants still run
                    harness.log(f"{variant.name} {body} FAILED: {exc}")
                    rate = math.nan
                by_name[variant.name] = rate
                rates.setdefault((body, variant.name), []).append(rate)
                harness.log(f"round {r + 1}/{rounds} {body:8} {variant.name:16} "
                            f"{rate:8.1f} tasks/s ({time.monotonic() - t0:.0f}s incl. setup)")
            for name, rate in by_name.items():
                ratios.setdefault((body, name), []).append(rate / by_name["plain"])
    rows = []

    def med(values: list[float]) -> float:
        ok = [v for v in values if not math.isnan(v)]
        return statistics.median(ok) if ok else math.nan

    for body in bodies:
        for variant in chosen:
            key = (body, variant.name)
            per_task = [f"{med(d[key]):.2f}" if key in d else "n/a"
                        for d in (commits, statements, batches)]  # fmt: skip
            rows.append([body, variant.label, f"{med(rates[key]):.1f}",
                         f"{med(ratios[key]):.2f}x",
                         " / ".join(f"{x:.2f}" for x in ratios[key]), *per_task])  # fmt: skip
    headers = ["body", "variant", "tasks/s (median)", "vs plain (median)", "ratio per round",
               "journal commits/task", "psycopg statements/task",
               "average claim batch"]  # fmt: skip
    worker = f"celery worker -P prefork -c {concurrency}, acks_late, Redis broker"
    params = {"n": n, "rounds": rounds, "prefetch multiplier": prefetch,
              "worker": worker}  # fmt: skip
    plot = report.bar_plot(
        "throughput",
        groups=bodies,
        series={v.label: [med(rates[(b, v.name)]) for b in bodies] for v in chosen},
        ylabel="tasks/s (median)",
        title=f"Throughput, {n} distinct deliveries, prefork -c {concurrency}",
    )
    report.emit("throughput", params, headers, rows, plot, record)
    return {"rates": rates, "ratios": ratios}
