"""The outcome journal: one row per ``(processor_id, fingerprint)``.

Field names are the public contract (docs/how-it-works.md): the admin, the docs, the
management commands and the tests use them. Rows are written by the claim store
(:mod:`celery_grousset.store`) with raw SQL on its own connection; the ORM is
used for reading, purging and the admin.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.db import models
from django.utils.translation import gettext_lazy as _

from celery_grousset.managers import OutcomeManager


class Status(models.TextChoices):
    IN_FLIGHT = "in_flight", _("in flight")
    COMPLETED = "completed", _("completed")
    FAILED = "failed", _("failed")


class Outcome(models.Model):
    """What happened to one fingerprint for one processor."""

    id = models.BigAutoField(primary_key=True)
    processor_id = models.CharField(
        max_length=128,
        help_text="Who deduplicates: workers of one service share it.",
    )
    fingerprint = models.CharField(
        max_length=64, help_text="BLAKE3-256 of the canonical key material (hex)."
    )
    task_name = models.CharField(max_length=255)
    task_id = models.CharField(
        max_length=255, blank=True, help_text="Delivery that holds / completed the claim."
    )
    status = models.CharField(max_length=16, choices=Status.choices)
    fence = models.BigIntegerField(
        help_text="Fencing token, growing on every claim of the key, also across a purge: "
        "max(previous fence + 1, the claim's database clock in microseconds since the "
        "epoch); a new row gets the clock value (as long as that clock does not step back)."
    )
    claim_token = models.CharField(max_length=32, help_text="Random per attempt.")
    started_at = models.DateTimeField(
        help_text="When the current attempt claimed the row (database clock)."
    )
    first_claimed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The first claim of the key since its row was written or expired "
        "(database clock); takeovers and reclaims keep it.",
    )
    stale_at = models.DateTimeField(
        help_text="When this claim turns stale (started_at + max_processing_time, database "
        "clock): another delivery may then take it over."
    )
    completed_at = models.DateTimeField(null=True, blank=True)
    expires_on = models.DateTimeField()
    deliveries = models.BigIntegerField(
        default=1,
        help_text="Every claim of the key since its row was written or expired: the first, "
        "duplicates, redeliveries (the same task id again, in-flight requeues) and re-claims.",
    )
    duplicates = models.BigIntegerField(
        default=0,
        help_text="Other deliveries of the same key answered from the memo or the in-flight "
        "policy (each listed under Deliveries by its task id).",
    )
    takeovers = models.IntegerField(default=0)
    result = models.BinaryField(null=True, blank=True)
    result_encoding = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="")
    worker = models.CharField(max_length=255, blank=True, default="")
    args_repr = models.TextField(blank=True, default="")
    payload_hash = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="BLAKE3 of all the arguments of a keyed call (idempotency_key, "
        "grousset_key), written by the claim that took the row: a call with the same key "
        "and other arguments is refused (PayloadMismatch). Empty: a plain call, or not "
        "validated.",
    )

    objects: ClassVar[OutcomeManager] = OutcomeManager()

    class Meta:
        db_table = "celery_grousset_outcome"
        verbose_name = _("journal entry")
        verbose_name_plural = _("journal entries")
        ordering = ("-started_at",)
        # The key of every claim. Fingerprint first, so the same index serves the admin's
        # fingerprint-prefix search. No index contains a column that a completion or a
        # duplicate changes (status, deliveries, result…): those updates stay HOT on
        # PostgreSQL (fillfactor 80, set in the migration) and touch no index at all.
        constraints = [
            models.UniqueConstraint(
                fields=("fingerprint", "processor_id"), name="grousset_outcome_key"
            ),
        ]
        indexes = [
            models.Index(fields=("expires_on",), name="grousset_outcome_expires"),
            models.Index(fields=("task_id",), name="grousset_outcome_task_id"),
            models.Index(fields=("started_at",), name="grousset_outcome_started"),
            models.Index(fields=("task_name", "started_at"), name="grousset_outcome_task"),
            models.Index(fields=("processor_id", "started_at"), name="grousset_outcome_proc"),
        ]
        permissions = [
            ("release_outcome", "Can release stale claims"),
            ("forget_outcome", "Can forget an outcome (allow re-run)"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} {self.fingerprint[:12]} ({self.status})"


class Delivery(models.Model):
    """A delivery that is not the journal row's own: one answered as a duplicate (the memo,
    a memoized failure, the in-flight policy), or one whose claim a later delivery took
    over. Written by the claim that sees it, purged with the journal; lets an operator
    find any delivery by its task id (``grousset_inspect <task id>``)."""

    id = models.BigAutoField(primary_key=True)
    processor_id = models.CharField(max_length=128)
    fingerprint = models.CharField(max_length=64)
    task_id = models.CharField(max_length=255)
    decision = models.CharField(
        max_length=1,
        help_text="The claim's decision code (celery_grousset.claim.Kind.code): i in flight, "
        "c completed, f failed, g gave up — this delivery was answered; t taken over, "
        "r reclaimed, x expired — this delivery's claim was taken by a later one.",
    )
    at = models.DateTimeField(
        help_text="Database clock. Purged once the journal row of its key is gone or "
        "was claimed afresh after it."
    )

    class Meta:
        db_table = "celery_grousset_delivery"
        verbose_name = _("delivery")
        verbose_name_plural = _("deliveries")
        # One index: the look-up by task id. The purge finds stale rows through the
        # journal's unique key; a duplicate's insert maintains nothing else.
        indexes = [
            models.Index(fields=("task_id",), name="grousset_delivery_task_id"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} {self.fingerprint[:12]} ({self.decision})"


class OutboxStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    SENT = "sent", _("sent")
    DEAD = "dead", _("dead")


class OutboxMessage(models.Model):
    """A message written in the caller's transaction, published by the relay
    (:mod:`celery_grousset.outbox`). Unlike the journal, it holds the task's
    arguments until the message is sent, as the broker would."""

    id = models.BigAutoField(primary_key=True)
    message_id = models.UUIDField(
        default=uuid.uuid4,
        unique=True,
        editable=False,
        help_text="Random, written with the row: names the message across databases "
        "(ids restart at 1 in every database).",
    )
    task_name = models.CharField(max_length=255)
    task_id = models.CharField(max_length=255, help_text="Celery task id it is published with.")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    options = models.JSONField(
        default=dict, blank=True, help_text="apply_async options: queue, eta, priority…"
    )
    status = models.CharField(
        max_length=16, choices=OutboxStatus.choices, default=OutboxStatus.PENDING
    )
    attempts = models.IntegerField(default=0, help_text="Publish attempts so far.")
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(help_text="Database clock.")
    available_at = models.DateTimeField(help_text="Not published before (retry backoff).")
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "celery_grousset_outboxmessage"
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        ordering = ("-id",)
        indexes = [
            models.Index(fields=("status", "available_at", "id"), name="grousset_outbox_due"),
            models.Index(fields=("status", "sent_at"), name="grousset_outbox_sent"),
        ]
        permissions = [("requeue_outboxmessage", "Can requeue outbox messages")]

    def __str__(self) -> str:
        return f"{self.task_name} #{self.id} ({self.status})"
