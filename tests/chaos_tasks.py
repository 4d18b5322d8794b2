"""Tasks of the chaos scenarios (tests/chaos). Each effect writes one row in the
effect ledger (no unique constraint) before the ``mid_effect`` fault point, so a
duplicate effect is a counted row, never a guess."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task

from celery_grousset import GroussetTask
from tests.tasks import record


def _pause(seconds: float) -> None:
    from celery_grousset.faults import fault

    fault("mid_effect")
    if seconds:
        time.sleep(seconds)


def _value(task: Any, key: str) -> dict[str, Any]:
    return {"key": key, "pid": os.getpid(), "fence": task.grousset.fence}


@shared_task(base=GroussetTask, bind=True, max_processing_time=3, name="chaos.effect")
def effect(self: Any, key: str, sleep: float = 0.0, barrier: str = "") -> dict[str, Any]:
    """Plain effect, max_processing_time 3 s (takeover scenarios)."""
    record(key)
    _pause(sleep)
    return _value(self, key)


@shared_task(base=GroussetTask, bind=True, max_processing_time=3, transactional=True,
             name="chaos.booking")  # fmt: skip
def booking(self: Any, key: str, sleep: float = 0.0, barrier: str = "") -> dict[str, Any]:
    """Transactional: the ledger row commits with the completion, fenced."""
    record(key, "booking")
    _pause(sleep)
    return _value(self, key)


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, name="chaos.slow")
def slow(self: Any, key: str, sleep: float = 0.0, barrier: str = "") -> dict[str, Any]:
    """max_processing_time 30 s: copies of a running task must wait, not take over."""
    record(key)
    _pause(sleep)
    return _value(self, key)


@shared_task(base=GroussetTask, bind=True, max_processing_time=3, on_in_flight="wait",
             name="chaos.skewed")  # fmt: skip
def skewed(self: Any, key: str, sleep: float = 0.0) -> dict[str, Any]:
    """Waits in-process for a fresh claim (no ETA: worker clocks may be skewed)."""
    record(key)
    _pause(sleep)
    return _value(self, key)


@shared_task(base=GroussetTask, bind=True, max_processing_time=3, expires_after=1,
             name="chaos.brief")  # fmt: skip
def brief(self: Any, key: str, sleep: float = 0.0) -> dict[str, Any]:
    """expires_after 1 s: the record can be purged right after completion."""
    record(key)
    _pause(sleep)
    return _value(self, key)


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, max_retries=3,
             name="chaos.flaky_retry")  # fmt: skip
def flaky_retry(self: Any, key: str, fail_times: int = 1) -> str:
    """Fails ``fail_times`` times via self.retry(), then succeeds."""
    from tests.ledger.models import Effect
    from tests.tasks import _db

    attempts = Effect.objects.using(_db()).filter(key=key, value="attempt").count()
    record(key, "attempt")
    if attempts < fail_times:
        raise self.retry(countdown=0.1)
    record(key, "done")
    return f"done after {attempts + 1}"


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, name="chaos.flaky_auto",
             autoretry_for=(ValueError,),
             retry_kwargs={"max_retries": 3, "countdown": 0.1})  # fmt: skip
def flaky_auto(self: Any, key: str, fail_times: int = 1) -> str:
    """Fails ``fail_times`` times with ValueError (autoretry_for), then succeeds."""
    from tests.ledger.models import Effect
    from tests.tasks import _db

    attempts = Effect.objects.using(_db()).filter(key=key, value="attempt").count()
    record(key, "attempt")
    if attempts < fail_times:
        raise ValueError("transient")
    record(key, "done")
    return f"done after {attempts + 1}"


@shared_task(base=GroussetTask, bind=True, max_processing_time=3, time_limit=1.5,
             name="chaos.overrun")  # fmt: skip
def overrun(self: Any, key: str, sleep: float = 5.0) -> dict[str, Any]:
    """Hard time limit (1.5 s) shorter than the task."""
    record(key)
    time.sleep(sleep)
    return _value(self, key)


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, soft_time_limit=1.5,
             name="chaos.soft")  # fmt: skip
def soft(self: Any, key: str, sleep: float = 1.0) -> dict[str, Any]:
    """Soft time limit 1.5 s; the completion write is what the limit interrupts."""
    record(key)
    time.sleep(sleep)
    return _value(self, key)


@shared_task(base=GroussetTask, bind=True, max_processing_time=30, name="chaos.collect")
def collect(self: Any, values: list[Any], key: str) -> int:
    """A chord body: one effect per call."""
    record(key, "body")
    return len(values)
