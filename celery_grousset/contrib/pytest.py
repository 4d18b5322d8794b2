"""pytest fixtures for testing your own guarded tasks.

Installing celery-grousset registers this plugin with pytest (a ``pytest11`` entry
point named ``celery_grousset.contrib.pytest``): its fixtures are available with no
``pytest_plugins`` line, and ``-p no:celery_grousset.contrib.pytest`` switches it off.

Fixtures:

``grousset_eager``
    Sets ``task_always_eager`` (and ``task_eager_propagates``) on the Celery app for
    the test, so ``task.delay()`` / ``task.apply()`` run in-process — guarded: the
    second call with the same arguments returns the memo instead of running the body.
    Yields the app; the previous configuration is restored afterwards.

``grousset_journal``
    A :class:`Journal` to inspect the outcome journal: ``get(task, *args, **kwargs)``,
    ``deliveries(...)``, ``memo(...)``, ``count()``, ``clear()``.

``grousset_celery_app``
    The Celery app ``grousset_eager`` configures (default: ``celery.current_app``).
    Override it in your ``conftest.py`` to name another app.

The claim store writes on a connection of its own and commits at once, so a test
that runs guarded tasks must use real commits: with pytest-django, mark it
``@pytest.mark.django_db(transaction=True)`` (these fixtures refuse a plain
``django_db`` mark with an explanation). Nothing here imports Django or Celery
before a fixture runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from celery import Celery
    from django.db.models import QuerySet

    from celery_grousset.models import Outcome

__all__ = ["Journal", "grousset_celery_app", "grousset_eager", "grousset_journal"]


class Journal:
    """Read (and clear) the outcome journal from a test.

    ``task`` arguments are guarded Celery tasks (the objects ``@shared_task`` /
    ``@app.task`` return); the record is found by the task's processor id and the
    fingerprint of ``(*args, **kwargs)``, exactly as a delivery would compute it.
    """

    def __init__(self, database: str | None = None) -> None:
        #: Django alias of the journal (None: ``GROUSSET["DATABASE"]``)
        self._database = database

    @property
    def database(self) -> str:
        """The Django database alias the journal is read from."""
        if self._database is not None:
            return self._database
        from celery_grousset.conf import grousset_settings

        return str(grousset_settings.DATABASE)

    def records(self) -> QuerySet[Outcome]:
        """Every journal entry, as a queryset (newest first)."""
        from celery_grousset.models import Outcome

        return Outcome.objects.using(self.database).all()

    def fingerprint(self, task: Any, *args: Any, **kwargs: Any) -> str:
        """The fingerprint a delivery of ``task(*args, **kwargs)`` claims."""
        return str(task.grousset_fingerprint(args, kwargs))

    def find(self, task: Any, *args: Any, **kwargs: Any) -> Outcome | None:
        """The record of ``task(*args, **kwargs)``, or None if it never ran."""
        from celery_grousset.models import Outcome

        opts = task.grousset_options()
        alias = self._database or opts.database
        fp = self.fingerprint(task, *args, **kwargs)
        return (
            Outcome.objects.using(alias)
            .filter(processor_id=opts.processor_id, fingerprint=fp)
            .first()
        )

    def get(self, task: Any, *args: Any, **kwargs: Any) -> Outcome:
        """The record of ``task(*args, **kwargs)``; fails the test if there is none."""
        record = self.find(task, *args, **kwargs)
        if record is None:
            call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            pytest.fail(
                f"no journal entry for {task.name}({call}) in database "
                f"{self._database or task.grousset_options().database!r} "
                f"({self.count()} entries in the journal)",
                pytrace=False,
            )
        return record

    def keyed(self, task: Any, key: str) -> Outcome:
        """The record of a call of ``task`` made with ``idempotency_key=key`` (its
        arguments do not count: the key names it); fails the test if there is none."""
        from celery_grousset.models import Outcome

        opts = task.grousset_options()
        alias = self._database or opts.database
        fp = task.grousset_fingerprint((), {}, key)
        found = Outcome.objects.using(alias).filter(processor_id=opts.processor_id,
                                                    fingerprint=fp).first()  # fmt: skip
        if found is None:
            pytest.fail(f"no journal entry for {task.name}(…, idempotency_key={key!r}) in "
                        f"database {alias!r}", pytrace=False)  # fmt: skip
        assert isinstance(found, Outcome)
        return found

    def protected(self, key: str, *, processor_id: str | None = None) -> Outcome:
        """The record of ``protect(key, …)`` (processor id default as in protect())."""
        from celery_grousset.claim import PROTECT_NAME
        from celery_grousset.conf import grousset_settings
        from celery_grousset.fingerprint import fingerprint
        from celery_grousset.models import Outcome

        processor = processor_id or grousset_settings.PROCESSOR_ID or "default"
        fp = fingerprint(PROTECT_NAME, idempotency_key=key)
        record = self.records().filter(processor_id=processor, fingerprint=fp).first()
        if record is None:
            pytest.fail(f"no journal entry for protect({key!r})", pytrace=False)
        assert isinstance(record, Outcome)
        return record

    def deliveries(self, task: Any, *args: Any, **kwargs: Any) -> int:
        """How many deliveries asked for this call (0: never)."""
        record = self.find(task, *args, **kwargs)
        return 0 if record is None else int(record.deliveries)

    def memo(self, task: Any, *args: Any, **kwargs: Any) -> Any:
        """The memoized return value a duplicate of this call receives (or its error)."""
        from celery_grousset import memo

        record = self.get(task, *args, **kwargs)
        released = record.status == "failed" and not record.result_encoding
        if record.status == "in_flight" or released:
            what = (
                "a failure that released the claim: a duplicate runs the task again"
                if released
                else "still in flight: a duplicate waits for it, or is requeued"
            )
            pytest.fail(f"{task.name}: this call has no memo: its record is {what}.", pytrace=False)
        result = bytes(record.result) if record.result is not None else None
        return memo.decode(result, record.result_encoding, record.error, record.fingerprint)

    def count(self, **filters: Any) -> int:
        """Number of journal entries (``filters``: Outcome field lookups, e.g. status=)."""
        return int(self.records().filter(**filters).count())

    def clear(self) -> int:
        """Delete every journal entry (test databases only!); return how many."""
        deleted, _ = self.records().delete()
        return int(deleted)


def _refuse_rollback_only_db(request: pytest.FixtureRequest) -> None:
    """A plain ``django_db`` mark wraps the test in a transaction the store cannot see;
    under pytest-django, no mark at all means no test database: the store's own
    connection, which pytest-django does not block, would write to the settings' one."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None:
        if request.config.pluginmanager.hasplugin("django") and _access_blocked():
            _refuse(request, _NO_TEST_DATABASE)
        return
    transaction = marker.kwargs.get("transaction", marker.args[0] if marker.args else False)
    transaction = transaction or marker.kwargs.get("reset_sequences", False)  # (implies it)
    # (a test that asks for transactional_db, or live_server, gets one whatever its mark)
    if not transaction and not {"transactional_db", "live_server"} & set(request.fixturenames):
        from celery_grousset.testcase_check import ROLLED_BACK

        _refuse(request, ROLLED_BACK)


#: why a test's guarded call is refused
_NO_TEST_DATABASE = ("guarded tasks write the journal, and this test has no test database: "
                     "without a django_db mark their claims would go to the database in "
                     "your settings. Use @pytest.mark.django_db(transaction=True).")  # fmt: skip


def _refuse(request: pytest.FixtureRequest, why: str) -> None:
    pytest.fail(f"{request.node.nodeid}: {why}", pytrace=False)


@pytest.fixture(autouse=True)
def _grousset_test_database(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under pytest-django, a guarded call run in the test's process is refused where its
    claims would leak: into a rolled-back test transaction's database (they would outlive
    it), or, with no test database, into the settings' database. That is a call in the
    test's own thread (eager, direct, ``protect()``; with or without the fixtures), where
    it fails the test, and a delivery to an in-process worker's thread (Celery's
    ``celery_worker``), which fails with ``DatabaseOperationForbidden``: it is judged by
    the test thread's connections, which hold the test's database rules."""
    if not request.config.pluginmanager.hasplugin("django"):
        yield
        return
    import threading

    from django.test.testcases import (  # type: ignore[attr-defined]
        DatabaseOperationForbidden,
    )

    from celery_grousset import guard
    from celery_grousset.testcase_check import forbidden, refuse_leaks, this_threads_connections

    test_thread, held = threading.current_thread(), this_threads_connections()

    def check(alias: str) -> None:
        here = threading.current_thread() is test_thread
        try:
            if request.node.get_closest_marker("django_db") is None and _access_blocked(alias):
                raise forbidden(_NO_TEST_DATABASE)
            refuse_leaks(alias, None if here else held.get(alias))
        except DatabaseOperationForbidden as exc:
            if not here:
                raise
            why = str(exc).removeprefix("celery-grousset: ")
        else:
            return
        _refuse(request, why)  # (outside the except: the message once, not chained)

    saved, guard.test_database_check = guard.test_database_check, check
    try:
        yield
    finally:
        guard.test_database_check = saved


def _access_blocked(alias: str | None = None) -> bool:
    """pytest-django refuses this test Django's database access (no ``django_db`` mark,
    ``transactional_db`` or project-wide unblocking), which the journal store's own
    connection would not notice."""
    from django.db import connections

    from celery_grousset.conf import grousset_settings

    try:
        connections[alias or grousset_settings.DATABASE].ensure_connection()
    except RuntimeError as exc:  # pytest-django's blocker: "Database access not allowed"
        return "not allowed" in str(exc)
    except Exception:  # the database itself: the test will say so
        return False
    return False


def _fresh_stores() -> None:
    """Drop cached journal connections (the test runner may have renamed the database)."""
    from celery_grousset.store import reset_stores

    reset_stores()


@pytest.fixture
def grousset_celery_app() -> Celery:
    """The Celery app of the tests: ``celery.current_app`` unless overridden."""
    from celery import current_app

    app: Celery = current_app._get_current_object()  # type: ignore[attr-defined]
    return app


@pytest.fixture
def grousset_eager(
    request: pytest.FixtureRequest, grousset_celery_app: Celery
) -> Iterator[Celery]:
    """Run tasks in-process (``task_always_eager``), guarded, for the test."""
    _refuse_rollback_only_db(request)
    conf = grousset_celery_app.conf
    saved = (conf.task_always_eager, conf.task_eager_propagates)
    conf.task_always_eager = True
    conf.task_eager_propagates = True
    _fresh_stores()
    try:
        yield grousset_celery_app
    finally:
        conf.task_always_eager, conf.task_eager_propagates = saved
        _fresh_stores()


@pytest.fixture
def grousset_journal(request: pytest.FixtureRequest) -> Iterator[Journal]:
    """Inspect the outcome journal (``GROUSSET["DATABASE"]``) from a test."""
    _refuse_rollback_only_db(request)
    _fresh_stores()
    try:
        yield Journal()
    finally:
        _fresh_stores()
