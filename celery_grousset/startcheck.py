"""The worker's start-up checks: its journal databases (logged, never fatal: a deploy
may start a worker before its migrations or its database), and the time limits its pool
does not enforce."""

from __future__ import annotations

import logging
import threading
from typing import Any

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


#: the pools whose tasks Celery runs without a time limit (no pool process to kill)
_UNLIMITED_POOLS = {"celery.concurrency.thread": "threads", "celery.concurrency.solo": "solo",
                    "celery.concurrency.eventlet": "eventlet"}  # fmt: skip


def warn_unenforced_time_limits(parent: Any) -> None:
    """A threads, solo or eventlet pool enforces no ``time_limit``: a stuck attempt is never killed
    before its claim turns stale, and a takeover can run the effect beside it (the
    guarantee's "keep a hard time_limit below max_processing_time")."""
    pool = _UNLIMITED_POOLS.get(getattr(getattr(parent, "pool_cls", None), "__module__", ""))
    if pool is not None:
        logger.warning(
            "celery-grousset: the %s pool enforces no time limit (Celery ignores time_limit "
            "and soft_time_limit there): a guarded attempt that runs past its "
            "max_processing_time is not killed, and another delivery may take its claim "
            "over and run the effect beside it. Keep each guarded task's "
            "max_processing_time above its longest possible run, or use the prefork pool.",
            pool,
        )
    if getattr(getattr(parent, "pool_cls", None), "__module__", "") == "celery.concurrency.gevent":
        _warn_soft_limits_on_gevent(parent.app, getattr(parent, "soft_time_limit", None))


def guarded_names(app: Any) -> list[str]:
    """The names of ``app``'s guarded tasks."""
    from celery_grousset.task import GroussetTaskMixin

    return sorted(n for n, t in app.tasks.items() if isinstance(t, GroussetTaskMixin))


def _warn_soft_limits_on_gevent(app: Any, worker_default: float | None) -> None:
    """The gevent pool enforces ``time_limit`` but not ``soft_time_limit``: a guarded task
    that counts on its soft limit (to end cleanly, its outcome written) is killed by its
    hard one instead, and its claim stays in flight until it turns stale."""
    default = worker_default or app.conf.task_soft_time_limit  # (--soft-time-limit first)
    soft = [name for name in guarded_names(app)
            if getattr(app.tasks[name], "soft_time_limit", None) or default]  # fmt: skip
    if soft:
        logger.warning(
            "celery-grousset: the gevent pool enforces no soft_time_limit (Celery applies "
            "only time_limit there), which these guarded tasks set: %s. An attempt past it "
            "is killed by its time_limit instead, its claim left in flight until it turns "
            "stale (max_processing_time): another delivery then takes it over and runs the "
            "effect again if the killed one had done it. Use the prefork pool for them.",
            ", ".join(soft),
        )
