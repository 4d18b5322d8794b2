"""Scenario ``profile``: py-spy on a worker child of the GroussetTask (PostgreSQL) variant.

Publishes N no-op deliveries, starts the worker, and once it is busy records
both pool children with ``py-spy record`` for ``seconds``: a flame graph of one
(bench/profile-pg.svg; waits on sockets included, idle excluded), and collapsed
stacks of the other sampled only while it holds the GIL (``--gil``: Python CPU
time), from which the inclusive share of each step of the guard is printed.
The bench's own probe thread is left out of the shares.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from bench import harness
from bench.throughput import VARIANTS

SVG = harness.BENCH / "profile-pg.svg"
RAW = harness.WORK / "profile-pg.txt"

#: steps of the guard path: (label, substring of a py-spy frame)
STEPS = [
    ("GroussetTask.__call__ (whole guard + body)", "__call__ (celery_grousset/task.py"),
    ("fingerprint", "fingerprint (celery_grousset/fingerprint.py"),
    ("args_repr / redaction", "_args_repr (celery_grousset/task.py"),
    ("options + ClaimRequest", "request (celery_grousset/guard.py"),
    ("store claim (whole)", "claim (celery_grousset/store/postgresql.py"),
    ("psycopg execute (claim + finish)", "execute (psycopg/connection.py"),
    ("run_owned (body + memo + finish)", "run_owned (celery_grousset/guard.py"),
    ("memo encode", "encode (celery_grousset/memo.py"),
    ("store finish", "finish (celery_grousset/store/postgresql.py"),
    ("events (claimed/logging/signals)", "(celery_grousset/events.py"),
    ("Celery trace_task (all of a task)", "trace_task (celery/app/trace.py"),
    ("Django fixup (close connections)", "(celery/fixups/django.py"),
    ("result backend store", "store_result (celery/backends/"),
    ("kombu / broker I/O", "(kombu/"),
]


def summarize(raw: Path, top: int = 15) -> str:
    """Inclusive share of samples per guard step, and the hottest leaf frames."""
    total = 0
    inclusive: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        if any("(bench/probe.py" in f for f in frames):
            continue  # the measuring thread
        total += count
        leaves[frames[-1]] += count
        for label, needle in STEPS:
            if any(needle in f for f in frames):
                inclusive[label] += count
    if not total:
        return "no samples"
    out = [f"{total} samples of one pool child while it held the GIL (Python CPU time)", "",
           "| guard step | inclusive % of samples |", "|---|---|"]  # fmt: skip
    out += [f"| {label} | {100 * inclusive[label] / total:.1f} |" for label, _ in STEPS]
    out += ["", "| hottest leaf frame | self % |", "|---|---|"]
    out += [f"| `{frame}` | {100 * n / total:.1f} |" for frame, n in leaves.most_common(top)]
    return "\n".join(out)


def run(n: int, seconds: int, prefetch: int) -> str:
    harness.setup_django()
    variant = VARIANTS["grousset-pg"]
    harness.reset_redis()
    harness.truncate(variant.alias or "postgresql")
    run_id = uuid.uuid4().hex[:8]
    harness.publish(variant.task, (f"{run_id}-{i}" for i in range(n)), 0.0)
    worker = harness.Worker({**variant.env, "BENCH_PREFETCH": str(prefetch)})
    try:
        deadline = time.monotonic() + 60
        while worker.stats().ok < 100:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker made no progress: {worker.tail()}")
            time.sleep(0.2)
        children = worker.children()
        spy = str(Path(sys.executable).with_name("py-spy"))
        procs = [
            subprocess.Popen([spy, "record", "-o", str(SVG), "--pid", str(children[0]),
                              "--duration", str(seconds), "--nonblocking", "--rate", "200"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT),
            subprocess.Popen([spy, "record", "-o", str(RAW), "--format", "raw", "--gil",
                              "--pid", str(children[-1]), "--duration", str(seconds),
                              "--rate", "200", "--nonblocking"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT),
        ]  # fmt: skip
        for proc in procs:
            proc.wait(seconds + 60)
        done = worker.stats().ok
    finally:
        worker.stop()
    summary = summarize(RAW)
    print(f"\n== profile (GroussetTask, PostgreSQL, no-op body; {done} tasks done) ==")
    print(summary)
    print(f"  flame graph: {SVG.relative_to(harness.ROOT)}; "
          f"collapsed stacks: {RAW.relative_to(harness.ROOT)}")
    return summary
