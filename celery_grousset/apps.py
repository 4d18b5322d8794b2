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
