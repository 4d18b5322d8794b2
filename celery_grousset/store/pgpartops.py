"""The partitioned journal's DDL (PostgreSQL): the generations created ahead, and the
DDL lock (retention by dropping whole generations is
:mod:`celery_grousset.store.pgpartretire`; the conversion from the single table
:mod:`celery_grousset.store.pgpartconvert`).

Everything runs on the Django connection of the journal's database alias. Partitions
are named ``celery_grousset_outcome_g<gen>`` and cover ``[gen, gen + 1)``; the width of
a generation in seconds lives in one place, the SQL function ``grousset_generation()``
written by the conversion (``grousset_generation_seconds()`` reads it back).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from celery_grousset.store.pgpartsql import TABLE

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


def _generation(cur: Any) -> int:
    cur.execute("SELECT grousset_generation()")
    return int(cur.fetchone()[0])
