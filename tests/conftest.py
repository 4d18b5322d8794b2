"""Shared fixtures: real databases, one alias per backend, skipped locally and
failing under CI when a service is down (docs/testing.md)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from tests import services  # noqa: E402
from tests.celeryapp import app as celery_app  # noqa: E402

celery_app.set_default()

#: pytest id -> Django alias
BACKENDS = {"sqlite": "default", "postgresql": "postgresql", "mariadb": "mysql"}


@pytest.fixture(params=list(BACKENDS), scope="session")
def alias(request: pytest.FixtureRequest) -> str:
    """A migrated journal database: each behaviour test runs once per backend."""
    name = BACKENDS[request.param]
    services.require_database(name)
    return name


@pytest.fixture
def store(alias: str) -> Iterator[object]:
    from celery_grousset.store import get_store

    yield get_store(alias)


@pytest.fixture
def processor() -> str:
    """A processor id of its own, so tests never see each other's rows."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def fp() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


@pytest.fixture
def journal(alias: str) -> Iterator[str]:
    """Point the guard (and the test tasks' ledger) at ``alias`` (a module may define its
    own ``journal``, e.g. the admin tests')."""
    from django.test import override_settings

    with override_settings(GROUSSET={"DATABASE": alias}):
        yield alias


@pytest.fixture
def temp_task() -> Iterator[object]:
    """Register throw-away GroussetTasks on the test app; unregister them afterwards."""
    from celery_grousset import GroussetTask

    made: list[str] = []

    def make(fn: object, **options: object) -> object:
        name = f"tests.temp.{getattr(fn, '__name__', 'task')}.{uuid.uuid4().hex[:6]}"
        made.append(name)
        return celery_app.task(base=GroussetTask, bind=True, name=name, **options)(fn)

    yield make
    for name in made:
        celery_app.tasks.pop(name, None)
