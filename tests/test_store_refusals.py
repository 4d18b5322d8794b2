"""A journal database that refuses the store's writes for a reason of its own (a
read-only database or session, a user without the grants) fails closed with an error
that names the problem and the fix, on PostgreSQL and MariaDB."""

from __future__ import annotations

import uuid

import pytest
from django.db import connections

from celery_grousset.claim import ClaimRequest
from celery_grousset.exceptions import StoreUnavailable
from celery_grousset.store import store_class
from tests import services


def claim_request() -> ClaimRequest:
    return ClaimRequest(
        processor_id=f"test-{uuid.uuid4().hex[:12]}", fingerprint=uuid.uuid4().hex * 2,
        task_name="t", task_id="id", token="tok", worker="w", args_repr="",
        max_processing_time=60.0, expires_after=3600.0, max_takeovers=3,
    )  # fmt: skip


@pytest.mark.parametrize("alias", ["postgresql", "mysql"])
def test_a_read_only_journal_is_named_with_its_fix(alias: str) -> None:
    services.require_database(alias)
    settings = connections.settings[alias]
    store = store_class(settings["ENGINE"])(alias, settings, 5.0)
    try:
        store.claim(claim_request())  # connected
        # Given the store's session turned read-only (a replica, a read-only mode)
        if store.vendor == "postgresql":
            from celery_grousset.store.pgdriver import driver

            driver().execute(store._conn, "SET default_transaction_read_only = on", {})
        else:
            store._conn.cursor().execute("SET SESSION TRANSACTION READ ONLY")
        # When a call claims / Then it fails closed, naming the problem and the fix
        with pytest.raises(StoreUnavailable, match=r"refused the write.*read-only.*primary"):
            store.claim(claim_request())
    finally:
        store.close()


def test_a_read_only_journal_met_on_a_fresh_connection_is_named_with_its_fix() -> None:
    """The store's connection broke (a failover), and the one it opened again reached a
    read-only server: the first such error lacked the fix the next ones carried."""
    services.require_database("postgresql")
    settings = connections.settings["postgresql"]
    store = store_class(settings["ENGINE"])("postgresql", dict(settings), 5.0)
    try:
        store.claim(claim_request())  # connected
        # Given the server terminates the connection, and the next one is read-only
        pid = store._conn.info.backend_pid if hasattr(store._conn, "info") else None
        if pid is None:
            pytest.skip("psycopg2: no backend pid on the connection object")
        with connections["postgresql"].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        options = dict(store.settings_dict.get("OPTIONS") or {})
        options["options"] = "-c default_transaction_read_only=on"
        store.settings_dict = {**store.settings_dict, "OPTIONS": options}
        # When a call claims / Then it fails closed, naming the problem and the fix
        with pytest.raises(StoreUnavailable, match=r"refused the write.*read-only.*primary"):
            store.claim(claim_request())
    finally:
        store.close()


def test_a_claim_behind_a_table_lock_fails_closed_within_the_store_timeout() -> None:
    """A claim queued behind a metadata lock (``FLUSH TABLES WITH READ LOCK``, ``LOCK
    TABLES … WRITE``, an ``ALTER`` waiting) waited for the client's read timeout (the
    store timeout + 5 s), and once more on a fresh connection; the statement stayed
    queued on the server. The session's ``lock_wait_timeout`` now bounds it."""
    import time

    import MySQLdb

    services.require_database("mysql")
    settings = connections.settings["mysql"]
    store = store_class(settings["ENGINE"])("mysql", settings, 1.0)
    params = connections["mysql"].get_connection_params()
    holder = MySQLdb.connect(**params)
    try:
        store.claim(claim_request())  # the store's connection is open and warm
        # Given another session holding the journal's table locked for writing
        holder.cursor().execute("LOCK TABLES celery_grousset_outcome WRITE")
        started = time.monotonic()
        # When a claim comes / Then it fails closed within about its store timeout
        with pytest.raises(StoreUnavailable):
            store.claim(claim_request())
        assert time.monotonic() - started < 4.0
    finally:
        holder.cursor().execute("UNLOCK TABLES")
        holder.close()
        store.close()


def test_a_store_session_stalled_mid_transaction_frees_its_row_lock_on_mariadb() -> None:
    """A worker that froze between a claim's statements and its commit (a paused VM, a
    GC pause, a partition) left its session idle in the transaction, holding the row's
    lock until the server's wait_timeout (8 h): no delivery could take the key over at
    stale_at (a review). MariaDB now ends such a session after STORE_TIMEOUT."""
    import time

    services.require_database("mysql")
    settings = connections.settings["mysql"]
    stalled = store_class(settings["ENGINE"])("mysql", settings, 1.0)
    other = store_class(settings["ENGINE"])("mysql", settings, 5.0)
    req = claim_request()
    try:
        stalled.claim(req)  # the row exists; the store's connection is open
        cur = stalled._conn.cursor()
        cur.execute("SELECT VERSION()")
        if "mariadb" not in str(cur.fetchone()[0]).lower():
            pytest.skip("MySQL has no idle_transaction_timeout")
        # Given the store's session stopped mid-transaction, holding the row's lock
        cur.execute("SELECT fence FROM celery_grousset_outcome WHERE processor_id = %s AND "
                    "fingerprint = %s FOR UPDATE", (req.processor_id, req.fingerprint))  # fmt: skip
        cur.fetchall()
        started = time.monotonic()
        # When another worker's store settles the key / Then it gets the row within
        # about the stalled store's timeout, not the server's wait_timeout
        assert other.release(req.processor_id, req.fingerprint, req.token)
        assert time.monotonic() - started < 4.0
    finally:
        stalled.discard()
        other.close()


def test_a_transactional_completion_gone_silent_before_its_commit_frees_its_row_on_mariadb(
) -> None:  # fmt: skip
    """A transactional body's session that went silent between its completion write and
    its commit (a partition, a frozen worker) kept the row's lock until the server's
    wait_timeout (8 h): the key made no progress for hours (a MariaDB outage review).
    Its session is now ended after STORE_TIMEOUT, as on PostgreSQL."""
    import time

    from django.db import DatabaseError, transaction

    from celery_grousset.store import Completion

    services.require_database("mysql")
    settings = connections.settings["mysql"]
    store = store_class(settings["ENGINE"])("mysql", settings, 1.0)
    other = store_class(settings["ENGINE"])("mysql", settings, 5.0)
    req = claim_request()
    if not connections["mysql"].mysql_is_mariadb:
        pytest.skip("MySQL has no idle_transaction_timeout")
    try:
        store.claim(req)
        with pytest.raises(DatabaseError), transaction.atomic(using="mysql"):  # (its end)
            # Given a transactional completion written, its commit not sent yet
            assert store.finish_in_transaction(req, Completion("completed"))
            started = time.monotonic()
            # When its session goes silent while another worker's store settles the key
            # Then that one gets the row within about the timeout (the completion, never
            # committed, is gone with the session), not after its own 5 s
            assert other.release(req.processor_id, req.fingerprint, req.token)
            assert time.monotonic() - started < 4.0
    finally:
        store.end_transactional()
        connections["mysql"].close()
        store.close()
        other.close()


def _idle_limit() -> int:
    """The idle_transaction_timeout of Django's MariaDB session."""
    with connections["mysql"].cursor() as cur:
        cur.execute("SELECT @@SESSION.idle_transaction_timeout")
        return int(cur.fetchone()[0])


def test_the_idle_limit_of_a_transactional_completion_is_put_back_after_its_commit() -> None:
    from django.db import transaction

    from celery_grousset.store import Completion

    services.require_database("mysql")
    settings, conn = connections.settings["mysql"], connections["mysql"]
    if not conn.mysql_is_mariadb:
        pytest.skip("MySQL has no idle_transaction_timeout")
    store = store_class(settings["ENGINE"])("mysql", settings, 1.0)
    req = claim_request()

    try:
        store.claim(req)
        before = _idle_limit()
        # When a transactional completion commits
        with transaction.atomic(using="mysql"):
            assert store.finish_in_transaction(req, Completion("completed"))
            during = _idle_limit()
        store.end_transactional()
        # Then its session was bounded for that transaction only
        assert (before, during, _idle_limit()) == (before, 1, before) and before != 1
    finally:
        store.close()


def test_two_transactional_completions_before_one_put_back_keep_the_sessions_idle_limit(
) -> None:  # fmt: skip
    """The second completion saved the first one's limit as the session's own, and the
    put-back restored that: Django's session kept STORE_TIMEOUT as its idle limit, and a
    later transaction of its own that idled longer lost its session ("Server has gone
    away": the outbox relay's batch, publishing to a broker that is down)."""
    from django.db import transaction

    from celery_grousset.store import Completion

    services.require_database("mysql")
    settings, conn = connections.settings["mysql"], connections["mysql"]
    if not conn.mysql_is_mariadb:
        pytest.skip("MySQL has no idle_transaction_timeout")
    store = store_class(settings["ENGINE"])("mysql", settings, 1.0)
    first, second = claim_request(), claim_request()

    try:
        store.claim(first)
        store.claim(second)
        before = _idle_limit()
        # When two transactional completions commit before their put-back
        for req in (first, second):
            with transaction.atomic(using="mysql"):
                assert store.finish_in_transaction(req, Completion("completed"))
        store.end_transactional()
        # Then the session has its own limit back
        assert (before, _idle_limit()) == (before, before) and before != 1
    finally:
        store.end_transactional()
        store.close()


@pytest.mark.parametrize("alias", ["postgresql", "mysql"])
def test_a_renewal_waits_for_a_row_lock_at_most_the_store_timeout(alias: str) -> None:
    """The renewal of a claim the worker's main process made (a late start) ran on
    Django's connection, whose lock wait is the server's (MariaDB 50 s, PostgreSQL none),
    not STORE_TIMEOUT: a row lock held elsewhere kept the child waiting that long (a
    review)."""
    import dataclasses
    import time

    from django.db import transaction

    from celery_grousset.models import Outcome

    services.require_database(alias)
    settings = connections.settings[alias]
    store = store_class(settings["ENGINE"])(alias, settings, 1.0)
    req = claim_request()
    try:
        store.claim(req)
        assert store.renew(req) and not store.renew(dataclasses.replace(req, token="other"))
        # Given another session holding the claim's row
        with transaction.atomic(using=alias):
            Outcome.objects.using(alias).select_for_update().get(
                processor_id=req.processor_id, fingerprint=req.fingerprint)  # fmt: skip
            started = time.monotonic()
            # When the claim is renewed / Then it fails closed within about the timeout
            with pytest.raises(StoreUnavailable):
                store.renew(req)
            assert time.monotonic() - started < 8.0
    finally:
        store.close()


def test_a_claim_on_a_shared_cache_sqlite_journal_waits_for_its_write_lock() -> None:
    """Django's SQLite test database is in memory, its connections sharing one cache:
    there SQLite answers "database table is locked" at once, without the busy timeout,
    so a claim made while another connection wrote was refused at once (flaky tests
    with two threads), and the refusal said it had waited STORE_TIMEOUT."""
    import sqlite3
    import threading
    import time

    from django.core.management import call_command

    name = f"file:grousset_shared_{uuid.uuid4().hex[:8]}?mode=memory&cache=shared"
    settings = {"ENGINE": "django.db.backends.sqlite3", "NAME": name}
    with services.extra_database("shared", **settings):
        call_command("migrate", "celery_grousset", database="shared", verbosity=0)
        store = store_class(settings["ENGINE"])("shared", connections.settings["shared"], 5.0)
        writer = sqlite3.connect(name, uri=True, isolation_level=None,
                                 check_same_thread=False)  # fmt: skip
        timer = threading.Timer(0.5, lambda: writer.execute("COMMIT"))
        try:
            # Given another connection of the process holding the write lock for 0.5 s
            writer.execute("BEGIN IMMEDIATE")
            timer.start()
            started = time.monotonic()
            # When a claim is made meanwhile / Then it waits for the lock, and is made
            assert store.claim(claim_request()).owned
            assert 0.4 < time.monotonic() - started < 4.0
            # And one that cannot get it in STORE_TIMEOUT says so, truly
            short = store_class(settings["ENGINE"])("shared", connections.settings["shared"],
                                                    0.3)  # fmt: skip
            writer.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"stayed locked for 0\.3 s"):
                short.claim(claim_request())
            assert time.monotonic() - started >= 0.3
            writer.execute("COMMIT")
            short.close()
        finally:
            timer.cancel()
            if timer.is_alive():
                timer.join(5)
            store.close()
            writer.close()


@pytest.mark.parametrize("alias", ["default", "postgresql", "mysql"])
def test_a_claim_waits_its_turn_on_a_shared_store_at_most_the_store_timeout(alias: str) -> None:
    """The greenlets of a gevent worker share their thread's store, one operation at a
    time: behind a claim waiting on a locked row, each waited for all those ahead of it
    (copies of that key took STORE_TIMEOUT each, in turn), past the tasks' hard time
    limit, which gevent enforces: tasks killed before their claim was sent, their
    messages acknowledged, their calls lost (a review: 20 of 20). A claim's turn is now
    waited for at most STORE_TIMEOUT, then refused (the delivery is sent again); a
    completion's is not: an effect ran, and refusing its outcome let a later call take
    the claim over and run it again (a review: protect() under gevent, 2 effects)."""
    import threading
    import time

    from celery_grousset.store import Completion, turns

    services.require_database(alias)
    settings = connections.settings[alias]
    store = store_class(settings["ENGINE"])(alias, settings, 0.5)
    store._lock = threading.RLock()  # (as get_store gives a thread's greenlets)
    held, done = threading.Event(), threading.Event()

    def ahead() -> None:  # an operation ahead, waiting 3 s (six store timeouts)
        with store._lock:
            held.set()
            done.wait(3.0)

    other = threading.Thread(target=ahead)
    other.start()
    try:
        held.wait(5)
        started = time.monotonic()
        # When a claim waits for its turn / Then it is refused after STORE_TIMEOUT
        with pytest.raises(StoreUnavailable, match=r"stayed busy for 0\.5 s"):
            turns.claiming(store.claim, claim_request())
        assert 0.45 < time.monotonic() - started < 2.0
        done.set()
        other.join(5)
        # And once the turn is free, the claim is made
        req = claim_request()
        assert turns.claiming(store.claim, req).owned
        # When its completion waits for its turn behind an operation of 3 s
        held.clear()
        done.clear()
        other = threading.Thread(target=ahead)
        other.start()
        held.wait(5)
        started = time.monotonic()
        # Then it waits as long as it takes, and its outcome is written
        assert store.finish(req.processor_id, req.fingerprint, req.token,
                            Completion("completed"))  # fmt: skip
        assert time.monotonic() - started > 2.0
    finally:
        done.set()
        other.join(5)
        store.close()
