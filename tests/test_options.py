"""Option resolution (celery_grousset/options.py): per call / task > GROUSSET > built-in
default, resolved once; max_processing_time has no default."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from celery_grousset.exceptions import GroussetError
from celery_grousset.options import NAMES, Options


def resolve(**explicit: object) -> Options:
    return Options.resolve("the test", dict(explicit), default_processor="app-main")


def test_explicit_beats_settings_beats_defaults() -> None:
    base = {k: v for k, v in settings.GROUSSET.items() if k != "MAX_PROCESSING_TIME"}
    # Given GROUSSET sets two options, and the call sets one of them again
    with override_settings(GROUSSET={**base, "MAX_PROCESSING_TIME": 30, "MAX_TAKEOVERS": 7}):
        opts = resolve(max_processing_time=timedelta(minutes=2))
    # Then the explicit value wins, the setting fills the rest, defaults the remainder
    assert opts.max_processing_time == 120.0
    assert opts.max_takeovers == 7
    assert opts.processor_id == "app-main" and opts.memoize is True
    assert opts.on_failure == "release" and opts.expires_after == 7 * 24 * 3600.0


def test_none_means_unset_at_every_level() -> None:
    with override_settings(GROUSSET={**settings.GROUSSET, "MAX_PROCESSING_TIME": 45}):
        opts = resolve(max_processing_time=None, processor_id=None)
    assert opts.max_processing_time == 45.0 and opts.processor_id == "app-main"


def test_missing_max_processing_time_is_a_configuration_error() -> None:
    base = {k: v for k, v in settings.GROUSSET.items() if k != "MAX_PROCESSING_TIME"}
    with override_settings(GROUSSET=base), pytest.raises(ImproperlyConfigured) as err:
        resolve()
    # a GroussetError too, naming what to set and where
    assert isinstance(err.value, GroussetError)
    assert "the test has no max_processing_time" in str(err.value)
    assert "--grousset-max-processing-time" in str(err.value)
    # ... and protect()'s names protect()'s own fixes, not a task's or a worker's
    with override_settings(GROUSSET=base), pytest.raises(ImproperlyConfigured) as err:
        Options.resolve("protect()", {}, default_processor="app-main")
    assert "pass max_processing_time= to protect()" in str(err.value)
    assert "worker" not in str(err.value) and "@app.task" not in str(err.value)


def test_every_option_name_is_a_setting_and_a_field() -> None:
    from celery_grousset.conf import DEFAULTS

    assert set(NAMES) == set(Options.__dataclass_fields__)
    assert {name.upper() for name in NAMES} <= set(DEFAULTS)


def test_a_bad_choice_is_refused_naming_it() -> None:
    with pytest.raises(GroussetError) as err:
        resolve(max_processing_time=10, on_in_flight="sometimes")
    assert "ON_IN_FLIGHT" in str(err.value)
