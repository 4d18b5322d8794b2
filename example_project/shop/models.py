"""The shop's tables, and the two fake providers' own records of what they did.

None of them has a unique constraint on the business key: a duplicate effect
would show up as a second row, so the demo counts effects instead of trusting
them.
"""

from __future__ import annotations

from django.db import models


class Booking(models.Model):
    """A seat booked for an order (written by the transactional ``book`` task)."""

    order_id = models.CharField(max_length=64, db_index=True)  # no unique=True, on purpose
    seat = models.CharField(max_length=16)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created"]

    def __str__(self) -> str:
        return f"order {self.order_id}: seat {self.seat}"


class SentMail(models.Model):
    """The fake mail provider's outbox: one row per mail it was asked to send."""

    message_id = models.CharField(max_length=64)
    recipient = models.CharField(max_length=254)
    subject = models.CharField(max_length=200)
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["sent_at"]

    def __str__(self) -> str:
        return f"{self.subject} ({self.message_id})"


class ProviderCharge(models.Model):
    """The fake payment provider's charges, keyed by the caller's idempotency key.

    Like a real provider (Stripe's ``Idempotency-Key``), a request with a key it
    has seen returns the first charge instead of charging again; ``requests``
    counts how often it was asked.
    """

    idempotency_key = models.CharField(max_length=128, unique=True)
    charge_id = models.CharField(max_length=64)
    reference = models.CharField(max_length=64)
    amount_cents = models.PositiveIntegerField()
    requests = models.PositiveIntegerField(default=1)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created"]

    def __str__(self) -> str:
        return f"{self.charge_id}: {self.amount_cents} cents for {self.reference}"
