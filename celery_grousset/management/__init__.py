"""Helpers shared by the ``grousset_*`` management commands.

Every command reads the journal on ``GROUSSET["DATABASE"]`` unless ``--database``
names another alias; times come from the database clock.
"""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError, CommandParser

from celery_grousset.journal import MIN_PREFIX as MIN_PREFIX

if TYPE_CHECKING:
    from celery_grousset.models import Outcome

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}



def parse_duration(text: str) -> timedelta:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` or plain seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use seconds or a number followed by s, m, h, d or w "
            "(for example 7d, 12h, 30m)"
        )
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2).lower()])


def as_duration(value: object) -> timedelta | None:
    """An option value as a timedelta (``call_command`` kwargs bypass argparse types)."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return timedelta(seconds=value)
    try:
        return parse_duration(str(value))
    except argparse.ArgumentTypeError as exc:
        raise CommandError(str(exc)) from exc


def add_database_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--database",
        default=None,
        help='Django database alias of the journal (default: GROUSSET["DATABASE"]).',
    )


def journal_alias(database: str | None) -> str:
    """The alias to read: ``--database`` or ``GROUSSET["DATABASE"]``; checked to exist."""
    from django.db import connections

    from celery_grousset.conf import grousset_settings

    alias = database or str(grousset_settings.DATABASE)
    if alias not in connections.settings:
        raise CommandError(
            f"unknown database alias {alias!r}; settings.DATABASES has "
            f"{sorted(connections.settings)}"
        )
    return alias


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
    if value is None:
        return "—"
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
            f"  {rec.fingerprint}  processor={rec.processor_id}  task={rec.task_name}  "
            f"status={rec.status}  task_id={rec.task_id}"
        )
    return "\n".join(lines)
