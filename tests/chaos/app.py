"""The Celery app chaos workers run (``celery -A tests.chaos.app worker``).

It is the test suite's app (same configuration, same ``tests.tasks``) with the
chaos tasks registered too, and a ``task_prerun`` barrier: a delivery whose
kwargs carry ``barrier="<dir>:<n>"`` waits, before its claim, until ``n``
deliveries have reached the barrier, so that their claims race.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery.signals import task_prerun

import tests.chaos_tasks  # noqa: F401  (registers the chaos tasks)
from tests.celeryapp import app

__all__ = ["app"]


def wait_at_barrier(spec: str, timeout: float = 20.0) -> None:
    """File barrier: create ``<dir>/<pid>``, wait until ``n`` files exist."""
    where, _, count = spec.rpartition(":")
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, f"{os.getpid()}-{time.monotonic_ns()}"), "w"):
        pass
    deadline = time.monotonic() + timeout
    while len(os.listdir(where)) < int(count) and time.monotonic() < deadline:
        time.sleep(0.001)


@task_prerun.connect
def _barrier(sender: Any = None, kwargs: dict[str, Any] | None = None, **_: Any) -> None:
    spec = (kwargs or {}).get("barrier")
    if spec:
        wait_at_barrier(str(spec))
