"""Configuration page: a router that keeps the journal on a database of its own."""

from __future__ import annotations

from typing import Any


# --8<-- [start:router]
class JournalRouter:
    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        if app_label != "celery_grousset":
            return None
        if model_name in ("outcome", "delivery"):  # the journal's tables
            return db == "journal"
        return True  # the outbox's: where the transactions that enqueue are
# --8<-- [end:router]
