"""Helpers shared by the ``grousset_*`` management commands.

Every command reads the journal on ``GROUSSET["DATABASE"]`` unless ``--database``
names another alias; times come from the database clock.

Arguments are checked here, once for every command, whether they come from the
command line (argparse ``type=``) or from ``call_command`` keyword arguments (which
bypass argparse): a duration is finite, at most :data:`MAX_DURATION_DAYS` days and
not negative (:func:`duration_option`); a count is a whole number within its range
(:func:`count_option`). Anything else is a :class:`CommandError` that says what is
allowed, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError, CommandParser

from celery_grousset.journal import MIN_PREFIX as MIN_PREFIX
from celery_grousset.settings_values import MAX_DURATION, as_seconds
from celery_grousset.shown import visible

if TYPE_CHECKING:
    from celery_grousset.models import Outcome

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


#: longest duration a command accepts (100 years; the settings' limit too)
MAX_DURATION_DAYS = int(MAX_DURATION // 86400)  # the settings' limit: 100 years
#: largest --batch-size (rows deleted per transaction)
MAX_BATCH_SIZE = 1_000_000


class _Refused(ValueError):
    """An argument outside what is allowed (the message says what is)."""


def _duration_seconds(value: object, *, positive: bool) -> float:
    """The one duration rule: ``value`` in seconds, or :class:`_Refused`."""
    allowed = (
        f"{'above 0' if positive else '0 or more'} and at most {MAX_DURATION_DAYS}d "
        "(100 years): seconds, or a number followed by s, m, h, d or w (30m, 12h, 7d)"
    )
    number = as_seconds(value)
    if number is None and isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise _Refused(f"must be a duration {allowed}; got {value!r}, an invalid duration")
        try:
            number = float(match.group(1)) * _UNITS[match.group(2).lower()]
        except OverflowError:
            number = math.inf
    if number is None:
        raise _Refused(f"must be a duration {allowed}; got {value!r}")
    if not math.isfinite(number) or number < 0 or number > MAX_DURATION_DAYS * 86400:
        raise _Refused(f"must be a duration {allowed}; got {value!r}")
    if positive and number == 0:
        raise _Refused(f"must be a duration {allowed}; got {value!r}")
    return number


def duration_option(
    value: object, *, option: str, positive: bool = False
) -> timedelta | None:
    """An option's duration (``None`` stays ``None``), or a :class:`CommandError`."""
    if value is None:
        return None
    try:
        return timedelta(seconds=_duration_seconds(value, positive=positive))
    except _Refused as exc:
        raise CommandError(f"{option} {exc}") from None


def count_option(value: object, *, option: str, low: int = 1, high: int = MAX_BATCH_SIZE) -> int:
    """An option's whole number within ``low``..``high``, or a :class:`CommandError`."""
    number: object = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
        raise CommandError(f"{option} must be a whole number from {low} to {high}; got {value!r}")
    return number


def argparse_type(check: Callable[[object], object]) -> Callable[[str], object]:
    """An argparse ``type=`` that applies ``check`` (errors become usage errors)."""

    def convert(text: str) -> object:
        try:
            return check(text)
        except CommandError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def add_duration_argument(
    parser: CommandParser, option: str, check: Callable[[object], object], help: str
) -> None:
    """A ``DURATION`` option (default None) whose value ``check`` turns into a duration."""
    parser.add_argument(
        option, type=argparse_type(check), default=None, metavar="DURATION", help=help
    )


def parse_duration(text: str) -> timedelta:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` or plain seconds (0 to 100 years)."""
    try:
        return timedelta(seconds=_duration_seconds(text, positive=False))
    except _Refused as exc:
        raise argparse.ArgumentTypeError(f"invalid duration: {exc}") from None


def as_duration(value: object, *, option: str = "--older-than") -> timedelta | None:
    """An option value as a timedelta (``call_command`` kwargs bypass argparse types)."""
    return duration_option(value, option=option)


def add_database_argument(
    parser: CommandParser, default: str = 'GROUSSET["DATABASE"]'
) -> None:
    parser.add_argument(
        "--database",
        default=None,
        help=f"Django database alias of the journal (default: {default}).",
    )


@contextmanager
def database_errors(alias: str, doing: str) -> Iterator[None]:
    """A database error inside becomes a :class:`CommandError` that names ``alias`` and
    what failed (``doing``); a journal whose tables do not exist or lack a migration
    names the fix (:func:`schema_problem`) instead of the driver's text."""
    from django.db import DatabaseError

    from celery_grousset.conf import GroussetSettingsError
    from celery_grousset.exceptions import StoreUnavailable

    try:
        yield
    except GroussetSettingsError as exc:  # (a command that skips the system checks)
        raise CommandError(f"{exc} (`manage.py check` lists every problem)") from exc
    except (DatabaseError, StoreUnavailable) as exc:
        raise CommandError(f"{doing} on {alias!r}: {schema_problem(alias) or exc}") from exc


def refuse_naive_clock() -> None:
    """``E012`` (``USE_TZ = False`` with a ``TIME_ZONE`` other than UTC) stops a command
    that runs no other system check: it would read the journal's times off by the UTC
    offset (expiry, stale claims)."""
    from celery_grousset.journal_check import time_zone_messages

    for message in time_zone_messages():
        raise CommandError(f"{message.msg} {message.hint} ({message.id})")


def schema_problem(alias: str) -> str | None:
    """What is wrong with the journal's tables on ``alias``, with the fix (``migrate``, or
    ``INSTALLED_APPS`` first): :func:`celery_grousset.journal_check.schema_problem`. None
    when they are fine, or when the database cannot be asked (an outage is not a schema
    problem)."""
    from django.db import DatabaseError

    from celery_grousset import journal_check
    from celery_grousset.store.refusals import missing_table_fix

    try:
        problem = journal_check.schema_problem(alias)
    except DatabaseError:
        return None
    return None if problem is None else f"{problem}: {missing_table_fix(alias)}"


def start_problem(alias: str, layout: str) -> str | None:
    """What a worker logs as an error at its start for the journal database ``alias``:
    its tables missing or behind (with the fix), another ``layout``, a database it cannot
    reach or a claim store that cannot open it (every claim there fails closed); None when
    there is none. An unreachable database is connected to once, not again for each."""
    from django.db import DatabaseError

    from celery_grousset import journal_check
    from celery_grousset.store.refusals import missing_table_fix

    try:
        problem = journal_check.schema_problem(alias)
    except DatabaseError as exc:
        found = [journal_check.unreadable(alias, exc)]
    else:
        if problem is not None:
            return f"{problem}: {missing_table_fix(alias)}"
        found = journal_check.journal_messages(alias, layout)
    return next((f"{m.msg} {m.hint}" for m in found if m.id in journal_check.AT_START), None)


def journal_alias(database: str | None) -> str:
    """The alias to read: ``--database`` or ``GROUSSET["DATABASE"]``; checked to exist."""
    from django.db import connections

    from celery_grousset.conf import GroussetSettingsError, grousset_settings

    try:  # (a command that skips the system checks meets a bad GROUSSET here)
        alias = database or str(grousset_settings.DATABASE)
    except GroussetSettingsError as exc:
        raise CommandError(f"{exc} (`manage.py check` lists every problem)") from exc
    if alias not in connections.settings:
        raise CommandError(
            f"unknown database alias {alias!r}; settings.DATABASES has "
            f"{sorted(connections.settings)}"
        )
    return alias


def other_journals(alias: str) -> str:
    """For a "not found": the other journal databases (a task's own ``database``), to
    look in with ``--database``; empty when there is none."""
    try:
        from celery_grousset.checks import journal_databases

        others = [repr(a) for a in journal_databases() if a != alias]
    except Exception:  # the checks report what stops this
        return ""
    return f"; other journal databases: {', '.join(others)} (pass --database)" if others else ""


def find(
    alias: str, needle: str, processor_id: str | None = None, limit: int = 50
) -> list[Outcome]:
    """Journal entries matching a task id, a fingerprint or a prefix of ≥ 8 hex chars."""
    from celery_grousset import journal

    return journal.find(alias, needle, processor_id, limit)


def human_seconds(seconds: float) -> str:
    """``3 d 4 h``, ``12 min 5 s``, ``0.42 s``."""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.0f} s"
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        value, seconds = divmod(seconds, size)
        if value >= 1:
            parts.append(f"{int(value)} {unit}")
        if len(parts) == 2:
            break
    return " ".join(parts)


def timestamp(value: datetime | None) -> str:
    """``value`` in UTC (an aware value in another zone is converted; a naive one is UTC
    already: ``USE_TZ = False`` with ``TIME_ZONE = "UTC"``)."""
    if value is None:
        return "—"
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def brief(rec: Outcome) -> dict[str, Any]:
    """One line's worth of a journal entry (for lists of matches)."""
    return {
        "fingerprint": rec.fingerprint,
        "processor_id": rec.processor_id,
        "task_name": rec.task_name,
        "task_id": rec.task_id,
        "status": rec.status,
        "started_at": iso(rec.started_at),
    }


def describe_matches(records: list[Outcome]) -> str:
    lines = [f"{len(records)} journal entries match:"]
    for rec in records:
        lines.append(
            f"  {rec.fingerprint}  processor={printable(rec.processor_id, False)}  "
            f"task={printable(rec.task_name, False)}  status={rec.status}  "
            f"task_id={printable(rec.task_id, False)}"
        )
    return "\n".join(lines)


#: ``text`` for an operator's terminal: its control characters (an escape sequence could
#: recolour, retitle or rewrite what the command shows) as Python escapes, as the admin
#: shows them; its newlines kept when ``lines``
printable = visible
