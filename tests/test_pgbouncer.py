"""The journal behind a real PgBouncer (Debian's ``pgbouncer``; scripts/apt-deps.sh), as
docs/configuration.md, "PgBouncer and other poolers", describes it:

* by default PgBouncer refuses the store's startup ``options`` (its timeouts), in session
  and transaction mode alike: every claim fails closed, and ``check --database``
  (``W013``) and the worker's start say so, with the fix, although Django's own
  connection works;
* with ``ignore_startup_parameters = options`` the store connects, logs that the server
  no longer applies its timeouts, and a call still runs once: the 8-process race.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from django.test import override_settings

from celery_grousset import protect
from celery_grousset.exceptions import StoreUnavailable
from tests import services
from tests.ledger.models import Effect
from tests.racer import race, run_racers
from tests.settings import bouncer_database

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def bouncer() -> Iterator[Callable[..., int]]:
    """``start(mode, ignore="")``: a PgBouncer in front of the suite's PostgreSQL; its port."""
    if not os.path.exists(BINARY):
        services.unavailable("PgBouncer", f"no {BINARY}: run scripts/apt-deps.sh")
    services.require_database("postgresql")
    started: list[subprocess.Popen[bytes]] = []
    home = tempfile.mkdtemp(prefix="grousset-pgbouncer-")
    os.chmod(home, 0o755)  # read by the unprivileged user PgBouncer runs as under root

    def start(mode: str, ignore: str = "") -> int:
        port = _free_port()
        ini = os.path.join(home, f"{port}.ini")
        with open(os.path.join(home, "users.txt"), "w") as users:
            users.write('"postgres" ""\n')
        with open(ini, "w") as conf:
            conf.write(
                "[databases]\n* = host=127.0.0.1 port=5432\n[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
                f"auth_type = trust\nauth_file = {home}/users.txt\npool_mode = {mode}\n"
                f"ignore_startup_parameters = {ignore}\n"
            )
        for name in os.listdir(home):
            os.chmod(os.path.join(home, name), 0o644)
        user = ["-u", "postgres"] if os.geteuid() == 0 else []
        proc = subprocess.Popen([BINARY, *user, ini], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        started.append(proc)
        deadline = time.monotonic() + 10
        while not services.port_open("127.0.0.1", port, timeout=0.2):
            assert proc.poll() is None, f"pgbouncer exited with {proc.returncode}"
            assert time.monotonic() < deadline, "pgbouncer did not listen within 10 s"
            time.sleep(0.05)
        return port

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_a_pooler_that_refuses_the_store_fails_closed_and_says_so(
    bouncer: Callable[..., int], mode: str, processor: str, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_grousset.journal_check import journal_messages
    from celery_grousset.startcheck import log_schema_problems

    # Given the journal's alias through a PgBouncer left at its defaults
    port = bouncer(mode)
    alias = f"bouncer_{mode}"
    ran: list[str] = []
    with services.extra_database(alias, **bouncer_database(port)):
        # When a guarded call runs there: it fails closed, the effect never runs, and the
        # error names the pooler and the fix
        with pytest.raises(StoreUnavailable) as failed:
            protect("k", ran.append, "effect", max_processing_time=60,
                    processor_id=processor, database=alias)  # fmt: skip
        assert ran == []
        assert "unsupported startup parameter" in str(failed.value)
        assert "ignore_startup_parameters" in str(failed.value)
        # And `check --database` warns although Django's connection reads the journal
        found = [m for m in journal_messages(alias, "table") if m.id == "celery_grousset.W013"]
        assert len(found) == 1 and "session and transaction mode" in found[0].msg
        # And so does a worker's start (its check runs in a thread of its own)
        with override_settings(GROUSSET={"DATABASE": alias}), caplog.at_level(logging.ERROR):
            thread = threading.Thread(target=log_schema_problems)
            thread.start()
            thread.join(30)
        logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(f"journal database {alias!r}" in m and "W013" not in m
                   and "unsupported startup parameter" in m for m in logged), logged  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_a_pooler_that_ignores_the_options_runs_each_call_once(
    bouncer: Callable[..., int],
    mode: str,
    processor: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from celery_grousset.store import get_store, postgresql

    # Given PgBouncer told to ignore the startup options (the racers' settings name it)
    port = bouncer(mode, ignore="options")
    monkeypatch.setenv("GROUSSET_TEST_PGBOUNCER_PORT", str(port))
    monkeypatch.setattr(postgresql, "_unbounded", set())
    with services.extra_database("bouncer", **bouncer_database(port)):
        # When the store connects: it says that the server no longer bounds its statements
        with caplog.at_level(logging.WARNING):
            get_store("bouncer").probe()
        assert any("does not apply the store's statement_timeout" in r.getMessage()
                   for r in caplog.records), caplog.text  # fmt: skip
        # And when 8 processes race on 200 keys through the pooler
        keys = [f"bouncer-{i}-{uuid.uuid4().hex[:6]}" for i in range(200)]
        results = run_racers(race, 8, "bouncer", keys, processor)
    # Then each key's effect ran exactly once, and every caller got the same value
    counts = Counter(
        Effect.objects.using("postgresql").filter(value=processor).values_list("key", flat=True)
    )
    assert set(counts) == set(keys)
    assert max(counts.values()) == 1
    for key in keys:
        assert len({r[key] for r in results}) == 1
