"""The database checks of a journal database (``manage.py check --database <alias>``):
whether it can be opened (``W007``), whether the journal's table is there and its
migrations all applied (``W009``),
whether its layout is the one ``GROUSSET["JOURNAL_LAYOUT"]`` names (``W010``), and
whether a SQLite journal is in WAL mode (``W005``).

They are warnings, not errors, because ``manage.py migrate`` runs the database checks
of the database it migrates before it migrates it: an error there would stop the very
command that fixes a missing table.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.core import checks

OUTCOME_TABLE = "celery_grousset_outcome"


def journal_aliases(default: str, task_databases: Iterable[str]) -> list[str]:
    """The journal databases: ``GROUSSET["DATABASE"]`` and each guarded task's own."""
    return sorted({default, *task_databases})


def journal_messages(alias: str, layout: str) -> list[checks.CheckMessage]:
    """The database checks of the journal database ``alias`` (see the module doc)."""
    from django.db import DatabaseError, connections

    conn = connections[alias]
    try:
        with conn.cursor() as cur:
            tables = conn.introspection.table_names(cur)
            mode = _sqlite_mode(cur) if conn.vendor == "sqlite" else "wal"
        partitioned = _partitioned(alias) if OUTCOME_TABLE in tables else None
        behind = unapplied_migrations(alias) if partitioned is not None else []
    except DatabaseError as exc:
        return [
            checks.Warning(
                f"The journal database {alias!r} could not be inspected: {exc}",
                hint="Check that the database in settings.DATABASES can be opened by this "
                "process (path, permissions, server up).",
                id="celery_grousset.W007",
            )
        ]
    found: list[checks.CheckMessage] = []
    if partitioned is None or behind:
        from celery_grousset.store.base import missing_table_fix

        what = (
            f"The journal's table {OUTCOME_TABLE} does not exist in database {alias!r}: every "
            "guarded task journaled there fails before its claim."
            if partitioned is None
            else f"The journal database {alias!r} lacks celery_grousset migrations "
            f"{', '.join(behind)}: claims there fail on the columns they add."
        )
        hint = f"To fix it, {missing_table_fix(alias)}"
        found.append(checks.Warning(what, hint=hint, id="celery_grousset.W009"))
    wanted = layout == "partitioned"
    if partitioned is not None and conn.vendor == "postgresql" and partitioned != wanted:
        found.append(_layout_mismatch(alias, layout))
    if mode != "wal":
        found.append(
            checks.Warning(
                f"The SQLite journal {alias!r} is in {mode!r} journal mode, not WAL: workers "
                "block each other's reads while a claim is written.",
                hint="Run `PRAGMA journal_mode=WAL` once on the database file (the claim store "
                "switches it on first use when it can).",
                id="celery_grousset.W005",
            )
        )
    return found


def unapplied_migrations(alias: str) -> list[str]:
    """The celery_grousset migrations this package has that ``alias`` has not applied
    (none when the database records no migrations at all: nothing to compare with)."""
    import pkgutil

    from django.db import connections
    from django.db.migrations.recorder import MigrationRecorder

    from celery_grousset import migrations

    recorder = MigrationRecorder(connections[alias])
    if not recorder.has_table():
        return []
    applied = {name for app, name in recorder.applied_migrations() if app == "celery_grousset"}
    known = sorted(m.name for m in pkgutil.iter_modules(migrations.__path__) if m.name[0].isdigit())
    return [name for name in known if name not in applied]


def _sqlite_mode(cur: object) -> str:
    cur.execute("PRAGMA journal_mode")  # type: ignore[attr-defined]
    return str(cur.fetchone()[0]).lower()  # type: ignore[attr-defined]


def _partitioned(alias: str) -> bool:
    from django.db import connections

    if connections[alias].vendor != "postgresql":
        return False
    from celery_grousset.store.pgpartops import is_partitioned

    return is_partitioned(alias)


def _layout_mismatch(alias: str, layout: str) -> checks.CheckMessage:
    if layout == "partitioned":
        what = "the single table"
        fix = (
            f"Run `manage.py grousset_partition convert --database {alias}`, or set "
            "GROUSSET['JOURNAL_LAYOUT'] to 'table'."
        )
    else:
        what = "the partitioned layout"
        fix = (
            "Set GROUSSET['JOURNAL_LAYOUT'] to 'partitioned', or run `manage.py "
            f"grousset_partition revert --database {alias}`."
        )
    return checks.Warning(
        f"GROUSSET['JOURNAL_LAYOUT'] is {layout!r}, but the journal in database {alias!r} "
        f"is {what}: every claim there fails.",
        hint=fix,
        id="celery_grousset.W010",
    )
