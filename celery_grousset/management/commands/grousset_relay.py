"""``manage.py grousset_relay``: publish the transactional outbox (:mod:`celery_grousset.outbox`).

Runs until SIGTERM or SIGINT (the batch in progress finishes and commits first);
``--once`` publishes what is due and exits. Several relays may run at once.
"""

from __future__ import annotations

import signal
import threading
from contextlib import nullcontext
from typing import Any, cast

from celery.result import denied_join_result
from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_grousset import outbox
from celery_grousset.management import (
    add_database_argument,
    count_option,
    database_errors,
    journal_alias,
    schema_problem,
)


def celery_app(path: str | None) -> Any:
    """``--app proj.celery`` (or ``module:attribute``), else Celery's current app."""
    if path:
        from celery.app.utils import find_app

        try:
            return find_app(path)
        except Exception as exc:
            raise CommandError(f"--app {path!r}: {type(exc).__name__}: {exc}") from exc
    from celery import current_app

    app: Any = cast(Any, current_app)._get_current_object()
    if getattr(app, "main", None) is None and not app.configured:
        raise CommandError(
            "no Celery app is configured in this process: import it in your project's "
            "__init__.py (the Celery docs' Django layout) or pass --app proj.celery"
        )
    return app


def import_tasks(app: Any) -> None:
    """The project's task modules, imported as a worker imports them at its start (Celery
    discovers them lazily): a row's call is then checked against its task, not sent by
    name unchecked for a worker to drop (a task no module defines is still sent by name).
    Celery's Django fixup sets Django up again on the way, which reconfigures logging: a
    ``LOGGING`` that leaves ``disable_existing_loggers`` on would silence this command's
    loggers, so their state is put back."""
    import logging

    loggers = [lg for lg in logging.root.manager.loggerDict.values()
               if isinstance(lg, logging.Logger)]  # fmt: skip
    disabled = [lg.disabled for lg in loggers]
    try:
        app.loader.import_default_modules()
    except Exception as exc:
        raise CommandError(f"could not import the task modules of the Celery app "
                           f"{app.main!r}: {type(exc).__name__}: {exc}") from exc  # fmt: skip
    finally:
        for lg, was in zip(loggers, disabled, strict=True):
            lg.disabled = was


class Command(BaseCommand):
    help = (
        "Publish pending outbox messages in batches (FOR UPDATE SKIP LOCKED) until "
        "SIGTERM; --once publishes what is due and exits."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser)
        parser.add_argument("--app", default=None, metavar="MODULE",
                            help="The Celery app, as for `celery -A` (default: the current app).")
        parser.add_argument("--once", action="store_true",
                            help="Publish everything due now, then exit.")
        parser.add_argument("--batch-size", type=int, default=outbox.DEFAULT_BATCH_SIZE,
                            help=f"Rows per locked batch (default {outbox.DEFAULT_BATCH_SIZE}).")
        parser.add_argument("--max-attempts", type=int, default=outbox.DEFAULT_MAX_ATTEMPTS,
                            help="Failed publishes before a row goes dead "
                            f"(default {outbox.DEFAULT_MAX_ATTEMPTS}).")
        parser.add_argument("--interval", type=float, default=outbox.DEFAULT_INTERVAL,
                            help="Seconds between polls when nothing is due "
                            f"(default {outbox.DEFAULT_INTERVAL}).")
        parser.add_argument("--backoff", type=float, default=outbox.DEFAULT_BACKOFF,
                            help="First retry delay in seconds, doubled per failure "
                            f"(default {outbox.DEFAULT_BACKOFF}).")
        parser.add_argument("--backoff-max", type=float, default=outbox.DEFAULT_BACKOFF_MAX,
                            help=f"Longest retry delay (default {outbox.DEFAULT_BACKOFF_MAX}).")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = journal_alias(options["database"])
        app = celery_app(options["app"])
        import_tasks(app)
        try:
            batch_size = count_option(options["batch_size"], option="--batch-size")
            relay = outbox.Relay(
                app,
                using=alias,
                batch_size=batch_size,
                max_attempts=int(options["max_attempts"]),
                backoff=float(options["backoff"]),
                backoff_max=float(options["backoff_max"]),
                interval=float(options["interval"]),
            )
        except (ValueError, CommandError) as exc:  # a bad argument: exit code 2
            raise CommandError(str(exc), returncode=2) from exc
        stop = threading.Event()
        if not options["once"]:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, frame: stop.set())
        verbosity = int(options["verbosity"])
        if verbosity and not options["once"]:
            self.stdout.write(f"grousset_relay: publishing the outbox of {alias!r}")
            self.stdout.flush()
        once = bool(options["once"])
        # A running relay waits an outage out; a journal without its tables is no outage
        if not once and (problem := schema_problem(alias)):
            raise CommandError(f"cannot publish the outbox of {alias!r}: {problem}")
        with database_errors(alias, "could not publish the outbox") if once else nullcontext(), \
                denied_join_result():  # no result is read here: none is subscribed to
            stats = relay.run(stop, once=once)
        if verbosity:
            self.stdout.write(
                f"grousset_relay: sent {stats.sent}, failed {stats.failed}, dead {stats.dead} "
                f"in {stats.batches} batch(es)"
            )
        if once and (stats.failed or stats.dead):  # a cron job must see it
            raise CommandError(
                f"{stats.failed} message(s) failed (retried after their backoff) and "
                f"{stats.dead} went dead: see their last_error in the admin's outbox or the "
                "grousset.outbox_publish_failed / grousset.outbox_dead log lines"
            )
