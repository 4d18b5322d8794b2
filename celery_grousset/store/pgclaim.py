"""The PostgreSQL claim statements: one key (:data:`CLAIM_SQL`) and a batch of keys
(:data:`BATCH_SQL`), built from the same pieces so the decision table, the writes, the
recorded deliveries and the commit's durability are written once.

Both lock the existing rows in a materialized CTE that evaluates the decision table of
:mod:`celery_grousset.claim` on each (SQL generated from ``claim.RULES``), then run an
``INSERT … ON CONFLICT DO UPDATE`` that applies each decision, and return the rows they
left with the decisions' codes. The batch takes its requests as parameter arrays
unnested ``WITH ORDINALITY``, locks the rows in key order and inserts in key order (two
batches never wait on each other in a cycle), and returns each row with its ordinal.
"""

from __future__ import annotations

import re

from celery_grousset.claim import (
    CLOCK_FENCE_SQL,
    ENC_GAVE_UP,
    OWN_DELIVERY,
    REDELIVERY,
    WRITES,
    Kind,
    Write,
    codes,
    decision_sql,
    gave_up_message,
)

NOW = "clock_timestamp()"

# The row of one claim, found through the unique key (fingerprint, processor_id) and
# nothing else. Written plainly, `processor_id = $1` also matches the admin's
# (processor_id, started_at) index, and while the table has no statistics (new, or
# just truncated) the generic plan ties the two and may pick that one: every claim
# then scans all of its processor's rows. `|| ''` keeps the processor a filter on
# the unique index's row, whatever the statistics say.
KEY = "{t}fingerprint = %(f)s AND {t}processor_id || '' = %(p)s"

# In ON CONFLICT DO UPDATE: the decision the CTE made on the locked row (generated from
# claim.RULES, so the SQL and Python forms of the table cannot drift), carried into the
# proposed row in its `error` column (read once in lf, the rows read after the lock
# ("lock first"; a short alias keeps the statement under 4 KiB); '' when the CTE found no
# row). A fresh insert keeps that '' as its error. (Written as a scalar subquery on the
# CTE instead, each of its ~20 uses was a separate sub-plan for the executor to set up on
# every call: measured 3 % of a claim + complete, 7 % of a duplicate claim.)
_A = "EXCLUDED.error"
# The decisions that take the row: their codes, and only theirs, sort after 'q' (one
# comparison instead of a list keeps the statement short; see claim._CODES).
_TAKES = "> 'q'"
_CLAIM = f"{_A} {_TAKES}"
assert {k.code for k, w in WRITES.items() if w in (Write.CLAIM, Write.CLAIM_RESET)} == {
    k.code for k in Kind if k.code > "q"
}
_RESET = f"{_A} = '{Kind.EXPIRED.code}'"
_GIVE_UP = f"{_A} = '{Kind.GAVE_UP.code}'"
_KEEP = f"{_A} = '{Kind.RESUMED.code}'"
_TAKEOVER = f"{_A} = '{Kind.TAKEOVER.code}'"
# The claim's one moment: read once, after the lock (see lf), so that
# expires_on - started_at is exactly expires_after.
_T = "EXCLUDED.started_at"
# (a parameter, not a literal: the statement's text stays under psycopg's 4 KiB cache limit)
GAVE_UP_ERROR = gave_up_message("{n}")
# A new row's fence: the claim's moment in microseconds since the epoch (claim.clock_fence).
_CLOCK_FENCE = CLOCK_FENCE_SQL.format(t="lf.t")
# claim.counted(), in SQL: 1 when the row answers this delivery and it is not a redelivery
# of one already counted (lf.ptid: the task id on the locked row). The insert
# proposes it as its `duplicates` (0 for a new row: nothing answered it).
# (Never NULL: a is '' for a new row, and a row found has a task id. The cast: the
# parameter's first use decides its type, and the insert needs the column's.)
_REDELIVERED = REDELIVERY.sql.replace("o.task_id", "lf.ptid")
_DUPLICATE = (
    f"(lf.a IN {codes(Write.COUNT, Write.GIVE_UP)} AND NOT "
    f"{_REDELIVERED.replace('%(tid)s', '%(tid)s::varchar')})::int"
)


def _if(cond: str, then: str, col: str) -> str:
    return f"CASE WHEN {cond} THEN {then} ELSE o.{col} END"


# What the upsert writes on a conflict: only the row (o), the proposed row (EXCLUDED) and
# the constant %(gu)s, so one key's statement and the batch's share it verbatim.
_SET = {
    "claim_token": _if(_CLAIM, "EXCLUDED.claim_token", "claim_token"),
    # The clock fence the insert proposed, or one more than the row's (fences never go
    # back, even across a purge: docs/guarantee.md, "Fencing tokens").
    "fence": _if(_CLAIM, "GREATEST(o.fence + 1, EXCLUDED.fence)", "fence"),
    "status": f"CASE WHEN {_CLAIM} THEN 'in_flight' WHEN {_GIVE_UP} THEN 'failed' "
    "ELSE o.status END",
    "task_name": _if(_CLAIM, "EXCLUDED.task_name", "task_name"),
    "task_id": _if(_CLAIM, "EXCLUDED.task_id", "task_id"),
    "worker": _if(_CLAIM, "EXCLUDED.worker", "worker"),
    "args_repr": _if(_CLAIM, "EXCLUDED.args_repr", "args_repr"),
    "payload_hash": _if(_CLAIM, "EXCLUDED.payload_hash", "payload_hash"),
    "started_at": _if(_CLAIM, _T, "started_at"),
    "stale_at": _if(_CLAIM, "EXCLUDED.stale_at", "stale_at"),
    "completed_at": f"CASE WHEN {_CLAIM} THEN NULL WHEN {_GIVE_UP} THEN {_T} "
    "ELSE o.completed_at END",
    # a give-up keeps the memo of its failure for expires_after, like a claim its row
    "expires_on": _if(f"{_CLAIM} OR {_GIVE_UP}", "EXCLUDED.expires_on", "expires_on"),
    "deliveries": f"CASE WHEN {_RESET} THEN 1 WHEN {_KEEP} THEN o.deliveries "
    "ELSE o.deliveries + 1 END",
    "takeovers": f"CASE WHEN {_RESET} THEN 0 WHEN {_TAKEOVER} THEN o.takeovers + 1 "
    "ELSE o.takeovers END",
    "duplicates": f"CASE WHEN {_RESET} THEN 0 ELSE o.duplicates + EXCLUDED.duplicates END",
    "first_claimed_at": _if(_RESET, _T, "first_claimed_at"),
    "result": f"CASE WHEN {_CLAIM} OR {_GIVE_UP} THEN NULL ELSE o.result END",
    "result_encoding": f"CASE WHEN {_CLAIM} THEN '' WHEN {_GIVE_UP} THEN '{ENC_GAVE_UP}' "
    "ELSE o.result_encoding END",
    "error": f"CASE WHEN {_RESET} THEN '' WHEN {_GIVE_UP} THEN "
    "replace(%(gu)s, '{n}', o.takeovers::text) ELSE o.error END",
}

#: the parameters that differ per request (in a batch: one array each, of this type)
PER_ROW = {
    "p": "text", "f": "text", "task": "text", "tid": "text", "tok": "text",
    "mpt": "interval", "exp": "interval", "maxt": "int8", "worker": "text", "args": "text",
    "ph": "text", "bounce": "bool",
}  # fmt: skip
_PARAM = re.compile(r"%\((\w+)\)s")


def _per_row(sql: str, row: str) -> str:
    """``sql`` with each per-request parameter read from the column of ``row``."""
    return _PARAM.sub(lambda m: f"{row}.{m[1]}" if m[1] in PER_ROW else m[0], sql)


# The locked row of one key and its decision (prev: a, ptid). In a batch, a lateral
# subquery per request, in key order: each one key's lookup through the unique key, and
# the rows are locked in that order.
_LOCKED = (
    f"{decision_sql(NOW)} AS a, o.task_id AS ptid FROM celery_grousset_outcome AS o "
    f"WHERE {KEY.format(t='o.')} FOR UPDATE"
)
# The upsert: one row per key (lf: the request, its decision a and the locked
# row's task id ptid, the moment t). A conflict with '' (no row when the CTE looked: a
# concurrent first insert won the race) updates nothing and returns no row; the store
# sends that claim again, and the CTE decides on the winner's row like any other.
# The seconds it returns until the row turns stale read stale_at: on PostgreSQL every
# claim writes it (claim.deadline's 0.1.0 case cannot arise here: a 0.1.0 worker's
# upsert proposes no stale_at, a NOT NULL column, and fails).
_UPSERT = f"""
INSERT INTO celery_grousset_outcome AS o (
    processor_id, fingerprint, task_name, task_id, status, fence, claim_token,
    started_at, stale_at, expires_on, deliveries, takeovers, result_encoding, error,
    worker, args_repr, payload_hash, first_claimed_at, duplicates)
SELECT %(p)s, %(f)s, %(task)s, %(tid)s, 'in_flight', {_CLOCK_FENCE}, %(tok)s,
    lf.t, lf.t + %(mpt)s, lf.t + %(exp)s, 1, 0, '', lf.a,
    %(worker)s, %(args)s, %(ph)s, lf.t, {_DUPLICATE}
FROM <lf>
ON CONFLICT (processor_id, fingerprint) DO UPDATE SET
    {", ".join(f"{col} = {expr}" for col, expr in _SET.items())}
WHERE {_A} <> ''
RETURNING <keys>o.fence, o.status, o.deliveries, o.takeovers, o.result,
    o.result_encoding, o.error, o.task_id, o.started_at, o.completed_at,
    EXTRACT(EPOCH FROM o.stale_at - {NOW})::float8, o.payload_hash
"""


def _upsert(rows: str, keys: str) -> str:
    """The upsert reading its rows (alias ``lf``) from ``rows``, returning ``keys`` first."""
    return _UPSERT.replace("<lf>", rows).replace("<keys>", keys)


# A delivery that is not the row's own (claim.recorded), from prev; never an empty id.
_RECORD = f"""
INSERT INTO celery_grousset_delivery (processor_id, fingerprint, task_id, decision, at)
SELECT %(p)s, %(f)s, x.id, a, now() FROM prev,
LATERAL (SELECT CASE WHEN a {_TAKES} THEN ptid ELSE %(tid)s END AS id) AS x
WHERE a <> '{Kind.RESUMED.code}' AND NOT {OWN_DELIVERY.sql.replace("o.task_id", "ptid")}
AND x.id <> ''
"""
# The commit waits for the WAL flush unless every claim only answered (a count, or the
# caller's own claim) or CLAIM_COMMIT is "async"; `answered` is that test on prev.a.
_DURABILITY = (
    "set_config('synchronous_commit', CASE WHEN {answered} OR %(async)s THEN 'off' "
    "ELSE 'on' END, true)"
)
_ANSWERED_ONLY = f"prev.a IN {codes(Write.COUNT, Write.NOTHING)}"

# The one row to upsert: the moment read after the lock, the decision, the row's task id.
_ONE_ROW = (
    f"(SELECT {NOW} AS t, coalesce(max(prev.a), '') AS a, max(prev.ptid) AS ptid "
    "FROM prev) AS lf"
)
CLAIM_SQL = f"""
WITH prev AS MATERIALIZED (
    SELECT {_LOCKED}
), ins AS ({_upsert(_ONE_ROW, keys="")}
), d AS ({_RECORD})
SELECT ins.*, coalesce(prev.a, ''), {_DURABILITY.format(answered=_ANSWERED_ONLY)}
FROM ins LEFT JOIN prev ON true
"""


def compact(sql: str) -> str:
    """``sql`` on one line, without the spaces around operators and commas (outside
    string literals): psycopg caches its %(name)s -> $n conversion only for statements
    up to 4 KiB."""
    parts = re.split(r"('[^']*')", " ".join(sql.split()))
    return "".join(p if i % 2 else re.sub(r" ?(<>|<=|>=|=|<|>|,) ?", r"\1", p)
                   for i, p in enumerate(parts))  # fmt: skip


CLAIM_SQL = compact(CLAIM_SQL)
assert len(CLAIM_SQL) <= 4096, "keep the claim statement cacheable by psycopg"

# (a key with no row was not answered: it is new)
_ALL_ANSWERED = f"bool_and(coalesce({_ANSWERED_ONLY}, false))"
# The batch's rows to upsert: one per request, in key order, with its decision and the
# locked row's task id; the batch's one moment, read after every lock.
_ROWS = (
    "(SELECT r.*, c.t, coalesce(prev.a, '') AS a, prev.ptid FROM r LEFT JOIN prev ON "
    f"prev.n = r.n, (SELECT {NOW} AS t, count(*) FROM prev) AS c) AS lf "
    "ORDER BY lf.p, lf.f"
)
# The batch: r holds the requests (n: the ordinal), prev the rows found, each locked by a
# lookup through the unique key, in key order; the answer names each row's ordinal.
#: A batch's requests as rows: one array parameter per PER_ROW field, n the ordinal.
REQUESTS = (
    "SELECT * FROM unnest("
    + ", ".join(f"%({name})s::{kind}[]" for name, kind in PER_ROW.items())
    + f") WITH ORDINALITY AS r({', '.join(PER_ROW)}, n)"
)
BATCH_SQL = f"""
WITH r AS ({REQUESTS}
), prev AS MATERIALIZED (
    SELECT s.*, x.* FROM (SELECT * FROM r ORDER BY p, f) AS s,
    LATERAL (SELECT {_per_row(_LOCKED, "s")}) AS x
), ins AS ({_per_row(_upsert(_ROWS, keys="o.processor_id, o.fingerprint, "), "lf")}
), d AS ({_per_row(_RECORD, "prev")}
), durability AS (
    SELECT {_DURABILITY.format(answered=_ALL_ANSWERED)}
    FROM r LEFT JOIN prev ON prev.n = r.n
)
SELECT r.n, ins.*, coalesce(prev.a, ''), durability.* FROM ins
JOIN r ON r.p = ins.processor_id AND r.f = ins.fingerprint
LEFT JOIN prev ON prev.n = r.n, durability
"""
BATCH_SQL = " ".join(BATCH_SQL.split())
