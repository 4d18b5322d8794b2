"""The slot a beat computes for a schedule's due run, at the edges a review found: a
crontab in another zone than its ``last_run_at``'s (Celery 5.3), relative intervals, and a
due time on the grid's midpoint. No broker, no worker: the compat run (Celery 5.3) runs it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from celery import Celery
from celery.schedules import crontab, schedule

from celery_grousset.periodic import slot_time

PARIS = ZoneInfo("Europe/Paris")


def _app(zone: str) -> Celery:
    app = Celery("slots", set_as_current=False)
    app.conf.update(timezone=zone, enable_utc=True)
    return app


def test_a_crontab_reads_its_fields_in_its_own_zone_whatever_zone_last_run_at_is_in() -> None:
    """On Celery 5.3 a last_run_at in UTC (django-celery-beat reloads its entries so) was
    read as if in the crontab's zone: every run of 08:00-09:00 UTC of a minutely 9-17
    Paris crontab got the 09:00 UTC slot, and all but one were skipped as duplicates."""
    now = datetime(2026, 12, 7, 8, 15, 30, tzinfo=UTC)  # 09:15:30 in Paris
    minutely = crontab(minute="*", hour="9-17", nowfun=lambda: now, app=_app("Europe/Paris"))
    # Given the 09:15 Paris run (08:15 UTC) as the entry's last run, in UTC and in Paris
    last = datetime(2026, 12, 7, 8, 15, tzinfo=UTC)
    # Then the slot due is the next minute, whichever zone last_run_at is in
    expected = datetime(2026, 12, 7, 8, 16, tzinfo=UTC)
    assert slot_time(minutely, last) == slot_time(minutely, last.astimezone(PARIS)) == expected


def test_a_relative_intervals_runs_each_get_a_slot_of_their_own() -> None:
    """relative=True rounds a due time down to the interval's largest unit, so runs of a
    90-minute interval come an hour apart at times: re-rounded to the 90-minute grid, the
    13:00 and 14:00 runs shared the 13:30 slot (a third of the runs skipped)."""
    app = _app("UTC")
    slots = []
    last = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    for _ in range(6):
        # Given each run published when due, its last_run_at the run before
        due = last + timedelta(minutes=90)
        due = due.replace(minute=0)  # (Celery's relative rounding, to the hour)
        every = schedule(timedelta(minutes=90), relative=True, nowfun=lambda d=due: d, app=app)
        slots.append(slot_time(every, last))
        last = due
    # Then each run has its own slot, its due time
    assert len(set(slots)) == len(slots), slots
    assert slots[:2] == [datetime(2026, 12, 7, 13, 0, tzinfo=UTC),
                         datetime(2026, 12, 7, 14, 0, tzinfo=UTC)]  # fmt: skip


def test_two_beats_name_the_same_slot_of_a_relative_interval() -> None:
    """Its due time as the slot, two beats 1.5 s apart on a relative 10 s entry named two
    slots, and both runs happened."""
    app = _app("UTC")
    now = datetime(2026, 12, 7, 12, 0, 9, tzinfo=UTC)
    every = schedule(timedelta(seconds=10), relative=True, nowfun=lambda: now, app=app)
    # Given two beats that last ran the entry 1.5 s apart
    a = slot_time(every, datetime(2026, 12, 7, 12, 0, 0, 200000, tzinfo=UTC))
    b = slot_time(every, datetime(2026, 12, 7, 12, 0, 1, 700000, tzinfo=UTC))
    # Then both name one slot, and one beat's next run the next one
    assert a == b == datetime(2026, 12, 7, 12, 0, 10, tzinfo=UTC)
    assert slot_time(every, datetime(2026, 12, 7, 12, 0, 10, 300000, tzinfo=UTC)) == (
        datetime(2026, 12, 7, 12, 0, 20, tzinfo=UTC)
    )


def test_an_interval_due_on_the_grids_midpoint_rounds_the_same_way_every_time() -> None:
    """The due time was now + (end - a second reading of the clock): on the midpoint of
    the grid, whether the clock moved between the two readings chose the slot."""
    app = _app("UTC")
    last = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)  # due 06:30 + 1 h: 07:30, a midpoint
    ticks = iter(datetime(2026, 12, 7, 7, 29, 59, i, tzinfo=UTC) for i in range(10**6))
    moving = schedule(timedelta(hours=1), nowfun=lambda: next(ticks), app=app)
    still = schedule(timedelta(hours=1), nowfun=lambda: datetime(2026, 12, 7, 7, 29, 59,
                                                                  tzinfo=UTC), app=app)  # fmt: skip
    start = last + timedelta(minutes=30)
    # Given a clock that moves a microsecond between readings, and one that does not
    # Then both name the same slot
    assert slot_time(moving, start) == slot_time(still, start)
