"""The conversion back: the partitioned journal becomes the single table again
(PostgreSQL; docs/scale.md, "Converting back").

:func:`revert` runs in ONE transaction holding the journal's exclusive lock (claims wait
for it, as for ``convert``'s copy): the rows of every generation are copied aside, the
partitioned table and its generations are dropped with the layout's functions, the
single table is created as the journal's migrations create it (Django's schema editor
on the ``Outcome`` model: the same columns, keys, index names and identity), and the
rows go back with their ids, fences and decisions; the id sequence continues after the
largest id. So it refuses a journal of more than ``max_rows`` rows (a larger one: let
retention shrink it first, or raise the limit for a quiet hour).
"""

from __future__ import annotations

from typing import Any

from celery_grousset.exceptions import InvalidArgument
from celery_grousset.store.pgpartops import (
    ABANDON,
    DDL_LOCK,
    FILLFACTOR,
    MAX_COPY_ROWS,
    PARTITIONED_SQL,
    _cursor,
    lock_timeout_ms,
    rows_within,
)
from celery_grousset.store.pgpartsql import TABLE

_ASIDE = "grousset_revert_rows"
#: what the partitioned layout adds besides its tables (the claim function goes with its
#: row type)
_LAYOUT_OBJECTS = (
    "DROP TYPE IF EXISTS grousset_claim_row CASCADE",
    "DROP FUNCTION IF EXISTS grousset_generation()",
    "DROP FUNCTION IF EXISTS grousset_generation_seconds()",
    f"DROP FUNCTION IF EXISTS {ABANDON.partition('(')[0]}",
)


def revert(alias: str, *, max_rows: int = MAX_COPY_ROWS) -> int:
    """Turn the partitioned journal of ``alias`` back into the single table; the rows
    kept. Returns their number."""
    from django.core.management.color import no_style
    from django.db import connections, transaction

    from celery_grousset.models import Outcome

    connection = connections[alias]
    with transaction.atomic(using=alias), _cursor(alias) as cur:
        cur.execute(f"SELECT pg_advisory_xact_lock({DDL_LOCK})")
        cur.execute(PARTITIONED_SQL, [TABLE])
        if not cur.fetchone()[0]:
            raise InvalidArgument(f"the journal of {alias!r} is not partitioned: nothing to revert")
        cur.execute(f"SET LOCAL lock_timeout = {lock_timeout_ms()}")
        cur.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        model = [str(f.column) for f in Outcome._meta.concrete_fields]
        columns, defaults = _columns(alias, cur, model)
        rows = rows_within(
            cur, alias, TABLE, max_rows, "let retention shrink it, or raise --max-rows for "
            "a quiet hour"
        )  # fmt: skip
        cur.execute(
            f"CREATE TEMPORARY TABLE {_ASIDE} ON COMMIT DROP AS SELECT {columns} FROM {TABLE}"
        )
        cur.execute(f"DROP TABLE {TABLE}")  # its generations with it
        for sql in _LAYOUT_OBJECTS:
            cur.execute(sql)
        with connection.schema_editor(atomic=False) as editor:
            editor.create_model(Outcome)
            cur.execute(f"ALTER TABLE {TABLE} SET ({FILLFACTOR})")
            for name, default in defaults.items():  # the migrations' database defaults
                cur.execute(f'ALTER TABLE {TABLE} ALTER COLUMN "{name}" SET DEFAULT {default}')
            # before the editor's deferred statements build the plain indexes: each is
            # then built once over the rows instead of updated row by row
            cur.execute(
                f"INSERT INTO {TABLE} ({columns}) SELECT {columns} FROM {_ASIDE} ORDER BY id"
            )
        for sql in connection.ops.sequence_reset_sql(no_style(), [Outcome]):
            cur.execute(sql)
    return rows


def _columns(alias: str, cur: Any, model: list[str]) -> tuple[str, dict[str, str]]:
    """The model's columns, in its order, and the database defaults the table's columns
    carry besides ``id``'s (some migrations keep one, for workers of the version before;
    the model does not know them). Refused unless the partitioned table has exactly the
    model's columns (and ``gen``): a journal a migration has not reached is not guessed."""
    cur.execute(
        "SELECT a.attname, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute AS a "
        "LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
        [TABLE],
    )
    found = dict(cur.fetchall())
    have = set(found) - {"gen"}
    if have != set(model):
        raise InvalidArgument(
            f"the journal of {alias!r} has the columns {sorted(have)}, the Outcome model "
            f"{sorted(model)}: run `manage.py migrate celery_grousset --database {alias}` "
            "(or install the version of celery-grousset that made the journal), then revert"
        )
    defaults = {n: d for n, d in found.items() if d is not None and n not in ("id", "gen")}
    return ", ".join(f'"{name}"' for name in model), defaults
