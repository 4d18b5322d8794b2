from __future__ import annotations

from django.apps import AppConfig


class BadAppConfig(AppConfig):
    name = "tests.badapp"
    label = "grousset_badapp"

    def ready(self) -> None:
        from tests.badapp import tasks  # noqa: F401  (creates the misconfigured Celery app)
