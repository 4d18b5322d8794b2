"""A ``transactional=True`` body, watched: what it did to the transaction it runs in.

The body, its writes and the completion share one transaction on the journal's
database (docs/guarantee.md, "Transactional tasks: exactly once"). A body can leave
that transaction unable to commit, and the completion statement would then fail with
an error that points into the guard, or the connection would look lost. Seen here, on
the body's way out, while the transaction is still open:

* a **conflict** the database resolved by rolling the transaction back (a deadlock, a
  serialization failure), when it is what left the transaction unable to commit: the
  last error the database raised for the body, with the transaction aborted
  (PostgreSQL; one rolled back to a savepoint is not) or a deadlock (MySQL/MariaDB roll
  the whole transaction back, savepoint or not). Never the task's failure, whatever
  the body raised after it: raised again for the delivery to be sent again
  (``TransactionLost``);
* a **lost connection** whose error the body caught: sent again the same way;
* a transaction the body **marked for rollback** (``transaction.set_rollback(True)``, an
  error it caught without a savepoint) or that PostgreSQL **aborted** at such an error,
  or a connection it **closed** (``connection.close()``, ``close_old_connections()``):
  the body's failure, raised as Django's ``TransactionManagementError`` with the cause
  and the fix (a closed connection would otherwise be taken for a lost one and the
  delivery sent again, for ever);
* the **commit**, seen by an ``on_commit`` callback registered before the body's own:
  an error raised after it comes from a callback the body registered, with the call's
  outcome committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_grousset import elsewhere, memo
from celery_grousset.binding import not_awaitable
from celery_grousset.claim import ClaimRequest
from celery_grousset.store import refusals

#: how a body left its transaction, and the fix (for :func:`broken`)
MARKED = ("marked for rollback (transaction.set_rollback(True), or a database error it "
          "caught without a savepoint of its own)",
          "Wrap a statement that may fail in its own `with transaction.atomic():`.")  # fmt: skip
ABORTED = ("aborted by a database error it caught without a savepoint of its own",
           MARKED[1])  # fmt: skip
CLOSED = ("closed: connection.close() or close_old_connections() in the body ends the "
          "transaction the guard runs it in",
          "Do not close the journal's connection inside a transactional task.")  # fmt: skip


class Body:
    """What the body did, seen while it ran and at the commit."""

    def __init__(self, timeout_ends: Callable[[], bool] = bool) -> None:
        self.conflict: BaseException | None = None  # the conflict a statement raised last
        self.ended = False  # that conflict rolled the whole transaction back (MySQL)
        self.committed = False  # the transaction committed (its callbacks run after)
        self.timeout_ends = timeout_ends  # the store's ends_on_lock_timeout
        self._ends: bool | None = None  # its answer, asked once

    def rolled_back(self, exc: BaseException) -> bool:
        """``exc`` rolled the whole transaction back: a conflict (refusals.rolled_back),
        or a lock wait timeout where the server says so (asked only then; unknown: yes,
        so that a transaction that may have lost writes never commits)."""
        return refusals.rolled_back(exc) or self._timeout_ended(exc)

    def _timeout_ended(self, exc: BaseException) -> bool:
        if not refusals.lock_timeout(exc):
            return False
        if self._ends is None:
            try:
                self._ends = bool(self.timeout_ends())
            except Exception:
                self._ends = True
        return self._ends

    def commit_seen(self) -> None:
        self.committed = True

    def watch(self, execute: Callable[..., Any], sql: Any, params: Any, many: bool,
              context: Any) -> Any:  # fmt: skip
        try:
            return execute(sql, params, many, context)
        except Exception as exc:
            self.saw(exc)
            raise

    def saw(self, exc: BaseException) -> None:
        """The database raised ``exc`` for a statement of the body's. The last such error
        decides (a conflict the body rolled back to a savepoint, followed by an error of
        its own, is not what broke the transaction); after one that rolled the whole
        transaction back, nothing else counts. Errors that only follow from an earlier one
        (an aborted transaction's, Django's refusal of a broken one) are not the
        database's say."""
        from django.db.transaction import TransactionManagementError

        if self.ended or isinstance(exc, TransactionManagementError) or refusals.aborted(exc):
            return
        self.conflict = exc if self.rolled_back(exc) else None
        self.ended = self.conflict is not None and (
            refusals.ends_transaction(exc) or self._timeout_ended(exc))


def run(body: Body, conn: Any, alias: str, req: ClaimRequest, fn: Callable[[], Any]) -> Any:
    """Run the body in the open transaction; raise instead what it did to it, if it left
    the transaction unable to commit (``conn``: the journal's Django connection)."""
    from django.db import transaction

    transaction.on_commit(body.commit_seen, using=alias)  # runs before the body's own
    with elsewhere.watched(alias, req.processor_id, req.task_name), conn.execute_wrapper(
        body.watch
    ):
        try:
            value = not_awaitable(fn(), req.task_name)
        except Exception as exc:
            instead = _unusable(body, conn, alias, req, exc)
            if instead is None or not _overrides(exc, instead):
                raise
            raise instead  # noqa: B904 (its cause is set: a conflict keeps its own)
    instead = _unusable(body, conn, alias, req, None)
    if instead is not None:
        raise instead
    return value


def _unusable(
    body: Body, conn: Any, alias: str, req: ClaimRequest, exc: BaseException | None
) -> BaseException | None:
    """The error to raise instead of ``exc`` (None: the body returned), if the
    transaction cannot commit: what the body did, the conflict that rolled it back, or
    the lost connection; None when it can commit, or when ``exc`` says why not itself."""
    from django.db import Error
    from django.db.transaction import TransactionManagementError

    if conn.closed_in_transaction:
        return broken(req, alias, CLOSED, exc)
    aborted = _aborted(conn)
    if exc is not None and refusals.aborted(exc):
        aborted = True
    own = exc is not None and not isinstance(exc, Error)  # the body's, not the database's
    gone = own or conn.needs_rollback or body.ended or aborted  # (own: below decides)
    if not gone and not isinstance(exc, TransactionManagementError):
        return None
    if aborted is None or _lost(conn):  # not the body's doing: the completion's
        return _gone(alias, exc)  # path sends the delivery again (TransactionLost)
    if body.conflict is not None and (body.ended or aborted):
        return body.conflict  # the database rolled the transaction back for it
    if exc is None:
        return broken(req, alias, ABORTED if aborted else MARKED, None)
    return broken(req, alias, ABORTED, exc) if refusals.aborted(exc) else None


def _overrides(exc: BaseException, instead: BaseException) -> bool:
    """Whether ``instead`` is raised in place of the body's ``exc``. A database error
    always gives way. An exception of the body's own (a domain error it raised on giving
    up a step whose conflict it caught) gives way only to a conflict that ended the
    transaction or a lost connection — not the task's failure, as if it had not been
    caught — and keeps its type for the body's failure (``autoretry_for`` still matches
    it; one raised ``from`` a conflict is that conflict's anyway: ``refusals.rolled_back``
    reads causes); Celery's control flow (``self.retry()``) is never replaced."""
    from django.db import Error
    from django.db.transaction import TransactionManagementError

    if isinstance(exc, Error):
        return True
    return not memo.control_flow(exc) and not isinstance(instead, TransactionManagementError)


def _gone(alias: str, cause: BaseException | None) -> BaseException:
    from django.db import OperationalError

    error = OperationalError(f"the connection to {alias!r} broke while the body ran")
    error.__cause__ = cause
    return error


def _aborted(conn: Any) -> bool | None:
    """PostgreSQL: the transaction was aborted by an error (None: the connection is
    gone); other databases: False."""
    if conn.vendor != "postgresql":
        return False
    from celery_grousset.store.pgdriver import driver

    return driver().in_transaction_error(conn.connection)


def _lost(conn: Any) -> bool:
    """The connection itself broke (MySQL/MariaDB: Django's ping says so; PostgreSQL's
    state is libpq's, :func:`_aborted`)."""
    return bool(conn.vendor == "mysql" and not conn.is_usable())


def broken(
    req: ClaimRequest, alias: str, how: tuple[str, str], cause: BaseException | None
) -> BaseException:
    """The body's failure: it left its transaction unable to commit."""
    from django.db.transaction import TransactionManagementError

    error = TransactionManagementError(
        f"{req.task_name}: the body left its transaction on the journal database {alias!r} "
        f"{how[0]}: its writes are rolled back and this attempt failed. {how[1]}"
    )
    error.__cause__ = cause
    return error


def connection_lost(conn: Any, raw: Any, exc: BaseException) -> bool:
    """``exc`` left the transactional block because the connection it ran on (``raw``,
    Django's ``conn`` then) broke, not for a failure of the task's own: it never
    opened, Django dropped it as broken (it connects anew after a failed rollback), or
    it no longer answers."""
    from django.db import InterfaceError, OperationalError

    if not isinstance(exc, (OperationalError, InterfaceError)):
        return False
    if raw is None or conn.connection is not raw:
        return True
    try:
        return not conn.is_usable()
    except Exception:  # the connection is in no state to say
        return True
