"""Shared fixtures: real databases, one alias per backend, skipped locally and
failing under CI when a service is down (docs/testing.md).

The suite runs on pytest-django (settings: ``tests.settings``, pyproject.toml), with two
choices of its own, because real ``celery worker`` processes share the databases:

* ``django_db_setup`` keeps the suite's databases instead of creating ``test_*`` copies:
  a worker subprocess connects to the names in ``tests.settings``. Each alias is
  (re)created and migrated lazily, by the first test that needs it
  (``services.require_database``), so a missing service skips only its own tests.
* Database access is opened through pytest-django's blocker for the whole session (from
  the first test on; collection stays blocked), in autocommit: a worker must see the
  rows a test committed (a ``django_db`` test's rolled-back transaction hides them), and
  tests keep apart by their own processor ids and keys rather than by emptying the
  tables after each test.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_django import DjangoDbBlocker
    from pytest_django.fixtures import Settings

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


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``serial`` test changes a whole server: never beside another test process."""
    if item.get_closest_marker("serial") and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail("a `serial` test runs alone, not under pytest -n: `make test` runs it "
                    "after the parallel run (pytest -m serial)", pytrace=False)  # fmt: skip


@pytest.fixture(scope="session")
def django_db_setup() -> None:
    """pytest-django's database setup, kept to the suite's own databases (see above)."""


@pytest.fixture(autouse=True, scope="session")
def _shared_databases(django_db_blocker: DjangoDbBlocker) -> Iterator[None]:
    """Committed database access from the first test on (see the module docstring): for
    module- and session-scoped fixtures too, e.g. those that start a worker. Collection
    stays blocked: a module that queries a database at import fails."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture(params=list(BACKENDS), scope="session")
def alias(request: pytest.FixtureRequest) -> str:
    """A migrated journal database: each behaviour test runs once per backend."""
    name = BACKENDS[request.param]
    services.require_database(name)
    return name


@pytest.fixture
def store(alias: str) -> Iterator[object]:
    from celery_grousset.store import get_store

    store = get_store(alias)
    yield store
    # (the put-back the guard does after a transactional completion: a test that calls
    # finish_in_transaction itself left Django's MariaDB session with STORE_TIMEOUT as
    # its idle_transaction_timeout, and a later test's transaction, idle longer than
    # that, lost its session: "Server has gone away")
    store.end_transactional()


@pytest.fixture
def processor() -> str:
    """A processor id of its own, so tests never see each other's rows."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def fp() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


@pytest.fixture
def journal(alias: str, settings: Settings) -> str:
    """Point the guard (and the test tasks' ledger) at ``alias`` (a module may define its
    own ``journal``, e.g. the admin tests')."""
    settings.GROUSSET = {"DATABASE": alias}
    return alias


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


@pytest.fixture
def single() -> Iterator[str]:
    """A fresh single-table journal on PostgreSQL (the ``pgconvert`` database, for the
    conversions' tests); fresh again afterwards."""
    from celery_grousset.store import reset_stores

    alias = services.CONVERTED
    services.require_database(alias)
    error = services.prepare(alias)
    assert error is None, error
    yield alias
    reset_stores()
    services._prepared[alias] = services.prepare(alias)
