"""The worker's start-up check of its journal databases (logged, never fatal: a deploy
may start a worker before its migrations or its database)."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("celery_grousset")


def log_schema_problems(alias: str | None = None) -> None:
    """Log each journal database whose tables do not exist or lack a migration, whose
    layout is not JOURNAL_LAYOUT, or which cannot be reached or the claim store cannot
    open, with the fix (at the worker's start). The worker runs all the same (a deploy
    may start it before its migrations or its database): a guarded delivery is retried
    until then, never run without its claim. Each journal database is checked in a
    thread of its own: one that never answers holds up only its own check."""
    from django.db import connections

    from celery_grousset.checks import journal_databases
    from celery_grousset.conf import grousset_settings
    from celery_grousset.management import start_problem

    try:
        if alias is None:
            aliases = [a for a in journal_databases() if a in connections.settings]
            threads = [threading.Thread(target=log_schema_problems, args=(a,), daemon=True,
                                        name=f"grousset-schema-{a}") for a in aliases]  # fmt: skip
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        elif problem := start_problem(alias, str(grousset_settings.JOURNAL_LAYOUT)):
            logger.error(
                "celery-grousset: journal database %r: %s Guarded deliveries are "
                "retried, never run, until then.", alias, problem,
            )  # fmt: skip
    except Exception:  # settings problems are the checks' to report; never the worker's end
        logger.debug("celery-grousset: journal schema not checked", exc_info=True)
    finally:
        connections.close_all()  # this thread's
