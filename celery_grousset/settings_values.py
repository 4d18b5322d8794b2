"""The value rules of the ``GROUSSET`` settings: each setting's type and range, and the
error that names a refused value and its fix (docs/configuration.md)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from celery_grousset.exceptions import ConfigurationError

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


class GroussetSettingsError(ConfigurationError):
    """``settings.GROUSSET`` (or a task option) has a value celery-grousset refuses.

    ``problems`` lists each one (:class:`Problem`: the setting, the message, the fix);
    the text names every setting concerned.
    """

    def __init__(self, problems: list[Problem] | str) -> None:
        if isinstance(problems, str):  # rebuilt from its text (Celery's JSON result backend)
            self.problems, self.setting = [], ""
            super().__init__(problems)
            return
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
    days = limit / 86400
    return (f"{days:g} day" + ("s" if days != 1 else "")) if days >= 1 else f"{limit:g} s"


def as_seconds(value: object) -> float | None:
    """A number of seconds or a timedelta as float seconds (infinite beyond the float
    range); None for any other type. The one reading of a duration value, used by the
    settings and by the management commands' options."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int beyond float range
            return math.inf
    return None


def seconds(value: object, *, name: str, maximum: float = MAX_DURATION) -> float | None:
    """Return ``value`` (seconds as int/float, or a timedelta) as float seconds.

    ``None`` stays ``None`` (unset). Anything else must be a finite duration above
    zero and at most ``maximum`` seconds (100 years unless said otherwise); otherwise
    :class:`GroussetSettingsError` (an ``ImproperlyConfigured``) names ``name``.
    """
    if value is None:
        return None
    number = as_seconds(value)
    if number is None:
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
            f"Give a positive, finite duration of at most {_duration_text(maximum)} "
            "(seconds, or a timedelta).",
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


#: the longest ``WORKER_CLAIM_FLUSH_DELAY`` (seconds): a pass waits for company, not longer
MAX_FLUSH_DELAY = 1.0


def _flush_delay(name: str, value: object) -> float:
    """0 (no delay) or a duration of at most :data:`MAX_FLUSH_DELAY`."""
    number = as_seconds(value)
    if number is None or not (math.isfinite(number) and 0 <= number <= MAX_FLUSH_DELAY):
        raise _fail(
            name,
            f"{name} must be 0 or a number of seconds (or a timedelta) of at most "
            f"{MAX_FLUSH_DELAY:g} s, got {_shown(value)}.",
            f"Write e.g. {name}=0.002 (2 ms), or remove it for 0 (claim at once).",
        )
    return number


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
                f"Write a plain integer from {low} to {high}.",
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


def check_bool(name: str, value: object) -> bool:
    """Validate a True/False option (a real ``bool``: ``"false"`` would be true); return it."""
    return _boolean(name, value)


def _choice(name: str, value: object) -> str:
    return check_choice(name, value)


def _text(max_length: int, *, optional: bool) -> Callable[[str, object], str | None]:
    def check(name: str, value: object) -> str | None:
        if value is None and optional:
            return None
        edges = optional and isinstance(value, str) and value.strip() != value  # (a processor
        if not isinstance(value, str) or not 1 <= len(value) <= max_length or edges:  # id: with
            kind = "None or a" if optional else "a"  # MySQL's PAD SPACE, "a " is "a")
            edges_text = ", with no white space at its ends" if optional else ""
            raise _fail(name, f"{name} must be {kind} non-empty str of at most {max_length} "
                        f"characters{edges_text}, got {_shown(value)}.",
                        f"Write e.g. {name}={'billing' if optional else 'default'!r}.")  # fmt: skip
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


#: BLAKE3's key derivation context of FINGERPRINT_KEY (fixed: a new one re-keys every
#: fingerprint)
FINGERPRINT_KEY_CONTEXT = "celery-grousset 2026-12 fingerprint key"


def _fingerprint_key(name: str, value: object) -> bytes | None:
    """None, or a secret of at least 32 bytes (a str as UTF-8), read back as the 32-byte
    key derived from it, never the secret itself (nor shown in an error)."""
    if value is None:
        return None
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    if not isinstance(raw, bytes) or len(raw) < 32:
        got = f"{len(raw)} bytes" if isinstance(raw, bytes) else f"a {type(value).__name__}"
        raise _fail(
            name,
            f"{name} must be None or a secret str or bytes of at least 32 bytes, got {got} "
            "(the value is not shown).",
            "Generate one with `python -c \"import secrets; print(secrets.token_urlsafe(32))\"` "
            "and keep it, like SECRET_KEY, out of version control.",
        )
    from blake3 import blake3

    return bytes(blake3(raw, derive_key_context=FINGERPRINT_KEY_CONTEXT).digest())


#: The options a ``GROUSSET["TASKS"]`` entry may set: the task options of
#: docs/configuration.md (``celery_grousset.options.NAMES`` and ``grousset_key``).
TASK_OPTIONS = (
    "max_processing_time",
    "expires_after",
    "processor_id",
    "on_in_flight",
    "transactional",
    "memoize",
    "on_failure",
    "validate_payload",
    "periodic_slot",
    "max_result_bytes",
    "max_takeovers",
    "database",
    "grousset_key",
)

_TASKS_EXAMPLE = 'TASKS={"shop.tasks.send_receipt": {"max_processing_time": 60}}'


def _key_names(name: str, value: object) -> tuple[str, ...] | Callable[..., object]:
    """``grousset_key``: argument names (not a str) or a callable over the arguments."""
    if callable(value):
        return value
    if isinstance(value, (list, tuple)) and value and all(
        isinstance(key, str) and key for key in value
    ):
        return tuple(value)
    raise _fail(
        name,
        f"grousset_key must be a list or tuple of argument names, or a callable, got "
        f"{_shown(value)}.",
        'Write e.g. "grousset_key": ("order_id",).',
    )


#: Celery's own task options that have no project-wide setting of their own
_CELERY_ONLY = frozenset((
    "autoretry_for", "dont_autoretry_for", "retry_kwargs", "retry_backoff", "retry_backoff_max",
    "retry_jitter", "max_retries", "default_retry_delay", "queue", "throws", "trail",
    "send_events"))  # fmt: skip


def _refuse_celery_option(key: str) -> None:
    """Refuse Celery's own task option ``key``, saying where Celery reads it instead."""
    from celery import Task

    where = {**dict(Task.from_config), "time_limit": "task_time_limit",
             "soft_time_limit": "task_soft_time_limit"}.get(key)  # fmt: skip
    if where or key in _CELERY_ONLY:
        everywhere = f", for every task (CELERY_{where.upper()})" if where else ""
        raise _fail("TASKS", f"{key!r} is a Celery task option, not one of celery-grousset's.",
                    f"Set it where Celery reads it: on the task ({key}=…){everywhere}, or for "
                    "tasks you do not own in Celery's task_annotations (CELERY_TASK_ANNOTATIONS).")


def _task_entry(
    where: str, options: object, option: Callable[[str, object], object]
) -> tuple[dict[str, object], list[Problem]]:
    """One entry of ``GROUSSET["TASKS"]``: its options as they read back, and its problems."""
    if not isinstance(options, Mapping):
        message = f"{where} must be a dict of task options, got {_shown(options)}."
        hint = f'Write {where} = {{"max_processing_time": 60, ...}}.'
        return {}, [Problem("TASKS", message, hint)]
    entry: dict[str, object] = {}
    problems: list[Problem] = []
    for key, value in options.items():
        try:
            if not isinstance(key, str) or key not in TASK_OPTIONS:
                if isinstance(key, str):
                    _refuse_celery_option(key)
                close = difflib.get_close_matches(str(key), TASK_OPTIONS, n=1, cutoff=0.6)
                meant = f" (did you mean {close[0]!r}?)" if close else ""
                raise _fail(
                    "TASKS",
                    f"{_shown(key)} is not a task option{meant}.",
                    f"The task options are {', '.join(TASK_OPTIONS)} (docs/configuration.md).",
                )
            if value is None:
                raise _fail("TASKS", f"{key} is None.", "Remove it to leave the option unset.")
            entry[key] = (_key_names if key == "grousset_key" else option)(key, value)
        except GroussetSettingsError as exc:
            problems += [Problem("TASKS", f"{where}: {p.message}", p.hint) for p in exc.problems]
    return entry, problems


def task_table(
    option: Callable[[str, object], object],
) -> Callable[[str, object], dict[str, dict[str, object]]]:
    """The validator of ``GROUSSET["TASKS"]``: a dict of task names or fnmatch patterns to
    dicts of task options, each checked by ``option(name, value)`` as a task option is."""

    def check(name: str, value: object) -> dict[str, dict[str, object]]:
        if not isinstance(value, Mapping):
            raise _fail(
                name,
                f"GROUSSET['{name}'] must be a dict of task names or patterns to dicts of task "
                f"options, got {_shown(value)}.",
                f"Write e.g. {_TASKS_EXAMPLE}.",
            )
        table: dict[str, dict[str, object]] = {}
        problems: list[Problem] = []
        for pattern, options in value.items():
            where = f"GROUSSET['{name}'][{_shown(pattern)}]"
            if not isinstance(pattern, str) or not pattern.strip():
                hint = f"Keys are task names or fnmatch patterns: {_TASKS_EXAMPLE}."
                problems.append(Problem(name, f"{where}: not a task name or pattern.", hint))
                continue
            table[pattern], found = _task_entry(where, options, option)
            problems += found
        if problems:
            raise GroussetSettingsError(problems)
        return table

    return check


_CHOICES = {
    "ON_IN_FLIGHT": ("retry", "wait"),
    "ON_FAILURE": ("release", "memoize"),
    "CLAIM_COMMIT": ("durable", "async"),
    "JOURNAL_LAYOUT": ("table", "partitioned"),
}
