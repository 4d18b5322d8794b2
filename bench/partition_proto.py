"""PROTOTYPE (bench only, not the product): the journal partitioned by generation.

docs/scale.md, "The partitioned layout", argues the design; this module is the
smallest thing that measures it. The journal table ``celery_grousset_outcome`` is
re-created as ``PARTITION BY RANGE (gen)``: one partition per generation (a day
here), ``gen`` = the generation of the claim that last took the row. Every unique
key carries ``gen`` (PostgreSQL requires it), so uniqueness across partitions is
not the index's job: one PL/pgSQL function call per claim (one statement, one round
trip, prepared) does, in order,

1. ``pg_advisory_xact_lock`` on a 64-bit hash of ``(processor_id, fingerprint)``:
   claims of one key queue here, until the holder commits;
2. moves the key's row, if it sits in any other attached generation (older, or the next
   one when the clock stepped back over a boundary), into the current one
   (``UPDATE … SET gen = cur``: row movement). In READ COMMITTED each statement of
   the function takes a new snapshot after the lock, so it sees the row any earlier
   holder committed;
3. runs the product's claim statement (:data:`celery_grousset.store.postgresql.CLAIM_SQL`,
   the same decision table) restricted to ``gen = cur``: partition pruning leaves
   one partition, one unique-index probe.

Retention is ``DETACH PARTITION … CONCURRENTLY`` + ``DROP TABLE`` of a generation
older than the retention window. Only the claim and the completion are adapted; the
admin and the commands read the parent table as before.
"""

from __future__ import annotations

import re
from typing import Any

from celery_grousset.store.postgresql import CLAIM_SQL, PostgresStore, _result

TABLE = "celery_grousset_outcome"
PARAMS = ("p", "f", "task", "tid", "tok", "exp", "mpt", "maxt", "worker", "args", "ph", "async")
TYPES = {"exp": "float8", "mpt": "float8", "maxt": "int", "async": "boolean"}

# The product's claim, restricted to the current generation: the same text with `gen`
# added to the row lookup, the inserted row and the conflict target.
_STMT = (
    CLAIM_SQL.replace("FOR UPDATE", "AND o.gen = _cur FOR UPDATE", 1)
    .replace("INSERT INTO celery_grousset_outcome AS o ( processor_id,",
             "INSERT INTO celery_grousset_outcome AS o ( gen, processor_id,", 1)
    .replace("SELECT %(p)s, %(f)s,", "SELECT _cur, %(p)s, %(f)s,", 1)
    .replace("ON CONFLICT (processor_id, fingerprint)",
             "ON CONFLICT (processor_id, fingerprint, gen)", 1)
)  # fmt: skip
assert _STMT.count("_cur") == 2 and "fingerprint, gen)" in _STMT, "CLAIM_SQL changed shape"
_STMT = re.sub(r"%\((\w+)\)s", r"_\1", _STMT)

FUNCTION = f"""
CREATE OR REPLACE FUNCTION grousset_proto_claim(
    {", ".join(f"_{n} {TYPES.get(n, 'text')}" for n in PARAMS)}, _cur int)
RETURNS SETOF grousset_proto_claim_row LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(_p || chr(31) || _f, 7));
    UPDATE {TABLE} SET gen = _cur
    WHERE fingerprint = _f AND processor_id = _p AND gen <> _cur;
    RETURN QUERY {_STMT};
END $fn$
"""

ROW_TYPE = """
DROP TYPE IF EXISTS grousset_proto_claim_row CASCADE;
CREATE TYPE grousset_proto_claim_row AS (fence bigint, status varchar, deliveries bigint,
    takeovers int, result bytea, result_encoding varchar, error text, task_id varchar,
    started_at timestamptz, completed_at timestamptz, retry_in float8,
    payload_hash varchar, code text, durability text)
"""

CALL = "SELECT * FROM grousset_proto_claim(" + ", ".join(f"%({n})s" for n in PARAMS) + ", %(cur)s)"
# The completion (FINISH_SQL, unchanged) does not know the row's generation: it probes
# every attached one, through each partition's unique index.

INDEXES = [
    "ALTER TABLE {t} ADD CONSTRAINT grousset_outcome_key UNIQUE (fingerprint, processor_id, gen)",
    "CREATE INDEX grousset_outcome_expires ON {t} (expires_on)",
    "CREATE INDEX grousset_outcome_task_id ON {t} (task_id)",
    "CREATE INDEX grousset_outcome_started ON {t} (started_at)",
    "CREATE INDEX grousset_outcome_task ON {t} (task_name, started_at)",
    "CREATE INDEX grousset_outcome_proc ON {t} (processor_id, started_at)",
]


def convert(cur: Any, gens: range, schema: str | None = None) -> None:
    """Replace the (empty) single table by the partitioned prototype, partitions
    ``gens`` (or, with ``schema``, create the prototype there, next to the single
    table, and leave ``cur`` on ``search_path = schema``)."""
    if schema:
        cur.execute(f"CREATE SCHEMA {schema}")
        cur.execute(f"SET search_path = {schema}, public")
        source = f"public.{TABLE}"
    else:
        cur.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_single")
        source = f"{TABLE}_single"
    cur.execute(
        f"CREATE TABLE {TABLE} (LIKE {source} INCLUDING DEFAULTS, gen int NOT NULL,"
        " PRIMARY KEY (id, gen)) PARTITION BY RANGE (gen)"
    )
    if not schema:
        cur.execute(f"DROP TABLE {source}")
    cur.execute("CREATE SEQUENCE IF NOT EXISTS grousset_proto_id_seq")
    cur.execute(f"ALTER TABLE {TABLE} ALTER id SET DEFAULT nextval('grousset_proto_id_seq')")
    for g in gens:
        add_partition(cur, g)
    cur.execute(ROW_TYPE)
    cur.execute(FUNCTION)


def add_partition(cur: Any, g: int) -> None:
    cur.execute(
        f"CREATE TABLE {TABLE}_g{g} PARTITION OF {TABLE} FOR VALUES FROM ({g}) TO ({g + 1})"
        " WITH (fillfactor = 80)"
    )


def drop_partition(cur: Any, g: int) -> None:
    """Retention of one generation (autocommit connection)."""
    cur.execute(f"ALTER TABLE {TABLE} DETACH PARTITION {TABLE}_g{g} CONCURRENTLY")
    cur.execute(f"DROP TABLE {TABLE}_g{g}")


def create_indexes(cur: Any, partitioned: bool) -> None:
    for ddl in INDEXES:
        if not partitioned:
            ddl = ddl.replace(", gen)", ")")
        cur.execute(ddl.format(t=TABLE))


def index_names() -> list[str]:
    return ["grousset_outcome_key", *(ddl.split()[2] for ddl in INDEXES[1:])]


def drop_indexes(cur: Any, schema: str = "public") -> None:
    cur.execute(f"ALTER TABLE {schema}.{TABLE} DROP CONSTRAINT IF EXISTS grousset_outcome_key")
    for name in index_names()[1:]:
        cur.execute(f"DROP INDEX IF EXISTS {schema}.{name}")


class ProtoStore(PostgresStore):
    """The product's store with the prototype's claim."""

    cur_gen = 0  # the product would compute it from clock_timestamp() after the lock
    call = CALL

    def claim(self, req: Any) -> Any:
        params = {**self.claim_params(req), "cur": self.cur_gen}
        row = self._run(lambda conn: conn.execute(self.call, params, prepare=True).fetchone())
        return _result(row)
