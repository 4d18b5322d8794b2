"""What a journal database that refuses the store's writes for a reason of its own
(permissions, read-only, tables missing) is told, whichever backend: the problem and the
fix. It stays :class:`StoreUnavailable`: nothing runs, the delivery is retried, and it
goes through once the database is put right. And which errors say the database rolled a
transaction back for a conflict (:func:`rolled_back`)."""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet

from celery_grousset.exceptions import StoreUnavailable

DENIED = "denied"
READ_ONLY = "read only"
#: the journal's table (the model's ``db_table``; the checks read it from here)
OUTCOME_TABLE = "celery_grousset_outcome"

_FIX = {
    DENIED: "the database user of DATABASES[{alias!r}] needs SELECT, INSERT, UPDATE and "
    "DELETE on the celery_grousset_* tables (the user that ran `migrate` has them): "
    "grant them",
    READ_ONLY: "the database is read-only here (a replica, a read-only mode, or "
    "default_transaction_read_only): point the journal at a writable primary",
}


def refused(alias: str, exc: BaseException, why: str) -> StoreUnavailable:
    """The error for ``exc``, a refusal of kind ``why`` (:data:`DENIED`, :data:`READ_ONLY`)."""
    fix = _FIX[why].format(alias=alias)
    return StoreUnavailable(f"journal database {alias!r} refused the write: {exc} — {fix}.")


#: PostgreSQL serialization_failure and deadlock_detected; MySQL/MariaDB deadlock (1213)
#: and MariaDB's "record has changed since last read" (1020: REPEATABLE READ with
#: innodb_snapshot_isolation, the default from 11.6). Not a lock wait timeout (1205): it
#: rolls back the statement only, and may come from another database the body writes to
_ROLLED_BACK = {"40001", "40P01", 1213, 1020}


def interrupted(alias: str, exc: BaseException) -> StoreUnavailable:
    """A claim interrupted by the task's soft time limit while its statement was out (a
    lock wait, a slow server): it may commit yet, so the delivery is sent again carrying
    its token, and the next one settles it — rather than leave a claim no attempt holds
    in flight until it is stale."""
    return StoreUnavailable(
        f"the claim on journal database {alias!r} was interrupted by {type(exc).__name__} "
        "(the task's soft time limit) before the database answered: the delivery is sent "
        "again, and finds out whether that claim was made"
    )


def timed_out(alias: str, timeout: float, exc: BaseException) -> StoreUnavailable:
    """A statement of the store not answered within ``STORE_TIMEOUT`` (a statement or
    lock wait timeout), naming this thread's own open transaction on the journal's
    database when there is one: a transactional call of the same key earlier in it holds
    the row's lock until it ends, and a claim of that key waits for it."""
    from django.db import connections

    own = ""
    conn = connections[alias] if alias in connections.settings else None
    if conn is not None and conn.connection is not None and conn.in_atomic_block:
        own = (
            f" — this thread's own transaction.atomic() on {alias!r} is open and may hold "
            "the row's lock (a transactional call of the same key earlier in it holds it "
            "until the transaction ends): call each key once per transaction, or after "
            "the commit (transaction.on_commit)"
        )
    return StoreUnavailable(
        f"the journal database {alias!r} did not answer within {timeout:g} s "
        f"(STORE_TIMEOUT: a slow server, or a lock another session holds): {exc}{own}"
    )


#: the journal refusing a statement of its own, whoever's transaction it runs in: a lock
#: wait or statement timeout (PostgreSQL 55P03, 57014; MySQL/MariaDB 1205), a permission
#: refused (42501; 1142), a read-only server (25006; 1290, 1792)
_NOT_TAKEN = {"55P03", "57014", "42501", "25006", 1205, 1142, 1290, 1792}


def _codes(exc: BaseException) -> Iterator[object]:
    """The SQLSTATE (PostgreSQL) or error number (MySQL/MariaDB) of ``exc`` and of each
    exception it was raised from (Django's, then the driver's under it) — up to Django's
    refusal of a broken transaction, whose cause (``rollback_exc``, never cleared on the
    connection) may be an error of an earlier transaction."""
    from django.db.transaction import TransactionManagementError

    from celery_grousset.store.pgdriver import sqlstate

    seen: BaseException | None = exc
    while seen is not None:
        code: object = sqlstate(seen)
        if code is None and type(seen).__module__.startswith("MySQLdb") and seen.args:
            code = seen.args[0]
        yield code
        seen = None if isinstance(seen, TransactionManagementError) else seen.__cause__


def _any(exc: BaseException, codes: AbstractSet[object]) -> bool:
    """One of ``codes`` is ``exc``'s or its causes' (:func:`_codes`)."""
    return any(code in codes for code in _codes(exc))


def rolled_back(exc: BaseException) -> bool:
    """``exc`` (Django's, the driver's under it, or one raised ``from`` such an error)
    says the database rolled the whole transaction back to resolve a conflict with
    another one: a serialization failure (REPEATABLE READ, SERIALIZABLE) or a deadlock.
    Nothing of it stands; it can run again."""
    return _any(exc, _ROLLED_BACK)


#: PostgreSQL in_failed_sql_transaction: a statement sent after an earlier one failed
#: inside the same transaction, which nothing rolled back to a savepoint
_ABORTED = {"25P02"}


def aborted(exc: BaseException) -> bool:
    """``exc`` says the transaction was already aborted by an earlier error in it (one a
    caller caught without a savepoint): the statement that raised it did nothing wrong."""
    return _any(exc, _ABORTED)


#: a conflict after which nothing of the transaction stands, even inside a savepoint:
#: MySQL/MariaDB roll the whole transaction back on a deadlock, and MariaDB 11.6.2+ on a
#: "record has changed since last read" (1020) too
_ENDS = {1213, 1020}


def ends_transaction(exc: BaseException) -> bool:
    """``exc``, a conflict (:func:`rolled_back`), rolled the whole transaction back,
    whatever savepoint the statement ran in."""
    return _any(exc, _ENDS)


def lock_timeout(exc: BaseException) -> bool:
    """``exc`` is MySQL/MariaDB's lock wait timeout (1205): one statement undone, or the
    whole transaction where the server runs with ``innodb_rollback_on_timeout``."""
    return _any(exc, {1205})


def not_taken(exc: BaseException) -> bool:
    """``exc``, raised by a statement of the journal's, says the database would not take
    that statement (a lock wait timeout, a refusal): its trouble, not the caller's. An
    error the statement only surfaced — a transaction a body's caught error aborted, a
    data error — is not one."""
    return _any(exc, _NOT_TAKEN)


#: a table that is not there: PostgreSQL undefined_table, MySQL/MariaDB 1146 (SQLite says
#: so in its text only)
_MISSING = {"42P01", 1146}


def table_missing(exc: BaseException) -> bool:
    """``exc`` says a statement named a table the database does not have (the fix is
    :func:`missing_table_fix`)."""
    return _any(exc, _MISSING) or "no such table" in str(exc)


def missing_table_fix(alias: str | None = None) -> str:
    """What creates the journal's tables (on ``alias``: migrate's default is "default")."""
    from django.apps import apps

    on = f" --database {alias}" if alias not in (None, "default") else ""
    fix = f"run `manage.py migrate celery_grousset{on}`."
    if not apps.is_installed("celery_grousset"):
        return "add 'celery_grousset' to INSTALLED_APPS, then " + fix
    if alias is not None and not _router_allows(alias):
        from django.db import connections

        there = [a for a in connections.settings if a != alias and _router_allows(a)]
        meant = (f" (or, if the router keeps the journal on {there[0]!r} on purpose, set "
                 f"GROUSSET['DATABASE'] = {there[0]!r}, and each task's database option)"
                 if len(there) == 1 else "")  # fmt: skip
        return (
            f"a DATABASE_ROUTERS router's allow_migrate() refuses app 'celery_grousset' on "
            f"{alias!r}, so `migrate` records its migrations there without creating its "
            f"tables: make it return True for that app on {alias!r}; then run `manage.py "
            f"migrate celery_grousset zero --fake{on}` (forget the recorded ones) and "
            f"{fix[4:-1]}{meant}."
        )
    if alias is not None and _recorded_without_table(alias):
        return (
            f"its migrations are recorded as applied on {alias!r} but its table is missing "
            f"(dropped by hand, or a restore without it), so `migrate` alone applies nothing: "
            f"run `manage.py migrate celery_grousset zero --fake{on}` (forget the recorded "
            f"ones) and {fix[4:]}"
        )
    return fix


def _recorded_without_table(alias: str) -> bool:
    """Whether ``migrate`` recorded this app's migrations on ``alias`` while the journal's
    table is not there (False when that cannot be read)."""
    from django.db import DatabaseError, connections
    from django.db.migrations.recorder import MigrationRecorder

    conn = connections[alias]
    opened = conn.connection is None  # (a claim store's thread has no Django connection)
    try:
        if OUTCOME_TABLE in conn.introspection.table_names():
            return False
        recorder = MigrationRecorder(conn)
        return recorder.has_table() and recorder.migration_qs.filter(app="celery_grousset").exists()
    except DatabaseError:
        return False
    finally:
        if opened:
            conn.close()


def _router_allows(alias: str) -> bool:
    from django.apps import apps
    from django.db import router

    try:
        return bool(router.allow_migrate_model(alias, apps.get_model("celery_grousset", "Outcome")))
    except Exception:  # a router that fails here: migrate would say so
        return True


def missing_table(alias: str, exc: BaseException) -> StoreUnavailable:
    """A table of the journal is not in ``alias``'s database: the fix is ``migrate``, after
    adding the app to ``INSTALLED_APPS`` when it is not there (without it, ``migrate``
    knows no ``celery_grousset`` and ``manage.py check`` runs none of its checks)."""
    return StoreUnavailable(
        f"the journal's tables are missing in database {alias!r} ({first_line(exc)}): "
        + missing_table_fix(alias)
    )


def schema_behind(alias: str, exc: BaseException) -> StoreUnavailable:
    """The journal's table lacks a column this version writes: the package was upgraded
    and ``migrate`` has not run on ``alias`` since."""
    return StoreUnavailable(
        f"the journal's table in database {alias!r} is older than this celery-grousset "
        f"(its migrations are not all applied: {first_line(exc)}): " + missing_table_fix(alias)
    )


def first_line(exc: BaseException) -> str:
    """A driver's error without the statement context PostgreSQL adds (``LINE 1: …`` and
    its caret), which would push the fix after it out of a log line's error field."""
    return next(iter(str(exc).splitlines()), "")
