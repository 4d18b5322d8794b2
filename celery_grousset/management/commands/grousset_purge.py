"""``manage.py grousset_purge``: delete expired journal entries in batches.

Only rows whose retention window has passed and that no attempt holds are
deleted (:func:`celery_grousset.journal.purge_expired`: settled rows, and abandoned
claims past ``expires_on`` plus their own ``max_processing_time``), one short
transaction per batch that skips a row another transaction holds instead of waiting for
it, so the purge never blocks claims for long and never touches an unexpired row or a
live claim.

It also deletes outbox rows (:mod:`celery_grousset.outbox`) sent longer ago than
the retention window (``GROUSSET["EXPIRES_AFTER"]``, plus ``--older-than``);
pending and dead rows are never touched. ``--no-outbox`` / ``--outbox-only``
choose one of the two.

Without ``--database`` it purges every journal database (``GROUSSET["DATABASE"]`` and
each guarded task's own ``database``), as the beat task ``purge_expired`` does; a
database that fails does not stop the others, and the command then exits 1.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_grousset.management import (
    MAX_BATCH_SIZE,
    MAX_DURATION_DAYS,
    add_database_argument,
    add_duration_argument,
    argparse_type,
    count_option,
    database_errors,
    duration_option,
    journal_alias,
    schema_problem,
)


def _older_than(value: object) -> object:
    return duration_option(value, option="--older-than")


def _by_generation() -> str:
    """What the partitioned layout's purge does differently, said beside its numbers."""
    from celery_grousset.conf import grousset_settings

    if grousset_settings.JOURNAL_LAYOUT != "partitioned":
        return ""
    return ("; partitioned layout: a run drops whole generations whose every row is "
            "purgeable, so expired rows that share one with a live row stay until it "
            "clears, and --batch-size does not apply: docs/scale.md")  # fmt: skip


def _aliases(database: str | None) -> list[str]:
    """``--database``, or every journal database: ``GROUSSET["DATABASE"]`` and each guarded
    task's own ``database`` (as the beat task ``purge_expired``)."""
    if database:
        try:
            return [journal_alias(database)]
        except CommandError as exc:  # a bad argument: exit code 2, as the help says
            raise CommandError(str(exc), returncode=2) from exc
    from celery_grousset.checks import journal_databases

    main = journal_alias(None)
    return [main, *(a for a in journal_databases() if a != main)]


def _batch_size(value: object) -> int:
    return count_option(value, option="--batch-size")


class Command(BaseCommand):
    help = (
        "Delete expired journal entries and abandoned claims in batches (never an "
        "unexpired entry or a live claim), in every journal database (GROUSSET[\"DATABASE\"] "
        "and each guarded task's own database) or the one --database names. "
        "Exit code 0 on success, 1 on error, 2 on a bad argument."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser, "every journal database")
        parser.add_argument(
            "--batch-size",
            type=argparse_type(_batch_size),
            default=10_000,
            help=f"Rows deleted per transaction: 1 to {MAX_BATCH_SIZE} (default 10000).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count what would be deleted; delete nothing.",
        )
        add_duration_argument(
            parser,
            "--older-than",
            _older_than,
            "Only rows that expired at least this long ago: seconds or 30m, 12h, 7d, 2w "
            f"(0 to {MAX_DURATION_DAYS}d).",
        )
        which = parser.add_mutually_exclusive_group()
        which.add_argument(
            "--no-outbox", action="store_true", help="Leave the outbox alone (journal only)."
        )
        which.add_argument(
            "--outbox-only",
            action="store_true",
            help="Purge only sent outbox rows older than the retention.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # call_command() keyword arguments bypass argparse: check them here too.
        options["batch_size"] = _batch_size(options["batch_size"])
        options["older_than"] = _older_than(options["older_than"])
        failed: list[str] = []
        for alias in _aliases(options["database"]):
            try:  # a database that fails does not stop the others (as the beat task)
                journal_alias(alias)  # (a task's own database missing from DATABASES)
                if not options.get("outbox_only"):
                    self._purge_journal(alias, **options)
                if not options.get("no_outbox"):
                    self._purge_outbox(alias, **options)
            except CommandError as exc:
                failed.append(str(exc))
        if failed:
            raise CommandError("; ".join(failed))

    def _purge_journal(self, alias: str, **options: Any) -> None:
        from celery_grousset import journal

        batch_size = int(options["batch_size"])
        verbosity = int(options["verbosity"])
        t0 = time.monotonic()
        with database_errors(alias, "purge failed"):
            if problem := schema_problem(alias):  # (the dry run too: it counts nothing)
                raise CommandError(f"purge failed on {alias!r}: {problem}")
            now = journal.now(alias)
            older_than = options["older_than"]
            before = now - older_than if older_than else now
            whole = _by_generation()
            if options["dry_run"]:
                count = journal.expired(alias, before).count()
                if verbosity:
                    self.stdout.write(
                        f"would purge {_entries(count)} from {alias!r} "
                        f"(dry run: nothing deleted{whole})"
                    )
                return
            progress = (
                self._progress_bar(journal.expired(alias, before).count())
                if (verbosity and _is_tty(self.stderr))
                else None
            )
            count = journal.purge_expired(
                alias, batch_size=batch_size, before=before, progress=progress
            )
        if progress is not None:
            self.stderr.write("\n", ending="")
        if verbosity:
            self.stdout.write(
                f"purged {_entries(count)} from {alias!r} in {time.monotonic() - t0:.2f} s"
                f"{whole}"
            )

    def _purge_outbox(self, alias: str, **options: Any) -> None:
        """Sent outbox rows whose ``sent_at`` is older than the retention window
        (``EXPIRES_AFTER``, plus ``--older-than``); pending and dead rows stay."""
        from datetime import timedelta

        from celery_grousset import journal, outbox_purge
        from celery_grousset.conf import grousset_settings, seconds

        verbosity = int(options["verbosity"])
        shown = verbosity > 1 or options.get("outbox_only")
        retention = seconds(grousset_settings.EXPIRES_AFTER, name="EXPIRES_AFTER") or 0.0
        with database_errors(alias, "outbox purge failed"):
            older_than = options["older_than"] or timedelta(0)
            cutoff = journal.now(alias) - older_than - timedelta(seconds=retention)
            if options["dry_run"]:
                count = outbox_purge.sent_before_count(using=alias, before=cutoff)
                if verbosity and (count or shown):
                    self.stdout.write(f"would purge {_messages(count)} from {alias!r} (dry run)")
                return
            count = outbox_purge.purge_sent(
                using=alias, before=cutoff, batch_size=int(options["batch_size"])
            )
        if verbosity and (count or shown):
            self.stdout.write(f"purged {_messages(count)} from {alias!r}")

    def _progress_bar(self, total: int) -> Any:
        """A ``\\r`` progress line on stderr (TTY only)."""
        width = 30

        def show(done: int) -> None:
            share = min(1.0, done / total) if total else 1.0
            filled = int(share * width)
            bar = "#" * filled + "." * (width - filled)
            self.stderr.write(f"\rpurging [{bar}] {done}/{total} ({share:4.0%})", ending="")
            self.stderr.flush()

        show(0)
        return show


def _is_tty(stream: Any) -> bool:
    """Django's OutputWrapper answers for the stream it wraps (sys.stderr by default)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or exotic stream
        return False


def _entries(count: int) -> str:
    return f"{count} expired journal {'entry' if count == 1 else 'entries'}"


def _messages(count: int) -> str:
    return f"{count} sent outbox {'message' if count == 1 else 'messages'}"
