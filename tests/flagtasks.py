"""Tasks for the worker-flag and metrics tests, registered on the test app only by
:mod:`tests.flagapp` (worker processes), never in the pytest process."""

from __future__ import annotations

import os
from typing import Any

from celery_grousset import GroussetTask
from tests.celeryapp import app
from tests.tasks import record


def _attempt(task: Any) -> dict[str, Any]:
    attempt = task.grousset  # fence 0 when the worker runs with --grousset-bypass
    return {
        "pid": os.getpid(),
        "fingerprint": attempt.fingerprint if attempt else None,
        "processor_id": attempt.processor_id if attempt else None,
        "fence": attempt.fence if attempt else None,
    }


@app.task(
    base=GroussetTask, bind=True, shared=False, name="tests.flagtasks.probe", max_processing_time=30
)
def probe(self: Any, key: str) -> dict[str, Any]:
    """A guarded effect that reports the attempt it ran as."""
    record(key, "probe")
    return _attempt(self)


@app.task(base=GroussetTask, bind=True, shared=False, name="tests.flagtasks.unbounded")
def unbounded(self: Any, key: str) -> dict[str, Any]:
    """No max_processing_time: runs only with --grousset-max-processing-time."""
    record(key, "unbounded")
    return {**_attempt(self), "max_processing_time": self.grousset_options().max_processing_time}


@app.task(bind=True, shared=False, name="tests.flagtasks.forgot_base", max_processing_time=30)
def forgot_base(self: Any, key: str) -> None:
    """Given a guard option but not base=GroussetTask: unguarded (check W011)."""
    record(key, "forgot_base")


@app.task(base=GroussetTask, bind=True, shared=False, name="tests.flagtasks.refused",
          max_processing_time=30, on_failure="memoize")  # fmt: skip
def refused(self: Any, key: str) -> None:
    """A guarded effect that fails, its failure memoized: duplicates raise it again."""
    record(key, "refused")
    raise ValueError(f"refused {key}")
