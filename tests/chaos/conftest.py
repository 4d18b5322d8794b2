"""Fixtures and collection rules of the chaos suite.

Every test here is ``chaos`` and ``slow``. Only those marked ``quick`` run in a
normal ``pytest`` session (CI); the rest run with ``CHAOS_FULL=1`` or through
``python -m tests.chaos``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import services
from tests.chaos.harness import Tally
from tests.chaos.proxy import TcpProxy

FULL = bool(os.environ.get("CHAOS_FULL"))
HERE = Path(__file__).resolve().parent

#: backend id -> Django alias
ALIASES = {"postgresql": "postgresql", "sqlite": "default", "mariadb": "mysql"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "quick: chaos scenarios run in every pytest session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="full chaos scenario: set CHAOS_FULL=1 or run make chaos")
    for item in items:
        if HERE not in Path(str(item.path)).resolve().parents:
            continue
        item.add_marker(pytest.mark.chaos)
        item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.timeout(900))  # scenarios with workers and kills
        if not FULL and item.get_closest_marker("quick") is None:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call" or (report.when == "setup" and not report.passed):
        item._chaos_passed = report.passed  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _fresh_connections() -> None:
    """Each scenario starts on fresh Django connections (a dropped one never cascades)."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        conn.close()


@pytest.fixture(scope="session")
def broker() -> str:
    return services.require_redis()


def need(alias: str) -> str:
    services.require_database(alias)
    from django.db import connections

    connections[alias].close()
    return alias


@pytest.fixture(scope="session")
def pg() -> str:
    return need("postgresql")


@pytest.fixture
def queue() -> str:
    return f"chaos-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def tally(request: pytest.FixtureRequest) -> Iterator[Callable[[str, str], Tally]]:
    """``tally(scenario, backend)``: counts written to results.jsonl with pass/fail."""
    made: list[Tally] = []

    def make(scenario: str, backend: str) -> Tally:
        t = Tally(scenario, backend)
        made.append(t)
        return t

    yield make
    passed = getattr(request.node, "_chaos_passed", None)
    for t in made:
        t.passed = bool(passed)
        t.write()


@pytest.fixture
def pg_proxy(pg: str) -> Iterator[TcpProxy]:
    """A stoppable proxy in front of PostgreSQL (workers get GROUSSET_TEST_PG_PORT)."""
    from django.db import connections

    s = connections.settings[pg]
    proxy = TcpProxy((str(s["HOST"]), int(s["PORT"])))
    proxy.start()
    yield proxy
    proxy.stop()


#: backend id -> the variable that points a worker's journal alias at a proxy's port
PORT_ENV = {"postgresql": "GROUSSET_TEST_PG_PORT", "mariadb": "GROUSSET_TEST_MYSQL_PORT"}


@pytest.fixture
def db_proxy(request: pytest.FixtureRequest) -> Iterator[tuple[str, TcpProxy]]:
    """``(backend, proxy)``: a proxy in front of the backend given as the parameter
    (``indirect=True``); workers get its port through ``PORT_ENV``."""
    backend = request.param
    alias = need(ALIASES[backend])
    from django.db import connections

    s = connections.settings[alias]
    proxy = TcpProxy((str(s["HOST"]), int(s["PORT"])))
    proxy.start()
    yield backend, proxy
    proxy.stop()
