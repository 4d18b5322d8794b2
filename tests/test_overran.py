"""An attempt whose body ran longer than its ``max_processing_time`` and still wrote its
outcome (no duplicate came in the window) is said at once: ``grousset.overran`` and
``grousset_overruns_total`` (docs/operations.md), before a duplicate in that window
runs the effect a second time."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_grousset import metrics
from celery_grousset.models import Outcome

BODIES = {
    "completed": {},
    "transactional": {"transactional": True},
    "failed, memoized": {"on_failure": "memoize"},
    "failed, released": {},
}


@pytest.fixture
def recorder() -> Iterator[Any]:
    from prometheus_client import CollectorRegistry

    rec = metrics.enable(CollectorRegistry(), fresh=True, gauges=False)
    try:
        yield rec
    finally:
        metrics.disable()
        rec.unregister()
        metrics._recorder = None


def overruns(rec: Any, task: str) -> float:
    return rec.registry.get_sample_value("grousset_overruns_total", {"task": task}) or 0.0


def _run(temp_task: Any, how: str, sleep: float, caplog: pytest.LogCaptureFixture) -> Any:
    def slow(self: Any) -> str:
        time.sleep(sleep)
        if how.startswith("failed"):
            raise ValueError("the body failed")
        return "done"

    task = temp_task(slow, max_processing_time=1, **BODIES[how])
    with caplog.at_level(logging.WARNING, logger="celery_grousset"):
        task.apply()
    return task


@pytest.mark.parametrize("how", list(BODIES))
def test_an_attempt_longer_than_max_processing_time_is_said(
    journal: str, temp_task: Any, recorder: Any, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    # Given a task with max_processing_time=1 whose body takes 1.3 s (no duplicate comes)
    task = _run(temp_task, how, 1.3, caplog)
    # Then its outcome was written (not fenced out) and the overrun is said with the fix
    rec = Outcome.objects.using(journal).get(task_name=task.name)
    assert rec.status == ("failed" if how.startswith("failed") else "completed")
    [line] = [r for r in caplog.records if r.getMessage().startswith("grousset.overran")]
    assert line.grousset_task == task.name and line.grousset_max_processing_time == 1
    assert 1.3 <= line.grousset_seconds < 10
    assert "raise max_processing_time" in line.getMessage()
    assert overruns(recorder, task.name) == 1


def test_an_attempt_within_max_processing_time_says_nothing(
    journal: str, temp_task: Any, recorder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    task = _run(temp_task, "completed", 0.0, caplog)
    assert not [r for r in caplog.records if "overran" in r.getMessage()]
    assert overruns(recorder, task.name) == 0
