"""The shop's effects in the admin, next to the outcome journal (read-only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from shop.models import Booking, ProviderCharge, SentMail


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Effects are written by tasks, never by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Booking)
class BookingAdmin(ReadOnlyAdmin):
    list_display = ("order_id", "seat", "created")
    search_fields = ("order_id",)


@admin.register(SentMail)
class SentMailAdmin(ReadOnlyAdmin):
    list_display = ("subject", "recipient", "message_id", "sent_at")
    search_fields = ("subject", "message_id")


@admin.register(ProviderCharge)
class ProviderChargeAdmin(ReadOnlyAdmin):
    list_display = ("charge_id", "reference", "amount_cents", "requests", "created")
    search_fields = ("reference", "charge_id", "idempotency_key")
