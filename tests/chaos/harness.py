"""Chaos harness: real worker processes on the chaos app, journal and ledger
readers, and the tally each scenario leaves for the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.workers import ROOT, Worker
from tests.workers import start_worker as shared_start_worker

ARTIFACTS = ROOT / "tests" / "artifacts" / "chaos"
RESULTS = Path(os.environ.get("CHAOS_RESULTS", str(ARTIFACTS / "results.jsonl")))
APP = "tests.chaos.app"
#: the broker the test process publishes to (tests/settings.py: GROUSSET_TEST_BROKER)
BROKER = os.environ.get("GROUSSET_TEST_BROKER", "redis://127.0.0.1:6379/14")


def start_worker(queue: str, *, database: str, concurrency: int = 1,
                 env: dict[str, str] | None = None, extra: list[str] | None = None,
                 ready_timeout: float = 60, broker: str = BROKER) -> Worker:  # fmt: skip
    """``celery -A tests.chaos.app worker`` (prefork, acks_late, prefetch 1)."""
    return shared_start_worker(
        queue, database=database, broker=broker, concurrency=concurrency, env=env,
        extra=extra, ready_timeout=ready_timeout, app=APP, log_prefix="chaos-",
    )  # fmt: skip


@contextmanager
def workers(queue: str, count: int = 1, **kwargs: Any) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    try:
        for _ in range(count):
            started.append(start_worker(queue, **kwargs))
        yield started
    finally:
        for w in started:
            w.stop()
            if w.proc.poll() is None:
                w.kill()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def log_count(ws: list[Worker], needle: str) -> int:
    return sum(w.text().count(needle) for w in ws)


def stopped(pid: int) -> bool:
    """True when ``pid`` is in the stopped state (SIGSTOP)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "T"
    except (FileNotFoundError, IndexError):
        return False


def cont(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


# -- journal and ledger ------------------------------------------------------------------------


def reconnecting(alias: str, read: Callable[[], Any]) -> Any:
    """Run a read; if the test process' connection was dropped (a server restart by
    another session on this shared machine), reconnect once and read again."""
    from django.db import InterfaceError, OperationalError, connections

    try:
        return read()
    except (OperationalError, InterfaceError):
        connections[alias].close()
        return read()


def effects(alias: str, key: str, value: str | None = None) -> int:
    from tests.ledger.models import Effect

    qs = Effect.objects.using(alias).filter(key=key)
    qs = qs.filter(value=value) if value is not None else qs
    return int(reconnecting(alias, qs.count))


def fp_of(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> str:
    return str(task.grousset_fingerprint(args, kwargs or {}))


def record_of(alias: str, task: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any] | None = None) -> Any:  # fmt: skip
    from celery_grousset.models import Outcome

    fp = fp_of(task, args, kwargs)
    qs = Outcome.objects.using(alias).filter(task_name=task.name, fingerprint=fp)
    return reconnecting(alias, qs.first)


def holder_pid(alias: str, task: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any] | None = None, timeout: float = 30) -> int:  # fmt: skip
    """The pid of the worker child holding the claim (from the journal's ``worker``).

    With ``WORKER_CLAIM`` on, ``worker`` names the main process that claimed: the child
    running the body is then the one of its pool children that recorded the key's latest
    effect in the ledger, or (a transactional effect is not visible yet) the one a
    ``stop`` fault has stopped."""

    def find() -> int | None:
        rec = record_of(alias, task, args, kwargs)
        if rec is None or rec.status != "in_flight":
            return None
        pid = int(rec.worker.rsplit(":", 1)[1])
        children = _children(pid)
        if not children:  # the per-task path: the child claimed for itself
            return pid
        ran = [p for p in _ledger_pids(alias, str(args[0])) if p in children]
        if ran:
            return ran[-1]
        paused = [p for p in children if stopped(p)]
        return paused[0] if len(paused) == 1 else None

    return int(wait_for(find, timeout, "a claim to be held"))


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def _ledger_pids(alias: str, key: str) -> list[int]:
    """The pids that recorded an effect for ``key``, oldest first (committed rows)."""
    from tests.ledger.models import Effect

    rows = Effect.objects.using(alias).filter(key=key).order_by("id").values_list("pid", flat=True)
    return list(reconnecting(alias, lambda: list(rows)))


def memo_of(rec: Any) -> Any:
    from celery_grousset import memo

    raw = bytes(rec.result) if rec.result is not None else None
    return memo.decode(raw, rec.result_encoding, rec.error, rec.fingerprint)


def new_key(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- the tally a scenario leaves for REPORT.md --------------------------------------------------


@dataclass
class Tally:
    """Counts of one scenario run on one backend (one line of results.jsonl)."""

    scenario: str
    backend: str
    deliveries: int = 0
    effects: int = 0
    takeovers: int = 0
    fence_outs: int = 0
    max_duplicate_effects: int = 0
    notes: list[str] = field(default_factory=list)
    passed: bool | None = None

    def add_key(self, alias: str, key: str, rec: Any, value: str | None = None) -> None:
        """Add the ledger and journal counts of one call (``rec`` may be None)."""
        n = effects(alias, key, value)
        self.effects += n
        self.max_duplicate_effects = max(self.max_duplicate_effects, n - 1)
        if rec is not None:
            self.deliveries += int(rec.deliveries)
            self.takeovers += int(rec.takeovers)

    def add_logs(self, ws: list[Worker]) -> None:
        self.fence_outs += log_count(ws, "grousset.fenced_out")

    def write(self) -> None:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with open(RESULTS, "a") as fh:
            fh.write(json.dumps({**asdict(self), "at": time.time()}) + "\n")
