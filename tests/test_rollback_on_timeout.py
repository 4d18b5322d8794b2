"""A MariaDB server started with ``innodb_rollback_on_timeout``: a lock wait timeout
rolls the whole transaction back, not one statement. A transactional body that caught
one without a savepoint went on in a new transaction, and the guard committed its
later writes with the completion: the effect's earlier writes were lost, the journal
said completed, and duplicates got the memo (a review). It is now a conflict that
ended the transaction (celery_grousset/txbody.py): nothing commits, the call runs again.

The server is this test's own (the option is read at start-up only), on a port of its
own, removed at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import OperationalError, connections

from celery_grousset import protect
from celery_grousset.exceptions import TransactionLost
from celery_grousset.models import Outcome
from tests import services

pytestmark = pytest.mark.slow

MARIADBD = "/usr/sbin/mariadbd"
ALIAS = "rollback_on_timeout"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """A MariaDB server of its own with innodb_rollback_on_timeout, and its port."""
    if not (os.path.exists(MARIADBD) and shutil.which("mariadb-install-db")):
        if os.environ.get("CI"):
            pytest.fail("mariadbd is not installed (scripts/apt-deps.sh installs it)")
        pytest.skip("mariadbd is not installed")
    data = tempfile.mkdtemp(prefix="grousset-rbt-")
    port = _free_port()
    log = open(os.path.join(data, "server.log"), "w")  # noqa: SIM115 - closed below
    proc = None
    try:
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}/db",
                        "--user=root", "--skip-test-db",
                        "--auth-root-authentication-method=normal"],
                       check=True, stdout=log, stderr=log, timeout=120)  # fmt: skip
        proc = subprocess.Popen(
            [MARIADBD, "--no-defaults", f"--datadir={data}/db", f"--port={port}",
             f"--socket={data}/sock", f"--pid-file={data}/pid", "--bind-address=127.0.0.1",
             "--user=root", "--innodb-rollback-on-timeout=ON", "--skip-log-bin",
             "--innodb-buffer-pool-size=32M"],
            stdout=log, stderr=log,
        )  # fmt: skip
        import MySQLdb

        deadline = time.monotonic() + 60
        while True:
            try:
                MySQLdb.connect(host="127.0.0.1", port=port, user="root").close()
                break
            except MySQLdb.OperationalError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield port
    finally:
        if proc is not None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            if proc.poll() is None:
                proc.kill()
        log.close()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def alias(server: int) -> Iterator[str]:
    """A journal database on that server, migrated."""
    import MySQLdb
    from django.conf import settings
    from django.core.management import call_command

    name = "grousset_rbt"
    conn = MySQLdb.connect(host="127.0.0.1", port=server, user="root")
    conn.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    conn.close()
    config = {**connections.settings["mysql"], "NAME": name, "PORT": str(server)}
    config["TEST"] = {**config.get("TEST", {}), "NAME": name}
    settings.DATABASES[ALIAS] = config
    connections.settings[ALIAS] = config
    try:
        call_command("migrate", "celery_grousset", database=ALIAS, verbosity=0)
        with connections[ALIAS].cursor() as cur:
            cur.execute("CREATE TABLE parts (k VARCHAR(64), part INT) ENGINE=InnoDB")
            cur.execute("CREATE TABLE busy (id INT PRIMARY KEY) ENGINE=InnoDB")
            cur.execute("INSERT INTO busy VALUES (1)")
        yield ALIAS
    finally:
        from celery_grousset.store import get_store

        with contextlib.suppress(Exception):
            get_store(ALIAS).close()
        connections[ALIAS].close()
        connections.settings.pop(ALIAS, None)  # (Django's dict may be the setting's own)
        settings.DATABASES.pop(ALIAS, None)


def _parts(alias: str, key: str) -> list[int]:
    with connections[alias].cursor() as cur:
        cur.execute("SELECT part FROM parts WHERE k = %s ORDER BY part", [key])
        return [row[0] for row in cur.fetchall()]


def test_a_caught_lock_wait_timeout_that_rolled_the_transaction_back_commits_nothing(
    server: int, alias: str
) -> None:
    import MySQLdb

    key = f"rbt-{uuid.uuid4().hex[:8]}"
    holder = MySQLdb.connect(host="127.0.0.1", port=server, user="root", db="grousset_rbt")
    holder.autocommit(False)
    holder.cursor().execute("SELECT id FROM busy WHERE id = 1 FOR UPDATE")

    def body() -> str:
        with connections[alias].cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            cur.execute("INSERT INTO parts VALUES (%s, 1)", [key])  # part 1 of the effect
            with contextlib.suppress(OperationalError):  # an optional step, on a row
                cur.execute("SELECT id FROM busy WHERE id = 1 FOR UPDATE")  # held: given up
            cur.execute("INSERT INTO parts VALUES (%s, 2)", [key])  # part 2
        return "done"

    try:
        # Given a server that rolls a transaction back on a lock wait timeout
        # When a transactional body catches one and goes on
        with pytest.raises(TransactionLost, match="Lock wait timeout"):
            protect(key, body, max_processing_time=30, database=alias, transactional=True,
                    processor_id=f"t-{uuid.uuid4().hex[:8]}")  # fmt: skip
    finally:
        holder.rollback()
        holder.close()
    # Then nothing of it committed (not part 2 alone), and its claim is not completed
    assert _parts(alias, key) == []
    assert not Outcome.objects.using(alias).filter(status="completed", args_repr__contains=key)


def test_the_setting_is_read_with_or_without_the_store_s_connection(alias: str) -> None:
    """The store reads the setting with its connection's facts; a store that has not
    connected yet (a claim the worker's main process made) asks Django's connection."""
    from celery_grousset.store import store_class

    settings = connections.settings[alias]
    fresh = store_class(settings["ENGINE"])(alias, settings, 5.0)
    assert fresh.ends_on_lock_timeout() is True and fresh.max_packet is None
    fresh.probe()  # (connected: its facts read)
    assert fresh.max_packet is not None and fresh.ends_on_lock_timeout() is True
    fresh.close()
    services.require_database("mysql")
    default = store_class(settings["ENGINE"])("mysql", connections.settings["mysql"], 5.0)
    assert default.ends_on_lock_timeout() is False  # (the shared server: the default)
