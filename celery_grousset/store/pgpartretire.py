"""Retention on the partitioned journal: dropping whole generations (docs/scale.md,
"Retention: drop a generation").

Why retention is safe with claims running: :func:`retire` first passes a barrier on a
generation's partition: a ``SHARE`` lock, taken and released in one short transaction,
waits for every claim that may write there (the claim's ``UPDATE`` locks every
partition); a claim that waited reads the generation again after its ``UPDATE``
(:mod:`celery_grousset.store.pgpartition`), so it writes to a newer one. Past the
barrier rows only leave a past generation (a renewal moves its row too), so the check
that every row of it is :func:`~celery_grousset.store.rows.purgeable` runs without a
lock that claims wait for: one probe of the index on each row's "abandoned after"
instant (:data:`~celery_grousset.store.pgpartops.ABANDON`), or one scan when a journal
lacks that index. A generation holding a live in-flight row (or an unexpired one)
stays. Only generations older than the current one are considered. After ``DETACH …
CONCURRENTLY`` (bounded: :data:`DETACH_MS`) no statement reaches the partition; it is
checked once more, and a row made live meanwhile (a renewal in place by an earlier
version) puts the partition back (``ATTACH``) instead of dropping it.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from django.db import DatabaseError

from celery_grousset.claim import Status
from celery_grousset.store.pgdriver import sqlstate
from celery_grousset.store.pgpartops import (
    _LOCK_NOT_AVAILABLE,
    ABANDON,
    ABANDON_INDEX,
    BARRIER_MS,
    EXACT_COUNT_UP_TO,
    _cursor,
    _generation,
    ddl_lock,
    lock_timeout_ms,
    partitions,
)
from celery_grousset.store.pgpartsql import TABLE
from celery_grousset.store.rows import purgeable_sql


def retire(alias: str, cutoff: datetime) -> int:
    """Detach and drop every generation older than the current one whose rows are all
    purgeable at ``cutoff``; the number of rows dropped with them. No claim waits for
    the checks: see the module doc. One run at a time: while another (a purge, a
    conversion) holds the DDL lock, this one drops nothing and returns 0. The lock is
    held by a transaction on a connection of its own (``DETACH … CONCURRENTLY`` runs
    outside any): a pooler in transaction mode keeps one server session for it, and it
    ends with the run, or with its connection."""
    from celery_grousset import events

    with ddl_lock(alias) as held:
        if held:
            return _retire(alias, cutoff)
    events.emit(logging.WARNING, "grousset.retention_skipped", {"database": alias},
                note="another purge or conversion holds the journal's DDL lock: this run "
                "dropped nothing")  # fmt: skip
    return 0


def _retire(alias: str, cutoff: datetime) -> int:
    timeout = min(lock_timeout_ms(), BARRIER_MS)
    dropped = 0
    with _cursor(alias) as cur:  # one look for the index, not one per partition
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [ABANDON_INDEX])
        indexed = bool(cur.fetchone()[0])
    for gen, name in _left_detached(alias):  # a run killed after its detach, or its drop
        with _cursor(alias) as cur:
            dropped += _drop_detached(alias, cur, gen, name, cutoff, indexed, time.perf_counter())
    for gen, name, pending, _ in partitions(alias):
        with _cursor(alias) as cur:
            start = time.perf_counter()
            if pending:  # a detach interrupted earlier (its wait cut short, a kill)
                if not _detached(alias, cur, gen, name, "FINALIZE"):
                    break  # (one partition may be pending at a time: the next run)
                dropped += _drop_detached(alias, cur, gen, name, cutoff, indexed, start)
                continue
            if gen >= _generation(cur):
                break
            if not _past_barrier(alias, cur, gen, name, cutoff, timeout):
                continue
            clear, may_change, rows = _clear(alias, cur, name, cutoff, indexed)
            if not clear:
                continue
            if not _detached(alias, cur, gen, name, "CONCURRENTLY"):
                break  # left pending: no other may be detached before it is finished
            # An abandoned claim in it may have been renewed since the check; detached, no
            # statement on the journal reaches it now: check its final rows once more.
            recheck = may_change or rows is None
            dropped += _drop_detached(alias, cur, gen, name, cutoff, indexed, start,
                                      rows=None if recheck else rows)  # fmt: skip
    return dropped


#: the longest ``DETACH … CONCURRENTLY`` waits for the transactions that may still read
#: the partition (a report left open on the journal); then it is left pending, and the
#: next run finishes it (``FINALIZE``) and checks it again
DETACH_MS = 30_000
_QUERY_CANCELED = "57014"
LEFT_DETACHED_SQL = (
    "SELECT c.relname FROM pg_class AS c WHERE c.relname ~ '^celery_grousset_outcome_g-?[0-9]+$' "
    "AND c.relkind = 'r' AND NOT c.relispartition "
    "AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
)


def _detached(alias: str, cur: Any, gen: int, name: str, how: str) -> bool:
    """``DETACH … CONCURRENTLY`` (or ``FINALIZE``, of one left pending) within
    :data:`DETACH_MS`; False (said, left pending for the next run) when old transactions
    held it longer."""
    started = time.perf_counter()
    try:
        cur.execute(f"SET statement_timeout = {DETACH_MS}")
        cur.execute(f"ALTER TABLE {TABLE} DETACH PARTITION {name} {how}")
        return True
    except DatabaseError as exc:
        if sqlstate(exc.__cause__ or exc) not in (_QUERY_CANCELED, _LOCK_NOT_AVAILABLE):
            raise
    finally:
        cur.execute("RESET statement_timeout")
    from celery_grousset import events

    events.emit(logging.WARNING, "grousset.generation_busy", {
        "generation": gen, "waited_ms": round((time.perf_counter() - started) * 1000),
        "database": alias,
    })  # fmt: skip
    return False


def _left_detached(alias: str) -> list[tuple[int, str]]:
    """Generations detached by a run that did not drop them (killed after its detach or
    during its drop): ``(gen, table)``."""
    with _cursor(alias) as cur:
        cur.execute(LEFT_DETACHED_SQL)
        return sorted((int(name.rsplit("_g", 1)[1]), name) for (name,) in cur.fetchall())


def _drop_detached(
    alias: str, cur: Any, gen: int, name: str, cutoff: datetime, indexed: bool, start: float,
    rows: int | None = None,
) -> int:
    """Drop a detached generation whose rows are all purgeable (checked again unless
    ``rows`` is given: counted when the first check was final), and say it; one with a
    row made live meanwhile goes back (``ATTACH``: its bound was checked by the detach's
    constraint). The rows dropped."""
    if rows is None:
        clear, _, rows = _clear(alias, cur, name, cutoff, indexed)
        if not clear:
            cur.execute(f"ALTER TABLE {TABLE} ATTACH PARTITION {name} "
                        f"FOR VALUES FROM ({gen}) TO ({gen + 1})")  # fmt: skip
            return 0
    if rows is None:  # counted when small; beyond, the planner's estimate (a count of
        # millions of rows would compete with the claims for the disk)
        cur.execute("SELECT greatest(reltuples, 0)::int8 FROM pg_class WHERE oid = to_regclass(%s)",
                    [name])  # fmt: skip
        rows = int(cur.fetchone()[0])
        if rows < EXACT_COUNT_UP_TO:
            cur.execute(f"SELECT count(*) FROM {name}")
            rows = int(cur.fetchone()[0])
    detached = time.perf_counter()
    cur.execute(f"DROP TABLE {name}")  # the file system frees its files meanwhile
    _retired(alias, gen, rows, detached - start, time.perf_counter() - detached)
    return rows


def _retired(alias: str, gen: int, rows: int, detach_s: float, drop_s: float) -> None:
    """The log line of a dropped generation: how long its checks and detach took (the
    journal's work) and its ``DROP TABLE`` (mostly the file system freeing its files)."""
    from celery_grousset import events

    events.emit(logging.INFO, "grousset.generation_retired", {
        "generation": gen, "rows": rows, "detach_seconds": round(detach_s, 3),
        "drop_seconds": round(drop_s, 3), "database": alias,
    })  # fmt: skip


def _past_barrier(
    alias: str, cur: Any, gen: int, name: str, cutoff: datetime, timeout: int
) -> bool:
    """The (past) generation ``gen`` has no unexpired row, and no claim writes to it
    any more."""
    from django.db import transaction

    # Unexpired rows keep it (one probe of its expires_on index, no lock taken)
    cur.execute(f"SELECT max(expires_on) > %s FROM {name}", [cutoff])
    if cur.fetchone()[0]:
        return False
    # A barrier, held for milliseconds: SHARE waits for the claims that may be writing
    # into this partition (a claim's UPDATE locks every partition) and they read the
    # generation again after it. Past it, rows only leave a past generation. A writer
    # that holds on (a transaction left open on the journal) keeps it for the next run.
    try:
        with transaction.atomic(using=alias):
            cur.execute(f"SET LOCAL lock_timeout = {timeout}")
            cur.execute(f"LOCK TABLE {name} IN SHARE MODE")
            return gen < _generation(cur)
    except DatabaseError as exc:
        if sqlstate(exc.__cause__ or exc) != _LOCK_NOT_AVAILABLE:
            raise
    from celery_grousset import events

    events.emit(logging.WARNING, "grousset.generation_busy", {
        "generation": gen, "waited_ms": timeout, "database": alias,
    })  # fmt: skip
    return False


def _clear(
    alias: str, cur: Any, name: str, cutoff: datetime, indexed: bool
) -> tuple[bool, bool, int | None]:
    """``(every row of the partition is purgeable at cutoff, a row of it could still
    become live (an in-flight row, whose claim may be renewed), its rows if counted)``.

    With the "abandoned after" index (:data:`ABANDON`): one probe of it, no scan — a
    row is purgeable once its instant has passed, so a generation goes when its newest
    instant has (up to a ``max_processing_time`` after the exact rule would let it).
    Without it: one scan with the exact rule (:func:`_census`)."""
    if indexed:
        cur.execute(
            f"SELECT coalesce(max({ABANDON}) <= extract(epoch FROM %s::timestamptz), true) "
            f"FROM {name}",
            [cutoff],
        )
        return bool(cur.fetchone()[0]), True, None
    rows, kept, in_flight = _census(alias, cur, name, cutoff)
    return kept == 0, in_flight > 0, rows


def _census(alias: str, cur: Any, name: str, cutoff: datetime) -> tuple[int, int, int]:
    """``(rows, rows not purgeable at cutoff, in-flight rows)`` of one partition (one
    scan: ``status`` has no index, on purpose)."""
    recheck, params = purgeable_sql(alias, cutoff)
    cur.execute(
        f"SELECT count(*), count(*) FILTER (WHERE ({recheck}) IS NOT TRUE), "
        f"count(*) FILTER (WHERE status = %s) FROM {name} AS {TABLE}",
        [*params, Status.IN_FLIGHT.value],
    )
    rows, kept, in_flight = cur.fetchone()
    return int(rows), int(kept), int(in_flight)
