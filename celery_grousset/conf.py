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
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from celery_grousset.exceptions import GroussetError

__all__ = [
    "DEFAULTS",
    "MAX_DURATION",
    "SETTINGS",
    "GroussetSettingsError",
    "Problem",
    "Setting",
    "check_choice",
    "grousset_settings",
    "on_reload",
    "seconds",
    "validate",
    "validate_setting",
]

#: The longest duration any setting or task option accepts: 100 years. Longer ones
#: would put ``expires_on`` (claim time + duration) past the dates databases hold.
MAX_DURATION = 36500 * 86400.0

#: Ids of the system checks that report settings problems (see checks.py).
ID_NOT_A_DICT = "celery_grousset.E004"
ID_BAD_VALUE = "celery_grousset.E010"
ID_UNKNOWN_KEY = "celery_grousset.E011"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with ``settings.GROUSSET``: which setting, what, and the fix."""

    setting: str
    message: str
    hint: str
    id: str = ID_BAD_VALUE

    def __str__(self) -> str:
        return f"{self.message} {self.hint}"


class GroussetSettingsError(GroussetError, ImproperlyConfigured):
    """``settings.GROUSSET`` (or a task option) has a value celery-grousset refuses.

    ``problems`` lists each one (:class:`Problem`: the setting, the message, the fix);
    the text names every setting concerned.
    """

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        self.setting = self.problems[0].setting if self.problems else ""
        text = "; ".join(str(p) for p in self.problems)
        super().__init__(f"celery-grousset: {text}")


def _fail(name: str, message: str, hint: str, id: str = ID_BAD_VALUE) -> GroussetSettingsError:
    return GroussetSettingsError([Problem(name, message, hint, id)])


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _duration_text(limit: float) -> str:
    return f"{limit / 86400:g} days" if limit >= 86400 else f"{limit:g} s"


def seconds(value: object, *, name: str, maximum: float = MAX_DURATION) -> float | None:
    """Return ``value`` (seconds as int/float, or a timedelta) as float seconds.

    ``None`` stays ``None`` (unset). Anything else must be a finite duration above
    zero and at most ``maximum`` seconds (100 years unless said otherwise); otherwise
    :class:`GroussetSettingsError` (an ``ImproperlyConfigured``) names ``name``.
    """
    if value is None:
        return None
    number: float
    if isinstance(value, timedelta):
        number = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int beyond float range
            number = math.inf
    else:
        raise _fail(
            name,
            f"{name} must be a number of seconds (int or float) or a timedelta, "
            f"got {_shown(value)} ({type(value).__name__}).",
            f"Write e.g. {name}=60 or {name}=timedelta(minutes=1).",
        )
    if not math.isfinite(number) or number <= 0 or number > maximum:
        raise _fail(
            name,
            f"{name} must be a duration above 0 and at most {_duration_text(maximum)}, "
            f"got {_shown(value)}.",
            f"Give a positive, finite duration of at most {maximum:g} seconds.",
        )
    return number


def check_choice(name: str, value: object) -> str:
    """Validate an option with a fixed set of values; return it."""
    choices = _CHOICES[name]
    if not isinstance(value, str) or value not in choices:
        shown = " or ".join(repr(c) for c in choices)
        raise _fail(
            name,
            f"{name.lower()} ({name}) must be one of {shown}, got {_shown(value)}.",
            f"Use {shown} (lower case, a str).",
        )
    return value


# -- validators: each returns the value as it reads back, or raises GroussetSettingsError ----


def _duration(name: str, value: object) -> float:
    if value is None:
        raise _fail(
            name,
            f"{name} must be a number of seconds or a timedelta, got None.",
            f"Remove {name} to use the default, or give a duration "
            "(e.g. 3600 or timedelta(hours=1)).",
        )
    result = seconds(value, name=name)
    assert result is not None
    return result


def _optional_duration(name: str, value: object) -> float | None:
    return seconds(value, name=name)


def _expires_after(name: str, value: object) -> float:
    if value is None:
        raise _fail(
            name,
            "EXPIRES_AFTER must be a number of seconds or a timedelta, got None (None would "
            "expire every record at once and turn deduplication off).",
            "Remove EXPIRES_AFTER for the default (7 days), or give the retention window, "
            "e.g. timedelta(days=30); at most 100 years.",
        )
    return _duration(name, value)


def _store_timeout(name: str, value: object) -> float:
    if value is None:
        return _duration(name, value)
    result = seconds(value, name=name, maximum=86400.0)
    assert result is not None
    return result


def _integer(low: int, high: int) -> Callable[[str, object], int]:
    def check(name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _fail(
                name,
                f"{name} must be an int from {low} to {high}, got {_shown(value)}.",
                f"Write a plain integer, e.g. {name}={DEFAULTS[name]!r}.",
            )
        return int(value)

    return check


def _boolean(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _fail(
            name,
            f"{name} must be True or False (a bool), got {_shown(value)}.",
            "Strings and numbers are refused (\"false\" would be true): write True or False.",
        )
    return value


def _choice(name: str, value: object) -> str:
    return check_choice(name, value)


def _text(max_length: int, *, optional: bool) -> Callable[[str, object], str | None]:
    def check(name: str, value: object) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not 1 <= len(value) <= max_length:
            kind = "None or a" if optional else "a"
            raise _fail(
                name,
                f"{name} must be {kind} non-empty str of at most {max_length} characters, "
                f"got {_shown(value)}.",
                f"Write e.g. {name}={'billing' if optional else 'default'!r}.",
            )
        return value

    return check


def _redact_keys(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        raise _fail(
            name,
            f"{name} must be a list, tuple or set of names, got the str {_shown(value)} "
            "(a str would be read letter by letter).",
            f"Write {name}=({value!r},) or [{value!r}].",
        )
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(
        isinstance(key, str) and key.strip() for key in value
    ):
        raise _fail(
            name,
            f"{name} must be a list, tuple or set of non-empty str names, got {_shown(value)}.",
            f"Write e.g. {name}=(\"pin_code\", \"mother_maiden_name\").",
        )
    return tuple(sorted(value)) if isinstance(value, (set, frozenset)) else tuple(value)


@dataclass(frozen=True)
class Setting:
    """One ``GROUSSET`` key: its default, its validator, and what it accepts."""

    name: str
    default: Any
    validate: Callable[[str, object], Any] = field(repr=False)
    accepts: str


_INT32 = 2**31 - 1

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
        # Emergency switch: run every task unguarded, logging loudly.
        Setting("BYPASS", False, _boolean, "a bool"),
        # Argument names whose values are redacted in args_repr (added to the built-in list).
        Setting(
            "REDACT_KEYS",
            (),
            _redact_keys,
            "a list, tuple or set of non-empty str (not a str); read back as a tuple",
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
    )
}

#: Built-in defaults. Keys are the ``GROUSSET`` setting names.
DEFAULTS: dict[str, Any] = {name: s.default for name, s in SETTINGS.items()}

_CHOICES = {
    "ON_IN_FLIGHT": ("retry", "wait"),
    "ON_FAILURE": ("release", "memoize"),
    "CLAIM_COMMIT": ("durable", "async"),
}


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
