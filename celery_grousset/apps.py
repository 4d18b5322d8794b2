from __future__ import annotations

from django.apps import AppConfig


class GroussetConfig(AppConfig):
    name = "celery_grousset"
    label = "celery_grousset"
    verbose_name = "Grousset outcome journal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery_grousset import checks  # noqa: F401  (registers system checks)
        from celery_grousset.install import connect

        connect()  # GROUSSET["TASKS"]: guard the tasks it names, as Celery apps register them
