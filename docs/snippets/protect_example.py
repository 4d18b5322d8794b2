"""``protect()``: the guard around any code path (a view, a command, a script)."""

from __future__ import annotations

# --8<-- [start:protect]
from datetime import date

from celery_grousset import protect

LOADED: list[str] = []  # stands in for the rows a real import writes


def load_file(day: date) -> int:
    """Your code: import one day's file, return how many rows were loaded."""
    LOADED.append(day.isoformat())
    return 1200


def import_day(day: date) -> int:
    # The first caller runs load_file; every later caller (another process, a
    # retry, a second cron host) gets the memoized row count instead.
    return protect(f"import:{day.isoformat()}", load_file, day, max_processing_time=600)
# --8<-- [end:protect]
