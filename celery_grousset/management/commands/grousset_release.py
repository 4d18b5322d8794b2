"""``manage.py grousset_release <fingerprint>``: let the next delivery run again.

* An **in-flight** claim (a stuck or dead attempt) is released through the store:
  the record turns ``failed`` with nothing memoized, so the next delivery claims
  it at once instead of waiting for ``max_processing_time``. A still-running
  holder is then fenced out once a delivery claims the call again: its completion is
  refused — but its effect may already have happened, and that delivery runs it again
  (a completion that comes before any new claim is recorded, as if never released).
  So a **fresh** claim (not yet stale: its attempt may be running) is refused unless
  ``--force``, as the admin's *release stale claims* action refuses it. The release
  names the claim's token: an attempt that took the claim over meanwhile keeps it.
* A **completed or failed** record is refused, because releasing it lets the
  effect happen again — unless ``--force``, which *forgets* it: ``expires_on`` is
  set to the database clock's now, so the next delivery re-runs the task. The row
  is kept; the next claim gets a higher fence (fences never go back for a key).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_grousset import journal
from celery_grousset.management import (
    add_database_argument,
    database_errors,
    describe_matches,
    find,
    journal_alias,
    other_journals,
    printable,
)

if TYPE_CHECKING:
    from celery_grousset.models import Outcome


class Command(BaseCommand):
    help = (
        "Release an in-flight claim so the next delivery runs at once; with --force, forget "
        "a completed or failed outcome so the next delivery runs the task again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("fingerprint", help="A fingerprint or a prefix of ≥ 8 hex chars.")
        parser.add_argument(
            "--processor-id",
            default=None,
            help="The processor whose record to release (required when several hold it).",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="Also release a fresh in-flight claim, or forget a completed/failed record: "
            "its effect may run again.",
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = journal_alias(options["database"])
        try:
            with database_errors(alias, "release failed"):
                self.handle_on(alias, **options)
        except CommandError as exc:  # (it quotes the journal's text: task, worker, processor)
            raise CommandError(printable(str(exc))) from exc.__cause__

    def say(self, text: str) -> None:
        self.stdout.write(printable(text))

    def handle_on(self, alias: str, **options: Any) -> None:
        needle = str(options["fingerprint"]).strip().lower()
        if not journal.fingerprint_like(needle):
            raise CommandError(
                f"{needle!r} is not a fingerprint or a prefix of one: give 8 to 64 hex "
                "characters (`manage.py grousset_inspect <task id>` shows the fingerprint)"
            )
        records = [
            r
            for r in find(alias, needle, options["processor_id"])
            if r.fingerprint.startswith(needle)
        ]
        if not records:
            who = f" for processor {options['processor_id']!r}" if options["processor_id"] else ""
            raise CommandError(f"no journal entry with fingerprint {needle!r}{who} in {alias!r}"
                               f"{other_journals(alias)} (a task id, or a prefix under 8 hex "
                               "characters? `manage.py grousset_inspect <task id>` shows the "
                               "fingerprint)")  # fmt: skip
        if len({r.fingerprint for r in records}) > 1:
            raise CommandError(
                describe_matches(records) + "\nThe prefix is ambiguous: pass more characters."
            )
        if len(records) > 1:
            processors = ", ".join(sorted(r.processor_id for r in records))
            raise CommandError(
                f"{len(records)} processors hold {records[0].fingerprint}: {processors}. "
                "Pass --processor-id to choose one."
            )
        rec = records[0]
        if rec.status == "in_flight":
            self._release(alias, rec, force=bool(options["force"]))
        else:
            self._forget(alias, rec, force=bool(options["force"]))

    def _release(self, alias: str, rec: Outcome, *, force: bool) -> None:
        from celery_grousset import journal

        stale, why = journal.release_plan(rec, journal.now(alias))
        if not stale and not force:
            raise CommandError(
                f"{rec.fingerprint} ({rec.processor_id}) is in flight, {why}. Its attempt "
                f"(task {rec.task_name}, held by {rec.worker or 'unknown'}) may still be "
                "running: releasing it now lets the next delivery run the effect a second "
                "time. Wait until it turns stale, or pass --force once you know that worker "
                "is gone."
            )
        if not journal.release(rec, alias, token=rec.claim_token, stale=not force):
            raise CommandError(
                f"{rec.fingerprint} ({rec.processor_id}) is no longer held by that attempt"
                f"{'' if force else ' as a stale claim'}: it finished, was taken over or "
                "was renewed by its attempt meanwhile. Run grousset_inspect to see it."
            )
        self.say(
            f"released the in-flight claim on {rec.fingerprint} (processor {rec.processor_id}, "
            f"task {rec.task_name}, held by {rec.worker or 'unknown'}), which "
            f"{'was ' + why if stale else 'was still fresh (--force)'}: the next delivery runs "
            "the task again; if the holder is still running, its completion is refused once a "
            "delivery has claimed the call again (before that, it is recorded: a duplicate "
            "then gets its memo)."
        )

    def _forget(self, alias: str, rec: Outcome, *, force: bool) -> None:
        from celery_grousset import journal

        eligible, why = journal.forget_plan(rec, journal.now(alias))
        if not eligible:
            self.say(
                f"{rec.fingerprint} ({rec.processor_id}) is {why}. Nothing to do."
            )
            return
        if not force:
            raise CommandError(
                f"{rec.fingerprint} ({rec.processor_id}) is {rec.status}, not in flight: "
                "releasing it would let its effect happen again. Pass --force to forget it "
                "(the next delivery re-runs the task)."
            )
        if journal.forget(rec, alias) is None:
            raise CommandError(
                f"{rec.fingerprint} ({rec.processor_id}) changed while releasing it (a new "
                "attempt claimed it); nothing was forgotten."
            )
        coming = ("a failed delivery was acknowledged: publish the call again if none is "
                  "coming" if rec.status == "failed" else "the delivery that completed it was "
                  "acknowledged: none comes unless the call is published again")  # fmt: skip
        self.say(
            f"forgot the {rec.status} outcome of {rec.fingerprint} (processor "
            f"{rec.processor_id}, task {rec.task_name}): the next delivery of the call runs the "
            f"task again with a higher fence ({coming})."
        )
