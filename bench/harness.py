"""Plumbing shared by the scenarios: databases, Redis, publishing, real workers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
WORK = BENCH / ".work"
BROKER_URL = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/12")
STATE_URL = os.environ.get("BENCH_BACKEND", "redis://127.0.0.1:6379/11")
JOURNAL = "celery_grousset_outcome"


def setup_django() -> None:
    """Configure Django in this (the harness) process with the bench settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class SlowSteps:
    """Logs an untimed step of a run (setup, teardown) that took longer than ``limit``
    seconds: a full run showed some of them stalling for minutes, cause unknown."""

    def __init__(self, name: str, limit: float = 20.0) -> None:
        self.name, self.limit = name, limit

    @contextlib.contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            seconds = time.monotonic() - t0
            if seconds > self.limit:
                log(f"{self.name}: {step} took {seconds:.1f}s (not part of the timing)")


# -- Redis -----------------------------------------------------------------------------------


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def reset_redis() -> None:
    """Empty the bench's own Redis databases (broker and state), nothing else."""
    for url in (BROKER_URL, STATE_URL):
        redis_client(url).flushdb()


# -- databases -------------------------------------------------------------------------------

_ready: set[str] = set()


def prepare_database(alias: str) -> None:
    """Create the alias' database if missing and migrate it (once per process)."""
    if alias in _ready:
        return
    from django.core.management import call_command
    from django.db import connections

    settings = connections.settings[alias]
    engine = settings["ENGINE"]
    if "postgresql" in engine:
        import psycopg

        with psycopg.connect(host=settings["HOST"], port=settings["PORT"],
                             user=settings["USER"], dbname="postgres", autocommit=True) as c:
            name = settings["NAME"]
            if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                c.execute(f'CREATE DATABASE "{name}"')
    elif "mysql" in engine:
        import MySQLdb

        conn = MySQLdb.connect(host=settings["HOST"], port=int(settings["PORT"]), user="root",
                               passwd="")  # fmt: skip
        try:
            conn.cursor().execute(
                f"CREATE DATABASE IF NOT EXISTS `{settings['NAME']}` "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )
        finally:
            conn.close()
    call_command("migrate", database=alias, verbosity=0, interactive=False)
    with connections[alias].cursor() as cur:
        if "sqlite" in engine:
            cur.execute("PRAGMA journal_mode=WAL")
        if "postgresql" in engine:
            from bench.app import RAW_DDL

            cur.execute(RAW_DDL)
    _ready.add(alias)


def truncate(alias: str) -> None:
    """Empty the journal (and the raw-claim table) of ``alias``."""
    from django.db import connections

    prepare_database(alias)
    conn = connections[alias]
    with conn.cursor() as cur:
        if conn.vendor == "postgresql":
            cur.execute(f"TRUNCATE {JOURNAL}, bench_raw_claim")
        else:
            cur.execute(f"DELETE FROM {JOURNAL}")
    conn.close()


def xact_commits(alias: str) -> int | None:
    """Transactions committed in ``alias``'s database so far (PostgreSQL's
    ``pg_stat_database``; None elsewhere). The bench's journal database is its own, so
    the difference across a run is the run's commits (plus the harness's few)."""
    from django.db import connections

    conn = connections[alias]
    if conn.vendor != "postgresql":
        return None
    with conn.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")  # this session's own counts
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cur.fetchone()[0])


def count_rows(alias: str, sql: str) -> int:
    from django.db import connections

    with connections[alias].cursor() as cur:
        cur.execute(sql)
        return int(cur.fetchone()[0])


# -- publishing and workers ------------------------------------------------------------------


def publish(task_name: str, keys: Iterable[str], sleep: float) -> int:
    """Publish one message per key (before the worker starts: not measured)."""
    from bench.app import app

    task = app.tasks[task_name]
    n = 0
    # Celery's Redis result backend subscribes this process to every sent task's result
    # channel (so AsyncResult.get() need not poll) and unsubscribes when the AsyncResult
    # is collected. Nobody reads those replies here: with thousands of them the pub/sub
    # connection's buffers fill and the UNSUBSCRIBE sends block. One publish in seven
    # stalled for about two minutes (seen with py-spy, 2026-12-01; probably until Redis
    # drops the client at its pub/sub output-buffer limit, not confirmed). The bench
    # never waits on an AsyncResult, so the publisher skips the subscription; the
    # messages and the worker's result writes are unchanged.
    backend = app.backend
    backend.on_task_call = lambda producer, task_id: None
    try:
        with app.producer_or_acquire() as producer:
            for key in keys:
                task.apply_async((key, sleep), producer=producer)
                n += 1
    finally:
        del backend.on_task_call
    return n


@dataclass
class RunStats:
    """What the pool children measured in one worker run."""

    first: float
    last: float
    ok: int
    retry: int
    fail: int
    effects: int
    unique_effects: int
    #: journal commits per delivery (PostgreSQL variants; set by the scenario)
    commits_per_task: float | None = None
    #: statements sent through psycopg by the worker's processes, per delivery
    statements_per_task: float | None = None
    #: requests per claim pass of the main-process claim thread (``WORKER_CLAIM``)
    average_batch: float | None = None

    @property
    def seconds(self) -> float:
        return max(self.last - self.first, 1e-9)


def _read_stats(client: Any, key: str) -> RunStats:
    raw = client.hgetall(key)
    rows = [json.loads(v) for v in raw.values()]
    firsts = [r["first"] for r in rows if r.get("first")]
    lasts = [r["last"] for r in rows if r.get("last")]
    return RunStats(
        first=min(firsts) if firsts else 0.0,
        last=max(lasts) if lasts else 0.0,
        ok=sum(r.get("ok", 0) for r in rows),
        retry=sum(r.get("retry", 0) for r in rows),
        fail=sum(r.get("fail", 0) for r in rows),
        effects=sum(r.get("effects", 0) for r in rows),
        unique_effects=int(client.scard(f"{key}:keys")),
    )


#: what the worker's processes add up at the end of a run (see :meth:`Worker.totals`)
TOTALS = ("statements", "passes", "claimed")


class Worker:
    """One ``celery -A bench.app worker -P prefork -c 2`` process."""

    def __init__(self, env: dict[str, str], concurrency: int = 2) -> None:
        WORK.mkdir(parents=True, exist_ok=True)
        (WORK / "logs").mkdir(exist_ok=True)
        self.stats_key = f"bench:stats:{uuid.uuid4().hex[:10]}"
        self.log = WORK / "logs" / f"{self.stats_key.rsplit(':', 1)[1]}.log"
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "PYTHONPATH": str(ROOT),
            "BENCH_STATS_KEY": self.stats_key,
            "BENCH_BROKER": BROKER_URL,
            "BENCH_BACKEND": STATE_URL,
            **env,
        }
        cmd = [
            sys.executable, "-m", "celery", "-A", "bench.app", "worker", "-P", "prefork",
            "-c", str(concurrency), "-Q", full_env.get("BENCH_QUEUE", "bench"),
            "-n", f"bench-{uuid.uuid4().hex[:6]}@%h", "-l", "warning",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=fh,
                                         stderr=subprocess.STDOUT)  # fmt: skip
        self.client = redis_client(STATE_URL)
        self.final: dict[str, int] = dict.fromkeys(TOTALS, 0)

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                             text=True, check=False)  # fmt: skip
        return [int(p) for p in out.stdout.split()]

    def stats(self) -> RunStats:
        return _read_stats(self.client, self.stats_key)

    def wait(self, done: int, timeout: float) -> RunStats:
        """Until ``done`` deliveries have succeeded (or failed); returns the final stats."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if stats.ok + stats.fail >= done:
                time.sleep(0.5)  # one more flush of every child
                return self.stats()
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited ({self.proc.returncode}): {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"timeout after {timeout:.0f}s with {stats.ok}/{done} done: {self.tail()}"
                )
            time.sleep(0.2)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def totals(self) -> dict[str, int]:
        """Statements (pool children and main process), claim passes and claims: final
        once the worker has stopped (the main process writes its part at shutdown)."""
        rows = [json.loads(v) for v in self.client.hgetall(self.stats_key).values()]
        return {k: sum(r.get(k, 0) for r in rows) for k in TOTALS}

    def stop(self) -> None:
        """Warm shutdown (SIGTERM); ``self.final`` keeps :meth:`totals` from after it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                for pid in self.children():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait(10)
        self.final = self.totals()
        self.client.delete(self.stats_key, f"{self.stats_key}:keys")
