"""What a journal database that refuses the store's writes for a reason of its own
(permissions, read-only) is told, whichever backend: the problem and the fix. It stays
:class:`StoreUnavailable`: nothing runs, the delivery is retried, and it goes through
once the database is put right."""

from __future__ import annotations

from celery_grousset.exceptions import StoreUnavailable

DENIED = "denied"
READ_ONLY = "read only"

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


#: PostgreSQL serialization_failure and deadlock_detected; MySQL/MariaDB ER_LOCK_DEADLOCK
_ROLLED_BACK = {"40001", "40P01", 1213}


def rolled_back(exc: BaseException) -> bool:
    """``exc`` (Django's, or the driver's under it) says the database rolled the whole
    transaction back to resolve a conflict with another one: a serialization failure
    (REPEATABLE READ, SERIALIZABLE) or a deadlock. Nothing of it stands; it can run again."""
    seen: BaseException | None = exc
    while seen is not None:
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if code is None and type(seen).__module__.startswith("MySQLdb") and seen.args:
            code = seen.args[0]
        if code in _ROLLED_BACK:
            return True
        seen = seen.__cause__
    return False
