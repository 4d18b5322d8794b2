"""The store contract: one atomic claim, a fenced completion, a release, and every other
statement the package sends to the journal's database.

A store talks to the journal's database on a connection of its own (one per thread of a
process and database alias), in autocommit mode, so that:

* the claim commits on its own even when the caller is inside ``transaction.atomic()``
  (docs/guarantee.md);
* Celery's Django fixup, which closes Django's connections around every task, does not
  make every claim pay for a new connection (docs/performance.md).

A connection that breaks is dropped and opened again on the next call; an operation
that fails on a connection that had been idle is retried once on a fresh one (safe: a
claim or a completion re-sent with the same token is recognised as the caller's own).
Anything else is :class:`~celery_grousset.exceptions.StoreUnavailable`: fails closed.

The operations that must share the caller's transaction or are made for operators
(the transactional completion, purge, lookups, the admin's counts, the database
clock) run on Django's connection for the alias; their vendor SQL lives here and in
the vendor modules too, never outside ``store/``.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from celery_grousset.claim import ENC_NONE, ClaimRequest, Kind
from celery_grousset.exceptions import InvalidArgument, PoisonDelivery
from celery_grousset.store.rows import finishable, purgeable, purgeable_sql

#: the longest value each identifying column of a claim holds (the model's max_length)
ID_LIMITS = {"task_id": 255, "task_name": 255, "processor_id": 128}
_ORPHANS: list[Any] = []  # discarded after a fork: freed, mysqlclient's closes the parent's


def check_claimable(req: ClaimRequest) -> None:
    """Raise :class:`PoisonDelivery` for a claim the journal can never store: a task id,
    task name or processor id over its column's length, with a NUL, or not UTF-8.
    Checked before the claim is sent: such a delivery is permanent, not an outage."""
    for field, limit in ID_LIMITS.items():
        value = getattr(req, field)
        if len(value) <= limit and "\x00" not in value and value.isascii():
            continue  # the common case: short and plain
        if len(value) > limit:
            why = f"{len(value)} characters, the journal holds at most {limit}"
        elif "\x00" in value:
            why = "it contains a NUL character"
        else:
            try:
                value.encode("utf-8")
                continue
            except UnicodeEncodeError:
                why = "it is not valid Unicode (a lone surrogate)"
        raise PoisonDelivery(
            f"the {field.replace('_', ' ')} {value[:40]!r}… cannot be stored in the journal "
            f"({why}): this call can never be claimed, so it is refused, not retried"
        )


def data_error(alias: str, exc: BaseException) -> PoisonDelivery:
    """The permanent error of a statement the database refused for its data (too long,
    NUL, wrong encoding): retrying cannot help, so it is never StoreUnavailable."""
    return PoisonDelivery(f"journal database {alias!r} refused the data of this call: {exc}")


def distinct_keys(
    reqs: Sequence[ClaimRequest],
    claim_batch: Callable[[Sequence[ClaimRequest]], list[ClaimResult]],
) -> list[ClaimResult]:
    """``claim_batch`` of ``reqs`` whose keys are distinct (what one batch statement or
    transaction needs); a key asked twice is claimed again in a later batch, after the
    first claim of it committed, exactly as one claim after the other would be."""
    first: dict[tuple[str, str], int] = {}
    for i, req in enumerate(reqs):
        first.setdefault((req.processor_id, req.fingerprint), i)
    if len(first) == len(reqs):
        return claim_batch(reqs)
    head = list(first.values())
    rest = [i for i in range(len(reqs)) if i not in set(head)]
    results = dict(zip(head, claim_batch([reqs[i] for i in head]), strict=True))
    results.update(zip(rest, distinct_keys([reqs[i] for i in rest], claim_batch), strict=True))
    return [results[i] for i in range(len(reqs))]


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What the claim decided and the row it left: the caller acts on ``kind``."""

    kind: Kind
    fence: int
    status: str
    deliveries: int
    takeovers: int
    result: bytes | None
    result_encoding: str
    error: str
    task_id: str
    started_at: datetime | None
    completed_at: datetime | None
    #: seconds (database clock) until an in-flight claim turns stale; 0 otherwise
    retry_in: float
    #: the row's payload hash: the caller's own when it took the row, else the holder's
    payload_hash: str = ""

    owned = property(lambda self: self.kind.owned)  # the caller holds the claim now


@dataclass(frozen=True, slots=True)
class Completion:
    """The terminal write of an attempt."""

    status: str  #: "completed" or "failed"
    result: bytes | None = None
    result_encoding: str = ENC_NONE
    error: str = ""


class Store(abc.ABC):
    """One database alias' journal, on a private connection."""

    vendor: str = ""
    #: whether a statement can commit while its answer is lost (a network in between)
    remote: bool = True
    #: ``SELECT`` of the database clock on Django's connection (None: this host's clock)
    clock_sql: str | None = None

    def __init__(self, alias: str, settings_dict: dict[str, Any], timeout: float,
                 claim_commit: str = "durable") -> None:  # fmt: skip
        self.alias = alias
        self.settings_dict = settings_dict
        self.timeout = timeout
        #: CLAIM_COMMIT: "async" lets an owning claim skip the WAL flush (PostgreSQL only)
        self.claim_commit = claim_commit

    # -- the claim path, on the private connection ------------------------------------------

    @abc.abstractmethod
    def claim(self, req: ClaimRequest) -> ClaimResult:
        """Atomically claim ``(processor_id, fingerprint)``; the result names the decision."""

    def claim_all(self, reqs: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim several keys; one result per request, in order (batch-ready seam: a store
        may do it in one statement; this default claims them one by one)."""
        return [self.claim(req) for req in reqs]

    @abc.abstractmethod
    def finish(
        self, processor_id: str, fingerprint: str, token: str, completion: Completion
    ) -> bool:
        """Fenced terminal write. False: the claim was lost (taken over)."""

    @abc.abstractmethod
    def release(self, processor_id: str, fingerprint: str, token: str | None = None,
                stale: bool = False) -> bool:  # fmt: skip
        """Free an in-flight claim (token None: any holder; ``stale``: only if stale now)."""

    @abc.abstractmethod
    def probe(self) -> None:
        """Read the journal table once on the private connection (StoreUnavailable)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the private connection (only from the process that opened it)."""

    def ends_on_lock_timeout(self) -> bool:
        """Whether a lock wait timeout rolls the whole transaction back (MySQL/MariaDB
        with ``innodb_rollback_on_timeout``): a transactional body that caught one lost
        its earlier writes, and its transaction must not commit."""
        return False

    def write_before_exit(self, req: ClaimRequest, completion: Completion) -> bool:
        """A process stopped (a revoke's SIGTERM) while the outcome of an effect that ran
        was being written: sent once more, on a fresh connection, before the process goes
        — else the claim is released once it is gone (celery_grousset.revoked) and a
        duplicate runs the effect again. The same token: a claim taken over is untouched.
        Under the store's lock: a greenlet killed (gevent) while others use the store."""
        try:
            with self._lock:
                self.discard()
                if self.finish(req.processor_id, req.fingerprint, req.token, completion):
                    return True
            why: object = "its claim was taken over"
        except BaseException as exc:  # (another signal, the journal away): as it was
            why = repr(exc)
        logging.getLogger("celery_grousset").warning(
            "celery-grousset: the outcome of stopped %s was not written: %s (its claim "
            "is left in flight until max_processing_time)", req.task_name, why)  # fmt: skip
        return False

    def discard(self, forked: bool = False) -> None:
        """Drop the connection. ``forked`` (the parent's): no I/O, kept, never freed
        (_ORPHANS). Else closed, errors ignored: left open mid-transaction (a claim cut by
        a soft time limit), it held its row locks while a traceback referenced it."""
        if forked:  # (no lock: another thread may have held it at the fork)
            if self._conn is not None:
                _ORPHANS.append(self._conn)
            self._conn = None
            return
        with self._lock, contextlib.suppress(Exception):  # (a thread's greenlets share it)
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    _conn: Any = None
    _lock: Any = contextlib.nullcontext()  # one operation at a time (store.get_store's)

    def stored_text(self, text: str) -> str:
        """``text`` as this journal stores it (a look-up's value must compare to it)."""
        return text

    def driver_params(self) -> dict[str, Any]:
        """Connection keyword arguments for the driver, as Django's own backend builds
        them from ``self.settings_dict`` (so OPTIONS such as sslmode are honoured)."""
        from django.db import connections

        wrapper = type(connections[self.alias])(self.settings_dict, self.alias)
        return dict(wrapper.get_connection_params())

    # -- the database clock, on Django's connection -----------------------------------------

    def now(self) -> datetime:
        """The database's clock, never a worker's: in UTC, aware, or naive under
        ``USE_TZ = False`` (as Django's ORM reads the journal's times; E012: in UTC)."""
        from django.conf import settings
        from django.db import connections
        from django.utils import timezone

        if self.clock_sql is None:
            return timezone.now()
        with connections[self.alias].cursor() as cur:
            cur.execute(self.clock_sql)
            value: datetime = cur.fetchone()[0]
        utc = value.astimezone(dt_timezone.utc) if value.tzinfo else value  # naive: UTC
        return utc.replace(tzinfo=dt_timezone.utc if settings.USE_TZ else None)

    def now_expression(self, plus: float = 0.0) -> Any:
        """The database clock (+ ``plus`` seconds) as a value for a query or a write."""
        from django.utils import timezone

        return timezone.now() + timedelta(seconds=plus)

    # -- the caller's transaction ----------------------------------------------------------

    def finish_in_transaction(self, req: ClaimRequest, completion: Completion) -> bool:
        """The fenced completion on Django's connection, inside the caller's open
        transaction (``transactional=True``): it commits or rolls back with the effect."""
        from celery_grousset.models import Outcome

        done = (
            Outcome.objects.using(self.alias)
            .filter(
                finishable(),
                processor_id=req.processor_id,
                fingerprint=req.fingerprint,
                claim_token=req.token,
            )
            .update(
                status=completion.status, result=completion.result,
                result_encoding=completion.result_encoding, error=completion.error,
                completed_at=self.now_expression(),
            )
        )
        return done == 1

    def holder(self, processor_id: str, fingerprint: str) -> tuple[str, int] | None:
        """``(status, fence)`` of a key's row, or None (the wait policy's poll)."""
        from celery_grousset.models import Outcome

        rows = Outcome.objects.db_manager(self.alias).by_key(processor_id, fingerprint)
        row = rows.values_list("status", "fence").first()
        return (str(row[0]), int(row[1])) if row is not None else None

    # -- operators' statements -------------------------------------------------------------

    def purge_expired(
        self,
        *,
        batch_size: int = 10_000,
        before: datetime | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete the rows :func:`purgeable` names in batches, one short transaction per
        batch: ``SELECT … FOR UPDATE SKIP LOCKED`` of a batch's ids, then their ``DELETE``.

        ``before``: delete only rows that expired before this moment, capped at the
        database clock. Unexpired rows and live claims are never touched: the ``DELETE``
        re-checks the whole condition on each row. A row another transaction holds is
        skipped, not waited for (the next run takes it): a batch never holds the rows it
        already deleted while it waits, so no claim of them waits for it, and two purges
        at once take different rows.
        """
        from django.db import connections, transaction

        from celery_grousset.models import Outcome

        if batch_size < 1:
            raise InvalidArgument("batch_size must be at least 1")
        now = self.now()
        cutoff = min(before, now) if before is not None else now
        conn = connections[self.alias]
        rows = Outcome.objects.using(self.alias).filter(purgeable(cutoff)).order_by()
        # The same condition again, on the columns of the row the DELETE locks.
        recheck, recheck_params = purgeable_sql(self.alias, cutoff)
        table = conn.ops.quote_name(Outcome._meta.db_table)
        total = 0
        while True:
            with transaction.atomic(using=self.alias), conn.cursor() as cursor:
                # FOR UPDATE SKIP LOCKED (SQLite: its one write lock first, so the DELETE
                # never has to upgrade a read; MariaDB < 10.6: FOR UPDATE, which waits)
                batch = self.lock_for_batch(rows).values_list("id", flat=True)[:batch_size]
                cursor.execute(*batch.query.get_compiler(using=self.alias).as_sql())
                ids = [row[0] for row in cursor.fetchall()]
                deleted = self.delete_batch(cursor, table, ids, recheck, recheck_params)
            total += deleted
            if progress is not None and deleted:
                progress(total)
            if len(ids) < batch_size:
                break
        return total

    def delete_batch(
        self, cursor: Any, table: str, ids: list[Any], recheck: str, params: Sequence[Any]
    ) -> int:
        """Delete the rows ``ids`` (a purge batch, locked) that still match ``recheck``, by
        primary key; the number deleted. In chunks under the parameters a statement may
        have (SQLite 999)."""
        from django.db import connections

        step = (connections[self.alias].features.max_query_params or 65_535) - len(params)
        deleted = 0
        for at in range(0, len(ids), step):
            chunk = ids[at : at + step]
            marks = ", ".join(["%s"] * len(chunk))
            cursor.execute(f"DELETE FROM {table} WHERE id IN ({marks}) AND ({recheck})",
                           (*chunk, *params))  # fmt: skip
            deleted += max(0, int(cursor.rowcount))
        return deleted

    def lookup(self, processor_id: str, fingerprints: Sequence[str]) -> list[tuple[Any, ...]]:
        """``(fingerprint, status, result_encoding, stale_at, expires_on, takeovers,
        payload_hash, now)``
        of the rows of these keys, in ONE query (``publish_unique``)."""
        from celery_grousset.models import Outcome

        now = self.now_expression()
        qs = Outcome.objects.using(self.alias).filter(
            processor_id=processor_id, fingerprint__in=list(fingerprints)
        )
        if isinstance(now, datetime):  # this host's clock (SQLite)
            return [(*r, now) for r in qs.values_list(*LOOKUP_COLUMNS)]
        return list(qs.annotate(grousset_now=now).values_list(*LOOKUP_COLUMNS, "grousset_now"))

    def estimated_count(self) -> int | None:
        """The planner's estimate of the journal's rows (None: no cheap estimate)."""
        return None

    def distinct_values(self, column: str, limit: int) -> list[str]:
        """Up to ``limit`` distinct values of an indexed journal column, in order."""
        from celery_grousset.models import Outcome

        if column not in ("task_name", "processor_id"):
            raise InvalidArgument(f"not an indexed filter column: {column!r}")
        qs = Outcome.objects.using(self.alias).order_by(column).values_list(column, flat=True)
        return [str(v) for v in qs.distinct()[:limit]]

    @abc.abstractmethod
    def renew(self, req: ClaimRequest) -> bool:
        """Push ``req``'s in-flight claim's ``stale_at`` to now + ``max_processing_time``
        (database clock) if ``req.token`` still holds it (a compare-and-set), on the
        private connection."""

    def begin_transactional(self) -> None:  # noqa: B027 (none here: a hook)
        """The first statement of a transactional body's transaction (on Django's
        connection to the journal): none here; row locks are taken as the body goes."""

    def end_transactional(self) -> None:  # noqa: B027
        """Once that transaction ended (committed or not): nothing to put back here."""

    def lock_for_batch(self, queryset: Any) -> Any:
        """``queryset`` locked for a batch in the current transaction (outbox relay, purge):
        ``FOR UPDATE SKIP LOCKED`` where the database has it."""
        from django.db import connections

        skip = connections[self.alias].features.has_select_for_update_skip_locked
        return queryset.select_for_update(skip_locked=skip)


LOOKUP_COLUMNS = (
    "fingerprint", "status", "result_encoding", "stale_at", "expires_on", "takeovers",
    "payload_hash",
)  # fmt: skip
