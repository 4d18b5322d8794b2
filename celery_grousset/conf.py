"""Settings: one ``GROUSSET`` dict in Django settings, read lazily.

The pattern follows Django REST framework's ``api_settings``: nothing is read at
import time, values are cached on first access, and the cache is dropped when
Django's ``setting_changed`` signal reports that ``GROUSSET`` changed (tests,
``override_settings``).

Precedence for a task option (documented in docs/configuration.md, checked by a
test against :data:`DEFAULTS`): per call > task (decorator kwarg or class
attribute) > worker flag > ``settings.GROUSSET`` > built-in default.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.signals import setting_changed

from celery_grousset.redact import DEFAULT_REDACT_KEYS
from celery_grousset.settings_values import (
    ID_NOT_A_DICT,
    ID_UNKNOWN_KEY,
    MAX_DURATION,
    TASK_OPTIONS,
    GroussetSettingsError,
    Problem,
    _boolean,
    _choice,
    _duration,
    _expires_after,
    _fingerprint_key,
    _flush_delay,
    _integer,
    _optional_duration,
    _redact_keys,
    _shown,
    _store_timeout,
    _text,
    check_bool,
    check_choice,
    seconds,
    task_table,
)

__all__ = [
    "DEFAULTS",
    "MAX_DURATION",
    "SETTINGS",
    "TASK_OPTIONS",
    "GroussetSettingsError",
    "Problem",
    "Setting",
    "check_bool",
    "check_choice",
    "grousset_settings",
    "on_reload",
    "seconds",
    "validate",
    "validate_setting",
]

@dataclass(frozen=True)
class Setting:
    """One ``GROUSSET`` key: its default, its validator, and what it accepts."""

    name: str
    default: Any
    validate: Callable[[str, object], Any] = field(repr=False)
    accepts: str


_INT32 = 2**31 - 1


def task_option(option: str, value: object) -> Any:
    """A task option in ``GROUSSET["TASKS"]``, checked by its setting's rule
    (``max_processing_time`` as ``MAX_PROCESSING_TIME`` …)."""
    name = option.upper()
    if name in ("ON_IN_FLIGHT", "ON_FAILURE"):
        return check_choice(name, value)
    return SETTINGS[name].validate(option, value)


#: Every ``GROUSSET`` setting, in the order of docs/configuration.md.
SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        # Django database alias of the outcome journal.
        Setting("DATABASE", "default", _text(255, optional=False), "a non-empty str"),
        # Who deduplicates. None: the Celery app's main name (or "default" for protect()).
        Setting(
            "PROCESSOR_ID", None, _text(128, optional=True), "None or a str of 1-128 characters"
        ),
        # Seconds an attempt may hold a claim before another may take it over. No default.
        Setting(
            "MAX_PROCESSING_TIME",
            None,
            _optional_duration,
            "None or a duration > 0 and <= 100 years; read back as float seconds",
        ),
        # Retention window: seconds a completed record is remembered (7 days).
        Setting(
            "EXPIRES_AFTER",
            7 * 24 * 3600,
            _expires_after,
            "a duration > 0 and <= 100 years (not None); read back as float seconds",
        ),
        # What a duplicate does while another attempt holds a fresh claim: "retry" or "wait".
        Setting("ON_IN_FLIGHT", "retry", _choice, '"retry" or "wait"'),
        # Run the task body and the completion in one transaction on the journal's database.
        Setting("TRANSACTIONAL", False, _boolean, "a bool"),
        # Store the return value so duplicates get it.
        Setting("MEMOIZE", True, _boolean, "a bool"),
        # When the body raises: "release" (next delivery runs again) or "memoize" (replay).
        Setting("ON_FAILURE", "release", _choice, '"release" or "memoize"'),
        # A keyed call (idempotency_key, grousset_key) whose arguments differ from those of
        # the call that holds the key's record raises PayloadMismatch instead of getting
        # that call's memo. False: the key covers varying arguments.
        Setting("VALIDATE_PAYLOAD", True, _boolean, "a bool"),
        # A run published by celery beat is keyed by its scheduled slot as well as by its
        # arguments (each slot runs once). False: by its arguments alone.
        Setting("PERIODIC_SLOT", True, _boolean, "a bool"),
        # Larger encoded results are not memoized (the effect is never re-run for it).
        Setting("MAX_RESULT_BYTES", 256 * 1024, _integer(0, 2**30), "an int from 0 to 2**30"),
        # Takeovers of one record before it is marked failed (a task that kills its worker).
        Setting("MAX_TAKEOVERS", 3, _integer(0, _INT32), "an int from 0 to 2**31 - 1"),
        # Seconds a store operation may take (connect, lock wait, statement) before it
        # fails closed.
        Setting(
            "STORE_TIMEOUT",
            5.0,
            _store_timeout,
            "a duration > 0 and <= 1 day; read back as float seconds",
        ),
        # PostgreSQL: "durable" claims wait for the WAL flush; "async" ones do not (opt-in;
        # completions always do). See docs/performance.md.
        Setting("CLAIM_COMMIT", "durable", _choice, '"durable" or "async"'),
        # PostgreSQL: the journal as one table, or partitioned by generation (opt-in, after
        # `manage.py grousset_partition convert`). See docs/scale.md.
        Setting("JOURNAL_LAYOUT", "table", _choice, '"table" or "partitioned"'),
        # Emergency switch: run every task unguarded, logging loudly.
        Setting("BYPASS", False, _boolean, "a bool"),
        # Claim guarded requests in the worker's main process before the pool runs them
        # (opt-in; `celery worker --grousset-batch`). See docs/performance.md.
        Setting("WORKER_CLAIM", False, _boolean, "a bool"),
        # Most claims the main process sends in one pass (per database).
        Setting(
            "WORKER_CLAIM_BATCH_SIZE", 100, _integer(1, 10_000), "an int from 1 to 10000"
        ),
        # Seconds the claim thread waits for more requests before a pass (0: at once).
        Setting(
            "WORKER_CLAIM_FLUSH_DELAY",
            0.0,
            _flush_delay,
            "0 or a duration of at most 1 s; read back as float seconds",
        ),
        # A child starting later than this after the main process's claim renews it first.
        # None: a tenth of the task's max_processing_time.
        Setting(
            "WORKER_CLAIM_RENEW_AFTER",
            None,
            _optional_duration,
            "None or a duration > 0 and <= 100 years; read back as float seconds",
        ),
        # Argument names whose values are redacted in args_repr (added to the built-in list).
        Setting(
            "REDACT_KEYS",
            (),
            _redact_keys,
            "a list, tuple or set of non-empty str (not a str); read back as a tuple",
        ),
        # A secret that keys the fingerprints (BLAKE3's keyed mode): a fingerprint of a
        # secret argument cannot be confirmed by guessing it. None: unkeyed.
        Setting(
            "FINGERPRINT_KEY",
            None,
            _fingerprint_key,
            "None or a str or bytes of at least 32 bytes; read back as the derived 32-byte key",
        ),
        # Maximum length of the stored args_repr.
        Setting(
            "ARGS_REPR_MAX_LENGTH", 1024, _integer(0, 1_000_000), "an int from 0 to 1000000"
        ),
        # Fail-closed retry backoff for a delivery that found the store unavailable (seconds).
        Setting(
            "STORE_RETRY_BACKOFF",
            1.0,
            _duration,
            "a duration > 0 and <= 100 years; read back as float seconds",
        ),
        Setting(
            "STORE_RETRY_BACKOFF_MAX",
            60.0,
            _duration,
            "a duration >= STORE_RETRY_BACKOFF and <= 100 years; read back as float seconds",
        ),
        # Tasks guarded from settings: task name or fnmatch pattern -> task options.
        Setting(
            "TASKS",
            {},
            task_table(task_option),
            "a dict of task names or patterns to dicts of task options",
        ),
    )
}

#: Built-in defaults. Keys are the ``GROUSSET`` setting names.
DEFAULTS: dict[str, Any] = {name: s.default for name, s in SETTINGS.items()}



def validate_setting(name: str, value: object) -> Any:
    """One ``GROUSSET`` value as it reads back; :class:`GroussetSettingsError` if refused."""
    return SETTINGS[name].validate(name, value)


def _unknown_key(key: object) -> Problem:
    shown = _shown(key)
    if not isinstance(key, str):
        return Problem(
            shown,
            f"settings.GROUSSET has a key {shown} that is not a str.",
            f"Keys are setting names: {', '.join(SETTINGS)}.",
            ID_UNKNOWN_KEY,
        )
    close = difflib.get_close_matches(key.upper(), list(SETTINGS), n=1, cutoff=0.6)
    hint = (
        f"did you mean {close[0]!r}?"
        if close
        else f"The settings are {', '.join(SETTINGS)} (docs/configuration.md)."
    )
    return Problem(
        key,
        f"unknown GROUSSET setting {shown} (a key of settings.GROUSSET).",
        hint[0].upper() + hint[1:],
        ID_UNKNOWN_KEY,
    )


def validate(user: object) -> tuple[dict[str, Any], list[Problem]]:
    """Check a ``GROUSSET`` value: (the settings as they read back, every problem found).

    The settings are complete (defaults filled in) only when there is no problem.
    """
    if user is None:
        user = {}
    if not isinstance(user, Mapping):
        return {}, [
            Problem(
                "GROUSSET",
                f"settings.GROUSSET must be a dict, got {type(user).__name__}.",
                'Write GROUSSET = {"MAX_PROCESSING_TIME": 60, ...} (or leave it out).',
                ID_NOT_A_DICT,
            )
        ]
    problems = [_unknown_key(key) for key in user if not (isinstance(key, str) and key in SETTINGS)]
    merged: dict[str, Any] = {}
    for name, setting in SETTINGS.items():
        value = user.get(name, setting.default)
        try:
            merged[name] = setting.validate(name, value)
        except GroussetSettingsError as exc:
            problems.extend(exc.problems)
    low, high = merged.get("STORE_RETRY_BACKOFF"), merged.get("STORE_RETRY_BACKOFF_MAX")
    if low is not None and high is not None and high < low:
        problems.append(
            Problem(
                "STORE_RETRY_BACKOFF_MAX",
                f"STORE_RETRY_BACKOFF_MAX ({high:g} s) must not be below STORE_RETRY_BACKOFF "
                f"({low:g} s).",
                "Raise STORE_RETRY_BACKOFF_MAX or lower STORE_RETRY_BACKOFF.",
            )
        )
    return merged, problems


class GroussetSettings:
    """Lazy view of ``settings.GROUSSET`` merged over :data:`DEFAULTS`, validated once.

    The first read checks every value (:data:`SETTINGS`); any problem raises
    :class:`GroussetSettingsError` (an ``ImproperlyConfigured``) naming each setting
    concerned, on every read until the settings change. Durations read back as float
    seconds, ``REDACT_KEYS`` as a tuple, everything else as given.
    """

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        from django.conf import settings

        merged, problems = validate(getattr(settings, "GROUSSET", None))
        if problems:
            raise GroussetSettingsError(problems)
        return merged

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._cache is None:
            self._cache = self._load()
        try:
            return self._cache[name]
        except KeyError:
            raise AttributeError(f"no GROUSSET setting {name!r}") from None

    def reload(self) -> None:
        self._cache = None


grousset_settings = GroussetSettings()


def redact_keys() -> frozenset[str]:
    """The names whose values are never shown or stored: the built-in
    :data:`~celery_grousset.redact.DEFAULT_REDACT_KEYS` plus ``GROUSSET["REDACT_KEYS"]``."""
    extra = grousset_settings.REDACT_KEYS
    return DEFAULT_REDACT_KEYS | frozenset(extra) if extra else DEFAULT_REDACT_KEYS

_reload_hooks: list[Callable[[], None]] = []


def on_reload(hook: Callable[[], None]) -> Callable[[], None]:
    """Register ``hook`` to run whenever GROUSSET or DATABASES change."""
    _reload_hooks.append(hook)
    return hook


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("GROUSSET", "DATABASES"):
        grousset_settings.reload()
        for hook in _reload_hooks:
            hook()


setting_changed.connect(_setting_changed, dispatch_uid="celery_grousset.conf")
