from __future__ import annotations

import sys
from typing import Any

from django.apps import AppConfig


class GroussetConfig(AppConfig):
    name = "celery_grousset"
    label = "celery_grousset"
    verbose_name = "Grousset outcome journal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # checks: registers the system checks (deploy_check: check --deploy's); periodic:
        # beat sends each run's slot
        from celery_grousset import checks, deploy_check, periodic, testworker_check  # noqa: F401
        from celery_grousset.install import connect

        connect()  # GROUSSET["TASKS"]: guard the tasks it names, as Celery apps register them
        testworker_check.connect()  # Celery's in-process test worker under manage.py test
        from celery_grousset.worker import install_active_apps

        # the worker's start-up step (it refuses a configuration error) even without
        # install(app) in the project's celery.py, which the --grousset-* flags need
        install_active_apps()
        from django.db.models.signals import post_migrate

        post_migrate.connect(_refresh_claim_function, sender=self)
        post_migrate.connect(_journals_left_behind, sender=self)
        from django.db.backends.signals import connection_created

        connection_created.connect(_close_stores_before_server_ddl,
                                   dispatch_uid="celery_grousset.server_ddl")  # fmt: skip


def _close_stores_before_server_ddl(sender: object, connection: Any, **kwargs: object) -> None:
    """Django connects without a database (``_nodb_cursor``) to create or drop one: a test
    run's setup and teardown (``manage.py test``, pytest-django). The journal's own
    connections close first, or PostgreSQL refuses to drop the test database they are
    still connected to; the next claim opens them again."""
    from django.db.backends.base.base import NO_DB_ALIAS

    if getattr(connection, "alias", None) == NO_DB_ALIAS:
        from celery_grousset.store import reset_stores

        reset_stores()


def _refresh_claim_function(sender: object, using: str = "default", **kwargs: object) -> None:
    """After ``migrate``: a partitioned journal's claim function (PostgreSQL) is the one
    this version writes, so an upgrade's claim rule reaches journals converted before."""
    from django.db import connections

    if connections[using].vendor == "postgresql":
        from celery_grousset.store.pgpartops import refresh_claim_function

        refresh_claim_function(using)


def _journals_left_behind(
    sender: object, using: str = "default", verbosity: int = 1, **kwargs: Any
) -> None:
    """After ``migrate`` on one database: a journal database elsewhere (``GROUSSET
    ["DATABASE"]``, a task's ``database``) whose tables are missing or behind is named,
    with its command — plain ``migrate`` migrates ``default`` only, and otherwise only
    the worker would say so. Never fails the migration."""
    if verbosity < 1:
        return
    try:
        from django.db import connections

        from celery_grousset.checks import journal_databases
        from celery_grousset.management import schema_problem

        behind = [(alias, schema_problem(alias)) for alias in journal_databases()
                  if alias != using and alias in connections.settings]  # fmt: skip
    except Exception:  # a settings or task error: the system checks say it
        return
    out = kwargs.get("stdout") or sys.stdout
    for alias, problem in behind:
        if problem is not None:
            out.write(f"celery_grousset: in the journal database {alias!r}, {problem}\n")
