"""The conversion of the single-table journal to the partitioned layout (PostgreSQL;
docs/scale.md, "Using it" and "Converting a large table"). Two ways to one result:

* :func:`convert` of a table as it is copies its rows into the current generation in
  ONE transaction holding the journal's exclusive lock (claims wait for it), so it
  refuses a table of more than ``max_rows`` rows.
* :func:`prepare` readies a table of any size **online**, claims going on: a column
  ``gen`` holding one past generation *g0* for every row (a default: no row is
  rewritten), a validated ``CHECK (gen = g0)``, and the partitioned layout's keys and
  indexes built ``CONCURRENTLY``. :func:`convert` of a prepared table then copies
  nothing: in one short transaction the table becomes generation *g0*'s partition (its
  prepared indexes become its keys; the check spares ``ATTACH`` its scan, the matching
  indexes spare it every build). Retention drops that partition like any past
  generation, once all its rows are purgeable.
"""

from __future__ import annotations

import re
from typing import Any

from celery_grousset.exceptions import InvalidArgument
from celery_grousset.store.pgpartops import (
    ABANDON,
    ABANDON_FUNCTION_SQL,
    ABANDON_INDEX,
    AHEAD,
    DDL_LOCK,
    MAX_COPY_ROWS,
    PARTITIONED_SQL,
    PROBE_INDEX_SQL,
    PROBE_SHAPE,
    _cursor,
    _generation,
    add_generation,
    ddl_lock,
    lock_timeout_ms,
    rows_within,
)
from celery_grousset.store.pgpartsql import FUNCTION_SQL, ROW_COLUMNS, TABLE

#: the partitioned layout's keys, on the parent and on every partition
PK_COLUMNS = "(id, gen)"
KEY_COLUMNS = "(fingerprint, processor_id, gen)"
#: what ``prepare`` builds on the single table, by name: the partitioned layout's keys
#: and indexes, in the shapes the parent's will have (so ``ATTACH`` adopts them)
PREPARED = {
    "grousset_outcome_gen_pk": f"CREATE UNIQUE INDEX CONCURRENTLY {{}} ON {TABLE} {PK_COLUMNS}",
    "grousset_outcome_gen_key": f"CREATE UNIQUE INDEX CONCURRENTLY {{}} ON {TABLE} {KEY_COLUMNS}",
    "grousset_outcome_gen_probe": f"CREATE INDEX CONCURRENTLY {{}} ON {TABLE} {PROBE_SHAPE}",
    "grousset_outcome_gen_abandoned": f"CREATE INDEX CONCURRENTLY {{}} ON {TABLE} ({ABANDON})",
}
CHECK = "grousset_outcome_gen_check"
_VALIDATION = f"the validation of {CHECK}"
_CHECK_DEF = re.compile(r"gen = (-?\d+)")
_SEQUENCE = "grousset_outcome_gen_id_seq"


def generation_functions(seconds: int) -> list[str]:
    """The SQL functions that hold the generation width (the one place it lives)."""
    return [
        "CREATE OR REPLACE FUNCTION grousset_generation_seconds() RETURNS int "
        f"LANGUAGE sql IMMUTABLE AS $$ SELECT {seconds} $$",
        "CREATE OR REPLACE FUNCTION grousset_generation() RETURNS int LANGUAGE sql VOLATILE "
        f"AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) / {seconds})::int $$",
    ]


def _checked_width(seconds: int) -> int:
    if not 60 <= seconds <= 366 * 86400:
        raise InvalidArgument("the generation width must be from 60 seconds to 366 days")
    return seconds


def readiness(cur: Any) -> tuple[int | None, int | None, list[str]]:
    """``(g0, width, missing)`` of a single table: the generation ``prepare`` gave its rows
    (None: never prepared), the width then, and what is still to build."""
    cur.execute(
        "SELECT pg_get_constraintdef(oid), convalidated FROM pg_constraint "
        "WHERE conrelid = to_regclass(%s) AND conname = %s",
        [TABLE, CHECK],
    )
    row = cur.fetchone()
    if row is None:
        return None, None, ["the column gen", _VALIDATION, *PREPARED]
    match = _CHECK_DEF.search(row[0])
    g0 = int(match.group(1)) if match else None
    missing = [] if row[1] else [_VALIDATION]
    cur.execute(
        "SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisvalid",
        [TABLE],
    )
    valid = {name for (name,) in cur.fetchall()}
    cur.execute("SELECT grousset_generation_seconds()")
    return g0, int(cur.fetchone()[0]), missing + [n for n in PREPARED if n not in valid]


def prepare(alias: str, *, seconds: int | None = None) -> tuple[int, list[str]]:
    """Ready the single table for a :func:`convert` that copies nothing, with claims going
    on (see the module doc). Runs again where an earlier run stopped. Returns ``(g0, the
    steps it did)``. Must run outside a transaction (``CREATE INDEX CONCURRENTLY``)."""
    with ddl_lock(alias) as held, _cursor(alias) as cur:
        if not held:
            raise InvalidArgument(
                f"another grousset_partition run is converting the journal of {alias!r}: "
                "wait for it to finish, then run prepare again"
            )
        return _prepare(alias, cur, seconds)


def _prepare(alias: str, cur: Any, seconds: int | None) -> tuple[int, list[str]]:
    from django.db import transaction

    _refuse_partitioned(alias, cur)
    g0, width, missing = readiness(cur)
    if g0 is not None and seconds is not None and seconds != width:
        raise InvalidArgument(
            f"the journal of {alias!r} was prepared with generations of {width} s: run "
            f"again with --generation {width}s (or without --generation)"
        )
    done = []
    if g0 is None:  # one brief exclusive lock: metadata only, no row rewritten
        with transaction.atomic(using=alias):
            cur.execute(f"SET LOCAL lock_timeout = {lock_timeout_ms()}")
            for sql in generation_functions(_checked_width(seconds or 86400)):
                cur.execute(sql)
            g0 = _generation(cur) - 1  # a past generation: claims write to newer ones
            cur.execute(f"ALTER TABLE {TABLE} ADD COLUMN gen int NOT NULL DEFAULT {g0}")
            cur.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {CHECK} CHECK (gen = {g0}) NOT VALID")
            cur.execute(ABANDON_FUNCTION_SQL)
        done.append(f"added the column gen = {g0}")
        missing = missing[1:]
    for step in missing:  # each waits for no claim: SHARE UPDATE EXCLUSIVE at most
        if step in PREPARED:
            cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {step}")  # one left invalid
            cur.execute(PREPARED[step].format(step))
        else:
            cur.execute(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {CHECK}")
        done.append(step)
    return g0, done


def _refuse_partitioned(alias: str, cur: Any) -> None:
    cur.execute(PARTITIONED_SQL, [TABLE])
    if cur.fetchone()[0]:
        raise InvalidArgument(f"the journal of {alias!r} is partitioned already")


def convert(
    alias: str,
    *,
    seconds: int | None = None,
    ahead: int = AHEAD,
    max_rows: int = MAX_COPY_ROWS,
) -> tuple[int, bool]:
    """Turn the single table into the partitioned layout in ONE transaction: a prepared
    table becomes a past generation as it is; any other has its rows copied into the
    current generation. Returns ``(rows, copied)`` (rows attached: the planner's
    estimate)."""
    from django.db import transaction

    with transaction.atomic(using=alias), _cursor(alias) as cur:
        cur.execute(f"SELECT pg_advisory_xact_lock({DDL_LOCK})")
        _refuse_partitioned(alias, cur)
        cur.execute(f"SET LOCAL lock_timeout = {lock_timeout_ms()}")
        cur.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        g0, width, missing = readiness(cur)
        if g0 is None:
            return _copy(alias, cur, _checked_width(seconds or 86400), ahead, max_rows), True
        if missing:
            raise InvalidArgument(
                f"the journal of {alias!r} is not fully prepared (still to do: "
                f"{', '.join(missing)}): run `manage.py grousset_partition prepare "
                f"--database {alias}` again, then convert"
            )
        if seconds is not None and seconds != width:
            raise InvalidArgument(
                f"the journal of {alias!r} was prepared with generations of {width} s, not "
                f"{seconds} s: convert without --generation"
            )
        return _attach(cur, g0, ahead), False


def _copy(alias: str, cur: Any, seconds: int, ahead: int, max_rows: int) -> int:
    rows = rows_within(
        cur, alias, TABLE, max_rows, f"run `manage.py grousset_partition prepare --database "
        f"{alias}` first (online, claims go on), then convert (it copies nothing); or raise "
        "--max-rows."
    )  # fmt: skip
    indexes = _plain_indexes(cur)
    for sql in generation_functions(seconds):
        cur.execute(sql)
    now = _generation(cur)
    cur.execute(f"ALTER TABLE {TABLE} ADD COLUMN gen int NOT NULL DEFAULT {now}")
    cur.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_single")
    _parent(cur, f"{TABLE}_single", now, ahead)
    cur.execute(f"INSERT INTO {TABLE} SELECT * FROM {TABLE}_single")
    cur.execute(f"DROP TABLE {TABLE}_single")
    _keys(cur, indexes)
    return rows


def _attach(cur: Any, g0: int, ahead: int) -> int:
    """The prepared table becomes generation ``g0``'s partition, nothing copied."""
    if g0 >= _generation(cur):
        raise InvalidArgument(
            f"the prepared generation {g0} is not in the past (has the database clock gone "
            "back?): convert again later"
        )
    indexes = _plain_indexes(cur)
    legacy = f"{TABLE}_g{g0}"
    cur.execute(
        "SELECT greatest(reltuples, 0)::int8 FROM pg_class WHERE oid = to_regclass(%s)", [TABLE]
    )
    rows = int(cur.fetchone()[0])
    cur.execute(f"ALTER TABLE {TABLE} RENAME TO {legacy}")
    # Its own primary key (id) and identity give way to the layout's; its other indexes
    # stay, renamed, for the parent's of the same shape to adopt
    cur.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'p'",
        [legacy],
    )
    for (name,) in cur.fetchall():
        cur.execute(f"ALTER TABLE {legacy} DROP CONSTRAINT {name}")
    cur.execute(f"ALTER TABLE {legacy} ALTER id DROP IDENTITY IF EXISTS")
    cur.execute(
        "SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass(%s) ORDER BY c.oid",
        [legacy],
    )
    suffix = f"_g{g0}"
    for (name,) in cur.fetchall():
        if name not in PREPARED:
            cur.execute(f"ALTER INDEX {name} RENAME TO {name[: 63 - len(suffix)]}{suffix}")
    pk, key = list(PREPARED)[:2]
    cur.execute(f"ALTER TABLE {legacy} ADD CONSTRAINT {pk} PRIMARY KEY USING INDEX {pk}")
    cur.execute(f"ALTER TABLE {legacy} ADD CONSTRAINT {key} UNIQUE USING INDEX {key}")
    _parent(cur, legacy, _generation(cur), ahead)
    # CHECK (gen = g0) spares the scan of the partition's bound
    cur.execute(
        f"ALTER TABLE {TABLE} ATTACH PARTITION {legacy} FOR VALUES FROM ({g0}) TO ({g0 + 1})"
    )
    _keys(cur, indexes)
    return rows


def _plain_indexes(cur: Any) -> list[str]:
    """The single table's own non-unique indexes (Django's), to be made on the parent."""
    cur.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexdef NOT LIKE "
        "'CREATE UNIQUE%%' AND schemaname = current_schema()",  # (a schema per tenant)
        [TABLE],
    )
    return [sql for name, sql in cur.fetchall() if name not in PREPARED]


def _parent(cur: Any, source: str, now: int, ahead: int) -> None:
    """The partitioned table under the journal's name, shaped like ``source`` (which has
    ``gen``), its id sequence past ``source``'s ids, and generations ``now`` and after."""
    cur.execute(
        f"CREATE TABLE {TABLE} (LIKE {source} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
        "PARTITION BY RANGE (gen)"
    )
    cur.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {CHECK}")
    cur.execute(f"ALTER TABLE {TABLE} ALTER gen SET DEFAULT grousset_generation()")
    cur.execute(f"SELECT coalesce(max(id), 0) FROM {source}")
    top = int(cur.fetchone()[0])
    cur.execute(f"CREATE SEQUENCE IF NOT EXISTS {_SEQUENCE}")
    cur.execute(f"SELECT setval('{_SEQUENCE}', %s + 1, false)", [top])
    cur.execute(f"ALTER TABLE {TABLE} ALTER id SET DEFAULT nextval('{_SEQUENCE}')")
    cur.execute(f"ALTER SEQUENCE {_SEQUENCE} OWNED BY {TABLE}.id")
    for gen in range(now, now + ahead + 1):
        add_generation(cur, gen)


def _keys(cur: Any, indexes: list[str]) -> None:
    """The parent's keys and indexes (a partition's matching index is adopted, not
    built again), the row type and the claim function."""
    cur.execute(f"ALTER TABLE {TABLE} ADD PRIMARY KEY {PK_COLUMNS}")
    cur.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT grousset_outcome_key UNIQUE {KEY_COLUMNS}")
    for sql in indexes:
        cur.execute(sql)
    cur.execute(ABANDON_FUNCTION_SQL)
    cur.execute(f"CREATE INDEX {ABANDON_INDEX} ON {TABLE} ({ABANDON})")
    cur.execute(PROBE_INDEX_SQL)
    cur.execute("DROP TYPE IF EXISTS grousset_claim_row CASCADE")
    cur.execute(_row_type(cur))
    cur.execute(FUNCTION_SQL)


def _row_type(cur: Any) -> str:
    cur.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
        [TABLE],
    )
    types = dict(cur.fetchall())
    cols = ", ".join(f"{name} {kind or types[name]}" for name, kind in ROW_COLUMNS)
    return f"CREATE TYPE grousset_claim_row AS ({cols})"
