"""Shared claim flow of the stores that lock the row first (SQLite, MySQL/MariaDB).

One short transaction: lock (``BEGIN IMMEDIATE`` / ``SELECT … FOR UPDATE``), read
the row and the database clock, :func:`celery_grousset.claim.decide`, write,
commit. Subclasses supply the dialect: placeholders, the lock, the clock, and
how a driver error maps to "retry the transaction" or "store unavailable".
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from celery_grousset.claim import (
    ENC_GAVE_UP,
    Action,
    ClaimRequest,
    Prev,
    Status,
    gave_up_message,
    kind_of,
)
from celery_grousset.store.base import ClaimResult, Completion, Store

TABLE = "celery_grousset_outcome"
_COLS = (
    "status, started_at, expires_on, result_encoding, takeovers, claim_token, fence, "
    "deliveries, result, error, task_id, completed_at"
)


class LockingStore(Store):
    #: DB-API placeholder
    ph = "%s"
    #: attempts of the whole transaction on a deadlock / lost insert race
    attempts = 5

    @abc.abstractmethod
    def _cursor(self) -> Any:
        """A cursor on the private connection (connecting if needed)."""

    @abc.abstractmethod
    def _begin_locked(self, cur: Any, req: ClaimRequest) -> tuple[tuple[Any, ...] | None, datetime]:
        """Open the transaction, lock and read the row (``_COLS``) and the database clock."""

    @abc.abstractmethod
    def _commit(self, cur: Any) -> None: ...

    @abc.abstractmethod
    def _rollback(self, cur: Any) -> None: ...

    @abc.abstractmethod
    def _ts(self, value: datetime) -> Any:
        """Adapt a UTC datetime for this driver."""

    @abc.abstractmethod
    def _parse_ts(self, value: Any) -> datetime | None: ...

    @abc.abstractmethod
    def _guard(self, fn: Any) -> Any:
        """Run ``fn`` mapping driver errors; retry transient ones."""

    # -- claim ---------------------------------------------------------------------------

    def claim(self, req: ClaimRequest) -> ClaimResult:
        return self._guard(lambda: self._claim_once(req))  # type: ignore[no-any-return]

    def _claim_once(self, req: ClaimRequest) -> ClaimResult:
        cur = self._cursor()
        try:
            row, now = self._begin_locked(cur, req)
            result = self._write(cur, req, row, now)
            self._commit(cur)
            return result
        except BaseException:
            self._rollback(cur)
            raise

    def _write(
        self, cur: Any, req: ClaimRequest, row: tuple[Any, ...] | None, now: datetime
    ) -> ClaimResult:
        p = self.ph
        expires = now + timedelta(seconds=req.expires_after)
        prev = None
        if row is not None:
            prev = Prev(
                status=row[0],
                started_at=self._parse_ts(row[1]) or now,
                expires_on=self._parse_ts(row[2]) or now,
                result_encoding=row[3],
                takeovers=row[4],
                claim_token=row[5],
            )
        from celery_grousset.claim import decide

        action = decide(prev, now, req)
        key = (req.processor_id, req.fingerprint)
        if action is Action.INSERT:
            cur.execute(
                f"INSERT INTO {TABLE} (processor_id, fingerprint, task_name, task_id, status, "
                "fence, claim_token, started_at, completed_at, expires_on, deliveries, "
                "takeovers, result, result_encoding, error, worker, args_repr) VALUES "
                f"({p}, {p}, {p}, {p}, 'in_flight', 1, {p}, {p}, NULL, {p}, 1, 0, NULL, '', '', "
                f"{p}, {p})",
                (
                    *key,
                    req.task_name,
                    req.task_id,
                    req.token,
                    self._ts(now),
                    self._ts(expires),
                    req.worker,
                    req.args_repr,
                ),
            )
            return self._result(
                req, None, Status.IN_FLIGHT, 1, 1, 0, None, "", "", now, None, now, owned=True
            )
        assert prev is not None and row is not None
        fence, deliveries, result, error = row[6], row[7], row[8], row[9]
        task_id, completed_at = row[10], self._parse_ts(row[11])
        takeovers, status, enc, started = (
            prev.takeovers,
            prev.status,
            prev.result_encoding,
            prev.started_at,
        )
        if action in (Action.RECLAIM, Action.TAKEOVER):
            expired = action is Action.RECLAIM and prev.expires_on <= now
            fence += 1
            deliveries = 1 if expired else deliveries + 1
            takeovers = 0 if expired else takeovers + (action is Action.TAKEOVER)
            error = "" if expired else error
            cur.execute(
                f"UPDATE {TABLE} SET claim_token = {p}, fence = {p}, status = 'in_flight', "
                f"task_name = {p}, task_id = {p}, worker = {p}, args_repr = {p}, "
                f"started_at = {p}, completed_at = NULL, expires_on = {p}, deliveries = {p}, "
                f"takeovers = {p}, result = NULL, result_encoding = '', error = {p} "
                f"WHERE processor_id = {p} AND fingerprint = {p}",
                (
                    req.token,
                    fence,
                    req.task_name,
                    req.task_id,
                    req.worker,
                    req.args_repr,
                    self._ts(now),
                    self._ts(expires),
                    deliveries,
                    takeovers,
                    error,
                    *key,
                ),
            )
            return self._result(
                req,
                prev,
                Status.IN_FLIGHT,
                fence,
                deliveries,
                takeovers,
                None,
                "",
                error,
                now,
                None,
                now,
                owned=True,
                task_id=req.task_id,
            )
        if action is Action.GIVE_UP:
            error = gave_up_message(prev.takeovers)
            deliveries += 1
            cur.execute(
                f"UPDATE {TABLE} SET status = 'failed', completed_at = {p}, expires_on = {p}, "
                f"deliveries = {p}, result = NULL, result_encoding = '{ENC_GAVE_UP}', error = {p} "
                f"WHERE processor_id = {p} AND fingerprint = {p}",
                (self._ts(now), self._ts(expires), deliveries, error, *key),
            )
            return self._result(
                req,
                prev,
                Status.FAILED,
                fence,
                deliveries,
                takeovers,
                None,
                ENC_GAVE_UP,
                error,
                started,
                now,
                now,
                owned=False,
                task_id=task_id,
            )
        own = prev.claim_token == req.token and status == Status.IN_FLIGHT
        if prev.claim_token != req.token:
            deliveries += 1
            cur.execute(
                f"UPDATE {TABLE} SET deliveries = deliveries + 1 "
                f"WHERE processor_id = {p} AND fingerprint = {p}",
                key,
            )
        return self._result(
            req,
            prev,
            status,
            fence,
            deliveries,
            takeovers,
            result,
            enc,
            error,
            started,
            completed_at,
            now,
            owned=own,
            task_id=task_id,
        )

    def _result(
        self,
        req: ClaimRequest,
        prev: Prev | None,
        status: str,
        fence: int,
        deliveries: int,
        takeovers: int,
        result: Any,
        enc: str,
        error: str,
        started_at: datetime,
        completed_at: datetime | None,
        now: datetime,
        *,
        owned: bool,
        task_id: str | None = None,
    ) -> ClaimResult:
        kind = kind_of(
            prev.status if prev is not None else None,
            owned,
            prev is not None and prev.claim_token == req.token,
            str(status),
            enc,
        )
        stale_at = started_at + timedelta(seconds=req.max_processing_time)
        return ClaimResult(
            kind=kind,
            fence=fence,
            status=str(status),
            deliveries=deliveries,
            takeovers=takeovers,
            result=bytes(result) if result is not None else None,
            result_encoding=enc,
            error=error,
            task_id=task_id if task_id is not None else req.task_id,
            started_at=started_at,
            completed_at=completed_at,
            retry_in=max(0.0, (stale_at - now).total_seconds()),
        )

    # -- finish / release ------------------------------------------------------------------

    def _now(self, cur: Any) -> datetime:
        raise NotImplementedError

    def finish(
        self, processor_id: str, fingerprint: str, token: str, completion: Completion
    ) -> bool:
        p = self.ph
        return self._update_one(
            f"UPDATE {TABLE} SET status = {p}, result = {p}, result_encoding = {p}, "
            f"error = {p}, completed_at = {p} WHERE processor_id = {p} AND "
            f"fingerprint = {p} AND claim_token = {p} AND (status = 'in_flight' OR "
            f"(status = {p} AND result_encoding = {p}))",
            lambda now: (
                completion.status,
                completion.result,
                completion.result_encoding,
                completion.error,
                now,
                processor_id,
                fingerprint,
                token,
                completion.status,
                completion.result_encoding,
            ),
        )

    def release(self, processor_id: str, fingerprint: str, token: str | None = None) -> bool:
        p = self.ph
        token_sql = f" AND claim_token = {p}" if token is not None else ""
        return self._update_one(
            f"UPDATE {TABLE} SET status = 'failed', result = NULL, result_encoding = '', "
            f"error = {p}, completed_at = {p} WHERE processor_id = {p} AND "
            f"fingerprint = {p} AND status = 'in_flight'{token_sql}",
            lambda now: (
                "released: the claim was given up (revoked, retried or by an operator)",
                now,
                processor_id,
                fingerprint,
                *((token,) if token is not None else ()),
            ),
        )

    def _update_one(self, sql: str, params: Callable[[Any], tuple[Any, ...]]) -> bool:
        """One guarded write transaction; ``params`` gets the database clock. True: one row."""

        def op() -> int:
            cur = self._cursor()
            try:
                self._begin_write(cur)
                cur.execute(sql, params(self._ts(self._now(cur))))
                count = int(cur.rowcount)
                self._commit(cur)
                return count
            except BaseException:
                self._rollback(cur)
                raise

        return self._guard(op) == 1  # type: ignore[no-any-return]

    def _begin_write(self, cur: Any) -> None:
        """Start the write transaction of finish / release (default: implicit)."""
