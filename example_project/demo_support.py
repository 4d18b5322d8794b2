"""Plumbing for :mod:`example_project.demo`: the demo folder, the worker process, tables.

Nothing here knows about celery-grousset; the demo's story is in ``demo.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from example_project import PROJECT_DIR

REPO_DIR = PROJECT_DIR.parent
T = TypeVar("T")

#: What the demo owns inside the demo folder (never anything else: the folder may be yours).
_DEMO_ENTRIES = ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm", "db.sqlite3-journal",
                 "broker", "results", "worker.log")  # fmt: skip


def demo_dir() -> Path:
    """The folder of the server-less defaults (same rule as ``proj.settings.DEMO_DIR``)."""
    return Path(os.environ.get("GROUSSET_DEMO_DIR") or REPO_DIR / ".demo").resolve()


def wipe(folder: Path) -> None:
    """Start from nothing: remove the demo's own files from ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in _DEMO_ENTRIES:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str,
             interval: float = 0.05) -> T:  # fmt: skip
    """Poll ``predicate`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")


class Worker:
    """One real ``celery -A proj worker`` process (prefork), logging to a file."""

    def __init__(self, log: Path, name: str, concurrency: int = 2) -> None:
        self.log = log
        self.name = name
        self.command = [
            sys.executable, "-m", "celery", "-A", "proj", "worker", "-P", "prefork",
            "-c", str(concurrency), "-n", f"{name}@%h", "-l", "info",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float = 60) -> float:
        """Start the worker; return the seconds it took to report ready."""
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "proj.settings",
            # proj and shop are top-level packages in example_project/
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(PROJECT_DIR), str(REPO_DIR), os.environ.get("PYTHONPATH")) if p
            ),
        }
        t0 = time.monotonic()
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(self.command, cwd=PROJECT_DIR, env=env, stdout=fh,
                                         stderr=subprocess.STDOUT)  # fmt: skip

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {self.proc.returncode}:\n"
                                   f"{self.tail()}")  # fmt: skip
            return " ready." in self.text()

        wait_for(ready, ready_timeout, "the worker to be ready", interval=0.1)
        return time.monotonic() - t0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def is_child(self, pid: int) -> bool:
        """Whether ``pid`` is one of this worker's pool processes."""
        out = subprocess.run(["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True,
                             text=True, check=False)  # fmt: skip
        return out.stdout.strip() == str(self.pid)

    def kill_child(self, pid: int) -> None:
        """SIGKILL one pool process of this worker (and nothing else)."""
        if not self.is_child(pid):
            raise RuntimeError(f"pid {pid} is not a pool process of worker {self.pid}")
        os.kill(pid, signal.SIGKILL)

    def stop(self, timeout: float = 20) -> int | None:
        """Warm shutdown (SIGTERM); SIGKILL only if it does not exit in ``timeout``."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                     text=True, check=False)  # fmt: skip
                for child in out.stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(child), signal.SIGKILL)
                proc.kill()
                proc.wait(10)
        return proc.returncode


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> str:
    """A plain-text table: columns separated by two spaces, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], int) for row in rows) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        columns = zip(row, widths, numeric, strict=True)
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in columns]
        return (indent + "  ".join(parts)).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def short(value: object, width: int = 18) -> str:
    """``value`` as text, cut to ``width`` characters with an ellipsis."""
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"
