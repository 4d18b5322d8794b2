"""The PostgreSQL store finds a claim's row through the unique key, whatever the statistics.

A journal that is new or was just truncated has no statistics. The admin's
``(processor_id, started_at)`` index then costs the same as the unique key
``(fingerprint, processor_id)`` for ``processor_id = $1 AND fingerprint = $2``,
and a generic plan that picks it scans every row of the processor on each claim
(measured: 0.67 ms at 1,500 rows, growing with the table). The statements are
planned here, generic, against an un-analysed copy of the journal with the same
indexes, and every index they scan must be the unique key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests import services

ROWS = 1500


def _positional(sql: str) -> tuple[str, list[str]]:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, sql), names


def _index_scans(plan: Any) -> Iterator[str]:
    if isinstance(plan, dict):
        if "Index Name" in plan:
            yield plan["Index Name"]
        for value in plan.values():
            yield from _index_scans(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from _index_scans(value)


_FILL = (
    "INSERT INTO celery_grousset_outcome (processor_id, fingerprint, task_name, "
    "task_id, status, fence, claim_token, started_at, stale_at, expires_on, deliveries, "
    "takeovers, result_encoding, error, worker, args_repr) "
    "SELECT 'p', md5(i::text) || md5(i::text), 't', i::text, 'completed', 1, "
    "md5(i::text), now(), now(), now(), 1, 0, '', '', 'w', '' "
    f"FROM generate_series(1, {ROWS}) AS i"
)
_SHADOW = (
    "CREATE TEMP TABLE celery_grousset_outcome (LIKE public.celery_grousset_outcome INCLUDING ALL)"
)


@pytest.fixture
def unanalysed_journal() -> Iterator[Any]:
    services.require_database("postgresql")
    import psycopg

    from celery_grousset.store import get_store

    store = get_store("postgresql")
    with psycopg.connect(**store._params(), autocommit=True) as conn:  # type: ignore[attr-defined]
        conn.execute("SET plan_cache_mode = force_generic_plan")
        # pg_temp comes first on the search path: this copy shadows the real journal
        conn.execute(_SHADOW)
        conn.execute(_FILL)
        yield conn


@pytest.mark.parametrize("statement", ["CLAIM_SQL", "FINISH_SQL", "RELEASE_SQL"])
def test_statements_use_the_unique_key_without_statistics(
    unanalysed_journal: Any, statement: str
) -> None:
    from celery_grousset.store import postgresql

    values = {"p": "'p'", "f": "'x'", "tok": "'t'", "mpt": "'60 s'", "exp": "'3600 s'", "maxt": "3"}
    _assert_unique_key(unanalysed_journal, statement, getattr(postgresql, statement), values)


def _assert_unique_key(conn: Any, statement: str, sql: str, values: dict[str, str]) -> None:
    """Every index the generic plan of ``sql`` scans is the unique key (``values``: the
    parameters' literals; the others NULL)."""
    sql, names = _positional(sql)
    conn.execute(f"PREPARE plan_probe AS {sql}")
    args = ", ".join(values.get(name, "NULL") for name in names)
    (plan,) = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE plan_probe({args})").fetchone()
    scans = list(_index_scans(plan if isinstance(plan, list) else json.loads(plan)))
    assert scans, f"{statement} scans no index: {plan}"
    assert all("fingerprint" in name for name in scans), f"{statement} scans {scans}"


@pytest.fixture
def unanalysed_django_journal() -> Iterator[Any]:
    """The same copy on Django's own connection (client-side binding: custom plans)."""
    services.require_database("postgresql")
    from django.db import connections

    conn = connections["postgresql"]
    with conn.cursor() as cur:
        cur.execute(_SHADOW)
        cur.execute(_FILL)
    try:
        yield conn
    finally:
        with conn.cursor() as cur:
            cur.execute("DROP TABLE pg_temp.celery_grousset_outcome")


def _explain(conn: Any, sql: str, params: list[Any]) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (plan,) = cur.fetchone()
    return list(_index_scans(plan if isinstance(plan, list) else json.loads(plan)))


def test_key_lookups_outside_the_store_use_the_unique_key(unanalysed_django_journal: Any) -> None:
    from celery_grousset.models import Outcome
    from celery_grousset.store.pgops import LOOKUP_SQL

    # by_key: the wait-mode poll, the pytest helpers
    qs = Outcome.objects.db_manager("postgresql").by_key("p", "x").values_list("status")
    sql, params = qs.query.sql_with_params()
    lookups = {
        "by_key": _explain(unanalysed_django_journal, sql, list(params)),
        "publish_unique": _explain(
            unanalysed_django_journal,
            LOOKUP_SQL,
            [["x", "y", "z"], "p"],
        ),
    }
    for name, scans in lookups.items():
        assert scans, f"{name} scans no index"
        assert all("fingerprint" in index for index in scans), f"{name} scans {scans}"


def test_the_batch_claim_uses_the_unique_key_without_statistics(unanalysed_journal: Any) -> None:
    from celery_grousset.store import pgclaim

    values = {"p": "'{p,p}'", "f": "'{x,y}'", "tok": "'{t,u}'", "maxt": "'{3,3}'"}
    _assert_unique_key(unanalysed_journal, "BATCH_SQL", pgclaim.BATCH_SQL, values)
