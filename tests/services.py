"""Real services for the tests: prepare databases, skip locally / fail in CI."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import pytest

CI = bool(os.environ.get("CI"))
_prepared: dict[str, str | None] = {}


def unavailable(what: str, why: str) -> NoReturn:
    msg = f"{what} is not available ({why})"
    if CI:
        pytest.fail(f"{msg}; CI is set, so this is a failure, not a skip", pytrace=False)
    pytest.skip(msg)


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pg_connect(**params: object) -> Any:
    """An autocommit connection on the driver Django's backend uses (psycopg 3 or 2)."""
    from celery_grousset.store.pgdriver import driver

    return driver().connect(params)


def _recreate_postgresql(settings: dict[str, object]) -> None:
    from celery_grousset.store.pgdriver import driver

    name = str(settings["NAME"])
    conn = pg_connect(
        host=str(settings["HOST"]),
        port=int(str(settings["PORT"])),
        user=str(settings["USER"]),
        dbname="postgres",
        connect_timeout=3,
    )
    try:
        driver().execute(conn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        driver().execute(conn, f'CREATE DATABASE "{name}"')
    finally:
        conn.close()


def _recreate_mysql(settings: dict[str, object]) -> None:
    import MySQLdb

    name = str(settings["NAME"])
    conn = MySQLdb.connect(
        host=str(settings["HOST"]),
        port=int(str(settings["PORT"])),
        user="root",
        passwd="",
        connect_timeout=3,
    )
    try:
        cur = conn.cursor()
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    finally:
        conn.close()


def drop_database(vendor: str, name: str) -> None:
    """Drop a scratch database a test made on the PostgreSQL or MySQL test server."""
    if vendor == "postgresql":
        from celery_grousset.store.pgdriver import driver

        conn = pg_connect(host="127.0.0.1", user="postgres", dbname="postgres", connect_timeout=3)
        try:
            driver().execute(conn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            conn.close()
        return
    import MySQLdb

    conn = MySQLdb.connect(host="127.0.0.1", user="root", passwd="", connect_timeout=3)
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def _recreate_sqlite(settings: dict[str, object]) -> None:
    name = str(settings["NAME"])
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name + suffix)


def prepare(alias: str) -> str | None:
    """Create a fresh database for ``alias`` and migrate it; return an error or None."""
    from django.core.management import call_command
    from django.db import connections

    from celery_grousset.store import reset_stores

    settings = connections.settings[alias]
    engine = settings["ENGINE"]
    try:
        if "postgresql" in engine:
            if not port_open(settings["HOST"], int(settings["PORT"])):
                return f"nothing listens on {settings['HOST']}:{settings['PORT']}"
            _recreate_postgresql(settings)
        elif "mysql" in engine:
            if not port_open(settings["HOST"], int(settings["PORT"])):
                return f"nothing listens on {settings['HOST']}:{settings['PORT']}"
            _recreate_mysql(settings)
        else:
            _recreate_sqlite(settings)
        connections[alias].close()
        reset_stores()
        call_command("migrate", database=alias, verbosity=0, interactive=False)
        if "sqlite" in engine:
            with connections[alias].cursor() as cur:
                cur.execute("PRAGMA journal_mode=WAL")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def require_database(alias: str) -> None:
    if alias not in _prepared:
        _prepared[alias] = prepare(alias)
    error = _prepared[alias]
    if error:
        unavailable(f"database {alias!r}", error)


#: the partitioned journal's alias, and the width of its generations (an hour: a row aged
#: by more than that in the contract tests is past the purge's straggler cutoff)
PARTITIONED = "pgpart"
#: the database the conversions' tests convert and revert (fresh for each: ``single``)
CONVERTED = "pgconvert"
GENERATION_SECONDS = 3600


def require_partitioned() -> str:
    """A fresh PostgreSQL journal converted to the partitioned layout (once per session)."""
    require_database(PARTITIONED)
    if "converted" not in _prepared:
        from django.core.management import call_command

        try:
            call_command("grousset_partition", "convert", database=PARTITIONED,
                         generation=GENERATION_SECONDS, verbosity=0)  # fmt: skip
            _prepared["converted"] = None
        except Exception as exc:
            _prepared["converted"] = f"{type(exc).__name__}: {exc}"
    if _prepared["converted"]:
        pytest.fail(f"converting {PARTITIONED!r} failed: {_prepared['converted']}")
    return PARTITIONED


def require_redis() -> str:
    url = os.environ.get("GROUSSET_TEST_BROKER", "redis://127.0.0.1:6379/14")
    if not port_open("127.0.0.1", 6379):
        unavailable("Redis", "nothing listens on 127.0.0.1:6379")
    return url


def require_rabbitmq() -> str:
    if not port_open("127.0.0.1", 5672):
        unavailable("RabbitMQ", "nothing listens on 127.0.0.1:5672")
    return "amqp://guest:guest@127.0.0.1:5672//"


@contextmanager
def extra_database(alias: str, **settings: Any) -> Iterator[None]:
    """An extra database alias visible to the checks (DATABASES is not re-read on
    override_settings), removed afterwards with the stores opened meanwhile."""
    from django.db import connections

    from celery_grousset.store import reset_stores

    old = connections.settings
    default = {**old["default"]}
    full = connections.configure_settings({"default": default, alias: settings})[alias]
    connections.settings = {**old, alias: full}
    try:
        yield
    finally:
        # (asgiref's Local keeps the connections out of __dict__: close and forget it, or
        # the next use of the alias would get this one back, on the old settings)
        made = getattr(connections._connections, alias, None)  # type: ignore[attr-defined]
        if made is not None:
            made.close()
            del connections[alias]
        connections.settings = old
        reset_stores()


def cut_broker_clients(redis_url: str, pid: int | None = None) -> int:
    """Kill the clients of the broker's Redis database but this one (a lost broker
    connection, as the workers see it): only process ``pid``'s when given (a test's own
    worker: cutting every client also cut the workers of the tests running beside it,
    whose broadcast subscription, revoke's, did not come back); how many were killed
    (at least one)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    db = client.connection_pool.connection_kwargs.get("db", 0)
    mine = client.client_id()
    ports = None if pid is None else _local_ports(pid)
    cut = [c["id"] for c in client.client_list() if int(c["db"]) == db and c["id"] != mine
           and (ports is None or int(str(c["addr"]).rsplit(":", 1)[1]) in ports)]  # fmt: skip
    for client_id in cut:
        client.client_kill_filter(_id=client_id)
    assert cut, "no client of the broker's database to cut"
    return len(cut)


def _local_ports(pid: int) -> set[int]:
    """The local TCP ports of process ``pid``'s sockets (Linux: /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as fh:
            for line in fh.read().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
