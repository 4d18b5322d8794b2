"""Every exception celery-grousset raises travels to the caller whole: pickled (eager
results, the pickle serializer) with its type, message and attributes, and rebuilt
from its message by Celery's JSON result backend with its type — so
``except GroussetSettingsError`` around ``result.get()`` matches what the task raised."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import pytest
from celery.backends.base import BaseBackend
from django.test import override_settings

from celery_grousset import exceptions
from celery_grousset.settings_values import GroussetSettingsError, Problem
from tests.celeryapp import app

#: one instance of each, with the keyword attributes set where it has any
SAMPLES: list[Exception] = [
    exceptions.ClaimInFlight("held", fingerprint="ab" * 32, retry_in=12.5),
    exceptions.MemoNotAccepted("not accepted", content_type="application/x-python-serialize"),
    exceptions.MemoizedFailure("replayed", exc_type="builtins.KeyError", exc_message="'k'"),
    exceptions.PayloadMismatch("mismatch", fingerprint="cd" * 32, stored_hash="1", given_hash="2"),
    GroussetSettingsError([Problem("EXPIRES_AFTER", "EXPIRES_AFTER is '7d'.", "Write 7 days.")]),
]
SAMPLES += [
    cls("a message")
    for _, cls in inspect.getmembers(exceptions, inspect.isclass)
    if issubclass(cls, exceptions.GroussetError) and cls not in {type(s) for s in SAMPLES}
]


@pytest.mark.parametrize("exc", SAMPLES, ids=lambda e: type(e).__name__)
def test_pickled_and_back_keeps_type_message_and_attributes(exc: Exception) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc) and back.args == exc.args
    assert vars(back) == vars(exc)


@pytest.mark.parametrize("exc", SAMPLES, ids=lambda e: type(e).__name__)
def test_celery_json_result_backend_rebuilds_the_type(exc: Exception) -> None:
    backend = BaseBackend(app, serializer="json")
    back = backend.exception_to_python(backend.prepare_exception(exc))
    assert type(back) is type(exc) and str(back) == str(exc)


def test_an_eager_task_under_a_refused_setting_reports_grousset_settings_error(
    journal: str,
) -> None:
    from tests.tasks import effect

    # Given a GROUSSET value celery-grousset refuses / When a task runs eagerly
    with override_settings(GROUSSET={"DATABASE": journal, "EXPIRES_AFTER": "7d"}):
        result = effect.apply(("refused-setting",))
    # Then its result is the settings error, with the setting it names
    assert result.failed() and type(result.result) is GroussetSettingsError
    problems: Any = result.result.problems
    assert [p.setting for p in problems] == ["EXPIRES_AFTER"]


def test_the_exceptions_module_exports_the_documented_exceptions_and_nothing_else() -> None:
    import re

    from celery_grousset import signals
    from tests.test_docs import DOCS

    # Given the exceptions docs/api.md lists from celery_grousset.exceptions
    table = (DOCS / "api.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M)) - {"GroussetSettingsError"}
    # Then `from celery_grousset.exceptions import *` gives exactly them (not the Reject and
    # ImproperlyConfigured it imports), and the signals module its three signals
    assert set(exceptions.__all__) == documented
    assert all(issubclass(getattr(exceptions, name), Exception) for name in exceptions.__all__)
    assert set(signals.__all__) == {"claim_taken_over", "duplicate_skipped", "fenced_out"}
