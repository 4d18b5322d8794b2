from __future__ import annotations

from django.apps import AppConfig


class GroussetConfig(AppConfig):
    name = "celery_grousset"
    label = "celery_grousset"
    verbose_name = "Grousset outcome journal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # checks: registers the system checks; periodic: beat sends each run's slot
        from celery_grousset import checks, periodic  # noqa: F401
        from celery_grousset.install import connect

        connect()  # GROUSSET["TASKS"]: guard the tasks it names, as Celery apps register them
        from django.db.models.signals import post_migrate

        post_migrate.connect(_refresh_claim_function, sender=self)


def _refresh_claim_function(sender: object, using: str = "default", **kwargs: object) -> None:
    """After ``migrate``: a partitioned journal's claim function (PostgreSQL) is the one
    this version writes, so an upgrade's claim rule reaches journals converted before."""
    from django.db import connections

    if connections[using].vendor == "postgresql":
        from celery_grousset.store.pgpartops import refresh_claim_function

        refresh_claim_function(using)
