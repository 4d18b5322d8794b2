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

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

#: Built-in defaults. Keys are the ``GROUSSET`` setting names.
DEFAULTS: dict[str, Any] = {
    # Django database alias of the outcome journal.
    "DATABASE": "default",
    # Who deduplicates. None: the Celery app's main name (or "default" for protect()).
    "PROCESSOR_ID": None,
    # Seconds an attempt may hold a claim before another may take it over. No default.
    "MAX_PROCESSING_TIME": None,
    # Retention window: seconds a completed record is remembered (7 days).
    "EXPIRES_AFTER": 7 * 24 * 3600,
    # What a duplicate does while another attempt holds a fresh claim: "retry" or "wait".
    "ON_IN_FLIGHT": "retry",
    # Run the task body and the completion in one transaction on the journal's database.
    "TRANSACTIONAL": False,
    # Store the return value so duplicates get it.
    "MEMOIZE": True,
    # When the body raises: "release" (next delivery runs again) or "memoize" (replay the error).
    "ON_FAILURE": "release",
    # Larger encoded results are not memoized (the effect is never re-run for it).
    "MAX_RESULT_BYTES": 256 * 1024,
    # Takeovers of one record before it is marked failed (a task that kills its worker).
    "MAX_TAKEOVERS": 3,
    # Seconds a store operation may take (connect, lock wait, statement) before it fails closed.
    "STORE_TIMEOUT": 5.0,
    # PostgreSQL: "durable" claims wait for the WAL flush; "async" ones do not (opt-in;
    # completions always do). See docs/performance.md.
    "CLAIM_COMMIT": "durable",
    # Emergency switch: run every task unguarded, logging loudly.
    "BYPASS": False,
    # Argument names whose values are redacted in args_repr (added to the built-in list).
    "REDACT_KEYS": (),
    # Maximum length of the stored args_repr.
    "ARGS_REPR_MAX_LENGTH": 1024,
    # Fail-closed retry backoff for a delivery that found the store unavailable (seconds).
    "STORE_RETRY_BACKOFF": 1.0,
    "STORE_RETRY_BACKOFF_MAX": 60.0,
}

_CHOICES = {
    "ON_IN_FLIGHT": ("retry", "wait"),
    "ON_FAILURE": ("release", "memoize"),
    "CLAIM_COMMIT": ("durable", "async"),
}


def seconds(value: object, *, name: str) -> float | None:
    """Return ``value`` (seconds as int/float, or a timedelta) as float seconds."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ImproperlyConfigured(
            f"celery-grousset: {name} must be a number of seconds or a timedelta, got {value!r}."
        )
    if value <= 0:
        raise ImproperlyConfigured(f"celery-grousset: {name} must be positive, got {value!r}.")
    return float(value)


def check_choice(name: str, value: object) -> str:
    """Validate an option with a fixed set of values; return it."""
    choices = _CHOICES[name]
    if value not in choices:
        raise ImproperlyConfigured(
            f"celery-grousset: {name.lower()} must be one of {choices}, got {value!r}."
        )
    return str(value)


class GroussetSettings:
    """Lazy view of ``settings.GROUSSET`` merged over :data:`DEFAULTS`."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        from django.conf import settings

        user = getattr(settings, "GROUSSET", None) or {}
        if not isinstance(user, dict):
            raise ImproperlyConfigured("celery-grousset: settings.GROUSSET must be a dict.")
        unknown = sorted(set(user) - set(DEFAULTS))
        if unknown:
            raise ImproperlyConfigured(
                f"celery-grousset: unknown GROUSSET setting(s) {unknown}; "
                f"known settings are {sorted(DEFAULTS)}."
            )
        merged = {**DEFAULTS, **user}
        for name in _CHOICES:
            check_choice(name, merged[name])
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
