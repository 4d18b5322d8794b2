"""Property-based test of the ``GROUSSET`` settings (issue 16): over the whole dict, with
values of many types, every value either reads back as docs/configuration.md says or
is refused — at first use and by ``manage.py check`` — with a message naming the
setting; and no check function ever raises.

The oracle below is written from the documented rules ("Types and ranges" in
docs/configuration.md), not from celery_grousset.conf.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from celery_grousset.conf import DEFAULTS, grousset_settings
from tests import services

YEARS_100 = 36500 * 86400.0
DURATIONS = {
    "MAX_PROCESSING_TIME": YEARS_100,
    "EXPIRES_AFTER": YEARS_100,
    "STORE_TIMEOUT": 86400.0,
    "STORE_RETRY_BACKOFF": YEARS_100,
    "STORE_RETRY_BACKOFF_MAX": YEARS_100,
    "WORKER_CLAIM_RENEW_AFTER": YEARS_100,
}
#: durations that may be None (unset)
OPTIONAL_DURATIONS = {"MAX_PROCESSING_TIME", "WORKER_CLAIM_RENEW_AFTER"}
CHOICES = {
    "ON_IN_FLIGHT": ("retry", "wait"),
    "ON_FAILURE": ("release", "memoize"),
    "CLAIM_COMMIT": ("durable", "async"),
    "JOURNAL_LAYOUT": ("table", "partitioned"),
}
BOOLS = {
    "TRANSACTIONAL", "MEMOIZE", "VALIDATE_PAYLOAD", "BYPASS", "WORKER_CLAIM", "PERIODIC_SLOT",
}
INTS = {
    "MAX_RESULT_BYTES": (0, 2**30),
    "MAX_TAKEOVERS": (0, 2**31 - 1),
    "ARGS_REPR_MAX_LENGTH": (0, 1_000_000),
    "WORKER_CLAIM_BATCH_SIZE": (1, 10_000),
}
TEXTS = {"DATABASE": (255, False), "PROCESSOR_ID": (128, True)}

_REFUSED = object()
CHOICE_WORDS = [
    *("retry", "wait", "release", "memoize", "durable", "async", "table", "partitioned"),
    *("false", "true", "0", "default", "256KB", "7d", "x" * 129),
]


def documented(name: str, value: object) -> object:
    """What ``GROUSSET[name] = value`` reads back as, or ``_REFUSED``."""
    if name in DURATIONS:
        if value is None:
            return None if name in OPTIONAL_DURATIONS else _REFUSED
        if isinstance(value, timedelta):
            number = value.total_seconds()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if abs(value) < 1e300 else math.inf
        else:
            return _REFUSED
        ok = math.isfinite(number) and 0 < number <= DURATIONS[name]
        return number if ok else _REFUSED
    if name == "WORKER_CLAIM_FLUSH_DELAY":
        number = value.total_seconds() if isinstance(value, timedelta) else value
        ok = isinstance(number, (int, float)) and not isinstance(number, bool)
        return float(number) if ok and 0 <= number <= 1.0 else _REFUSED
    if name in CHOICES:
        return value if isinstance(value, str) and value in CHOICES[name] else _REFUSED
    if name in BOOLS:
        return value if isinstance(value, bool) else _REFUSED
    if name in INTS:
        low, high = INTS[name]
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        return value if ok else _REFUSED
    if name in TEXTS:
        longest, optional = TEXTS[name]
        if value is None and optional:
            return None
        ok = isinstance(value, str) and 1 <= len(value) <= longest
        if ok and optional:  # a processor id: no white space at its ends
            ok = value.strip() == value  # type: ignore[union-attr]
        return value if ok else _REFUSED
    if name == "TASKS":
        return documented_tasks(value)
    if name == "FINGERPRINT_KEY":
        return documented_key(value)
    assert name == "REDACT_KEYS", name
    if not isinstance(value, (list, tuple, set, frozenset)):
        return _REFUSED
    if not all(isinstance(key, str) and key.strip() for key in value):
        return _REFUSED
    return tuple(sorted(value)) if isinstance(value, (set, frozenset)) else tuple(value)


def documented_key(value: object) -> object:
    """``None``, or a str (UTF-8) or bytes of at least 32 bytes, read back as the 32-byte
    key BLAKE3 derives from it."""
    from blake3 import blake3

    from celery_grousset.settings_values import FINGERPRINT_KEY_CONTEXT

    if value is None:
        return None
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    if not isinstance(raw, bytes) or len(raw) < 32:
        return _REFUSED
    return blake3(raw, derive_key_context=FINGERPRINT_KEY_CONTEXT).digest()


#: the task options a GROUSSET["TASKS"] entry may set ("Guard tasks from settings")
TASK_OPTIONS = (
    *("max_processing_time", "expires_after", "processor_id", "on_in_flight", "transactional"),
    *("memoize", "on_failure", "max_result_bytes", "max_takeovers", "database", "grousset_key"),
)


def documented_tasks(value: object) -> object:
    """``GROUSSET["TASKS"]``: a dict of non-empty str names or patterns to dicts of task
    options, each option (never None) accepted as its setting is; ``grousset_key`` a
    non-empty list or tuple of non-empty str names. Reads back with each option as its
    setting reads back, ``grousset_key`` as a tuple."""
    if not isinstance(value, dict):
        return _REFUSED
    table: dict[str, dict[str, object]] = {}
    for pattern, options in value.items():
        if not isinstance(pattern, str) or not pattern.strip() or not isinstance(options, dict):
            return _REFUSED
        entry: dict[str, object] = {}
        for option, raw in options.items():
            if option not in TASK_OPTIONS or raw is None:
                return _REFUSED
            if option == "grousset_key":
                ok = isinstance(raw, (list, tuple)) and bool(raw) and all(
                    isinstance(key, str) and key for key in raw
                )
                read: object = tuple(raw) if ok else _REFUSED  # type: ignore[arg-type]
            else:
                read = documented(option.upper(), raw)
            if read is _REFUSED:
                return _REFUSED
            entry[option] = read
        table[pattern] = entry
    return table


names = st.text("abcdefgIKLMNOPRSTU_", min_size=1, max_size=12)
patterns = names | st.sampled_from(["tests.tasks.*", "*", "shop.tasks.send_receipt", "x.?", " "])
durations = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.timedeltas(min_value=timedelta(days=-40000), max_value=timedelta(days=40000)),
    st.sampled_from([0, 1, 60, 0.5, 3600.0, YEARS_100, YEARS_100 + 1, 86400, 86401]),
)
values = st.one_of(
    st.none(),
    st.booleans(),
    durations,
    st.integers(min_value=-(2**40), max_value=2**40),
    st.text(max_size=8),
    st.binary(min_size=30, max_size=34),
    st.text(min_size=30, max_size=34),
    st.sampled_from(CHOICE_WORDS),
    st.lists(st.one_of(names, st.integers(), st.none(), st.just("")), max_size=3),
    st.tuples(names),
    st.frozensets(names, max_size=3),
    st.dictionaries(names, st.integers(), max_size=2),
    st.dictionaries(
        patterns, st.dictionaries(st.sampled_from(TASK_OPTIONS), durations, max_size=2), max_size=2
    ),
)


def valid(name: str) -> st.SearchStrategy[Any]:
    """Values the documentation accepts for ``name``."""
    if name in DURATIONS:
        top = DURATIONS[name]
        strategy: st.SearchStrategy[Any] = st.one_of(
            st.floats(min_value=1e-6, max_value=top),
            st.integers(min_value=1, max_value=int(top)),
            st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(seconds=top)),
        )
        if name == "STORE_RETRY_BACKOFF":  # mostly below the default STORE_RETRY_BACKOFF_MAX
            strategy = st.floats(min_value=1e-6, max_value=60.0) | strategy
        return strategy | st.none() if name in OPTIONAL_DURATIONS else strategy
    if name in CHOICES:
        return st.sampled_from(CHOICES[name])
    if name in BOOLS:
        return st.booleans()
    if name in INTS:
        low, high = INTS[name]
        return st.integers(min_value=low, max_value=high)
    if name in TEXTS:
        longest, optional = TEXTS[name]
        text = st.text(min_size=1, max_size=min(longest, 20)) | st.just("x" * longest)
        return text | st.none() if optional else text
    if name == "TASKS":
        def option(name: str) -> st.SearchStrategy[tuple[str, Any]]:
            if name == "grousset_key":
                return st.lists(names, min_size=1, max_size=2).map(lambda v: (name, v))
            good = valid(name.upper()).filter(lambda v: v is not None)
            return good.map(lambda v: (name, v))

        entries = st.lists(st.sampled_from(TASK_OPTIONS).flatmap(option), max_size=3).map(dict)
        return st.dictionaries(patterns.filter(str.strip), entries, max_size=3)
    if name == "FINGERPRINT_KEY":
        return st.none() | st.text(min_size=32, max_size=40) | st.binary(min_size=32, max_size=40)
    return st.one_of(st.lists(names, max_size=3), st.tuples(names), st.frozensets(names))


@st.composite
def groussets(draw: st.DrawFn) -> dict[Any, Any]:
    """A GROUSSET dict: some settings, each valid three times in four, and now and then
    a misspelt, lower-case or unknown key."""
    chosen = draw(st.lists(st.sampled_from(sorted(DEFAULTS)), unique=True, max_size=6))
    grousset: dict[Any, Any] = {}
    for name in chosen:  # (sampled_from: hypothesis biases one_of and integers to the ends)
        good = draw(st.sampled_from([True, True, True, False]))
        grousset[name] = draw(valid(name) if good else values)
    if draw(st.sampled_from([True] + [False] * 7)):
        key = draw(
            st.sampled_from(sorted(DEFAULTS)).map(str.lower)
            | st.sampled_from(["MAX_PROCESING_TIME", "EXPIRE_AFTER", "BYPAS", "NOT_A_SETTING"])
            | names
        )
        grousset[key] = draw(values)
    return grousset


@pytest.fixture(scope="module", autouse=True)
def journal() -> Iterator[None]:
    services.require_database("default")
    old = os.environ.get("CELERY_SKIP_CHECKS")
    os.environ["CELERY_SKIP_CHECKS"] = "1"  # the Django fixup's nested check run
    yield
    if old is None:
        os.environ.pop("CELERY_SKIP_CHECKS", None)
    else:
        os.environ["CELERY_SKIP_CHECKS"] = old


SETTINGS_IDS = {"celery_grousset.E004", "celery_grousset.E010", "celery_grousset.E011"}


def run_check_functions() -> list[checks.CheckMessage]:
    """Every celery-grousset check function, called directly: none may raise."""
    from celery_grousset.checks import check_journal_databases, check_tasks

    return [*check_tasks(), *check_journal_databases(databases=["default"])]


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(grousset=groussets())
def test_every_grousset_works_as_documented_or_is_refused_by_name(grousset: dict[str, Any]) -> None:
    # Given any GROUSSET dict: the oracle's verdict on each key
    unknown = [key for key in grousset if key not in DEFAULTS]
    expected = {name: documented(name, grousset.get(name, DEFAULTS[name])) for name in DEFAULTS}
    refused = sorted(name for name, value in expected.items() if value is _REFUSED)
    low, high = expected["STORE_RETRY_BACKOFF"], expected["STORE_RETRY_BACKOFF_MAX"]
    inverted = low is not _REFUSED and high is not _REFUSED and high < low  # type: ignore[operator]
    with override_settings(GROUSSET=grousset):
        # When the check functions run / Then none raises
        messages = run_check_functions()
        found = {m.id for m in messages}
        text = " ".join(f"{m.msg} {m.hint or ''} {m.obj or ''}" for m in messages)
        event("refused" if (unknown or refused or inverted) else "accepted")
        if not (unknown or refused or inverted):
            # Then a valid dict reads back as documented and passes the settings checks
            for name, value in expected.items():
                got = getattr(grousset_settings, name)
                assert got == value and type(got) is type(value), (name, grousset, got)
            assert not found & SETTINGS_IDS, text
            assert "celery_grousset.E014" not in found, text
        else:
            # Then the first read refuses it, naming every refused setting
            with pytest.raises(ImproperlyConfigured) as info:
                grousset_settings.DATABASE  # noqa: B018
            message = str(info.value)
            for name in [*refused, *(repr(key) for key in unknown)]:
                assert name in message, (name, message)
            if inverted:
                assert "STORE_RETRY_BACKOFF_MAX" in message, message
            # And the checks report it under the settings ids, naming the same settings
            assert found and found <= SETTINGS_IDS, (found, text)
            for name in [*refused, *(repr(key) for key in unknown)]:
                assert name in text, (name, text)


@settings(max_examples=100, deadline=None)
@given(grousset=st.one_of(st.lists(names), st.text(max_size=5), st.integers(), st.none()))
def test_a_grousset_that_is_not_a_dict_is_refused(grousset: object) -> None:
    with override_settings(GROUSSET=grousset):
        messages = run_check_functions()
        if grousset is None:  # no GROUSSET: all defaults
            expires_after = grousset_settings.EXPIRES_AFTER
            assert expires_after == DEFAULTS["EXPIRES_AFTER"]
            assert not {m.id for m in messages} & SETTINGS_IDS
            return
        with pytest.raises(ImproperlyConfigured, match="GROUSSET must be a dict"):
            grousset_settings.DATABASE  # noqa: B018
        assert {m.id for m in messages} == {"celery_grousset.E004"}


bad_entries = st.dictionaries(
    patterns,
    st.one_of(
        values,
        st.dictionaries(st.sampled_from([*TASK_OPTIONS, "acks_late", "typo"]), values, max_size=2),
    ),
    max_size=2,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(tasks=st.one_of(valid("TASKS"), valid("TASKS"), bad_entries, values))
def test_every_tasks_table_works_as_documented_or_is_refused_by_name(tasks: object) -> None:
    # Given GROUSSET["TASKS"]: what the documentation says it reads back as
    expected = documented("TASKS", tasks)
    event("refused" if expected is _REFUSED else "accepted")
    with override_settings(GROUSSET={"DATABASE": "default", "TASKS": tasks}):
        # When the check functions run (they guard the test app's matching tasks)
        messages = run_check_functions()
        found = {m.id for m in messages}
        text = " ".join(f"{m.msg} {m.hint or ''} {m.obj or ''}" for m in messages)
        assert "celery_grousset.E014" not in found, text
        if expected is not _REFUSED:
            # Then a valid table reads back as documented and passes the settings checks
            assert expected == grousset_settings.TASKS
            assert not found & SETTINGS_IDS, text
        else:
            # Then it is refused, naming GROUSSET['TASKS'], at first use and by the checks
            with pytest.raises(ImproperlyConfigured, match=r"GROUSSET\['TASKS'\]"):
                grousset_settings.TASKS  # noqa: B018
            assert found == {"celery_grousset.E010"}, text
            assert "GROUSSET['TASKS']" in text
