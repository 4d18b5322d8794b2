"""The database checks of a journal database (``manage.py check --database <alias>``):
whether it can be opened (``W007``), whether the journal's table is there and its
migrations all applied (``W009``),
whether its layout is the one ``GROUSSET["JOURNAL_LAYOUT"]`` names (``W010``),
whether a SQLite journal is in WAL mode (``W005``), whether a MySQL/MariaDB journal
stores text as utf8mb4 (``W012``), and whether the claim store's own connection reads
the journal (``W013``: a pooler can refuse it while Django's connection works). And the
time zone the journal's times are read in (``E012``, :func:`time_zone_messages`).

They are warnings, not errors, because ``manage.py migrate`` runs the database checks
of the database it migrates before it migrates it: an error there would stop the very
command that fixes a missing table.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks

from celery_grousset.store.refusals import OUTCOME_TABLE

LAYOUT_MISMATCH = "celery_grousset.W010"
STORE_REFUSED = "celery_grousset.W013"
UNREADABLE = "celery_grousset.W007"
#: the warnings a worker logs as errors at its start: with them every claim fails closed
AT_START = (LAYOUT_MISMATCH, STORE_REFUSED, UNREADABLE)
TABLES_MISSING = "the journal's tables do not exist"


def journal_aliases(default: str, task_databases: Iterable[str]) -> list[str]:
    """The journal databases: ``GROUSSET["DATABASE"]`` and each guarded task's own."""
    return sorted({default, *task_databases})


#: TIME_ZONE values under which naive datetimes are UTC.
UTC_NAMES = frozenset(
    {"UTC", "Etc/UTC", "UCT", "Etc/UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu",
     "GMT", "Etc/GMT", "GMT0", "Etc/GMT0", "GMT+0", "Etc/GMT+0", "GMT-0", "Etc/GMT-0",
     "Greenwich", "Etc/Greenwich"}
)  # fmt: skip


def alias_errors(alias: str, named: str, obj: str | None = None) -> list[checks.CheckMessage]:
    """E003: the journal database ``alias`` (``named``: where it is set) is not in
    ``DATABASES``, or its engine is not one the journal supports."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections

    from celery_grousset.store import store_class

    if alias not in connections.settings:
        why = f"{named} is {alias!r}, which is not in settings.DATABASES."
        hint = f"Use one of {sorted(connections.settings)}."
    else:
        engine = connections.settings[alias]["ENGINE"]
        try:
            vendor = store_class(engine).vendor  # the store's own engine -> backend mapping
            return database_time_zone(alias, vendor, obj)
        except ImproperlyConfigured:
            why = (f"The journal database {alias!r} ({named}) uses {engine!r}; "
                   "celery-grousset supports PostgreSQL, SQLite and MySQL/MariaDB.")  # fmt: skip
            hint = "Point it at a supported database."
    return [checks.Error(why, hint=hint, obj=obj, id="celery_grousset.E003")]


def database_time_zone(alias: str, vendor: str, obj: str | None) -> list[checks.CheckMessage]:
    """E016: a MySQL/MariaDB or SQLite journal database whose ``DATABASES[alias]
    ["TIME_ZONE"]`` is not UTC. Those databases store naive times: the store writes and
    compares UTC, Django's ORM (the purge, the admin, the commands) would read and write
    them as local times."""
    from django.conf import settings
    from django.db import connections

    zone = connections.settings[alias].get("TIME_ZONE")
    if vendor == "postgresql" or not settings.USE_TZ or zone is None or zone in UTC_NAMES:
        return []  # (PostgreSQL stores time zones; USE_TZ = False is E012's)
    return [checks.Error(
        f"The journal database {alias!r} has DATABASES[{alias!r}]['TIME_ZONE'] = {zone!r} on "
        f"{vendor}: the journal writes UTC times, which Django would read as {zone} times, "
        "so the purge, the admin and the commands would misjudge every record by the "
        "offset (an unexpired record can be purged and its effect run twice).",
        hint=f"Remove TIME_ZONE from DATABASES[{alias!r}] (or set it to 'UTC'), or give the "
        "journal a database alias of its own without it (GROUSSET['DATABASE']).",
        obj=obj, id="celery_grousset.E016",
    )]  # fmt: skip


def repeatable_read(alias: str) -> list[checks.CheckMessage]:
    """W004: the MySQL/MariaDB journal database ``alias`` runs at REPEATABLE READ."""
    from django.db import connections

    from celery_grousset.store import store_class

    settings = connections.settings.get(alias) or {}
    try:
        vendor = store_class(settings["ENGINE"]).vendor
    except Exception:  # not in DATABASES, or not a journal engine: E003 says so
        return []
    options = settings.get("OPTIONS") or {}
    level = str(options.get("isolation_level", "")).lower()
    # (None: Django sets none, so the server's default applies: REPEATABLE READ unless
    # the server is configured otherwise)
    server = "isolation_level" in options and options["isolation_level"] is None
    if vendor != "mysql" or (level != "repeatable read" and not server):
        return []
    return [
        checks.Warning(
            f"The journal database {alias!r} runs at REPEATABLE READ"
            + (" (OPTIONS['isolation_level'] is None: the server's default, REPEATABLE "
               "READ unless it sets another)" if server else "")
            + ": transactional tasks read a snapshot older than their claim, and the "
            "outbox relay's batch (SELECT … FOR UPDATE SKIP LOCKED) takes gap locks that "
            "make outbox.enqueue() in your transactions wait for it to publish.",
            hint="Remove OPTIONS['isolation_level'] (Django's default is READ COMMITTED).",
            id="celery_grousset.W004",
        )
    ]


def _schema_warning(alias: str, problem: str) -> checks.CheckMessage:
    """W009: the journal's tables are missing or behind on ``alias``, and what fixes it."""
    from celery_grousset.store.refusals import missing_table_fix

    fix = missing_table_fix(alias)
    if fix.startswith("run "):  # plain `migrate` (not a router's or INSTALLED_APPS' fix)
        fix += (" (`migrate` itself shows this warning before it applies them: then it "
                "is about to fix it).")  # fmt: skip
    return checks.Warning(
        f"In the journal database {alias!r} ({OUTCOME_TABLE}), {problem}: every "
        "guarded delivery journaled there is refused before its claim: a worker sends it "
        "again and again (it never runs unguarded), protect() and eager calls raise "
        "StoreUnavailable.",
        hint=f"To fix it, {fix}",
        id="celery_grousset.W009",
    )


def unreadable(alias: str, exc: BaseException) -> checks.CheckMessage:
    """W007: the journal database ``alias`` could not be asked (``exc``)."""
    return checks.Warning(
        f"The journal database {alias!r} could not be inspected: {exc}",
        hint="Check that the database in settings.DATABASES can be opened by this "
        "process (path, permissions, server up).",
        id=UNREADABLE,
    )


def journal_messages(alias: str, layout: str) -> list[checks.CheckMessage]:
    """The database checks of the journal database ``alias`` (see the module doc)."""
    from django.db import DatabaseError, connections

    conn = connections[alias]
    try:
        problem = schema_problem(alias)
        broken = store_problem(alias) if problem is None else None  # (SQLite: WAL on)
        with conn.cursor() as cur:
            mode = _sqlite_mode(conn, cur) if conn.vendor == "sqlite" else "wal"
            charsets = _mysql_charsets(cur) if conn.vendor == "mysql" else None
        partitioned = None if problem == TABLES_MISSING else _partitioned(alias)
    except DatabaseError as exc:
        return [unreadable(alias, exc)]
    found: list[checks.CheckMessage] = []
    if problem is not None:
        found.append(_schema_warning(alias, problem))
    if broken is not None:
        found.append(
            checks.Warning(
                f"The journal database {alias!r} opens on Django's connection, but not on "
                f"the claim store's own: {broken}",
                hint="Every guarded task journaled there fails closed (retried, never run) "
                "until the store's connection works.",
                id=STORE_REFUSED,
            )
        )
    wanted = layout == "partitioned"
    if partitioned is not None and conn.vendor == "postgresql" and partitioned != wanted:
        found.append(_layout_mismatch(alias, layout))
    if charsets is not None:
        found.append(_utf8mb3(alias, *charsets))
    if mode != "wal" and not conn.is_in_memory_db():  # type: ignore[attr-defined]
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


def schema_problem(alias: str) -> str | None:
    """What is wrong with the journal's tables on ``alias``: missing (``TABLES_MISSING``),
    or a migration of this package not applied there; None when they are fine. Raises
    Django's DatabaseError when the database cannot be asked."""
    from django.db import connections

    if OUTCOME_TABLE not in connections[alias].introspection.table_names():
        return TABLES_MISSING
    if behind := unapplied_migrations(alias):
        return f"the journal's migrations {', '.join(behind)} are not applied"
    return None


def store_problem(alias: str) -> str | None:
    """Why the claim store's own connection to ``alias`` cannot read the journal, or None.
    It is not Django's connection (on PostgreSQL it carries the store's timeouts as
    startup options), so Django's working proves nothing about it."""
    from celery_grousset.exceptions import StoreUnavailable
    from celery_grousset.store import get_store

    try:
        store = get_store(alias)
    except Exception:  # a configuration problem (E003, E015…): its own check says it
        return None
    try:
        store.probe()
    except StoreUnavailable as exc:
        return str(exc)
    return None


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


def _sqlite_mode(conn: Any, cur: object) -> str:
    # (a read first: a connection opened before another turned WAL on reports the old
    # mode until its next read transaction)
    conn.introspection.table_names(cur)
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
        id=LAYOUT_MISMATCH,
    )


def _mysql_charsets(cur: object) -> tuple[str, str | None] | None:
    """The connection's and the journal's character sets, when they cannot store text
    outside the BMP (None: they can)."""
    from celery_grousset.store.mysql import CONNECTION_SQL, four_byte

    cur.execute(CONNECTION_SQL)  # type: ignore[attr-defined]
    _, connection, column, *_ = cur.fetchone()  # type: ignore[attr-defined]
    return None if four_byte(connection, column) else (connection, column)


def _utf8mb3(alias: str, connection: str, column: str | None) -> checks.CheckMessage:
    return checks.Warning(
        f"The MySQL/MariaDB journal database {alias!r} stores text as {connection} "
        f"(connection) / {column or '-'} (journal table), not utf8mb4: a character outside "
        "the BMP (an emoji) in a call's arguments or an error is stored as its escape "
        "(\\U0001f600).",
        hint=f"Set DATABASES[{alias!r}]['OPTIONS']['charset'] = 'utf8mb4' (Django 5.2's "
        "default) and convert the tables: ALTER TABLE celery_grousset_outcome CONVERT TO "
        "CHARACTER SET utf8mb4 (and celery_grousset_delivery, celery_grousset_outboxmessage).",
        id="celery_grousset.W012",
    )


def time_zone_messages() -> list[checks.CheckMessage]:
    """``USE_TZ = False`` with naive times that are not UTC (E012)."""
    from django.conf import settings

    if settings.USE_TZ or settings.TIME_ZONE in UTC_NAMES:
        return []
    return [
        checks.Error(
            f"USE_TZ is False and TIME_ZONE is {settings.TIME_ZONE!r}: the journal compares "
            "times read from the database clock, which Django then handles as naive local "
            "times, so records expire early or late by the UTC offset (an unexpired record "
            "can be purged and its effect run twice).",
            hint="Set USE_TZ = True (Django's default since 5.0); or, if you must keep naive "
            "datetimes, TIME_ZONE = 'UTC'.",
            id="celery_grousset.E012",
        )
    ]
