"""The effect ledger: one row per executed effect, deliberately WITHOUT a unique
constraint, so that a duplicate effect shows up as a second row."""

from __future__ import annotations

from django.db import models


class Effect(models.Model):
    key = models.CharField(max_length=200, db_index=True)
    value = models.CharField(max_length=200, blank=True, default="")
    pid = models.IntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "ledger"
