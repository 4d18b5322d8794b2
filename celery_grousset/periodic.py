"""Periodic tasks: each scheduled slot of a ``celery beat`` entry is its own key
(docs/periodic.md).

Beat publishes the same call every time. Keyed by its arguments alone, a guarded
periodic task would be answered from its memo for ``EXPIRES_AFTER``: a daily report
would run once a week. So:

* in the beat process (a ``beat_init`` handler, whatever the scheduler class), each
  publish of a due entry carries the header ``grousset_slot``: the slot's time (ISO 8601,
  UTC) derived from the entry's *schedule*, not from the clock at publish time, so two
  beat processes publishing the same due run send the same slot (:func:`slot_time`);
* in the worker, a guarded task keys a delivery that carries the header by its slot as
  well as by its arguments (the slot is the fingerprint's causality token), unless its
  ``periodic_slot`` option is off (:func:`run_slot`). A slot runs once, however many
  beat processes publish it.
"""

from __future__ import annotations

import logging
import math
from contextvars import ContextVar
from datetime import datetime, timedelta, timezone
from typing import Any

from celery.signals import beat_init, before_task_publish
from django.core.exceptions import ImproperlyConfigured

from celery_grousset import events
from celery_grousset.exceptions import FingerprintError

#: the message header that carries a periodic run's slot
SLOT_HEADER = "grousset_slot"
_MAX_LENGTH = 64


#: the slot of the beat entry being published in this context
_SLOT: ContextVar[str | None] = ContextVar("grousset_slot", default=None)
_warned: set[str] = set()


def slot_time(schedule: Any, last_run_at: datetime) -> datetime | None:
    """The UTC time of the slot that is due for an entry last run at ``last_run_at``:
    None if the schedule gives no due time (it has no ``remaining_estimate``).

    The due time is ``now + schedule.remaining_estimate(last_run_at)``. A crontab or
    solar due time is the same in every beat process (rounded to the second). An interval
    schedule's due time depends on when *this* beat last ran the entry, so it is rounded
    to the nearest multiple of the interval since the Unix epoch: two beats whose runs
    round to the same multiple name the same slot (runs either side of the midpoint
    between two multiples do not, however close: docs/periodic.md), and one beat's runs
    (at least an interval apart) never share one. A ``relative`` interval's due time is
    rounded down by Celery to the interval's largest unit (a day, an hour, a minute, a
    second), so one beat's runs come as little as the interval rounded down to that unit
    apart (a 90-minute entry: an hour): its slot is its due time rounded *down* to a grid
    of that spacing, which two runs of one beat never share and two beats' due times in
    one grid step agree on.
    """
    from celery.schedules import crontab, solar
    from celery.schedules import schedule as interval
    from celery.utils.time import remaining

    try:
        now = schedule.maybe_make_aware(schedule.now())
        if isinstance(schedule, interval) and not isinstance(schedule, (crontab, solar)):
            # as its remaining_estimate, with one reading of the clock (two readings
            # moved a due time on the midpoint of the grid to one side or the other)
            last, every = schedule.maybe_make_aware(last_run_at), schedule.seconds
            due = now + remaining(last, timedelta(seconds=every), now, schedule.relative)
            step, nearest = (_relative_step(every), 0.0) if schedule.relative else (every, 0.5)
        else:
            if isinstance(schedule, crontab):  # its fields read in its own zone (Celery
                # 5.3 read an aware last_run_at's own: django-celery-beat's are in UTC)
                zone: Any = schedule.tz
                last_run_at = schedule.maybe_make_aware(last_run_at).astimezone(zone)
            due = now + schedule.remaining_estimate(last_run_at)
            step, nearest = 1.0, 0.5
    except (AttributeError, NotImplementedError, TypeError):
        return None
    step = float(step) if step > 0 else 1.0
    when = math.floor(due.astimezone(timezone.utc).timestamp() / step + nearest) * step
    return datetime.fromtimestamp(when, timezone.utc)


def _relative_step(every: float) -> float:
    """The least spacing of a ``relative`` interval's runs: the interval rounded down to
    its largest unit, as Celery's ``delta_resolution`` rounds its due times."""
    unit = next(u for u in (86_400.0, 3_600.0, 60.0, 1.0) if every >= u or u == 1.0)
    return max(unit * math.floor(every / unit), 1.0)


def entry_slot(entry: Any) -> str | None:
    """The slot of a beat entry's due run, as the header carries it (ISO 8601, UTC)."""
    try:
        when = slot_time(entry.schedule, entry.last_run_at)
    except Exception as exc:  # a schedule that fails here must not stop the publish
        events.emit(logging.WARNING, "grousset.periodic_slot_failed",
                    {"entry": entry.name, "error": events.error_text(exc)})  # fmt: skip
        return None
    if when is None:
        if entry.name not in _warned:
            _warned.add(entry.name)
            events.emit(logging.WARNING, "grousset.periodic_no_slot", {
                "entry": entry.name, "schedule": repr(entry.schedule)}, note=(
                "the schedule gives no due time (no remaining_estimate), so its runs carry "
                "no slot and a guarded task keys them by their arguments alone "
                "(docs/periodic.md)"))  # fmt: skip
        return None
    return when.isoformat()


def install_scheduler(scheduler: Any) -> None:
    """Make ``scheduler`` (any beat scheduler class) send each due entry's slot: its
    ``apply_async(entry, …)`` runs with the slot set, and :func:`_add_slot_header` puts
    it on the message (``before_task_publish``). Idempotent."""
    original = scheduler.apply_async
    if getattr(original, "grousset_slot", False):
        return

    def apply_async(entry: Any, *args: Any, **kwargs: Any) -> Any:
        reset = _SLOT.set(entry_slot(entry))
        try:
            return original(entry, *args, **kwargs)
        finally:
            _SLOT.reset(reset)

    apply_async.grousset_slot = True  # type: ignore[attr-defined]
    scheduler.apply_async = apply_async


@beat_init.connect(weak=False, dispatch_uid="celery_grousset.periodic.beat_init")
def _on_beat_init(sender: Any = None, **kwargs: Any) -> None:
    install_scheduler(sender.scheduler)


@before_task_publish.connect(weak=False, dispatch_uid="celery_grousset.periodic.publish")
def _add_slot_header(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    slot = _SLOT.get()
    if slot is not None and headers is not None:
        headers.setdefault(SLOT_HEADER, slot)


def run_slot(task: Any, value: object) -> str | None:
    """The slot a guarded delivery is keyed by: its ``grousset_slot`` header (``value``)
    when the task keys periodic runs by slot (option ``periodic_slot``, default on);
    else None. Raises FingerprintError for a header that is not a slot."""
    if value is None:
        return None
    try:
        keyed = task.grousset_options().periodic_slot
    except ImproperlyConfigured:  # the guard raises it; a bypassed task still runs
        keyed = True
    if not keyed:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_LENGTH:
        raise FingerprintError(
            f"{task.name}: the {SLOT_HEADER} message header must be a slot time (an ISO 8601 "
            f"str of at most {_MAX_LENGTH} characters, as celery beat sends it with "
            f"celery-grousset loaded), got {str(value)[:80]!r}; remove the header or set "
            "periodic_slot=False on the task"
        )
    return value
