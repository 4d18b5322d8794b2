"""A guarded call's options, resolved once: per call > task > worker flag >
``settings.GROUSSET`` > built-in default (docs/configuration.md)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from celery_grousset.conf import (
    TASK_OPTIONS,
    GroussetSettingsError,
    check_bool,
    check_choice,
    grousset_settings,
    seconds,
    task_option,
)
from celery_grousset.exceptions import ConfigurationError

#: the options a task, a worker flag or protect() may set (GROUSSET keys in upper case)
NAMES = tuple(name for name in TASK_OPTIONS if name != "grousset_key")


@dataclass(frozen=True, slots=True)
class Options:
    """Resolved guard options (docs/configuration.md)."""

    max_processing_time: float
    processor_id: str
    expires_after: float = 7 * 24 * 3600.0
    on_in_flight: str = "retry"
    transactional: bool = False
    memoize: bool = True
    on_failure: str = "release"
    #: refuse a keyed call whose arguments differ from the record's (PayloadMismatch)
    validate_payload: bool = True
    #: key a run celery beat published by its slot too (celery_grousset.periodic)
    periodic_slot: bool = True
    max_result_bytes: int = 256 * 1024
    max_takeovers: int = 3
    database: str = "default"

    @classmethod
    def resolve(cls, where: str, explicit: dict[str, Any], default_processor: str) -> Options:
        """Merge ``explicit`` (per call / task; None = unset) over GROUSSET and defaults."""
        s = grousset_settings
        checked, problems = {}, []  # each explicit value, checked by its setting's rule
        for name, value in explicit.items():
            if value is not None:
                try:
                    checked[name] = task_option(name, value)
                except GroussetSettingsError as exc:  # every bad option is named at once
                    problems.extend(exc.problems)
        if problems:
            raise GroussetSettingsError(problems)

        def pick(name: str) -> Any:
            return checked[name] if name in checked else getattr(s, name.upper())

        mpt = seconds(pick("max_processing_time"), name="max_processing_time")
        if mpt is None:
            fix = ("pass max_processing_time= to protect()" if where == "protect()" else
                   "set it on the task (@app.task(base=GroussetTask, max_processing_time=60)), "
                   "start this worker with --grousset-max-processing-time")  # fmt: skip
            raise ConfigurationError(
                f"celery-grousset: {where} has no max_processing_time. It has no default on "
                "purpose (how long may an attempt hold the claim before another delivery takes "
                f"it over?). To fix it: {fix}, or set GROUSSET['MAX_PROCESSING_TIME'] in "
                "Django settings."
            )
        return cls(
            max_processing_time=mpt,
            processor_id=str(pick("processor_id") or default_processor),
            expires_after=seconds(pick("expires_after"), name="expires_after") or 0.0,
            on_in_flight=check_choice("ON_IN_FLIGHT", pick("on_in_flight")),
            transactional=bool(pick("transactional")),
            memoize=bool(pick("memoize")),
            on_failure=check_choice("ON_FAILURE", pick("on_failure")),
            validate_payload=check_bool("validate_payload", pick("validate_payload")),
            periodic_slot=check_bool("periodic_slot", pick("periodic_slot")),
            max_result_bytes=int(pick("max_result_bytes")),
            max_takeovers=int(pick("max_takeovers")),
            database=str(pick("database")),
        )


def reads_like(name: str, meant: Iterable[str]) -> str | None:
    """The name of ``meant`` that ``name`` reads like a misspelling of (None: none). A
    name inside one (a ``processor`` or ``processing_time`` of your own) is not one."""
    # (a ratio of 0.85 needs 2·min(len) ≥ 0.85·(sum of len): the others are never close)
    near = [m for m in meant if 2 * min(len(name), len(m)) >= 0.85 * (len(name) + len(m))]
    close = difflib.get_close_matches(name, near, n=1, cutoff=0.85) if near else []
    return close[0] if close and name not in close[0] else None


def flat_setting_key(name: str) -> str | None:
    """The GROUSSET key a flat ``GROUSSET_<KEY>`` / ``CELERY_GROUSSET_<KEY>`` setting
    names (or reads like a misspelling of), else None."""
    from celery_grousset.conf import SETTINGS

    for prefix in ("CELERY_GROUSSET_", "GROUSSET_"):
        if name.startswith(prefix):
            key = name[len(prefix):]
            return key if key in SETTINGS else reads_like(key, SETTINGS)
    return None
