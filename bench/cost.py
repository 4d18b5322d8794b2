"""Scenario ``cost``: where each task's time goes, by process, plain Celery vs the guard.

The same deliveries as ``throughput`` (no-op and 5 ms bodies, one ``celery worker -P
prefork``) for plain Celery, ``GroussetTask`` on PostgreSQL (per-task claim and
``WORKER_CLAIM``) and the hand-rolled raw psycopg claim, in alternating order over
several rounds. While a worker drains its queue, the CPU time every process on the
machine has used (``/proc/<pid>/stat``; Linux only) is read at 5 % and at 95 % of the
deliveries, and the difference is divided by the tasks done in between and grouped: the
pool children, the worker's parent process, the PostgreSQL server (its backends, reaped
ones included), the Redis server, everything else; and the machine's busy CPU time
(``/proc/stat``).

From the same window: the *child cycle*, the wall time one pool child spends per
task (concurrency x wall time / tasks), and what the guard adds to it. Before the
rounds, the round trips the guard cannot avoid are measured on this machine: a
``SELECT 1``, a one-row ``INSERT`` committed durably (``synchronous_commit = on``,
no index) and a Redis ``PING``. The notes give the best ratio to plain Celery that
*any* guard making two durable round trips per task from the pool child (the claim
before the effect, the completion before the ack) can reach at this concurrency:
plain cycle / (plain cycle + 2 x durable commit round trip), before any server or
client CPU is counted.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench import harness, report
from bench.store_micro import _connect
from bench.throughput import BODIES, VARIANTS, run_variant

CHOSEN = ("plain", "grousset-pg", "grousset-pg-batch", "raw-pg")
GROUPS = ("pool children", "worker parent", "PostgreSQL", "Redis", "other")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _processes() -> dict[int, tuple[str, str, int, int, int]]:
    """pid -> (comm, cmdline head, ppid, own CPU ticks, reaped children's CPU ticks)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()[:80]
        except OSError:
            continue  # gone in between
        close = stat.rindex(")")
        comm = stat[stat.index("(") + 1 : close]
        fields = stat[close + 2 :].split()
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
        text = cmd.replace(b"\0", b" ").decode(errors="replace")
        out[int(entry)] = (comm, text, int(fields[1]), utime + stime, cutime + cstime)
    return out


def cpu_by_group(worker_pid: int) -> dict[str, float]:
    """CPU seconds used so far by each group of processes (see the module doc)."""
    totals = dict.fromkeys(GROUPS, 0.0)
    for pid, (comm, cmd, ppid, own, reaped) in _processes().items():
        if pid == worker_pid:
            group = "worker parent"
        elif ppid == worker_pid:
            group = "pool children"
        elif comm.startswith("postgres") or cmd.startswith("postgres"):
            group = "PostgreSQL"
            if cmd.startswith("/"):  # the postmaster: add the backends it has reaped
                own += reaped
        elif comm.startswith("redis-server"):
            group = "Redis"
        else:
            group = "other"
        totals[group] += own / TICK
    return totals


def busy_cpu() -> float:
    """CPU seconds the machine has been busy (all CPUs), from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / TICK  # minus idle and iowait


def _median_us(call: Callable[[int], object], samples: int, warmup: int = 50) -> float:
    """Median microseconds of ``call(i)`` over ``samples`` calls, after ``warmup``."""
    times = []
    for i in range(samples + warmup):
        t0 = time.perf_counter()
        call(i)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def round_trips(samples: int = 2000) -> dict[str, float]:
    """Median microseconds of the round trips a guard cannot avoid, on this machine."""
    harness.prepare_database("postgresql")
    _, conn = _connect("postgresql")
    with conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_rtt (k bigint)")
        conn.execute("TRUNCATE bench_rtt")
        conn.execute("SET synchronous_commit = on")
        statements = {"SELECT 1": "SELECT %s::int",
                      "durable INSERT commit": "INSERT INTO bench_rtt VALUES (%s)"}  # fmt: skip
        out: dict[str, float] = {}
        for label, sql in statements.items():

            def execute(i: int, sql: str = sql) -> object:
                return conn.execute(sql, (i,), prepare=True)

            out[label] = _median_us(execute, samples)
        conn.execute("DROP TABLE bench_rtt")
    client = harness.redis_client(harness.STATE_URL)
    out["Redis PING"] = _median_us(lambda _: client.ping(), samples)
    return out


def measure(name: str, n: int, concurrency: int, prefetch: int,
            sleep: float) -> dict[str, float]:  # fmt: skip
    """Drain ``n`` deliveries; CPU µs per task by group, rate and child cycle."""
    marks = []

    def read_counters(worker: harness.Worker) -> None:
        deadline = time.monotonic() + 120 + n * (sleep + 0.02)
        for fraction in (0.05, 0.95):
            while (done := worker.stats().ok) < n * fraction:
                if worker.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: worker stalled at {done}/{n}: {worker.tail()}")
                time.sleep(0.02)
            marks.append((time.monotonic(), done, cpu_by_group(worker.proc.pid), busy_cpu()))

    stats = run_variant(VARIANTS[name], n, sleep, prefetch, concurrency=concurrency,
                        watch=read_counters)  # fmt: skip
    (t0, done0, cpu0, busy0), (t1, done1, cpu1, busy1) = marks
    tasks = done1 - done0
    if tasks < n / 2:  # the children report every 0.2 s: a short drain has no window
        raise RuntimeError(
            f"{name}: only {tasks} of {n} deliveries fell between the two CPU readings "
            "(the pool children report every 0.2 s): use a larger --n"
        )
    out = {g: (cpu1[g] - cpu0[g]) / tasks * 1e6 for g in GROUPS}
    out["all (machine)"] = (busy1 - busy0) / tasks * 1e6
    out["busy %"] = 100 * (busy1 - busy0) / ((t1 - t0) * (os.cpu_count() or 1))
    out["child cycle"] = concurrency * (t1 - t0) / tasks * 1e6
    out["tasks/s"] = stats.ok / stats.seconds
    return out


def run(n: int, rounds: int, bodies: list[str], concurrency: int, prefetch: int,
        record: bool) -> dict[str, object]:  # fmt: skip
    harness.setup_django()
    rtt = round_trips()
    harness.log("round trips (median µs): " + ", ".join(f"{k} {v:.0f}" for k, v in rtt.items()))
    figures: dict[tuple[str, str], list[dict[str, float]]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        order = CHOSEN if r % 2 == 0 else tuple(reversed(CHOSEN))
        for body in bodies:
            this_round = {}
            for name in order:
                this_round[name] = measure(name, n, concurrency, prefetch, BODIES[body])
                figures.setdefault((body, name), []).append(this_round[name])
                shown = " ".join(f"{k}={v:.0f}" for k, v in this_round[name].items())
                harness.log(f"round {r + 1}/{rounds} {body:8} {name:12} {shown}")
            for name in CHOSEN:
                ratio = this_round[name]["tasks/s"] / this_round["plain"]["tasks/s"]
                ratios.setdefault((body, name), []).append(ratio)

    def med(body: str, name: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[(body, name)])

    headers = ["body", "variant", "tasks/s", "vs plain", *(f"{g} µs" for g in GROUPS),
               "all µs (machine)", "CPU busy", "child cycle µs", "added per task µs"]  # fmt: skip
    rows = []
    durable = rtt["durable INSERT commit"]
    notes = [
        "CPU µs = CPU time per task of each group of processes, between 5 % and 95 % of "
        "the deliveries (medians of the rounds); child cycle = wall time per task of one "
        f"pool child (concurrency {concurrency} x wall / tasks).",
        "Round trips measured before the rounds (median µs): "
        + ", ".join(f"{k} {v:.0f}" for k, v in rtt.items()) + ".",
    ]  # fmt: skip
    bounds = {}
    for body in bodies:
        plain_cycle = med(body, "plain", "child cycle")
        for name in CHOSEN:
            rows.append([
                body, VARIANTS[name].label, f"{med(body, name, 'tasks/s'):.0f}",
                f"{statistics.median(ratios[(body, name)]):.2f}x",
                *(f"{med(body, name, g):.0f}" for g in GROUPS),
                f"{med(body, name, 'all (machine)'):.0f}", f"{med(body, name, 'busy %'):.0f} %",
                f"{med(body, name, 'child cycle'):.0f}",
                f"{med(body, name, 'child cycle') - plain_cycle:+.0f}",
            ])  # fmt: skip
        bounds[body] = plain_cycle / (plain_cycle + 2 * durable)
        notes.append(
            f"Bound, {body} body: a guard making two durable round trips per task from the "
            f"pool child, with no CPU of its own, reaches at most plain cycle / (plain cycle "
            f"+ 2 x {durable:.0f} µs) = {plain_cycle:.0f} / {plain_cycle + 2 * durable:.0f} "
            f"= {bounds[body]:.2f}x of plain Celery here."
        )
        notes.append(
            f"Bound, {body} body, WORKER_CLAIM (the claim leaves the pool child; its durable "
            f"completion stays): {plain_cycle:.0f} / {plain_cycle + durable:.0f} = "
            f"{plain_cycle / (plain_cycle + durable):.2f}x, if the worker's main process "
            "keeps up."
        )
    first = bodies[0]
    plot = report.bar_plot(
        "cost",
        groups=[*GROUPS, "child cycle ÷ 4"],
        series={VARIANTS[name].label: [*(med(first, name, g) for g in GROUPS),
                                       med(first, name, "child cycle") / 4] for name in CHOSEN},
        ylabel="µs per task",
        title=f"CPU per task by process, {first} body, {n} deliveries, prefork -c {concurrency}",
    )  # fmt: skip
    worker = f"celery worker -P prefork -c {concurrency}, acks_late, Redis broker"
    params = {"n": n, "rounds": rounds, "bodies": ",".join(bodies),
              "prefetch multiplier": prefetch, "worker": worker}  # fmt: skip
    report.emit("cost", params, headers, rows, plot, record, notes)
    return {"bounds": bounds, "rtt": rtt, "ratios": ratios}
