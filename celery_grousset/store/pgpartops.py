"""The partitioned journal's DDL (PostgreSQL): the generations created ahead, and
retention by dropping whole generations (the conversion from the single table is
:mod:`celery_grousset.store.pgpartconvert`).

Everything runs on the Django connection of the journal's database alias. Partitions
are named ``celery_grousset_outcome_g<gen>`` and cover ``[gen, gen + 1)``; the width of
a generation in seconds lives in one place, the SQL function ``grousset_generation()``
written by the conversion (``grousset_generation_seconds()`` reads it back).

Why retention is safe with claims running: :func:`retire` first passes a barrier on a
generation's partition: a ``SHARE`` lock, taken and released in one short transaction,
waits for every claim that may write there (the claim's ``UPDATE`` locks every
partition); a claim that waited reads the generation again after its ``UPDATE``
(:mod:`celery_grousset.store.pgpartition`), so it writes to a newer one. Past the
barrier rows only leave a past generation, so the check that every row of it is
:func:`~celery_grousset.store.rows.purgeable` runs without a lock that claims wait for:
one probe of the index on each row's "abandoned after" instant (:data:`ABANDON`), or one
scan when a journal lacks that index. A generation holding a live in-flight row (or an
unexpired one) stays. Only generations older than the current one are considered.
After ``DETACH … CONCURRENTLY`` no statement reaches the partition; it is checked once
more, and a row made live meanwhile (the renewal of a claim that had been abandoned)
puts the partition back (``ATTACH``) instead of dropping it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import DatabaseError

from celery_grousset.claim import Status
from celery_grousset.store.pgdriver import sqlstate
from celery_grousset.store.pgpartsql import TABLE
from celery_grousset.store.rows import purgeable_sql

#: generations created ahead of the current one (convert, create-ahead, every purge)
AHEAD = 3
#: a retired generation's rows are counted up to here; beyond, its planner estimate
EXACT_COUNT_UP_TO = 100_000

#: a generation's storage parameter, as the single table's (its migration): room on
#: each page for a row's next version, so completions and duplicates stay HOT updates
FILLFACTOR = "fillfactor = 80"
DDL_LOCK = "hashtext('celery_grousset.partitions')"  # one DDL run at a time
#: the longest retention's barrier waits (ms): claims queue behind its lock request, so
#: a transaction left open on the journal costs them this much, and the generation waits
#: for the next run
BARRIER_MS = 500
_LOCK_NOT_AVAILABLE = "55P03"
_BOUND = re.compile(r"FROM \((-?\d+)\) TO")

PARTITIONED_SQL = "SELECT count(*) FROM pg_partitioned_table WHERE partrelid = to_regclass(%s)"
PARTITIONS_SQL = (
    "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending, "
    "greatest(c.reltuples, 0)::int8 FROM pg_inherits AS i JOIN pg_class AS c "
    "ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)"
)


def _cursor(alias: str) -> Any:
    from django.db import connections

    return connections[alias].cursor()


def refresh_claim_function(alias: str) -> bool:
    """The partitioned journal's claim function as this version writes it (``convert``
    created it; ``migrate`` after an upgrade refreshes it: apps.py). False: not partitioned."""
    from celery_grousset.store.pgpartsql import FUNCTION_SQL

    if not is_partitioned(alias):
        return False
    with _cursor(alias) as cur:
        cur.execute(FUNCTION_SQL)
    return True


def is_partitioned(alias: str) -> bool:
    """The journal table of ``alias`` is the partitioned layout."""
    with _cursor(alias) as cur:
        cur.execute(PARTITIONED_SQL, [TABLE])
        return bool(cur.fetchone()[0])


def partitions(alias: str) -> list[tuple[int, str, bool, int]]:
    """``(gen, partition, detach_pending, estimated_rows)`` of every partition, oldest first."""
    with _cursor(alias) as cur:
        cur.execute(PARTITIONS_SQL, [TABLE])
        found = [
            (int(m.group(1)), name, bool(pending), int(rows))
            for name, bound, pending, rows in cur.fetchall()
            if (m := _BOUND.search(bound or ""))
        ]
    return sorted(found)


def generation_seconds(alias: str) -> int:
    with _cursor(alias) as cur:
        cur.execute("SELECT grousset_generation_seconds()")
        return int(cur.fetchone()[0])


def current_generation(alias: str) -> int:
    with _cursor(alias) as cur:
        cur.execute("SELECT grousset_generation()")
        return int(cur.fetchone()[0])


#: Each row's "abandoned after" instant (epoch seconds): from then on the row is
#: purgeable whatever its status — settled rows once past ``expires_on``; in-flight rows
#: once stale, past ``expires_on`` and past ``expires_on`` + their own
#: ``max_processing_time`` (``stale_at - started_at``): the rule of
#: :func:`~celery_grousset.store.rows.purgeable`, as one number. Completions, releases and
#: duplicates never change these three columns, so completions stay HOT updates; the
#: partitioned layout indexes it (``convert``) so retention proves a generation clear
#: with one index probe instead of a scan.
ABANDON = "grousset_abandoned_after(stale_at, expires_on, started_at)"
ABANDON_INDEX = "grousset_outcome_abandoned"
ABANDON_FUNCTION_SQL = (
    "CREATE OR REPLACE FUNCTION grousset_abandoned_after(stale timestamptz, expires "
    "timestamptz, started timestamptz) RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE "
    "AS $$ SELECT greatest(extract(epoch FROM stale), extract(epoch FROM expires), "
    "extract(epoch FROM expires) + extract(epoch FROM stale) - extract(epoch FROM started)"
    ")::float8 $$"  # epoch arithmetic: no time zone involved, so immutable in truth
)


#: A hash index on ``fingerprint`` in every generation: the claim's probe of the past
#: generations (``pgpartsql.MOVE_SQL``, one probe per non-empty generation) reads this
#: index instead of the unique key's B-tree, a quarter of its size (about 29 B a row
#: against 110), so the probes of a large journal stay in memory: at 50M rows, claim p50
#: 3.4-3.8 ms without it, 1.3-1.5 ms with it (docs/scale.md).
PROBE_INDEX = "grousset_outcome_probe"
PROBE_SHAPE = "USING hash (fingerprint)"
PROBE_INDEX_SQL = f"CREATE INDEX IF NOT EXISTS {PROBE_INDEX} ON {TABLE} {PROBE_SHAPE}"


def add_generation(cur: Any, gen: int) -> bool:
    """Create and attach the partition of ``gen`` (False: it exists already)."""
    name = f"{TABLE}_g{gen}"
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
    if cur.fetchone()[0]:
        return False
    cur.execute(
        f"CREATE TABLE {name} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
        f"WITH ({FILLFACTOR})"
    )
    # ATTACH takes SHARE UPDATE EXCLUSIVE on the journal: claims go on meanwhile.
    cur.execute(
        f"ALTER TABLE {TABLE} ATTACH PARTITION {name} FOR VALUES FROM ({gen}) TO ({gen + 1})"
    )
    return True


def create_ahead(alias: str, ahead: int = AHEAD) -> list[int]:
    """Partitions for the current generation and the next ``ahead``; the created ones."""
    from django.db import transaction

    with transaction.atomic(using=alias), _cursor(alias) as cur:
        cur.execute(f"SELECT pg_advisory_xact_lock({DDL_LOCK}), grousset_generation()")
        now = int(cur.fetchone()[1])
        return [g for g in range(now, now + ahead + 1) if add_generation(cur, g)]


#: the largest journal ``convert`` or ``revert`` copies in its one transaction
MAX_COPY_ROWS = 100_000


def rows_within(cur: Any, alias: str, table: str, max_rows: int, fix: str) -> int:
    """The rows of ``table``, refused (naming ``fix``) above ``max_rows``: a copy in the
    one transaction of ``convert`` or ``revert`` holds the lock claims wait for. Counted
    up to one past the limit: a full count of a large table would hold it as long."""
    from celery_grousset.exceptions import InvalidArgument

    cur.execute(f"SELECT count(*) FROM (SELECT 1 FROM {table} LIMIT %s) AS r", [max_rows + 1])
    rows = int(cur.fetchone()[0])
    if rows > max_rows:
        raise InvalidArgument(
            f"the journal of {alias!r} has more than {max_rows} rows to copy in one "
            f"transaction (claims wait for it): {fix}"
        )
    return rows


def lock_timeout_ms() -> int:
    """How long the DDL here waits for a lock on the journal (``STORE_TIMEOUT``): claims
    queue behind a lock request, so none is left waiting longer than a claim may."""
    from celery_grousset.conf import grousset_settings

    return max(1, int(float(grousset_settings.STORE_TIMEOUT) * 1000))


def retire(alias: str, cutoff: datetime) -> int:
    """Detach and drop every generation older than the current one whose rows are all
    purgeable at ``cutoff``; the number of rows dropped with them. No claim waits for
    the checks: see the module doc. One run at a time: while another (a purge, a
    conversion) holds the DDL lock, this one drops nothing and returns 0. The lock is
    held by a transaction on a connection of its own (``DETACH … CONCURRENTLY`` runs
    outside any): a pooler in transaction mode keeps one server session for it, and it
    ends with the run, or with its connection."""
    with ddl_lock(alias) as held:
        return _retire(alias, cutoff) if held else 0


@contextlib.contextmanager
def ddl_lock(alias: str) -> Iterator[bool]:
    """The DDL lock (one run at a time), tried once: held by a transaction on a connection
    of its own until the block ends (a session lock taken through a pooler in transaction
    mode could be unlocked on another server session, and stay held); False: another run
    holds it."""
    from django.db import connections

    own = connections.create_connection(alias)
    try:
        own.set_autocommit(False)
        with own.cursor() as cur:
            cur.execute(f"SELECT pg_try_advisory_xact_lock({DDL_LOCK})")
            held = bool(cur.fetchone()[0])
        yield held
    finally:
        with contextlib.suppress(Exception):
            own.rollback()
        own.close()


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
                cur.execute(f"ALTER TABLE {TABLE} DETACH PARTITION {name} FINALIZE")
                dropped += _drop_detached(alias, cur, gen, name, cutoff, indexed, start)
                continue
            if gen >= _generation(cur):
                break
            if not _past_barrier(alias, cur, gen, name, cutoff, timeout):
                continue
            clear, may_change, rows = _clear(alias, cur, name, cutoff, indexed)
            if not clear or not _detached(alias, cur, gen, name):
                continue
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


def _detached(alias: str, cur: Any, gen: int, name: str) -> bool:
    """``DETACH … CONCURRENTLY`` within :data:`DETACH_MS`; False (said, kept pending for
    the next run) when old transactions held it longer."""
    try:
        cur.execute(f"SET statement_timeout = {DETACH_MS}")
        cur.execute(f"ALTER TABLE {TABLE} DETACH PARTITION {name} CONCURRENTLY")
        return True
    except DatabaseError as exc:
        if sqlstate(exc.__cause__ or exc) not in (_QUERY_CANCELED, _LOCK_NOT_AVAILABLE):
            raise
    finally:
        cur.execute("RESET statement_timeout")
    from celery_grousset import events

    events.emit(logging.WARNING, "grousset.generation_busy", {
        "generation": gen, "waited_ms": DETACH_MS, "database": alias,
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


def _generation(cur: Any) -> int:
    cur.execute("SELECT grousset_generation()")
    return int(cur.fetchone()[0])


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
