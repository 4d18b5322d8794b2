from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    """The example app: its models count the effects the tasks have."""

    name = "shop"
    verbose_name = "Shop (example)"
    default_auto_field = "django.db.models.BigAutoField"
