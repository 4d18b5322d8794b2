"""The conversion back (``grousset_partition revert``, PostgreSQL; docs/scale.md,
"Converting back"): the partitioned journal becomes the single table its migrations
make, every key keeping its row, its fence and its decision, and the layout's
functions gone."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management.base import CommandError
from django.db import connections

from celery_grousset.claim import Kind
from celery_grousset.models import Outcome
from celery_grousset.store import get_store, pgpartops, reset_stores
from tests import services
from tests.test_partition import layout, req, run, three_keys

ALIAS = services.CONVERTED
TABLE = "celery_grousset_outcome"


def schema(alias: str) -> dict[str, Any]:
    """What the journal table is: columns by name (type, null, default, identity; their
    order is the model's after a revert, the migrations' before), keys and indexes by
    name, storage parameters, partitioning; and the layout's functions."""
    conn = connections[alias]
    with conn.cursor() as cur:
        cur.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull, attidentity, "
            "pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute AS a LEFT JOIN pg_attrdef AS d "
            "ON d.adrelid = a.attrelid AND d.adnum = a.attnum WHERE a.attrelid = %s::regclass "
            "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attname",
            [TABLE],
        )
        columns = cur.fetchall()
        cur.execute(
            "SELECT indexname, regexp_replace(indexdef, ' ON .* USING ', ' USING ') "
            "FROM pg_indexes WHERE tablename = %s ORDER BY indexname",
            [TABLE],
        )
        indexes = cur.fetchall()
        cur.execute("SELECT relkind, reloptions FROM pg_class WHERE oid = %s::regclass", [TABLE])
        kind, options = cur.fetchone()
        cur.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'grousset%%' ORDER BY 1")
        functions = [name for (name,) in cur.fetchall()]
        constraints = conn.introspection.get_constraints(cur, TABLE)
    return {"columns": columns, "indexes": indexes, "kind": kind, "options": options,
            "functions": functions, "constraints": constraints}  # fmt: skip


def test_revert_gives_back_the_migrated_table_with_every_row(single: str, processor: str) -> None:
    migrated = schema(single)
    assert migrated["kind"] == "r" and migrated["functions"] == []
    # Given a journal prepared and converted (its rows one past generation), then claimed
    # on the partitioned layout: a completed key, an in-flight one, a new one
    store = get_store(single)
    first, done, flying, _idle = three_keys(store, processor)
    run("grousset_partition", "prepare", "--generation", "3600", database=single)
    run("grousset_partition", "convert", database=single)
    with layout(single):
        reset_stores()
        part = get_store(single)
        assert part.claim(req(processor, done.fingerprint)).kind is Kind.COMPLETED  # it moves
        later = req(processor)
        assert part.claim(later).kind is Kind.NEW
        with connections[single].cursor() as cur:
            cur.execute(f"SELECT count(DISTINCT gen) FROM {TABLE}")
            assert cur.fetchone()[0] == 2  # the rows in two generations
    assert schema(single)["kind"] == "p"
    before = {o.fingerprint: o for o in Outcome.objects.using(single)}
    # When it is reverted
    text = run("grousset_partition", "revert", database=single)
    assert "(4 rows copied)" in text and "'JOURNAL_LAYOUT'] = 'table'" in text
    # Then the table is the one the migrations made: columns, identity, keys, indexes,
    # fill factor; the generations and the layout's functions are gone
    assert schema(single) == migrated
    assert not [t for t in connections[single].introspection.table_names() if f"{TABLE}_" in t]
    # And every row is as it was (ids, fences, decisions)
    after = {o.fingerprint: o for o in Outcome.objects.using(single)}
    fields = [f.attname for f in Outcome._meta.concrete_fields]
    assert {fp: [getattr(o, f) for f in fields] for fp, o in after.items()} == {
        fp: [getattr(o, f) for f in fields] for fp, o in before.items()
    }
    # And the single-table store answers each key's decision; a new key gets the next id
    reset_stores()
    table = get_store(single)
    memo = table.claim(req(processor, done.fingerprint))
    assert memo.kind is Kind.COMPLETED and memo.fence == first.fence and memo.result == b'"ok"'
    assert table.claim(req(processor, flying.fingerprint)).kind is Kind.IN_FLIGHT
    assert table.claim(req(processor, later.fingerprint)).kind is Kind.IN_FLIGHT
    new = req(processor)
    assert table.claim(new).kind is Kind.NEW
    assert Outcome.objects.using(single).get(fingerprint=new.fingerprint).id > max(
        o.id for o in before.values()
    )
    # And reverting again is refused; converting again works (the round trip)
    with pytest.raises(CommandError, match="not partitioned: nothing to revert"):
        run("grousset_partition", "revert", database=single)
    assert "(5 rows copied)" in run("grousset_partition", "convert", database=single)
    assert pgpartops.is_partitioned(single)


def test_revert_refuses_a_journal_above_max_rows_and_leaves_it(single: str, processor: str) -> None:
    # Given a converted journal of three keys
    store = get_store(single)
    keys = [req(processor) for _ in range(3)]
    for key in keys:
        store.claim(key)
    run("grousset_partition", "convert", "--generation", "3600", database=single)
    # When revert may copy at most two rows
    with pytest.raises(CommandError, match="more than 2 rows to copy in one transaction"):
        run("grousset_partition", "revert", "--max-rows", "2", database=single)
    # Then the journal is still partitioned, its rows and its claims as they were
    assert pgpartops.is_partitioned(single)
    with layout(single):
        reset_stores()
        part = get_store(single)
        assert [part.claim(req(processor, k.fingerprint)).kind for k in keys] == [
            Kind.IN_FLIGHT
        ] * 3
    reset_stores()


def test_revert_refuses_a_journal_whose_columns_are_not_the_models(single: str) -> None:
    # Given a converted journal with a column the model does not have
    run("grousset_partition", "convert", database=single)
    with connections[single].cursor() as cur:
        cur.execute(f"ALTER TABLE {TABLE} ADD COLUMN extra int")
    # When it is reverted, the refusal names the columns and the fix, and nothing changes
    with pytest.raises(CommandError, match=r"'extra'.*run `manage.py migrate celery_grousset"):
        run("grousset_partition", "revert", database=single)
    assert pgpartops.is_partitioned(single)


def test_a_single_table_left_with_the_layouts_functions_is_named_as_the_other_layout(
    single: str, processor: str
) -> None:
    """``migrate celery_grousset zero`` on a partitioned journal drops the table, not the
    layout's functions; migrated again, the single table met a partitioned store's claim
    with "its migrations are not all applied" (a review), which `migrate` cannot fix."""
    from celery_grousset.exceptions import StoreUnavailable

    # Given a journal converted, then migrated to zero and back (the functions stay)
    run("grousset_partition", "convert", database=single)
    run("migrate", "celery_grousset", "zero", database=single)
    run("migrate", "celery_grousset", database=single)
    assert schema(single)["kind"] == "r" and schema(single)["functions"]
    # When a worker whose JOURNAL_LAYOUT is 'partitioned' claims on it
    with layout(single):
        reset_stores()
        with pytest.raises(StoreUnavailable) as refused:
            get_store(single).claim(req(processor))
    # Then it is told the layouts differ, and how to make them one
    text = str(refused.value)
    assert "JOURNAL_LAYOUT'] is 'partitioned'" in text and "single table" in text, text
    assert "grousset_partition convert" in text and "not all applied" not in text, text


def test_a_table_dropped_by_hand_names_the_fix_that_migrate_alone_is_not(single: str) -> None:
    """With its migrations recorded, a journal table dropped by hand was met with "run
    `migrate`", which then applies nothing (a review): the advice went in a circle."""
    from django.core import checks

    from celery_grousset.exceptions import StoreUnavailable
    from celery_grousset.journal_check import journal_messages

    # Given the journal's table dropped, its migrations still recorded
    with connections[single].cursor() as cur:
        cur.execute(f"DROP TABLE {TABLE} CASCADE")
    # When a claim meets it, and the checks look at it
    reset_stores()
    with pytest.raises(StoreUnavailable) as refused:
        get_store(single).claim(req("p"))
    found = [m for m in journal_messages(single, "table") if m.id == "celery_grousset.W009"]
    # Then both say to forget the recorded migrations first, then migrate
    for text in (str(refused.value), f"{found[0].msg} {found[0].hint}" if found else ""):
        assert f"migrate celery_grousset zero --fake --database {single}" in text, text
        assert "recorded as applied" in text, text
    assert isinstance(found[0], checks.Warning)
