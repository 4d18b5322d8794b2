"""The PostgreSQL store on the driver Django's connection uses — psycopg 3, or psycopg2
(``GROUSSET_TEST_PG_DRIVER=psycopg2``, and the compat stack ``pg2`` that has only
psycopg2): the driver's errors keep their meaning for the guarantee. An outage or a
timeout is StoreUnavailable (fail closed); data the database refuses is
PoisonDelivery (permanent); a session lost while idle is reconnected once."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from celery_grousset.claim import ClaimRequest, Kind
from celery_grousset.exceptions import PoisonDelivery, StoreUnavailable
from celery_grousset.store import Completion
from celery_grousset.store.pgdriver import Driver, Psycopg2, Psycopg3, driver
from celery_grousset.store.postgresql import PostgresStore
from tests import services
from tests.blackhole import blackhole


def make(processor: str, fp: str | None = None) -> ClaimRequest:
    return ClaimRequest(
        processor, fp or uuid.uuid4().hex * 2, "t", uuid.uuid4().hex, uuid.uuid4().hex, "w",
        "", 60.0, 3600.0, 3,
    )  # fmt: skip


@pytest.fixture
def pg() -> Iterator[PostgresStore]:
    """A store of its own on the journal's PostgreSQL (1 s STORE_TIMEOUT)."""
    services.require_database("postgresql")
    store = PostgresStore("postgresql", connections.settings["postgresql"], timeout=1.0)
    yield store
    store.close()


def test_a_row_lock_held_past_the_store_timeout_is_store_unavailable(pg: PostgresStore) -> None:
    processor = f"lock-{uuid.uuid4().hex[:8]}"
    first = make(processor)
    assert pg.claim(first).kind is Kind.NEW
    # Given another session holding the row's lock in an open transaction
    other = driver().connect(pg._params())
    driver().execute(other, "BEGIN")
    driver().execute(
        other, "SELECT 1 FROM celery_grousset_outcome WHERE fingerprint = %s FOR UPDATE",
        (first.fingerprint,),
    )  # fmt: skip
    try:
        # When a claim of that key waits longer than STORE_TIMEOUT / Then it fails closed
        with pytest.raises(StoreUnavailable, match="did not answer within 1 s"):
            pg.claim(make(processor, first.fingerprint))
    finally:
        other.close()
    # And the store's connection still works once the lock is gone
    assert pg.claim(make(processor, first.fingerprint)).kind is Kind.IN_FLIGHT


def test_a_session_terminated_while_idle_is_reconnected_once(pg: PostgresStore) -> None:
    processor = f"term-{uuid.uuid4().hex[:8]}"
    assert pg.claim(make(processor)).kind is Kind.NEW  # connect (and prepare)
    pid = pg._conn.info.backend_pid
    # Given the server ended the store's session (restart, idle timeout, an operator)
    pg.terminate_connection()
    # When the next claim is sent / Then it goes through on a new session
    assert pg.claim(make(processor)).kind is Kind.NEW
    assert pg._conn.info.backend_pid != pid


def test_a_nul_in_a_completion_is_a_permanent_error(pg: PostgresStore) -> None:
    # psycopg2 refuses a NUL before sending (ValueError), PostgreSQL refuses it with
    # psycopg 3 (DataError): both are the data's fault, never an outage.
    processor = f"nul-{uuid.uuid4().hex[:8]}"
    first = make(processor)
    pg.claim(first)
    bad = Completion("failed", None, "", "boom \x00 here")
    with pytest.raises(PoisonDelivery, match="refused the data"):
        pg.finish(processor, first.fingerprint, first.token, bad)
    assert pg.finish(processor, first.fingerprint, first.token, Completion("failed", None, "", "x"))


def test_a_database_without_the_journal_table_says_run_migrate() -> None:
    services.require_database("postgresql")
    # Given a store on a database where the journal was never migrated
    bare = {**connections.settings["postgresql"], "NAME": "postgres"}
    store = PostgresStore("postgresql", bare, timeout=1.0)
    try:
        # When it claims / Then the error names the fix, and it fails closed
        with pytest.raises(StoreUnavailable, match=r"manage\.py migrate celery_grousset"):
            store.claim(make("bare"))
    finally:
        store.close()


def test_a_role_that_may_not_read_pg_settings_still_claims() -> None:
    """The store reads its connection's statement_timeout once, to warn when a pooler
    dropped it: through pg_settings, which some hardenings revoke, every connect failed
    and every claim with it (fail closed, for a warning)."""
    services.require_database("postgresql")
    base = connections.settings["postgresql"]
    admin = services.pg_connect(host=base["HOST"], port=int(base["PORT"]), user="postgres",
                                dbname=base["NAME"])  # fmt: skip
    role = "grousset_no_settings"
    grants = [
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}",
        "REVOKE SELECT ON pg_catalog.pg_settings FROM PUBLIC",
    ]
    try:
        # Given a role that may use the journal but not read pg_settings
        driver().execute(admin, f"DROP ROLE IF EXISTS {role}")
        driver().execute(admin, f"CREATE ROLE {role} LOGIN")
        for sql in grants:
            driver().execute(admin, sql)
        store = PostgresStore("postgresql", {**base, "USER": role}, timeout=1.0)
        try:
            # When its store claims / Then the claim goes through
            assert store.claim(make(f"role-{uuid.uuid4().hex[:8]}")).kind is Kind.NEW
        finally:
            store.close()
    finally:
        driver().execute(admin, "GRANT SELECT ON pg_catalog.pg_settings TO PUBLIC")
        driver().execute(admin, f"DROP OWNED BY {role}")
        driver().execute(admin, f"DROP ROLE IF EXISTS {role}")
        admin.close()


def _behind_the_drivers_back(conn: object, sql: str) -> None:
    """``sql`` on the store's server session, unseen by the driver's own bookkeeping of
    prepared statements (as another client's transaction on a pooled session is)."""
    pgconn = getattr(conn, "pgconn", None)
    if pgconn is not None:  # psycopg 3 clears its cache when it sees DEALLOCATE go by
        assert pgconn.exec_(sql.encode()).error_message == b""
    else:
        conn.cursor().execute(sql)  # type: ignore[attr-defined]


@pytest.mark.parametrize("session", ["lost its statements", "has one under the name"])
def test_a_server_session_that_does_not_keep_prepared_statements_is_served_unprepared(
    session: str,
) -> None:
    """Behind a pooler in transaction mode (PgBouncer), each transaction may run on
    another server session: one without the store's prepared statement ("does not
    exist") or with another client's under its name ("already exists"). The statement
    failed every time: claims and completions never went through, and on psycopg2 a
    completion that kept failing left its claim to be taken over, the effect run twice."""
    services.require_database("postgresql")
    pg = PostgresStore("postgresql", connections.settings["postgresql"], timeout=1.0)
    processor = f"pool-{uuid.uuid4().hex[:8]}"
    first = make(processor)
    try:
        if session == "lost its statements":
            # Given a session that prepared the claim, then lost it
            assert pg.claim(first).kind is Kind.NEW
            _behind_the_drivers_back(pg._conn, "DEALLOCATE ALL")
        elif hasattr(pg._connect(), "pgconn"):
            # Given a session that holds another client's statement under the name
            # psycopg 3 gives its first one
            _behind_the_drivers_back(pg._conn, "PREPARE _pg3_0 AS SELECT 1")
        else:  # psycopg2 names a statement by its hash: another client's is the same
            assert pg.claim(first).kind is Kind.NEW
            pg._conn.prepared.clear()
        # When claims and completions are sent
        req = make(processor)
        done = Completion("completed", b"1", "application/json")
        assert pg.claim(req).kind is Kind.NEW
        assert pg.claim(first).kind in (Kind.NEW, Kind.RESUMED)
        assert pg.finish(processor, req.fingerprint, req.token, done)
        assert pg.finish(processor, first.fingerprint, first.token, done)
        # Then they went through, unprepared from then on
        assert pg.prepare is False
    finally:
        pg.close()


def test_an_alias_that_turns_prepared_statements_off_is_served_unprepared() -> None:
    """psycopg's setting for a pooler, OPTIONS {"prepare_threshold": None}, was dropped
    from the store's connection: it prepared its statements all the same."""
    services.require_database("postgresql")
    settings = connections.settings["postgresql"]
    pooled = {**settings, "OPTIONS": {**settings.get("OPTIONS", {}), "prepare_threshold": None}}
    pg = PostgresStore("postgresql", pooled, timeout=1.0)
    try:
        # When claims and a completion are sent, more than psycopg's threshold of times
        processor = f"nopre-{uuid.uuid4().hex[:8]}"
        for _ in range(6):
            req = make(processor)
            assert pg.claim(req).kind is Kind.NEW
        assert pg.finish(processor, req.fingerprint, req.token,
                         Completion("completed", b"1", "application/json"))  # fmt: skip
        # Then the server session holds no prepared statement
        count = driver().execute(pg._conn, "SELECT count(*) FROM pg_prepared_statements")
        assert count.fetchone()[0] == 0 and pg.prepare is False
    finally:
        pg.close()


def _driver_class(name: str) -> type[Driver]:
    """The driver class ``name``, skipped where it is not installed (the compat stacks)."""
    pytest.importorskip("psycopg" if name == "psycopg" else "psycopg2")
    return Psycopg3 if name == "psycopg" else Psycopg2


#: run in a process of its own (a GIL held forever would stop the test's own process):
#: connect, wait for "go", interrupt while a thread counts; print the two figures
_INTERRUPT_SCRIPT = """
import json, sys, threading, time
from celery_grousset.store import pgdriver
drv = pgdriver.Psycopg3() if sys.argv[1] == "psycopg" else pgdriver.Psycopg2()
conn = drv.connect(json.loads(sys.argv[2]))
print("connected", flush=True)
sys.stdin.readline()
ticks, stop = [0], threading.Event()
def tick():
    while not stop.is_set():
        time.sleep(0.01)
        ticks[0] += 1
threading.Thread(target=tick, daemon=True).start()
t0 = time.monotonic()
drv.interrupt(conn, within=1.0)
print(json.dumps({"elapsed": time.monotonic() - t0, "ticks": ticks[0]}), flush=True)
stop.set()
"""


@pytest.mark.parametrize("name", ["psycopg", "psycopg2"])
def test_an_interrupt_whose_cancel_goes_unanswered_does_not_stop_the_process(
    pg: PostgresStore, name: str
) -> None:
    """libpq's cancel opens a connection of its own and waits for the server with no
    timeout, holding the GIL on both drivers: a server that accepted it and never
    answered (a partition, a frozen postmaster) stopped every thread of the worker."""
    import json
    import subprocess
    import sys

    _driver_class(name)
    settings = connections.settings["postgresql"]
    with blackhole((settings["HOST"] or "127.0.0.1", int(settings["PORT"]))) as proxy:
        params = {**pg._params(), "host": "127.0.0.1", "port": proxy.port, "sslmode": "disable"}
        child = subprocess.Popen(
            [sys.executable, "-c", _INTERRUPT_SCRIPT, name, json.dumps(params)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert child.stdout is not None and child.stdout.readline() == "connected\n"
            # Given new connections to the server accepted and never answered
            proxy.deaf.set()
            # When the process interrupts its connection's statement
            out, _ = child.communicate("go\n", timeout=20)
        finally:
            child.kill()
            child.wait()
    # Then it gives up on the cancel within its wait, its other threads running meanwhile
    figures = json.loads(out)
    assert figures["elapsed"] < 3.0, figures
    assert figures["ticks"] > 30, figures


@pytest.mark.parametrize("by", ["host", "hostaddr"])
@pytest.mark.parametrize("name", ["psycopg", "psycopg2"])
def test_an_interrupt_cancels_the_statement_on_a_server_that_answers(
    pg: PostgresStore, name: str, by: str
) -> None:
    """``hostaddr``: a connection made by address under a host name no resolver knows (a
    name for TLS only) was never cancelled: the probe looked the name up (a review)."""
    import threading
    import time

    drv = _driver_class(name)()
    params = pg._params()
    if by == "hostaddr":
        params = {**params, "host": "db.invalid", "hostaddr": "127.0.0.1", "sslmode": "disable",
                  "port": int(connections.settings["postgresql"]["PORT"])}  # fmt: skip
    conn = drv.connect(params)
    ended: list[BaseException] = []
    pid = drv.execute(conn, "SELECT pg_backend_pid()").fetchone()[0]

    def sleep() -> None:
        try:
            drv.execute(conn, "SET statement_timeout = 0")
            drv.execute(conn, "SELECT pg_sleep(30)")
        except BaseException as exc:
            ended.append(exc)

    def sleeping() -> bool:
        with connections["postgresql"].cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s "
                        "AND wait_event = 'PgSleep'", [pid])  # fmt: skip
            return bool(cur.fetchone()[0])

    try:
        # Given a statement running on the connection
        runner = threading.Thread(target=sleep, daemon=True)
        runner.start()
        deadline = time.monotonic() + 10
        while not sleeping() and time.monotonic() < deadline:
            time.sleep(0.02)
        t0 = time.monotonic()
        # When it is interrupted / Then the server ends it at once
        drv.interrupt(conn)
        runner.join(10)
        assert not runner.is_alive() and time.monotonic() - t0 < 5
        assert len(ended) == 1 and isinstance(ended[0], drv.QueryCanceled), ended
    finally:
        conn.close()


def test_an_outage_error_is_one_line_without_the_servers_context() -> None:
    """The error field of grousset.store_unavailable carried PostgreSQL's CONTEXT line
    (the tuple it was locking) after the message: noise in a log line (a review)."""
    import threading
    import time

    services.require_database("postgresql")
    store = PostgresStore("postgresql", connections.settings["postgresql"], timeout=2.0)
    processor = f"line-{uuid.uuid4().hex[:8]}"
    first = make(processor)
    store.claim(first)
    other = driver().connect(store._params())
    pid = store._conn.info.backend_pid
    try:
        # Given the row locked by another session, and the store's session terminated
        # while its claim waits for that lock
        driver().execute(other, "BEGIN")
        driver().execute(
            other, "SELECT 1 FROM celery_grousset_outcome WHERE fingerprint = %s FOR UPDATE",
            (first.fingerprint,),
        )  # fmt: skip

        def terminate() -> None:
            time.sleep(0.5)
            driver().execute(other, "SELECT pg_terminate_backend(%s)", (pid,))

        threading.Thread(target=terminate, daemon=True).start()
        # When the claim fails / Then its error is one line, naming the outage
        with pytest.raises(StoreUnavailable) as failed:
            store.claim(make(processor, first.fingerprint))
        assert "\n" not in str(failed.value), str(failed.value)
        assert str(failed.value).startswith("journal database 'postgresql': ")
    finally:
        other.close()
        store.close()


def test_the_cancels_probe_over_a_unix_socket_asks_the_path_this_process_knows(
    tmp_path: Any,
) -> None:
    """A Unix socket's peer name is the path the server bound, which may not exist here
    (its directory mounted elsewhere in a container): the probe asked it and the cancel
    was never sent (a review)."""
    import os
    import socket
    import threading

    from celery_grousset.store.pgdriver import answers

    services.require_database("postgresql")
    settings = connections.settings["postgresql"]
    bound, mounted = tmp_path / "server-side", tmp_path / "client-side"
    bound.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(bound / ".s.PGSQL.5432"))
    listener.listen(8)

    def relay() -> None:  # each connection to the real server's TCP port
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                server = socket.create_connection((settings["HOST"] or "127.0.0.1",
                                                   int(settings["PORT"])))  # fmt: skip
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=relay, daemon=True).start()
    # Given the server's socket directory known here under another path
    os.rename(bound, mounted)
    drv = driver()
    params = {**PostgresStore("postgresql", settings, timeout=2.0)._params(),
              "host": str(mounted), "port": 5432}  # fmt: skip
    conn = drv.connect(params)
    try:
        # When the cancel's probe asks whether the server answers / Then it does
        assert answers(conn, 1.0)
    finally:
        conn.close()
        listener.close()


def _pipe(source: Any, sink: Any) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
