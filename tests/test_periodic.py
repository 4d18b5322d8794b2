"""Periodic tasks: each celery beat slot is its own key (docs/periodic.md).

The slot a beat process computes (:func:`slot_time`), the worker keying a delivery by
its ``grousset_slot`` header, and two real ``celery beat`` processes on one schedule
with a real worker: counted effects equal the slots published, none run twice.
"""

from __future__ import annotations

import inspect
import re
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import BaseSchedule, crontab, schedule
from celery.signals import before_task_publish
from django.test import override_settings

from celery_grousset.exceptions import FingerprintError
from celery_grousset.fingerprint import fingerprint
from celery_grousset.models import Outcome
from celery_grousset.periodic import SLOT_HEADER, install_scheduler, slot_time
from tests import services
from tests.celeryapp import app
from tests.ledger.models import Effect
from tests.workers import start_beat, workers

UTC = timezone.utc


def ledger(alias: str, key: str) -> list[str]:
    return list(Effect.objects.using(alias).filter(key=key).values_list("value", flat=True))


# -- the slot a beat computes ---------------------------------------------------------------


NOW = datetime(2026, 12, 1, 12, 0, 2, 345678, tzinfo=UTC)


def test_two_beats_name_the_same_interval_slot() -> None:
    every = schedule(timedelta(seconds=10), nowfun=lambda: NOW, app=app)
    # Given two beats that last ran the entry 3 s apart (they started at other moments),
    # so the run is due at 11:59:58.3 for one and 12:00:01.3 for the other
    a = slot_time(every, NOW - timedelta(seconds=14))
    b = slot_time(every, NOW - timedelta(seconds=11))
    # Then both name the same slot: the nearest multiple of the interval since the epoch
    assert a == b == datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    # And one beat's next run (an interval after this one) is the next slot
    assert slot_time(every, NOW) == datetime(2026, 12, 1, 12, 0, 10, tzinfo=UTC)


def test_crontab_slot_is_the_scheduled_time() -> None:
    every_5 = crontab(minute="*/5", nowfun=lambda: NOW, app=app)
    # Given two beats that ran the 11:55 slot at 11:55:00.5 and 11:57:30 (late)
    lasts = (NOW - timedelta(minutes=5, seconds=1.8), NOW - timedelta(minutes=2, seconds=32))
    slots = {slot_time(every_5, last) for last in lasts}
    # Then both name the crontab time that fell due, to the second
    assert slots == {datetime(2026, 12, 1, 12, 0, tzinfo=UTC)}


def test_a_schedule_without_a_due_time_gives_no_slot() -> None:
    class Opaque(BaseSchedule):
        def is_due(self, last_run_at: datetime) -> Any:
            return True, 1.0

    assert slot_time(Opaque(app=app), datetime.now(UTC)) is None


def test_a_beat_scheduler_puts_the_slot_on_its_message(redis_url: str) -> None:
    seen: list[dict[str, Any]] = []

    def capture(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if headers and headers.get("task") == "tests.tasks.periodic_effect":
            seen.append(dict(headers))

    scheduler = Scheduler(app=app, lazy=True)
    install_scheduler(scheduler)
    install_scheduler(scheduler)  # idempotent
    every = timedelta(seconds=30)
    last = datetime.now(UTC) - every
    entry = ScheduleEntry(
        name="t", task="tests.tasks.periodic_effect", schedule=every, last_run_at=last,
        args=("x",), options={"queue": f"never-consumed-{uuid.uuid4().hex[:6]}"}, app=app,
    )  # fmt: skip
    before_task_publish.connect(capture, weak=False)
    try:
        # When the scheduler publishes the due entry, and a plain publish follows
        scheduler.apply_entry(entry, producer=None)
        app.tasks["tests.tasks.periodic_effect"].apply_async(
            ("x",), queue=f"never-consumed-{uuid.uuid4().hex[:6]}"
        )
    finally:
        before_task_publish.disconnect(capture)
    # Then the beat's message carries the entry's slot; the plain publish none
    slot = slot_time(entry.schedule, last)
    assert slot is not None
    assert [h.get(SLOT_HEADER) for h in seen] == [slot.isoformat(), None]


@pytest.fixture(scope="module")
def redis_url() -> str:
    return services.require_redis()


# -- the worker keys a delivery by its slot -------------------------------------------------


def test_each_slot_runs_once_with_the_same_arguments(journal: str) -> None:
    from tests.tasks import periodic_effect

    key = f"slot-{uuid.uuid4().hex[:8]}"
    monday, tuesday = "2026-12-07T06:00:00+00:00", "2026-12-08T06:00:00+00:00"
    # Given the same call published for two slots, the first slot twice (two beats)
    runs = [
        periodic_effect.apply((key,), headers={SLOT_HEADER: slot}).get()
        for slot in (monday, monday, tuesday)
    ]
    # Then each slot ran once: the second slot is not answered from the first one's memo
    assert sorted(ledger(journal, key)) == [monday, tuesday]
    assert runs[0] == runs[1] and runs[2]["slot"] == tuesday
    # And each slot's record is the call's fingerprint with the slot as causality token
    sig = inspect.signature(periodic_effect.run)
    for slot, deliveries in ((monday, 2), (tuesday, 1)):
        fp = fingerprint(periodic_effect.name, (key,), signature=sig, causality=slot)
        assert Outcome.objects.using(journal).get(fingerprint=fp).deliveries == deliveries


def test_periodic_slot_off_keys_by_the_arguments_alone(journal: str) -> None:
    from tests.tasks import periodic_effect

    key = f"noslot-{uuid.uuid4().hex[:8]}"
    with override_settings(GROUSSET={"DATABASE": journal, "PERIODIC_SLOT": False}):
        for slot in ("2026-12-07T06:00:00+00:00", "2026-12-08T06:00:00+00:00"):
            periodic_effect.apply((key,), headers={SLOT_HEADER: slot}).get()
    # Then the second slot got the first one's memo
    assert ledger(journal, key) == ["2026-12-07T06:00:00+00:00"]


def test_a_slot_header_that_is_not_a_slot_is_refused(journal: str) -> None:
    from tests.tasks import periodic_effect

    key = f"badslot-{uuid.uuid4().hex[:8]}"
    result = periodic_effect.apply((key,), headers={SLOT_HEADER: 42})
    assert isinstance(result.result, FingerprintError)
    assert SLOT_HEADER in str(result.result) and "periodic_slot=False" in str(result.result)
    assert ledger(journal, key) == []


def test_a_bypassed_task_with_a_slot_still_runs(journal: str, temp_task: Any) -> None:
    ran: list[str] = []

    def unconfigured(self: Any, key: str) -> str:
        ran.append(self.grousset.fingerprint)
        return key

    # Given a task without max_processing_time (the guard would refuse it), under BYPASS
    task = temp_task(unconfigured)
    with override_settings(GROUSSET={"DATABASE": journal, "BYPASS": True}):
        result = task.apply(("k",), headers={SLOT_HEADER: "2026-12-07T06:00:00+00:00"})
    # Then the emergency switch still runs it, with its slot's fingerprint
    assert result.get() == "k" and len(ran) == 1
    sig = inspect.signature(task.run)
    assert ran[0] == fingerprint(
        task.name, ("k",), signature=sig, causality="2026-12-07T06:00:00+00:00"
    )


# -- two real beat processes, one worker ----------------------------------------------------

_SENT = re.compile(r"tests\.tasks\.periodic_effect sent\. id->([0-9a-f-]{36})")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_beats_on_one_schedule_run_each_slot_once(redis_url: str, tmp_path: Path) -> None:
    services.require_database("postgresql")
    queue, key = f"q-{uuid.uuid4().hex[:10]}", f"beat-{uuid.uuid4().hex[:8]}"
    env = {"GROUSSET_TEST_BEAT_KEY": key, "GROUSSET_TEST_BEAT_EVERY": "1"}
    opts: dict[str, Any] = {"database": "postgresql", "broker": redis_url}
    with workers(queue, 1, concurrency=2, **opts):
        # Given two independent celery beat processes (own schedule files) on one schedule
        beats = [start_beat(queue, schedule_dir=tmp_path, env=env, **opts) for _ in range(2)]
        try:
            time.sleep(10)
        finally:
            for beat in beats:
                beat.stop()
        sent = [_SENT.findall(beat.text()) for beat in beats]
        assert all(len(ids) >= 5 for ids in sent), [b.text()[-2000:] for b in beats]
        # When every published copy has been processed
        slots = [{app.AsyncResult(i).get(timeout=60)["slot"] for i in ids} for ids in sent]
    # Then the beats published the same slots (so the copies really competed)
    assert len(slots[0] & slots[1]) >= 3, slots
    # And no slot ran twice, and each slot either beat published ran: effects == slots
    effects, published = ledger("postgresql", key), slots[0] | slots[1]
    assert len(effects) == len(set(effects)) and published <= set(effects), (effects, slots)
    # (a beat stopped between a publish and its log line leaves that last slot unlogged)
    assert len(set(effects) - published) <= len(beats), (effects, slots)
    assert sum(len(ids) for ids in sent) > len(effects)
