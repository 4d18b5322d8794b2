"""``manage.py grousset_partition convert|status|create-ahead``: the partitioned journal
(PostgreSQL, opt-in; docs/scale.md, "The partitioned layout").

* ``convert`` turns the single table into the partitioned layout in ONE transaction
  (claims wait for it) and installs the claim function; refused above ``--max-rows``
  (default 100000: a large table follows the online procedure in docs/scale.md). Then
  set ``GROUSSET["JOURNAL_LAYOUT"] = "partitioned"`` and restart the workers.
* ``status`` lists the generations (partitions) and their estimated rows.
* ``create-ahead`` creates the partitions of the current generation and the next
  ``--ahead`` (``grousset_purge`` and ``purge_expired`` do it on every run).
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
)


def _width(value: object) -> Any:
    return duration_option(value, option="--generation", positive=True)


class Command(BaseCommand):
    help = (
        "Convert the journal to the partitioned layout (PostgreSQL), show its generations, or "
        "create the next ones. Exit code 0 on success, 1 on error."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=("convert", "status", "create-ahead"))
        add_database_argument(parser)
        parser.add_argument(
            "--generation",
            type=argparse_type(_width),
            default="1d",
            metavar="DURATION",
            help="convert: the width of a generation (partition): 60 s to 366 d (default 1d).",
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
            default=100_000,
            help="convert: refuse a larger table (default 100000).",
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
        try:
            if action != "convert" and not pgpartops.is_partitioned(alias):
                raise CommandError(
                    f"the journal of {alias!r} is not partitioned: run "
                    f"`manage.py grousset_partition convert --database {alias}` first."
                )
            if action == "convert":
                seconds = int(_width(options["generation"]).total_seconds())
                rows = pgpartops.convert(
                    alias, seconds=seconds, ahead=options["ahead"], max_rows=options["max_rows"]
                )
                self.stdout.write(
                    f"converted the journal of {alias!r} to generations of {seconds} s "
                    f"({rows} rows copied); now set GROUSSET['JOURNAL_LAYOUT'] = 'partitioned' "
                    "and restart the workers"
                )
            elif action == "create-ahead":
                made = pgpartops.create_ahead(alias, options["ahead"])
                self.stdout.write(f"created {len(made)} generations: {made}")
            else:
                self._status(alias)
        except InvalidArgument as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            raise CommandError(f"grousset_partition {action} failed on {alias!r}: {exc}") from exc

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
