"""Settings validation (issue 16, defect 8): every ``GROUSSET`` value is checked for type
and range once, in ``celery_grousset.conf``; a bad one is refused at first use with
``ImproperlyConfigured`` naming the setting and the fix, never silently reinterpreted."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from celery_grousset.conf import DEFAULTS, grousset_settings, seconds, validate


def read(grousset: Any, name: str = "DATABASE") -> Any:
    with override_settings(GROUSSET=grousset):
        return getattr(grousset_settings, name)


def refused(grousset: Any, name: str = "DATABASE") -> str:
    """The message with which reading ``name`` under ``grousset`` is refused."""
    with pytest.raises(ImproperlyConfigured) as info:
        read(grousset, name)
    return str(info.value)


# -- the cases of the issue ---------------------------------------------------------------


def test_expires_after_none_is_refused_not_dedup_off() -> None:
    # Given EXPIRES_AFTER=None (today: every record expires at once, no deduplication)
    # When a setting is read / Then it is refused, naming the setting and the fix
    message = refused({"EXPIRES_AFTER": None}, "EXPIRES_AFTER")
    assert "EXPIRES_AFTER" in message and "None" in message
    assert "timedelta" in message  # the fix: a number of seconds or a timedelta


@pytest.mark.parametrize("value", ["false", "False", "0", "", 0, 1, None, "true"])
def test_bypass_accepts_only_real_bools(value: object) -> None:
    # Given BYPASS set to a string or number (today "false" is truthy: bypass ON)
    # When it is read / Then it is refused
    message = refused({"BYPASS": value}, "BYPASS")
    assert "BYPASS" in message and "True or False" in message


def test_bypass_false_reads_back_false() -> None:
    assert read({"BYPASS": False}, "BYPASS") is False
    assert read({"BYPASS": True}, "BYPASS") is True


def test_redact_keys_as_a_string_is_refused() -> None:
    # Given REDACT_KEYS="pin_code" (today: iterated letter by letter)
    message = refused({"REDACT_KEYS": "pin_code"}, "REDACT_KEYS")
    # Then it is refused, with the fix
    assert "REDACT_KEYS" in message and "('pin_code',)" in message


@pytest.mark.parametrize("value", [[1], ["ok", None], [""], {"a": 1}, 7])
def test_redact_keys_must_be_a_collection_of_names(value: object) -> None:
    assert "REDACT_KEYS" in refused({"REDACT_KEYS": value}, "REDACT_KEYS")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(["pin_code"], ("pin_code",)), (("a", "b"), ("a", "b")), ({"z", "a"}, ("a", "z"))],
)
def test_redact_keys_read_back_as_a_tuple(value: object, expected: tuple[str, ...]) -> None:
    assert read({"REDACT_KEYS": value}, "REDACT_KEYS") == expected


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_RESULT_BYTES", "256KB"),
        ("MAX_RESULT_BYTES", -1),
        ("MAX_RESULT_BYTES", 2.5),
        ("MAX_RESULT_BYTES", True),
        ("MAX_PROCESSING_TIME", "abc"),
        ("MAX_PROCESSING_TIME", 0),
        ("MAX_PROCESSING_TIME", -5),
        ("MAX_PROCESSING_TIME", math.nan),
        ("MAX_PROCESSING_TIME", math.inf),
        ("MAX_PROCESSING_TIME", timedelta(0)),
        ("STORE_TIMEOUT", "x"),
        ("STORE_TIMEOUT", 0),
        ("STORE_TIMEOUT", -1.0),
        ("STORE_TIMEOUT", None),
        ("EXPIRES_AFTER", -1),
        ("EXPIRES_AFTER", 0),
        ("EXPIRES_AFTER", timedelta(days=-1)),
        ("EXPIRES_AFTER", 10**12),  # beyond any date the database can hold
        ("EXPIRES_AFTER", "7d"),
        ("MAX_TAKEOVERS", -1),
        ("MAX_TAKEOVERS", "3"),
        ("MAX_TAKEOVERS", None),
        ("ARGS_REPR_MAX_LENGTH", -1),
        ("ARGS_REPR_MAX_LENGTH", None),
        ("STORE_RETRY_BACKOFF", 0),
        ("STORE_RETRY_BACKOFF_MAX", "1m"),
        ("TRANSACTIONAL", "yes"),
        ("MEMOIZE", 1),
        ("DATABASE", ""),
        ("DATABASE", None),
        ("DATABASE", 3),
        ("PROCESSOR_ID", ""),
        ("PROCESSOR_ID", 5),
        ("PROCESSOR_ID", "x" * 129),  # the column holds 128
        ("PROCESSOR_ID", " "),  # MySQL's PAD SPACE collations: " " is ""
        ("PROCESSOR_ID", "billing "),  # ... and "billing " is "billing"
        ("ON_IN_FLIGHT", "RETRY"),
        ("ON_FAILURE", None),
        ("CLAIM_COMMIT", "fast"),
        ("WORKER_CLAIM_FLUSH_DELAY", -0.001),
        ("WORKER_CLAIM_FLUSH_DELAY", 2),  # at most 1 s
        ("WORKER_CLAIM_FLUSH_DELAY", None),
        ("WORKER_CLAIM_FLUSH_DELAY", "2ms"),
        ("WORKER_CLAIM_FLUSH_DELAY", math.nan),
    ],
)
def test_bad_values_are_refused_naming_the_setting(name: str, value: object) -> None:
    # Given one bad value / When any setting is read
    message = refused({name: value})
    # Then the message names the setting and the value (and says what is allowed)
    assert name in message, message
    assert "must" in message, message


def test_a_duration_limit_is_said_in_words() -> None:
    # STORE_TIMEOUT is at most a day: "1 day", not "1 days"; a limit under a day in seconds
    assert "at most 1 day," in refused({"STORE_TIMEOUT": 10**6})
    assert "at most 1 s," in refused({"WORKER_CLAIM_FLUSH_DELAY": 2})
    # And the hint says the limit in the same words, not as a float's exponent (3.1536e+09)
    _, [problem] = validate({"MAX_PROCESSING_TIME": float("nan")})
    assert "at most 36500 days (seconds, or a timedelta)" in problem.hint, problem.hint


def test_backoff_max_below_backoff_is_refused() -> None:
    message = refused({"STORE_RETRY_BACKOFF": 10, "STORE_RETRY_BACKOFF_MAX": 5})
    assert "STORE_RETRY_BACKOFF_MAX" in message and "STORE_RETRY_BACKOFF" in message


def test_misspelt_key_names_the_closest_valid_key() -> None:
    # Given a misspelt key
    message = refused({"MAX_PROCESING_TIME": 5})
    # Then the error names it and the key that was meant
    assert "MAX_PROCESING_TIME" in message and "Did you mean 'MAX_PROCESSING_TIME'?" in message
    # And a lower-case key is pointed at its upper-case name
    assert "Did you mean 'EXPIRES_AFTER'?" in refused({"expires_after": 5})


def test_not_a_dict_is_refused() -> None:
    assert "settings.GROUSSET must be a dict" in refused(["DATABASE"])


def test_every_problem_is_listed_at_once() -> None:
    message = refused({"BYPASS": "no", "MEMOIZE": "no", "MAX_PROCESING_TIME": 1})
    assert "BYPASS" in message and "MEMOIZE" in message and "MAX_PROCESING_TIME" in message


def test_the_error_is_an_improperly_configured_grousset_error() -> None:
    from celery_grousset.conf import GroussetSettingsError
    from celery_grousset.exceptions import GroussetError

    with pytest.raises(GroussetSettingsError) as info:
        read({"BYPASS": "false"}, "BYPASS")
    assert isinstance(info.value, GroussetError) and isinstance(info.value, ImproperlyConfigured)
    assert [p.setting for p in info.value.problems] == ["BYPASS"]


# -- what valid values read back as -------------------------------------------------------


def test_defaults_read_back_unchanged() -> None:
    with override_settings(GROUSSET={}):
        for name, value in DEFAULTS.items():
            assert getattr(grousset_settings, name) == value, name


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("MAX_PROCESSING_TIME", 60, 60.0),
        ("MAX_PROCESSING_TIME", timedelta(minutes=2), 120.0),
        ("MAX_PROCESSING_TIME", None, None),
        ("EXPIRES_AFTER", timedelta(days=1), 86400.0),
        ("EXPIRES_AFTER", 0.5, 0.5),
        ("STORE_TIMEOUT", 2, 2.0),
        ("STORE_RETRY_BACKOFF_MAX", timedelta(minutes=5), 300.0),
        ("MAX_RESULT_BYTES", 0, 0),
        ("MAX_TAKEOVERS", 0, 0),
        ("PROCESSOR_ID", "billing", "billing"),
        ("ON_IN_FLIGHT", "wait", "wait"),
        ("WORKER_CLAIM_FLUSH_DELAY", 0, 0.0),
        ("WORKER_CLAIM_FLUSH_DELAY", 0.002, 0.002),
        ("WORKER_CLAIM_FLUSH_DELAY", timedelta(milliseconds=5), 0.005),
    ],
)
def test_valid_values_read_back_as_documented(name: str, value: object, expected: object) -> None:
    got = read({name: value}, name)
    assert got == expected and type(got) is type(expected)


def test_none_grousset_means_all_defaults() -> None:
    assert read(None, "EXPIRES_AFTER") == DEFAULTS["EXPIRES_AFTER"]


# -- seconds(): the shared duration rule (task options use it too) -------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**12, timedelta(days=40000)])
def test_seconds_refuses_non_finite_and_huge_durations(value: object) -> None:
    with pytest.raises(ImproperlyConfigured, match="max_processing_time"):
        seconds(value, name="max_processing_time")


def test_seconds_accepts_numbers_and_timedeltas() -> None:
    assert seconds(None, name="x") is None
    assert seconds(1, name="x") == 1.0
    assert seconds(timedelta(hours=1), name="x") == 3600.0


def test_a_journal_database_not_in_databases_is_named_at_the_call() -> None:
    """An eager call with GROUSSET['DATABASE'] naming no database failed with Django's
    bare "The connection 'nope' doesn't exist": neither the setting nor the fix."""
    import uuid

    from celery_grousset.exceptions import ConfigurationError
    from tests.tasks import effect

    # Given a journal database that is not in DATABASES / When a guarded task is called
    with override_settings(GROUSSET={"DATABASE": "nope"}), pytest.raises(ConfigurationError) as got:
        effect.apply((f"nope-{uuid.uuid4().hex[:8]}",)).get()
    # Then the error names the setting and the databases there are (nothing ran)
    assert "GROUSSET['DATABASE'] is 'nope'" in str(got.value)
    assert "not in settings.DATABASES" in str(got.value)
