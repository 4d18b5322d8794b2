"""Scenario ``store``: the claim store per call, against raw-driver floors.

For each backend (PostgreSQL, SQLite, MariaDB) in one process:

* ``claim + complete`` of a new fingerprint, and a ``duplicate claim`` of a
  completed one, through :func:`celery_grousset.store.get_store`;
* the floor a careful team writes by hand on the same database: an autocommit
  ``INSERT … ON CONFLICT DO NOTHING`` (``INSERT OR IGNORE`` / ``INSERT IGNORE``)
  and an ``UPDATE``, prepared where the driver can;
* PostgreSQL only: the store's own SQL sent on a raw psycopg connection (the
  cost of the store's Python around its statements).

Statements per call are counted in the driver (``psycopg.Cursor.execute``,
MySQLdb ``query``/``commit``, SQLite's trace callback): each one is a round
trip on the network backends. Implementations take turns call by call.
Targets: claim + complete <= 1.3 x the PostgreSQL floor; a duplicate claim is one
round trip.
"""

from __future__ import annotations

import hashlib
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench import harness, report

WARMUP = 30
RESULT = b'"ok"'
ENC = "application/json;utf-8"
_count = [0]

FLOOR_DDL = {
    "postgresql": "CREATE TABLE IF NOT EXISTS bench_floor (processor_id text, fingerprint text, "
    "status text NOT NULL, token text NOT NULL, result bytea, "
    "started_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
    "PRIMARY KEY (processor_id, fingerprint))",
    "sqlite": "CREATE TABLE IF NOT EXISTS bench_floor (processor_id text, fingerprint text, "
    "status text NOT NULL, token text NOT NULL, result blob, "
    "started_at text NOT NULL DEFAULT CURRENT_TIMESTAMP, "
    "PRIMARY KEY (processor_id, fingerprint))",
    "mysql": "CREATE TABLE IF NOT EXISTS bench_floor (processor_id varchar(64), "
    "fingerprint char(64), status varchar(16) NOT NULL, token char(32) NOT NULL, "
    "result blob, started_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), "
    "PRIMARY KEY (processor_id, fingerprint))",
}
FLOOR_INSERT = {
    "postgresql": "INSERT INTO bench_floor (processor_id, fingerprint, status, token) "
    "VALUES (%s, %s, 'in_flight', %s) ON CONFLICT DO NOTHING RETURNING 1",
    "sqlite": "INSERT OR IGNORE INTO bench_floor (processor_id, fingerprint, status, token) "
    "VALUES (?, ?, 'in_flight', ?)",
    "mysql": "INSERT IGNORE INTO bench_floor (processor_id, fingerprint, status, token) "
    "VALUES (%s, %s, 'in_flight', %s)",
}
FLOOR_UPDATE = (
    "UPDATE bench_floor SET status = 'done', result = {p} "
    "WHERE processor_id = {p} AND fingerprint = {p} AND token = {p}"
)


def fp(salt: str, i: int) -> str:
    return hashlib.sha256(f"{salt}-{i}".encode()).hexdigest()


@contextmanager
def counting() -> Iterator[None]:
    """Count statements sent by psycopg and MySQLdb (SQLite: trace callbacks)."""
    import MySQLdb.connections
    import psycopg

    originals = (psycopg.Cursor.execute, MySQLdb.connections.Connection.query,
                 MySQLdb.connections.Connection.commit)  # fmt: skip

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            _count[0] += 1
            return fn(*args, **kwargs)

        return counted

    psycopg.Cursor.execute = wrap(originals[0])  # type: ignore[method-assign]
    MySQLdb.connections.Connection.query = wrap(originals[1])
    MySQLdb.connections.Connection.commit = wrap(originals[2])
    try:
        yield
    finally:
        psycopg.Cursor.execute = originals[0]  # type: ignore[method-assign]
        MySQLdb.connections.Connection.query = originals[1]
        MySQLdb.connections.Connection.commit = originals[2]


def _trace(conn: Any) -> None:
    """SQLite: count every statement the connection runs."""

    def cb(_: str) -> None:
        _count[0] += 1

    conn.set_trace_callback(cb)


class Impl:
    """One implementation: ``claim_complete(fp)`` and ``duplicate(fp)``."""

    def __init__(self, label: str, claim_complete: Callable[[str], None],
                 duplicate: Callable[[str], None]) -> None:  # fmt: skip
        self.label = label
        self.claim_complete = claim_complete
        self.duplicate = duplicate
        self.times: dict[str, list[float]] = {"claim + complete": [], "duplicate claim": []}
        self.statements: dict[str, int] = {"claim + complete": 0, "duplicate claim": 0}


def _request(processor: str, f: str) -> Any:
    """One claim request of the benchmark (a new token and task id each time)."""
    from celery_grousset.claim import ClaimRequest

    return ClaimRequest(
        processor_id=processor, fingerprint=f, task_name="bench.grousset",
        task_id=uuid.uuid4().hex, token=uuid.uuid4().hex, worker="bench:1",
        args_repr="('k',)", max_processing_time=60.0, expires_after=3600.0,
        max_takeovers=3,
    )  # fmt: skip


def _store_impl(alias: str, processor: str) -> Impl:
    from celery_grousset.claim import Kind
    from celery_grousset.store import Completion, get_store

    store = get_store(alias)
    done = Completion("completed", RESULT, ENC)

    def claim_complete(f: str) -> None:
        req = _request(processor, f)
        res = store.claim(req)
        store.finish(processor, f, req.token, done)
        assert res.kind is Kind.NEW, res.kind

    def duplicate(f: str) -> None:
        res = store.claim(_request(processor, f))
        assert res.kind is Kind.COMPLETED, res.kind

    return Impl("celery-grousset store", claim_complete, duplicate)


def _floor_impl(vendor: str, conn: Any, processor: str) -> Impl:
    p = "?" if vendor == "sqlite" else "%s"
    insert, update = FLOOR_INSERT[vendor], FLOOR_UPDATE.format(p=p)
    if vendor == "postgresql":

        def claim_complete(f: str) -> None:
            tok = uuid.uuid4().hex
            assert conn.execute(insert, (processor, f, tok), prepare=True).fetchone()
            conn.execute(update, (RESULT, processor, f, tok), prepare=True)

        def duplicate(f: str) -> None:
            assert conn.execute(insert, (processor, f, uuid.uuid4().hex),
                                prepare=True).fetchone() is None  # fmt: skip

    else:
        cur = conn.cursor()

        def claim_complete(f: str) -> None:
            tok = uuid.uuid4().hex
            cur.execute(insert, (processor, f, tok))
            assert cur.rowcount == 1
            cur.execute(update, (RESULT, processor, f, tok))

        def duplicate(f: str) -> None:
            cur.execute(insert, (processor, f, uuid.uuid4().hex))
            assert cur.rowcount == 0

    return Impl(f"raw {vendor} floor (INSERT…DO NOTHING + UPDATE)", claim_complete, duplicate)


def _store_sql_impl(alias: str, conn: Any, processor: str) -> Impl:
    """PostgreSQL: the store's own statements and parameters, sent on a raw psycopg
    connection."""
    from celery_grousset.store import get_store
    from celery_grousset.store.postgresql import CLAIM_SQL, FINISH_SQL, PostgresStore

    store = get_store(alias)
    assert isinstance(store, PostgresStore)

    def claim_complete(f: str) -> None:
        req = _request(processor, f)
        conn.execute(CLAIM_SQL, store.claim_params(req), prepare=True).fetchone()
        done = {"st": "completed", "res": RESULT, "enc": ENC, "err": "", "p": processor,
                "f": f, "tok": req.token}  # fmt: skip
        conn.execute(FINISH_SQL, done, prepare=True)

    def duplicate(f: str) -> None:
        conn.execute(CLAIM_SQL, store.claim_params(_request(processor, f)), prepare=True).fetchone()

    return Impl("store SQL on raw psycopg", claim_complete, duplicate)


def _connect(alias: str) -> tuple[str, Any]:
    """A raw autocommit driver connection to ``alias``' database."""
    from django.db import connections

    s = connections.settings[alias]
    vendor = connections[alias].vendor
    if vendor == "postgresql":
        import psycopg

        conn: Any = psycopg.connect(host=s["HOST"], port=s["PORT"], user=s["USER"],
                                    dbname=s["NAME"], autocommit=True)  # fmt: skip
    elif vendor == "sqlite":
        import sqlite3

        conn = sqlite3.connect(s["NAME"], isolation_level=None, timeout=10)
        conn.execute("PRAGMA journal_mode=WAL")
        _trace(conn)
    else:
        import MySQLdb

        conn = MySQLdb.connect(host=s["HOST"], port=int(s["PORT"]), user="root", passwd="",
                               db=s["NAME"])  # fmt: skip
        conn.autocommit(True)
    return vendor, conn


def _measure(impls: list[Impl], op: str, salt: str, iterations: int) -> None:
    """Call by call, the implementations take turns (rotating order), so a slow
    second on a shared machine hits them all alike."""
    for i in range(iterations):
        k = i % len(impls)
        for impl in impls[k:] + impls[:k]:
            fn = impl.claim_complete if op == "claim + complete" else impl.duplicate
            f = fp(f"{salt}-{impl.label}", i)
            before = _count[0]
            t0 = time.perf_counter()
            fn(f)
            impl.times[op].append(time.perf_counter() - t0)
            impl.statements[op] += _count[0] - before


def bench_backend(alias: str, iterations: int) -> tuple[str, list[Impl]]:
    harness.truncate(alias)
    vendor, conn = _connect(alias)
    cur = conn.cursor()
    cur.execute(FLOOR_DDL[vendor])
    cur.execute("DELETE FROM bench_floor")
    salt = uuid.uuid4().hex[:8]
    processor = f"bench-{salt}"
    impls = [_store_impl(alias, processor), _floor_impl(vendor, conn, processor)]
    if vendor == "postgresql":
        _, conn2 = _connect(alias)
        impls.append(_store_sql_impl(alias, conn2, f"{processor}-sql"))
    with counting():
        for k, impl in enumerate(impls):  # warm up: connect, prepare
            for f in [fp(f"{salt}w{k}", i) for i in range(WARMUP)]:
                impl.claim_complete(f)
                impl.duplicate(f)
        if vendor == "sqlite":
            from celery_grousset.store import get_store

            _trace(get_store(alias)._conn)
        _measure(impls, "claim + complete", salt, iterations)
        _measure(impls, "duplicate claim", salt, iterations)  # the same, now completed, keys
    conn.close()
    return vendor, impls


FLOOR_LABEL = "raw floor (INSERT…DO NOTHING + UPDATE)"


def run(iterations: int, record: bool) -> dict[str, float]:
    harness.setup_django()
    rows = []
    groups: list[str] = []
    medians: dict[tuple[str, str], float] = {}  # (group, implementation) -> µs
    ratios: dict[str, float] = {}
    notes = []
    for alias in ("postgresql", "default", "mysql"):
        try:
            vendor, impls = bench_backend(alias, iterations)
        except Exception as exc:
            harness.log(f"store {alias}: skipped ({type(exc).__name__}: {exc})")
            continue
        store, floor = impls[0], impls[1]
        for op in ("claim + complete", "duplicate claim"):
            group = f"{vendor}\n{op}"
            groups.append(group)
            floor_med = statistics.median(floor.times[op])
            for impl in impls:
                t = sorted(impl.times[op])
                med = statistics.median(t)
                p99 = t[min(len(t) - 1, int(len(t) * 0.99))]
                label = FLOOR_LABEL if impl is floor else impl.label
                medians[(group, label)] = med * 1e6
                ratios[f"{vendor}:{op}:{label}"] = med / floor_med
                rows.append([vendor, op, label, f"{med * 1e6:.0f}", f"{p99 * 1e6:.0f}",
                             f"{impl.statements[op] / len(t):.2f}",
                             f"{med / floor_med:.2f}x"])  # fmt: skip
        if vendor == "postgresql":
            r = ratios[f"postgresql:claim + complete:{store.label}"]
            dup = store.statements["duplicate claim"] / len(store.times["duplicate claim"])
            notes.append(
                f"PostgreSQL claim + complete: {r:.2f}x the raw floor (target <= 1.30x): "
                f"{'met' if r <= 1.3 else 'NOT met'}"
            )
            notes.append(
                f"PostgreSQL duplicate claim: {dup:.2f} round trips (target 1): "
                f"{'met' if dup <= 1.0 else 'NOT met'}"
            )
    labels = list(dict.fromkeys(label for _, label in medians))
    series = {lab: [medians.get((g, lab), float("nan")) for g in groups] for lab in labels}
    headers = ["backend", "operation", "implementation", "µs/call (median)", "p99 µs",
               "statements/call", "vs floor"]  # fmt: skip
    plot = report.bar_plot("store", groups, series, "µs per call (median)",
                           f"Claim store per call, {iterations} calls each")  # fmt: skip
    params = {"calls per measurement": iterations, "order": "interleaved call by call"}
    report.emit("store", params, headers, rows, plot, record, notes)
    return ratios
