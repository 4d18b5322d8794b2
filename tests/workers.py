"""Real ``celery worker`` processes for the tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "artifacts" / "worker-logs"


class Worker:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, name: str) -> None:
        self.proc = proc
        self.log = log
        self.name = name
        self.terminated = False

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def children(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]

    def terminate(self) -> None:
        """Begin its warm shutdown (once: a second SIGTERM is not sent by :meth:`stop`)."""
        if self.proc.poll() is None and not self.terminated:
            self.proc.send_signal(signal.SIGTERM)
            self.terminated = True

    def stop(self, timeout: float = 15) -> None:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        for pid in self.children():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def logged(queue: str, text: str) -> bool:
    """Whether a worker of ``queue`` has logged ``text`` (its log files, by name)."""
    return any(text in log.read_text(errors="replace") for log in LOGS.glob(f"{queue}-*.log"))


def start_worker(
    queue: str,
    *,
    database: str,
    broker: str,
    concurrency: int = 2,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
    ready_timeout: float = 60,
    app: str = "tests.celeryapp",
    log_prefix: str = "",
    drop_env: tuple[str, ...] = (),
) -> Worker:
    LOGS.mkdir(parents=True, exist_ok=True)
    name = f"w{uuid.uuid4().hex[:8]}"
    log = LOGS / f"{log_prefix}{queue}-{name}.log"
    full_env = _environment(queue, database, broker, env)
    for var in drop_env:
        full_env.pop(var, None)
    extra, pool = list(extra or []), "prefork"
    if "-P" in extra:  # in place of prefork: Celery patches for gevent by the FIRST -P only
        at = extra.index("-P")
        pool = extra.pop(at + 1)
        del extra[at]
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-Q",
        queue,
        "-n",
        f"{name}@%h",
        "-l",
        "info",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        *extra,
    ]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=fh, stderr=subprocess.STDOUT)
    worker = Worker(proc, log, name)
    if ready_timeout:
        ready(worker, ready_timeout)
    return worker


def ready(worker: Worker, timeout: float = 60) -> Worker:
    """Wait until ``worker`` says it is ready (it exited, or not in time: RuntimeError)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.proc.poll() is not None:
            raise RuntimeError(
                f"worker exited with {worker.proc.returncode}:\n{worker.text()[-3000:]}"
            )
        if " ready." in worker.text():
            return worker
        time.sleep(0.1)
    worker.kill()
    raise RuntimeError(f"worker not ready after {timeout}s:\n{worker.text()[-3000:]}")


def _environment(
    queue: str, database: str, broker: str, env: dict[str, str] | None
) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "GROUSSET_TEST_DB": database,
        "GROUSSET_TEST_BROKER": broker,
        "GROUSSET_TEST_QUEUE": queue,
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }


def start_beat(
    queue: str,
    *,
    database: str,
    broker: str,
    schedule_dir: Path,
    env: dict[str, str] | None = None,
    app: str = "tests.beatapp",
    ready_timeout: float = 60,
) -> Worker:
    """A real ``celery beat`` process with its own schedule file in ``schedule_dir``,
    publishing to ``queue``; logs at debug level (each publish's task id)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    schedule_dir.mkdir(parents=True, exist_ok=True)
    name = f"beat{uuid.uuid4().hex[:8]}"
    log = LOGS / f"{queue}-{name}.log"
    cmd = [
        sys.executable, "-m", "celery", "-A", app, "beat", "-l", "debug",
        "-s", str(schedule_dir / f"{name}.db"), "--pidfile", str(schedule_dir / f"{name}.pid"),
    ]  # fmt: skip
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=_environment(queue, database, broker, env), stdout=fh,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    beat = Worker(proc, log, name)
    deadline = time.monotonic() + ready_timeout
    while "beat: Starting..." not in beat.text():
        if proc.poll() is not None or time.monotonic() > deadline:
            beat.kill()
            raise RuntimeError(f"celery beat did not start:\n{beat.text()[-3000:]}")
        time.sleep(0.1)
    return beat


@contextmanager
def workers(queue: str, count: int = 1, **kwargs: object) -> Iterator[list[Worker]]:
    """``count`` workers on ``queue``, started side by side and stopped side by side."""
    timeout = float(kwargs.pop("ready_timeout", 60))  # type: ignore[arg-type]
    started: list[Worker] = []
    try:
        for _ in range(count):
            started.append(start_worker(queue, ready_timeout=0, **kwargs))  # type: ignore[arg-type]
        for w in started:
            ready(w, timeout)
        yield started
    finally:
        for w in started:  # each begins its warm shutdown, then each is waited for
            w.terminate()
        for w in started:
            w.stop()
