"""Shared claim flow of the stores that lock the row first (SQLite, MySQL/MariaDB).

One short transaction: lock (``BEGIN IMMEDIATE`` / ``SELECT … FOR UPDATE``), read
the row and the database clock, :func:`celery_grousset.claim.decide`, apply the
decision's write (:data:`celery_grousset.claim.WRITES`, one method each), commit.
A batch (``claim_all``) is one such transaction for all its keys: the rows locked in
key order (two batches never wait on each other in a cycle), one commit.
Subclasses supply the dialect: placeholders, the lock, the clock, and how a driver
error maps to "retry the transaction" or "store unavailable".
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from celery_grousset.claim import (
    ENC_GAVE_UP,
    WRITES,
    ClaimRequest,
    Kind,
    Prev,
    Status,
    Write,
    clock_fence,
    deadline,
    decide,
    gave_up_message,
    is_duplicate,
    next_fence,
    recorded,
)
from celery_grousset.store.base import ClaimResult, Completion, Store, distinct_keys
from celery_grousset.store.rows import FINISHABLE, RELEASED

TABLE = "celery_grousset_outcome"
DELIVERIES = "celery_grousset_delivery"
#: what a claim that the row answers adds to its assignments: a duplicate, or not
_DUPLICATE = {True: ", duplicates = duplicates + 1", False: ""}
COLS = (
    "status, stale_at, expires_on, result_encoding, takeovers, claim_token, fence, "
    "deliveries, result, error, task_id, started_at, completed_at, payload_hash"
)


class Found:
    """The locked row as read (``COLS``), parsed."""

    def __init__(self, store: LockingStore, row: tuple[Any, ...]) -> None:
        parse = store.parse_ts
        self.started_at = parse(row[11])
        self.prev = Prev(
            status=row[0],
            stale_at=parse(row[1]),
            expires_on=parse(row[2]),
            result_encoding=row[3],
            takeovers=row[4],
            claim_token=row[5],
            payload_hash=row[13],
            task_id=row[10],
            started_at=self.started_at,
            fence=row[6],
        )
        self.fence: int = row[6]
        self.deliveries: int = row[7]
        self.result = bytes(row[8]) if row[8] is not None else None
        self.error: str = row[9]
        self.task_id: str = row[10]
        self.completed_at = parse(row[12]) if row[12] is not None else None
        self.payload_hash: str = row[13]


class LockingStore(Store):
    #: DB-API placeholder
    ph = "%s"
    #: attempts of the whole transaction on a deadlock / lost insert race
    attempts = 5

    @abc.abstractmethod
    def _cursor(self) -> Any:
        """A cursor on the private connection (connecting if needed)."""

    @abc.abstractmethod
    def _lock_row(self, cur: Any, req: ClaimRequest) -> tuple[tuple[Any, ...] | None, datetime]:
        """In the open transaction, lock and read the row (``COLS``) and the database clock."""

    @abc.abstractmethod
    def _commit(self, cur: Any) -> None: ...

    @abc.abstractmethod
    def _rollback(self, cur: Any) -> None: ...

    @abc.abstractmethod
    def _ts(self, value: datetime) -> Any:
        """Adapt a UTC datetime for this driver."""

    @abc.abstractmethod
    def parse_ts(self, value: Any) -> datetime:
        """A datetime column as read by this driver, as an aware UTC datetime."""

    @abc.abstractmethod
    def _guard(self, fn: Any) -> Any:
        """Run ``fn`` mapping driver errors; retry transient ones."""

    @abc.abstractmethod
    def _now(self, cur: Any) -> datetime:
        """The database clock, read on the private connection."""

    # -- claim ---------------------------------------------------------------------------

    def probe(self) -> None:
        def read() -> None:
            cur = self._cursor()
            try:
                cur.execute(f"SELECT 1 FROM {TABLE} WHERE 1 = 0")
                cur.fetchall()
            finally:
                self._rollback(cur)

        self._guard(read)

    def claim(self, req: ClaimRequest) -> ClaimResult:
        return self._guard(lambda: self._claim_together([req])[0])  # type: ignore[no-any-return]

    def claim_all(self, reqs: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Several claims in ONE short transaction, one commit: the rows locked in key
        order (two batches never deadlock), each decided and written as one claim."""
        if len(reqs) < 2:
            return [self.claim(req) for req in reqs]
        return distinct_keys(reqs, lambda batch: self._guard(lambda: self._claim_together(batch)))

    def _claim_together(self, reqs: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """The claims of ``reqs`` (distinct keys) in one transaction."""
        order = sorted(range(len(reqs)), key=lambda i: (reqs[i].processor_id, reqs[i].fingerprint))
        cur = self._cursor()
        try:
            self._begin_write(cur)
            results = {i: self._claim_locked(cur, reqs[i]) for i in order}
            self._commit(cur)
        except BaseException:
            self._rollback(cur)
            raise
        return [results[i] for i in range(len(reqs))]

    def _claim_locked(self, cur: Any, req: ClaimRequest) -> ClaimResult:
        """Lock, read, decide and write one claim in the open transaction."""
        row, now = self._lock_row(cur, req)
        found = Found(self, row) if row is not None else None
        kind = decide(found.prev if found else None, now, req)
        result = self._WRITERS[WRITES[kind]](self, cur, req, kind, found, now)
        task_id = recorded(kind, found.prev, req) if found else None
        if task_id is not None:
            self._record(cur, req, task_id, kind, now)
        return result

    def _record(self, cur: Any, req: ClaimRequest, task_id: str, kind: Kind, now: datetime) -> None:
        """A delivery that is not the row's own (``claim.recorded``), in the claim's
        transaction: ``grousset_inspect <task id>`` finds it."""
        p = self.ph
        cur.execute(
            f"INSERT INTO {DELIVERIES} (processor_id, fingerprint, task_id, decision, at) "
            f"VALUES ({p}, {p}, {p}, {p}, {p})",
            (req.processor_id, req.fingerprint, task_id, kind.code, self._ts(now)),
        )

    def _update(
        self, cur: Any, req: ClaimRequest, assignments: str, params: tuple[Any, ...]
    ) -> None:
        p = self.ph
        cur.execute(
            f"UPDATE {TABLE} SET {assignments} WHERE processor_id = {p} AND fingerprint = {p}",
            (*params, req.processor_id, req.fingerprint),
        )

    def _insert(
        self, cur: Any, req: ClaimRequest, kind: Kind, found: Found | None, now: datetime
    ) -> ClaimResult:
        p, fence = self.ph, clock_fence(now)
        cur.execute(
            f"INSERT INTO {TABLE} (processor_id, fingerprint, task_name, task_id, status, "
            "fence, claim_token, started_at, stale_at, completed_at, expires_on, deliveries, "
            "takeovers, result, result_encoding, error, worker, args_repr, payload_hash, "
            f"first_claimed_at, duplicates) VALUES ({p}, {p}, {p}, {p}, 'in_flight', {p}, {p}, "
            f"{p}, {p}, NULL, {p}, 1, 0, NULL, '', '', {p}, {p}, {p}, {p}, 0)",
            (
                req.processor_id,
                req.fingerprint,
                req.task_name,
                req.task_id,
                fence,
                req.token,
                *self._times(req, now),
                req.worker,
                req.args_repr,
                req.payload_hash,
                self._ts(now),
            ),
        )
        return _owned(req, kind, now, fence=fence, deliveries=1, takeovers=0, error="")

    def _claim(
        self, cur: Any, req: ClaimRequest, kind: Kind, found: Found | None, now: datetime
    ) -> ClaimResult:
        assert found is not None
        fence = next_fence(found.fence, now)
        p = self.ph
        reset = ""
        if WRITES[kind] is Write.CLAIM_RESET:  # expired: a new life for the key
            deliveries, takeovers, error = 1, 0, ""
            reset = f", first_claimed_at = {p}, duplicates = 0"
        else:
            deliveries, error = found.deliveries + 1, found.error
            takeovers = found.prev.takeovers + (kind is Kind.TAKEOVER)
        self._update(
            cur,
            req,
            f"claim_token = {p}, fence = {p}, status = 'in_flight', task_name = {p}, "
            f"task_id = {p}, worker = {p}, args_repr = {p}, started_at = {p}, stale_at = {p}, "
            f"completed_at = NULL, expires_on = {p}, deliveries = {p}, takeovers = {p}, "
            f"result = NULL, result_encoding = '', error = {p}, payload_hash = {p}{reset}",
            (
                req.token,
                fence,
                req.task_name,
                req.task_id,
                req.worker,
                req.args_repr,
                *self._times(req, now),
                deliveries,
                takeovers,
                error,
                req.payload_hash,
                *((self._ts(now),) if reset else ()),
            ),
        )
        return _owned(
            req, kind, now, fence=fence, deliveries=deliveries, takeovers=takeovers, error=error
        )

    def _give_up(
        self, cur: Any, req: ClaimRequest, kind: Kind, found: Found | None, now: datetime
    ) -> ClaimResult:
        assert found is not None
        error = gave_up_message(found.prev.takeovers)
        p = self.ph
        expires = now + timedelta(seconds=req.expires_after)
        self._update(
            cur,
            req,
            f"status = 'failed', completed_at = {p}, expires_on = {p}, deliveries = "
            f"deliveries + 1, result = NULL, result_encoding = '{ENC_GAVE_UP}', error = {p}"
            + _DUPLICATE[is_duplicate(kind, found.prev, req)],
            (self._ts(now), self._ts(expires), error),
        )
        return _found(req, kind, found, now, status=Status.FAILED.value,
                      result_encoding=ENC_GAVE_UP, error=error, result=None, completed_at=now,
                      deliveries=found.deliveries + 1)

    def _count(
        self, cur: Any, req: ClaimRequest, kind: Kind, found: Found | None, now: datetime
    ) -> ClaimResult:
        assert found is not None
        dup = _DUPLICATE[is_duplicate(kind, found.prev, req)]
        self._update(cur, req, "deliveries = deliveries + 1" + dup, ())
        return _found(req, kind, found, now, deliveries=found.deliveries + 1)

    def _nothing(
        self, cur: Any, req: ClaimRequest, kind: Kind, found: Found | None, now: datetime
    ) -> ClaimResult:
        assert found is not None
        return _found(req, kind, found, now)

    _WRITERS: dict[Write, Callable[..., ClaimResult]] = {
        Write.INSERT: _insert,
        Write.CLAIM: _claim,
        Write.CLAIM_RESET: _claim,
        Write.GIVE_UP: _give_up,
        Write.COUNT: _count,
        Write.NOTHING: _nothing,
    }

    def _times(self, req: ClaimRequest, now: datetime) -> tuple[Any, Any, Any]:
        """``started_at, stale_at, expires_on`` of a claim made at ``now``."""
        return (
            self._ts(now),
            self._ts(now + timedelta(seconds=req.max_processing_time)),
            self._ts(now + timedelta(seconds=req.expires_after)),
        )

    # -- finish / release ------------------------------------------------------------------

    def finish(
        self, processor_id: str, fingerprint: str, token: str, completion: Completion
    ) -> bool:
        p = self.ph
        return self._update_one(
            f"UPDATE {TABLE} SET status = {p}, result = {p}, result_encoding = {p}, "
            f"error = {p}, completed_at = {p} WHERE processor_id = {p} AND "
            f"fingerprint = {p} AND claim_token = {p} AND {FINISHABLE.format(st=p, enc=p)}",
            lambda now: (
                completion.status,
                completion.result,
                completion.result_encoding,
                completion.error,
                self._ts(now),
                processor_id,
                fingerprint,
                token,
                completion.status,
                completion.result_encoding,
            ),
        )

    def release(self, processor_id: str, fingerprint: str, token: str | None = None,
                stale: bool = False) -> bool:  # fmt: skip
        p = self.ph
        token_sql = f" AND claim_token = {p}" if token is not None else ""
        stale_sql = f" AND stale_at <= {p}" if stale else ""
        return self._update_one(
            f"UPDATE {TABLE} SET status = 'failed', result = NULL, result_encoding = '', "
            f"error = {p}, completed_at = {p} WHERE processor_id = {p} AND "
            f"fingerprint = {p} AND status = 'in_flight'{token_sql}{stale_sql}",
            lambda now: (
                RELEASED,
                self._ts(now),
                processor_id,
                fingerprint,
                *((token,) if token is not None else ()),
                *((self._ts(now),) if stale else ()),
            ),
        )

    def renew(self, req: ClaimRequest) -> bool:
        """As the base's, on the private connection: bounded by ``STORE_TIMEOUT``."""
        p, ahead = self.ph, timedelta(seconds=req.max_processing_time)
        return self._update_one(
            f"UPDATE {TABLE} SET stale_at = {p} WHERE processor_id = {p} AND fingerprint = "
            f"{p} AND claim_token = {p} AND status = 'in_flight'",
            lambda now: (self._ts(now + ahead), req.processor_id, req.fingerprint, req.token),
        )

    def _update_one(self, sql: str, params: Callable[[datetime], tuple[Any, ...]]) -> bool:
        """One guarded write transaction; ``params`` gets the database clock. True: one row."""

        def op() -> int:
            cur = self._cursor()
            try:
                self._begin_write(cur)
                cur.execute(sql, params(self._now(cur)))
                count = int(cur.rowcount)
                self._commit(cur)
                return count
            except BaseException:
                self._rollback(cur)
                raise

        return self._guard(op) == 1  # type: ignore[no-any-return]

    def _begin_write(self, cur: Any) -> None:
        """Start a write transaction: a claim's, a batch's, finish / release (default:
        implicit)."""


def _retry_in(prev: Prev, req: ClaimRequest, now: datetime) -> float:
    """Seconds until the held claim ``prev`` turns stale for ``req`` (0: not held)."""
    if prev.status != Status.IN_FLIGHT:
        return 0.0
    return max(0.0, (deadline(prev, req) - now).total_seconds())


def _owned(
    req: ClaimRequest, kind: Kind, now: datetime, *, fence: int, deliveries: int,
    takeovers: int, error: str,
) -> ClaimResult:
    """The result of a claim that took the row at ``now``."""
    return ClaimResult(
        kind=kind, fence=fence, status=Status.IN_FLIGHT.value, deliveries=deliveries,
        takeovers=takeovers, result=None, result_encoding="", error=error,
        task_id=req.task_id, started_at=now, completed_at=None,
        retry_in=req.max_processing_time, payload_hash=req.payload_hash,
    )


def _found(
    req: ClaimRequest, kind: Kind, found: Found, now: datetime, **changed: Any
) -> ClaimResult:
    """The result of a claim that left the row to its holder (``changed``: what it wrote)."""
    values: dict[str, Any] = dict(
        kind=kind, fence=found.fence, status=found.prev.status, deliveries=found.deliveries,
        takeovers=found.prev.takeovers, result=found.result,
        result_encoding=found.prev.result_encoding, error=found.error, task_id=found.task_id,
        started_at=found.started_at, completed_at=found.completed_at,
        retry_in=_retry_in(found.prev, req, now),
        payload_hash=found.payload_hash,
    )
    values.update(changed)
    return ClaimResult(**values)
