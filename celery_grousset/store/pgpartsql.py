"""The partitioned journal's claim, as SQL (PostgreSQL; see
:mod:`celery_grousset.store.pgpartition`): the function ``grousset_claim`` and the one
statement that calls it, both derived from
:data:`~celery_grousset.store.pgclaim.CLAIM_SQL` (the same decision table, restricted
to the current generation)."""

from __future__ import annotations

import re

from celery_grousset.store.pgclaim import CLAIM_SQL, KEY, PER_ROW, REQUESTS

TABLE = "celery_grousset_outcome"

# The parameters of CLAIM_SQL, in the function's fixed order (its signature: a change of
# order would add an overload beside the installed function, not replace it), and their
# SQL types (text if unlisted).
PARAMS = ("tok", "ph", "tid", "maxt", "f", "p", "task", "mpt", "exp", "worker", "args",
          "bounce", "gu", "async")  # fmt: skip
if set(PARAMS) != set(re.findall(r"%\((\w+)\)s", CLAIM_SQL)):  # pragma: no cover
    raise RuntimeError("CLAIM_SQL's parameters changed: update pgpartsql.PARAMS")
_TYPES = {"exp": "interval", "mpt": "interval", "maxt": "int", "async": "boolean",
          "bounce": "boolean"}  # fmt: skip

# The product's claim, restricted to the current generation: the same text with `gen`
# added to the row lookup, the inserted row and the conflict target.
_STMT = CLAIM_SQL
for _old, _new in (
    ("FOR UPDATE", "AND o.gen = _cur FOR UPDATE"),
    (f"INSERT INTO {TABLE} AS o ( processor_id,", f"INSERT INTO {TABLE} AS o ( gen,processor_id,"),
    ("SELECT %(p)s,%(f)s,", "SELECT _cur,%(p)s,%(f)s,"),
    ("ON CONFLICT (processor_id,fingerprint)", "ON CONFLICT (processor_id,fingerprint,gen)"),
):
    _STMT = _STMT.replace(_old, _new, 1)
if _STMT.count("_cur") != 2 or "fingerprint,gen)" not in _STMT:  # pragma: no cover
    raise RuntimeError("CLAIM_SQL changed shape: update celery_grousset/store/pgpartition.py")
_STMT = re.sub(r"%\((\w+)\)s", r"_\1", _STMT)
_MOVE_KEY = re.sub(r"%\((\w+)\)s", r"_\1", KEY.format(t=""))
#: Step 2 of the claim: the key's row, in whichever past generation it was left, moves
#: into the current one (one probe per non-empty past generation, on ``PROBE_INDEX``)
MOVE_SQL = f"UPDATE {TABLE} SET gen = _cur WHERE {_MOVE_KEY} AND gen <> _cur"

#: A claim's renewal (``WORKER_CLAIM``'s late start): its row moves into the current
#: generation with it, as a claim's does, never made live again in a past one (which
#: retention may have checked and be detaching)
RENEW_SQL = (
    f"UPDATE {TABLE} SET gen = grousset_generation(), "
    "stale_at = clock_timestamp() + make_interval(secs => %(mpt)s) "
    "WHERE processor_id = %(p)s AND fingerprint = %(f)s AND claim_token = %(tok)s "
    "AND status = 'in_flight'"
)

#: The advisory lock of a key (``p``, ``f``: SQL for its processor id and fingerprint):
#: claims of one key queue on it until the holder commits.
LOCK_KEY = "hashtextextended({p} || chr(31) || {f}, 7)"

#: The columns the claim returns (CLAIM_SQL's RETURNING, then its decision code and the
#: commit mode); those named after a table column take its type (read at conversion).
ROW_COLUMNS = (
    ("fence", None), ("status", None), ("deliveries", None), ("takeovers", None),
    ("result", None), ("result_encoding", None), ("error", None), ("task_id", None),
    ("started_at", None), ("completed_at", None), ("retry_in", "float8"),
    ("payload_hash", None), ("code", "text"), ("durability", "text"),
)  # fmt: skip

FUNCTION_SQL = f"""
CREATE OR REPLACE FUNCTION grousset_claim(
    {", ".join(f"_{n} {_TYPES.get(n, 'text')}" for n in PARAMS)})
RETURNS SETOF grousset_claim_row LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE _cur int; _now int;
BEGIN
    PERFORM pg_advisory_xact_lock({LOCK_KEY.format(p="_p", f="_f")});
    _cur := grousset_generation();
    LOOP
        {MOVE_SQL};
        _now := grousset_generation();
        EXIT WHEN _now = _cur;
        _cur := _now;
    END LOOP;
    RETURN QUERY {_STMT};
END $fn$
"""


def _call(row: str | None = None) -> str:
    """The call of ``grousset_claim``, each argument cast to its type: a statement
    parameter, or (``row``: a batch) the column of ``row`` for a per-request one."""
    args = []
    for n in PARAMS:
        source = f"{row}.{n}" if row and n in PER_ROW else f"%({n})s"
        args.append(f"{source}::{_TYPES.get(n, 'text')}")
    return f"grousset_claim({', '.join(args)})"


CALL_SQL = f"SELECT * FROM {_call()}"

# A batch (``claim_all``): ONE statement, ONE commit. First every key's lock, in the
# order of the locks' ids (the sort needs them all before it yields a row), so the batch
# never waits for a key's lock while it holds a partition's or a row's (a claim waiting
# behind retention's barrier may hold the key it wants); then one call of the function
# per request, in key order, each taking its lock again (held already: no wait). The
# calls' commit settings are replaced by the batch's: the commit waits for the WAL flush
# unless every claim only answered (or CLAIM_COMMIT is "async"), as on the single table.
_RESULT = ", ".join(f"c.{name}" for name, _ in ROW_COLUMNS[:-1])
BATCH_CALL_SQL = f"""
WITH r AS ({REQUESTS}
), locks AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(k) FROM (
        SELECT {LOCK_KEY.format(p="r.p", f="r.f")} AS k FROM r ORDER BY 1) AS l
), c AS MATERIALIZED (
    SELECT r.n, r.p, r.f, g.* FROM (
        SELECT r.* FROM r, (SELECT count(*) FROM locks) AS held ORDER BY r.p, r.f
    ) AS r, LATERAL {_call("r")} AS g
), durability AS (
    SELECT set_config('synchronous_commit', CASE WHEN bool_and(c.durability = 'off')
        THEN 'off' ELSE 'on' END, true) FROM c
)
SELECT c.n, c.p, c.f, {_RESULT}, durability.* FROM c, durability
"""
BATCH_CALL_SQL = " ".join(BATCH_CALL_SQL.split())
