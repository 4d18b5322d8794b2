"""The journal sessions waiting on a row lock, as the tests that hold one see them."""

from __future__ import annotations

#: the sessions of this test database waiting on a row lock, by the client's address
LOCK_WAITERS = {
    "postgresql": "SELECT client_port FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
    "AND datname = current_database()",
    # (a claim waiting on the row in MariaDB's optimizer is not listed in INNODB_TRX: a
    # statement on the journal running past 200 ms is taken for one waiting on its lock)
    "mysql": "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() "
    "AND DB = DATABASE() AND INFO LIKE '%%celery_grousset_outcome%%' AND TIME_MS > 200",
}


def lock_waiters(alias: str) -> list[str]:
    """The client addresses (a port, or ``host:port``) of the sessions waiting on a row
    lock in ``alias``'s database; asked on the lock holder's own session (PostgreSQL's
    activity view is read afresh, not from the transaction's snapshot)."""
    from django.db import connections

    vendor = connections[alias].vendor
    with connections[alias].cursor() as cur:
        if vendor == "postgresql":
            cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute(LOCK_WAITERS[vendor])
        return [str(row[0]) for row in cur.fetchall() if row[0]]
