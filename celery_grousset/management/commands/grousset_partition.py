"""``manage.py grousset_partition prepare|convert|status|create-ahead|revert``: the
partitioned journal (PostgreSQL, opt-in; docs/scale.md, "The partitioned layout").

* ``convert`` turns the single table into the partitioned layout in ONE transaction and
  installs the claim function. A table as it is has its rows copied (claims wait for
  it), refused above ``--max-rows`` (default 100000); a table ``prepare`` readied is
  attached as one past generation, nothing copied. Then set
  ``GROUSSET["JOURNAL_LAYOUT"] = "partitioned"`` and restart the workers.
* ``prepare`` readies a table of any size online, claims going on (a column and a
  check added as metadata, the layout's indexes built ``CONCURRENTLY``); a run that
  stopped is finished by the next.
* ``status`` lists the generations (partitions) and their estimated rows.
* ``create-ahead`` creates the partitions of the current generation and the next
  ``--ahead`` (``grousset_purge`` and ``purge_expired`` do it on every run).
* ``revert`` turns the partitioned journal back into the single table in ONE
  transaction, its rows copied (claims wait for it; refused above ``--max-rows``). Then
  set ``GROUSSET["JOURNAL_LAYOUT"] = "table"`` and restart the workers.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from celery_grousset.exceptions import InvalidArgument
from celery_grousset.management import (
    add_database_argument,
    argparse_type,
    count_option,
    duration_option,
    journal_alias,
    schema_problem,
)


def _width(value: object) -> Any:
    return duration_option(value, option="--generation", positive=True)


class Command(BaseCommand):
    help = (
        "Convert the journal to the partitioned layout (PostgreSQL) or prepare a large one for "
        "it online, show its generations, create the next ones, or revert to the single "
        "table. Exit code 0 on success, 1 on error."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        from celery_grousset.store.pgpartops import MAX_COPY_ROWS

        parser.add_argument(
            "action", choices=("prepare", "convert", "status", "create-ahead", "revert")
        )
        add_database_argument(parser)
        parser.add_argument(
            "--generation",
            type=argparse_type(_width),
            default=None,
            metavar="DURATION",
            help="prepare, convert: the width of a generation (partition): 60 s to 366 d "
            "(default 1d; a prepared table keeps the width it was prepared with).",
        )
        parser.add_argument(
            "--ahead",
            type=argparse_type(lambda v: count_option(v, option="--ahead", high=1000)),
            default=3,
            help="Generations created after the current one (1 to 1000, default 3).",
        )
        parser.add_argument(
            "--max-rows",
            type=argparse_type(lambda v: count_option(v, option="--max-rows", high=10**9)),
            default=MAX_COPY_ROWS,
            help=f"convert, revert: refuse a larger journal (default {MAX_COPY_ROWS}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from celery_grousset.store import pgpartops

        alias = journal_alias(options["database"])
        if connections[alias].vendor != "postgresql":
            raise CommandError(
                f"the journal database {alias!r} is {connections[alias].vendor}: only "
                "PostgreSQL has the partitioned layout."
            )
        action = options["action"]
        if problem := schema_problem(alias):  # not "not partitioned": `migrate` first
            raise CommandError(f"the journal of {alias!r}: {problem}")
        try:
            if action == "status" and not pgpartops.is_partitioned(alias):
                self.stdout.write(
                    f"the journal of {alias!r} is a single table (not partitioned): "
                    f"`manage.py grousset_partition convert --database {alias}` partitions it."
                )
                return
            if action == "create-ahead" and not pgpartops.is_partitioned(alias):
                raise CommandError(
                    f"the journal of {alias!r} is not partitioned: run "
                    f"`manage.py grousset_partition convert --database {alias}` first."
                )
            width = options["generation"]
            seconds = None if width is None else int(_width(width).total_seconds())
            if action == "prepare":
                self._prepare(alias, seconds)
            elif action == "convert":
                self._convert(alias, seconds, options["ahead"], options["max_rows"])
            elif action == "revert":
                self._revert(alias, options["max_rows"])
            elif action == "create-ahead":
                made = pgpartops.create_ahead(alias, options["ahead"])
                self.stdout.write(f"created {len(made)} generations: {made}")
            else:
                self._status(alias)
        except InvalidArgument as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            raise CommandError(f"grousset_partition {action} failed on {alias!r}: {exc}") from exc

    def _prepare(self, alias: str, seconds: int | None) -> None:
        from celery_grousset.store import pgpartconvert

        g0, done = pgpartconvert.prepare(alias, seconds=seconds)
        steps = "; ".join(done) if done else "nothing left to do"
        self.stdout.write(
            f"prepared the journal of {alias!r} (its rows: generation {g0}): {steps}. Next, "
            f"with the workers stopped: `manage.py grousset_partition convert --database "
            f"{alias}` (copies nothing), set GROUSSET['JOURNAL_LAYOUT'] = 'partitioned', "
            "start the workers"
        )

    def _convert(self, alias: str, seconds: int | None, ahead: int, max_rows: int) -> None:
        from celery_grousset.store import pgpartconvert, pgpartops

        rows, copied = pgpartconvert.convert(
            alias, seconds=seconds, ahead=ahead, max_rows=max_rows
        )
        how = f"{rows} rows copied" if copied else f"about {rows} rows attached, none copied"
        self.stdout.write(
            f"converted the journal of {alias!r} to generations of "
            f"{pgpartops.generation_seconds(alias)} s ({how}); now set "
            "GROUSSET['JOURNAL_LAYOUT'] = 'partitioned' and restart the workers"
        )

    def _revert(self, alias: str, max_rows: int) -> None:
        from celery_grousset.store import pgpartrevert

        rows = pgpartrevert.revert(alias, max_rows=max_rows)
        self.stdout.write(
            f"reverted the journal of {alias!r} to the single table ({rows} rows copied); now "
            "set GROUSSET['JOURNAL_LAYOUT'] = 'table' and restart the workers"
        )

    def _status(self, alias: str) -> None:
        from celery_grousset.store import pgpartops

        now = pgpartops.current_generation(alias)
        self.stdout.write(
            f"partitioned journal on {alias!r}: generations of "
            f"{pgpartops.generation_seconds(alias)} s, current {now}"
        )
        for gen, name, pending, rows in pgpartops.partitions(alias):
            mark = " (current)" if gen == now else " (detach pending)" if pending else ""
            self.stdout.write(f"  {gen}  {name}  ~{rows} rows{mark}")
