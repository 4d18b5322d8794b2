"""The transactional outbox: ``outbox.enqueue`` in the caller's transaction, the relay,
the admin's requeue action and the purge of sent rows.

Behaviour tests run on every backend against a Redis queue nobody consumes (read back
from Redis, keys deleted afterwards). The end-to-end tests use real workers
(tests/workers.py) on PostgreSQL + Redis and relays as ``python -m django
grousset_relay`` subprocesses; effects are counted in the ledger.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connections, transaction
from django.db.models import Count, Max
from django.test import Client
from kombu import Queue

from celery_grousset import outbox
from celery_grousset.delivery import KEY_HEADER
from celery_grousset.exceptions import InvalidArgument
from celery_grousset.journal import now as _db_now
from celery_grousset.models import OutboxMessage, OutboxStatus, Outcome
from tests import services
from tests.celeryapp import app
from tests.ledger.models import Effect
from tests.workers import ROOT, workers

N = int(os.environ.get("GROUSSET_TEST_OUTBOX_N", "2000"))


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(services.require_redis())


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"ob-{uuid.uuid4().hex[:10]}"
    services.require_redis()
    yield name
    client = _redis()
    keys = [*client.scan_iter(match=f"{name}*"), *client.scan_iter(match=f"_kombu.binding*.{name}")]
    if keys:
        client.delete(*keys)


def messages(queue: str) -> list[dict[str, Any]]:
    """Every message waiting in ``queue``: headers plus decoded args/kwargs."""
    client, out = _redis(), []
    for name in client.scan_iter(match=f"{queue}*"):
        if client.type(name) == b"list":
            for raw in client.lrange(name, 0, -1):
                msg = json.loads(raw)
                args, kwargs, embed = json.loads(base64.b64decode(msg["body"]))
                out.append({**msg["headers"], "args": args, "kwargs": kwargs,
                            "callbacks": embed.get("callbacks")})  # fmt: skip
    return out


def relay(alias: str, target: Any = None, **options: Any) -> outbox.RelayStats:
    return outbox.Relay(target or app, using=alias, **options).run(once=True)


def test_only_committed_messages_are_published_once_each(alias: str, queue: str) -> None:
    from tests.tasks import effect

    mine = OutboxMessage.objects.using(alias).filter(options__queue=queue)
    # Given three transactions: one commits two messages, one rolls back, one commits one
    with transaction.atomic(using=alias):
        first = outbox.enqueue(effect, ("a",), using=alias, queue=queue)
        outbox.enqueue(effect, ("b",), {"sleep": 0.0}, using=alias, queue=queue,
                       headers={"x-auth": "HeaderTok_9"})  # fmt: skip
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        outbox.enqueue(effect, ("lost",), using=alias, queue=queue)
        raise RuntimeError("rollback")
    with transaction.atomic(using=alias):
        outbox.enqueue("tests.tasks.effect", ("c",), using=alias, queue=queue, idempotency_key="k",
                       link=effect.s("LinkArg_3"), chain=[effect.s("ChainArg_4")])  # fmt: skip
    assert mine.count() == 3 and mine.filter(status="pending").count() == 3
    first.refresh_from_db(using=alias)
    assert first.created_at is not None and first.available_at <= _db_now(alias)
    # When a relay runs once, then once more
    stats = relay(alias)
    again = relay(alias)
    # Then the committed messages were published once each, with their task ids and keys
    got = sorted(messages(queue), key=lambda m: m["args"][0])
    assert [m["args"][0] for m in got] == ["a", "b", "c"] and again.sent == 0
    assert stats.sent >= 3
    rows = {r.task_id: r for r in mine}
    assert {m["id"] for m in got} == set(rows)
    # (a call's identity is the one delay() gives it: its arguments, or its own key)
    keys = {m["args"][0]: m.get(KEY_HEADER) for m in got}
    assert keys == {"a": None, "b": None, "c": "k"}
    assert [m.get("x-auth") for m in got] == [None, "HeaderTok_9", None]
    assert [m["callbacks"][0]["args"] for m in got if m["callbacks"]] == [["LinkArg_3"]]
    # ... and the rows are sent, their arguments, headers, keys and linked signatures
    # dropped (each may hold a token), the rest kept
    assert all(r.status == "sent" and r.sent_at and r.args == [] and r.attempts == 1
               and "headers" not in r.options and "idempotency_key" not in r.options
               and "link" not in r.options and "chain" not in r.options
               and r.options["queue"] == queue for r in rows.values())  # fmt: skip


def two_rows_for(alias: str, queue: str, broker: str) -> tuple[Celery, Any, Any]:
    """An app on ``broker`` that never retries a publish, and two pending rows."""
    from tests.tasks import effect

    down = Celery("down", broker=broker, set_as_current=False)
    down.conf.broker_connection_retry = False
    down.conf.broker_connection_max_retries = 0
    down.conf.task_publish_retry = False
    with transaction.atomic(using=alias):
        a = outbox.enqueue(effect, ("x",), using=alias, queue=queue)
        b = outbox.enqueue(effect, ("y",), using=alias, queue=queue)
    return down, a, b


def test_a_row_enqueued_by_0_1_0_is_published_under_the_key_its_relay_gave_it(
    alias: str, queue: str
) -> None:
    """0.1.0's relay published a row under the key ``outbox:<id>``: one it published and
    did not mark sent (stopped for the upgrade) ran again under the call's own
    fingerprint once the new relay sent it (an upgrade review)."""
    from tests.tasks import effect

    with transaction.atomic(using=alias):
        row = outbox.enqueue(effect, ("legacy",), using=alias, queue=queue)
    # Given the row as 0.1.0 wrote it: its arguments as JSON values, not a JSON text
    OutboxMessage.objects.using(alias).filter(pk=row.pk).update(args=["legacy"], kwargs={})
    try:
        # When the relay publishes it / Then under 0.1.0's key, with its arguments
        assert relay(alias).sent == 1
        [msg] = messages(queue)
        assert msg[KEY_HEADER] == f"outbox:{row.pk}", msg
        assert msg["args"] == ["legacy"]
    finally:
        OutboxMessage.objects.using(alias).filter(pk=row.pk).delete()


def test_an_enqueued_call_is_published_as_delay_publishes_it(alias: str, queue: str) -> None:
    """The row kept its arguments as JSON values: jsonb wrote 1e16 as an integer (another
    value, another fingerprint than delay()'s), and a datetime, Decimal or UUID, which
    delay() sends, was a bare TypeError."""
    from tests.tasks import charge, effect

    calls = [(effect, ("big",), {"sleep": 1e16}),
             (charge, (7,), {"amount": Decimal("1.10"), "note": datetime(2026, 1, 2, tzinfo=UTC)}),
             (charge, (uuid.UUID(int=5),), {"amount": "3"})]  # fmt: skip
    # Given the calls enqueued and published by the relay, and the same calls by delay()
    with transaction.atomic(using=alias):
        rows = [outbox.enqueue(t, a, k, using=alias, queue=queue) for t, a, k in calls]
    try:
        assert relay(alias).sent == len(calls)
        for task, args, kwargs in calls:
            task.apply_async(args, kwargs, queue=queue)
        # Then each call's two messages carry the same arguments, to the byte
        sent = [json.dumps([m["args"], m["kwargs"]], sort_keys=True) for m in messages(queue)]
        assert len(sent) == 2 * len(calls) and all(sent.count(text) == 2 for text in sent), sent
        assert any("1e+16" in text for text in sent)
    finally:
        OutboxMessage.objects.using(alias).filter(pk__in=[r.pk for r in rows]).delete()


def test_enqueue_refuses_arguments_it_cannot_write_naming_the_fix(alias: str) -> None:
    mine = OutboxMessage.objects.using(alias).filter(task_name="elsewhere.notify")
    before = mine.count()
    # Given an argument no JSON takes, for a task named only (the fingerprint does not see
    # it here) / Then enqueue refuses it, saying what to pass
    with pytest.raises(InvalidArgument, match=r"cannot be written as JSON.*primary key"),\
            transaction.atomic(using=alias):  # fmt: skip
        outbox.enqueue("elsewhere.notify", (object(),), using=alias)
    # ... and a countdown that is no number of seconds is named as such
    with pytest.raises(InvalidArgument, match="countdown must be a number of seconds, got 'soon'"),\
            transaction.atomic(using=alias):  # fmt: skip
        outbox.enqueue("elsewhere.notify", (), using=alias, countdown="soon")
    assert mine.count() == before  # and no row was written


def test_enqueue_refuses_a_lone_surrogate_in_its_options_on_every_database(alias: str) -> None:
    """A key or header holding a lone surrogate (``json.loads`` of a form's input) was
    stored on SQLite, and on PostgreSQL broke the caller's transaction with a DataError
    from the jsonb column (a review)."""
    mine = OutboxMessage.objects.using(alias).filter(task_name="elsewhere.notify")
    before = mine.count()
    with transaction.atomic(using=alias):
        # Given a key, then a header, with a lone surrogate / Then each is refused first
        with pytest.raises(InvalidArgument, match=r"lone surrogate \('\\ud800'\)"):
            outbox.enqueue("elsewhere.notify", (), using=alias, idempotency_key="k-\ud800")
        with pytest.raises(InvalidArgument, match="clean the value it came from"):
            outbox.enqueue("elsewhere.notify", (), using=alias, headers={"x-ref": "\udfff"})
        # And the caller's transaction goes on: its next row is written and committed
        row = outbox.enqueue("elsewhere.notify", (), using=alias, idempotency_key="k-1")
    try:
        assert mine.count() == before + 1
    finally:  # (a due row left behind would be the next relay test's first row)
        mine.filter(pk=row.pk).delete()


def test_a_rows_own_publish_timeout_wins_over_the_relays(alias: str, queue: str) -> None:
    """The relay passes its confirm timeout to apply_async: a row enqueued with its own
    ``timeout`` raised "multiple values for keyword argument" and went dead."""
    from tests.tasks import effect

    with transaction.atomic(using=alias):
        row = outbox.enqueue(effect, ("t",), using=alias, queue=queue, timeout=5)
    try:
        stats = relay(alias)
        row.refresh_from_db(using=alias)
        assert row.status == OutboxStatus.SENT and stats.dead == 0, row.last_error
    finally:
        OutboxMessage.objects.using(alias).filter(pk=row.pk).delete()


def test_the_relay_keeps_one_broker_connection_across_batches(
    alias: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection per batch re-did the handshake and re-declared the queues inside
    every batch's transaction (its rows locked meanwhile)."""
    from tests.tasks import effect

    opened: list[Any] = []
    real = outbox.confirmed_connection
    monkeypatch.setattr(outbox, "confirmed_connection",
                        lambda *a: opened.append(real(*a)) or opened[-1])  # fmt: skip
    with transaction.atomic(using=alias):
        rows = [outbox.enqueue(effect, (f"c{j}",), using=alias, queue=queue) for j in range(3)]
    try:
        # When the relay publishes them one batch each
        stats = relay(alias, batch_size=1)
        # Then it opened one connection for all its batches, and closed it when it ended
        assert stats.sent >= 3 and stats.batches >= 3 and len(opened) == 1
        assert opened[0].connection is None
    finally:
        OutboxMessage.objects.using(alias).filter(pk__in=[r.pk for r in rows]).delete()


def test_enqueue_refuses_a_call_its_tasks_serializer_cannot_encode(alias: str) -> None:
    """A row that would only go dead at the relay is not written: a Decimal is json (the
    row's own encoding) but no YAML value."""

    def body(amount: Any) -> None:
        return None

    yaml_task = app.tasks.get("tests.outbox_yaml") or app.task(name="tests.outbox_yaml",
                                                               serializer="yaml")(body)  # fmt: skip
    with pytest.raises(InvalidArgument, match="cannot be encoded by the task's serializer 'yaml'"),\
            transaction.atomic(using=alias):  # fmt: skip
        outbox.enqueue(yaml_task, (Decimal("1.50"),), using=alias)
    assert not OutboxMessage.objects.using(alias).filter(task_name="tests.outbox_yaml").exists()


def test_enqueue_on_a_database_without_the_outbox_table_names_migrate(
    alias: str, tmp_path: Path
) -> None:
    """The driver's bare 'relation "celery_grousset_outboxmessage" does not exist' (or
    1146, or 'no such table') named neither the package nor the fix."""
    engine = connections.settings[alias]["ENGINE"]
    name = f"grousset_nomig_{uuid.uuid4().hex[:8]}"
    scratch = {**connections.settings[alias], "NAME": str(tmp_path / "nomig.sqlite3")
               if "sqlite" in engine else name}  # fmt: skip
    recreate = (services._recreate_postgresql if "postgresql" in engine else
                services._recreate_mysql if "mysql" in engine else services._recreate_sqlite)
    recreate(scratch)
    try:
        # Given a database where `migrate` has not run
        with services.extra_database("nomig", **scratch):
            # When a message is enqueued in a transaction there
            with pytest.raises(DatabaseError) as raised, transaction.atomic(using="nomig"):
                outbox.enqueue("tests.effect", ("k",), using="nomig")
            # (and a claim there, by the journal's store, says the same: one rule)
            from celery_grousset.exceptions import StoreUnavailable
            from celery_grousset.store import get_store
            from tests.test_pg_driver import make

            with pytest.raises(StoreUnavailable, match=r"missing.*'nomig'.*migrate celery_"):
                get_store("nomig").claim(make("nomig"))
    finally:
        if "sqlite" not in engine:
            _drop(alias, name)
    # Then the error is still a database error, and names the table and the fix
    message = str(raised.value)
    assert "the outbox's table is missing in database 'nomig'" in message, message
    assert "run `manage.py migrate celery_grousset --database nomig`" in message, message


def test_a_broker_outage_costs_no_attempt_and_never_makes_a_row_dead(
    alias: str, queue: str
) -> None:
    """During an outage each batch charged its first due row an attempt and pushed it
    back, so the rows took turns: a half-hour outage made the whole backlog dead, every
    message then lost until someone requeued it in the admin."""
    # Given two pending messages and a broker nobody listens on
    down, a, b = two_rows_for(alias, queue, "redis://127.0.0.1:1/0")
    b.refresh_from_db(using=alias)  # (its times, from the database clock)
    rows = OutboxMessage.objects.using(alias)
    # When the relay fails to publish the first one, with max_attempts=1 (any failure it
    # charged would make the row dead)
    stats = relay(alias, down, max_attempts=1, backoff=60)
    # (the run's totals say why it stopped: the batch ends at its first row)
    assert stats.broker_down and stats.failed == 1 and stats.dead == 0
    a.refresh_from_db(using=alias)
    b.refresh_from_db(using=alias)
    # Then it is still pending, charged no attempt, with the error, and waits (backoff
    # 60 s, jittered: 30 to 60 s) behind the second, which was never tried
    assert a.status == "pending" and a.attempts == 0 and "Error" in a.last_error
    assert a.available_at > _db_now(alias) + timedelta(seconds=25)
    assert b.status == "pending" and b.attempts == 0
    # And once the broker is back, both are published
    rows.filter(pk=a.pk).update(available_at=b.available_at)
    relay(alias)
    assert set(rows.filter(pk__in=[a.pk, b.pk]).values_list("status", flat=True)) == {"sent"}
    assert sorted(m["args"][0] for m in messages(queue)) == ["x", "y"]


#: the app of a relay whose Redis result store is down (its broker is up): built by the
#: test below, found by ``grousset_relay --app``
RESULT_STORE_DOWN: Any = None


def test_a_result_store_outage_costs_no_attempt_and_the_relay_command_publishes_through_it(
    alias: str, queue: str
) -> None:
    """A Redis result backend subscribes to each task's result before its publish: with
    the result store down, the relay charged every row an attempt (about 20 s each) and
    made the backlog dead, though the broker was up (a review: 2 runs, 2 dead rows)."""
    from django.core.management import call_command

    global RESULT_STORE_DOWN
    # Given two pending messages, a live broker and a result store nobody listens on
    store_down, a, b = two_rows_for(alias, queue, services.require_redis())
    store_down.conf.result_backend = "redis://127.0.0.1:1/0"
    store_down.conf.result_backend_transport_options = {"retry_policy": {"max_retries": 1}}
    store_down.conf.redis_socket_connect_timeout = 1
    RESULT_STORE_DOWN = store_down
    rows = OutboxMessage.objects.using(alias).filter(pk__in=[a.pk, b.pk])
    # When a relay that subscribes (a worker's relay thread on a non-prefork pool) fails
    stats = relay(alias, store_down, max_attempts=1, backoff=60)
    # Then no row is charged for it (max_attempts=1: a charge is a dead row)
    assert stats.dead == 0 and stats.broker_down, stats
    assert set(rows.values_list("status", "attempts")) == {("pending", 0)}
    # When `grousset_relay` runs (it subscribes to no result: it reads none)
    rows.update(available_at=_db_now(alias))
    call_command("grousset_relay", "--once", "--database", alias,
                 "--app", "tests.test_outbox:RESULT_STORE_DOWN", verbosity=0)  # fmt: skip
    # Then both are published
    assert set(rows.values_list("status", flat=True)) == {"sent"}
    assert sorted(m["args"][0] for m in messages(queue)) == ["x", "y"]


def test_a_publish_the_broker_refuses_goes_dead_after_max_attempts(alias: str) -> None:
    """A failure that is not an outage (RabbitMQ refuses the publish on a live connection:
    its queue exists with other arguments) is charged to the row: retried, then dead."""
    from kombu import Connection

    from tests.tasks import effect

    url = services.require_rabbitmq()
    name = f"ob-refused-{uuid.uuid4().hex[:8]}"
    with Connection(url) as direct:  # the queue as another service declared it
        direct.SimpleQueue(name, queue_args={"x-max-length": 1}).close()
    rabbit = Celery("rabbit", broker=url, set_as_current=False)
    rabbit.conf.task_publish_retry = False
    with transaction.atomic(using=alias):
        row = outbox.enqueue(effect, ("refused",), using=alias, queue=name)
    row.refresh_from_db(using=alias)  # (its times, from the database clock)
    rows = OutboxMessage.objects.using(alias)
    try:
        for attempt in (1, 2):
            rows.filter(pk=row.pk).update(available_at=row.created_at)
            stats = relay(alias, rabbit, max_attempts=2, backoff=60)
            row.refresh_from_db(using=alias)
            assert not stats.broker_down and row.attempts == attempt, row.last_error
        assert row.status == "dead" and "PRECONDITION_FAILED" in row.last_error, row.last_error
        assert outbox.arguments(row)[0] == ["refused"]  # kept for a requeue
    finally:
        rows.filter(pk=row.pk).delete()
        with Connection(url) as direct:
            direct.default_channel.queue_delete(name)


def test_a_full_queue_that_refuses_a_message_holds_up_no_other_queue(alias: str) -> None:
    """RabbitMQ's nack of a full queue (``x-overflow: reject-publish``) was read as an
    outage: the batch stopped at the first such row, charged nothing, and every row of
    every other queue waited behind that queue's backlog (an outbox review)."""
    from kombu import Connection

    from tests.tasks import effect

    url = services.require_rabbitmq()
    full, other = (f"ob-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("full", "other"))
    with Connection(url) as direct:  # a queue that holds one message and refuses more
        args = {"x-max-length": 1, "x-overflow": "reject-publish"}
        direct.SimpleQueue(full, queue_args=args).close()
        direct.SimpleQueue(other).close()
    rabbit = Celery("rabbit", broker=url, set_as_current=False)
    rabbit.conf.task_publish_retry = False
    rabbit.conf.task_queues = [Queue(full, queue_arguments=args), Queue(other)]
    # Given rows for the full queue first, then rows for another queue
    with transaction.atomic(using=alias):
        rows = [outbox.enqueue(effect, (f"f{j}",), using=alias, queue=full) for j in range(3)]
        rows += [outbox.enqueue(effect, (f"o{j}",), using=alias, queue=other) for j in range(2)]
    try:
        # When the relay runs once
        stats = relay(alias, rabbit, backoff=60)
        for row in rows:
            row.refresh_from_db(using=alias)
        # Then the other queue's rows are sent, and the refused ones charged an attempt
        assert not stats.broker_down and stats.sent == 3, stats
        assert [r.status for r in rows] == ["sent", "pending", "pending", "sent", "sent"]
        assert [r.attempts for r in rows[1:3]] == [1, 1], [r.last_error for r in rows]
        with Connection(url) as direct:
            sizes = [direct.SimpleQueue(full, queue_args=args).qsize(),
                     direct.SimpleQueue(other).qsize()]  # fmt: skip
        assert sizes == [1, 2]
    finally:
        OutboxMessage.objects.using(alias).filter(pk__in=[r.pk for r in rows]).delete()
        with Connection(url) as direct:
            for name in (full, other):
                direct.default_channel.queue_delete(name)


def _own_redis(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A redis-server of the test's own (it is frozen or reconfigured), on a free port."""
    import shutil
    import socket

    services.require_redis()
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([binary, "--port", str(port), "--save", "", "--appendonly", "no",
                               "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 10
    while not services.port_open("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.05)
    return server, port


def test_a_redis_refusal_of_one_queue_is_charged_and_one_of_the_server_is_an_outage(
    alias: str, tmp_path: Path
) -> None:
    """An error reply about one key (WRONGTYPE) was read as an outage: retried for ever
    at no cost, never dead, holding up every other queue (an outbox review); Redis out
    of memory stays an outage: the row charged nothing."""
    import redis

    from tests.tasks import effect

    server, port = _own_redis(tmp_path)
    target = Celery("refusing", broker=f"redis://127.0.0.1:{port}/0", set_as_current=False)
    target.conf.task_publish_retry = False
    client = redis.Redis(port=port)
    with transaction.atomic(using=alias):
        bad = outbox.enqueue(effect, ("w",), using=alias, queue="ob-wrongtype")
        good = outbox.enqueue(effect, ("g",), using=alias, queue="ob-fine")
    rows = OutboxMessage.objects.using(alias).filter(pk__in=[bad.pk, good.pk])
    try:
        # Given one queue's key holding a string (another service's key, say)
        client.set("ob-wrongtype", "not a list")
        # When the relay runs / Then that row is charged, and the other queue's is sent
        stats = relay(alias, target, backoff=60)
        bad.refresh_from_db(using=alias)
        good.refresh_from_db(using=alias)
        assert not stats.broker_down and good.status == OutboxStatus.SENT, stats
        assert (bad.status, bad.attempts) == ("pending", 1) and "WRONGTYPE" in bad.last_error
        # And given the server out of memory, the row is charged nothing: an outage
        client.delete("ob-wrongtype")
        client.config_set("maxmemory", 1)
        rows.filter(pk=bad.pk).update(available_at=bad.created_at)
        stats = relay(alias, target, backoff=60)
        bad.refresh_from_db(using=alias)
        assert stats.broker_down and bad.attempts == 1 and "maxmemory" in bad.last_error, stats
        # And a relay whose user may not push (an ACL change) is in an outage too
        client.config_set("maxmemory", 0)
        client.acl_setuser("relay", enabled=True, passwords=["+pw"], keys=["*"],
                           commands=["+@all", "-lpush", "-rpush"])  # fmt: skip
        denied = Celery("denied", broker=f"redis://relay:pw@127.0.0.1:{port}/0",
                        set_as_current=False)  # fmt: skip
        denied.conf.task_publish_retry = False
        rows.filter(pk=bad.pk).update(available_at=bad.created_at)
        stats = relay(alias, denied, backoff=60)
        bad.refresh_from_db(using=alias)
        assert stats.broker_down and bad.attempts == 1 and "permissions" in bad.last_error, stats
    finally:
        server.kill()
        server.wait()
        rows.delete()


def test_redis_replies_about_the_whole_server_are_outages_whatever_their_shape() -> None:
    """MISCONF (a failed snapshot: every write refused) arrives as a plain ResponseError
    and was read as one row's refusal: every row was charged, then dead (a review)."""
    from redis.exceptions import NoPermissionError, ResponseError

    from celery_grousset.outbox_failures import whole_broker

    misconf = "MISCONF Redis is configured to save RDB snapshots, but it's currently unable"
    # Given the replies as redis-py raises them, alone and inside a pipeline
    piped = "Command # 1 (LPUSH q) of pipeline caused error: "
    whole = [ResponseError(misconf), ResponseError(piped + misconf),
             NoPermissionError("this user has no permissions")]  # fmt: skip
    one_key = [ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
               ResponseError(piped + "WRONGTYPE Operation against a key")]  # fmt: skip
    # Then those about the server are outages, those about one key are not
    assert [whole_broker(e) for e in whole] == [True, True, True]
    assert [whole_broker(e) for e in one_key] == [False, False]


def test_a_redis_broker_that_stops_answering_holds_the_relay_no_longer_than_its_timeout(
    alias: str, tmp_path: Path
) -> None:
    """kombu's Redis transport waits for an answer for ever: a broker that stopped
    answering (a partition, a frozen server) held the relay mid-batch, its rows locked,
    and said nothing (an outbox review)."""
    from tests.tasks import effect

    server, port = _own_redis(tmp_path)
    target = Celery("hung", broker=f"redis://127.0.0.1:{port}/0", set_as_current=False)
    target.conf.task_publish_retry = False
    with transaction.atomic(using=alias):
        row = outbox.enqueue(effect, ("hung",), using=alias, queue="ob-hung")
    done: list[outbox.RelayStats] = []
    try:
        # Given a Redis broker that stops answering (its process frozen)
        server.send_signal(signal.SIGSTOP)
        # When the relay publishes
        runner = threading.Thread(target=lambda: done.append(relay(alias, target, backoff=60,
                                  confirm_timeout=1.0)), daemon=True)  # fmt: skip
        runner.start()
        runner.join(15)
        # Then it gives up within its timeout, the row pending and charged nothing
        assert done, "the relay still waits for the broker"
        row.refresh_from_db(using=alias)
        assert done[0].broker_down and (row.status, row.attempts) == ("pending", 0), row.last_error
    finally:
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait()
        OutboxMessage.objects.using(alias).filter(pk=row.pk).delete()


def test_an_unexpected_error_pauses_the_relay_and_never_ends_it(
    alias: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop caught database errors only: anything else (a bug, a setting refused
    when a batch first reads the store) ended the worker's relay thread for good after
    one log line, the worker still running, its outbox never published again."""
    from tests.tasks import effect

    with transaction.atomic(using=alias):
        row = outbox.enqueue(effect, ("after-error",), using=alias, queue=queue)
    real, calls = outbox.Relay.run_batch, []

    def flaky(self: outbox.Relay) -> outbox.RelayStats:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("an error no database raised")
        return real(self)

    monkeypatch.setattr(outbox.Relay, "run_batch", flaky)
    stop = threading.Event()
    # When the relay's first batch raises an error that is not the database's
    runner = threading.Thread(target=outbox.Relay(app, using=alias, backoff=0.05).run,
                              args=(stop,), daemon=True)  # fmt: skip
    runner.start()
    try:
        # Then it pauses and goes on: the row is published
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and OutboxMessage.objects.using(alias).get(
                pk=row.pk).status != "sent":  # fmt: skip
            time.sleep(0.05)
        assert OutboxMessage.objects.using(alias).get(pk=row.pk).status == "sent"
        assert len(calls) >= 2 and runner.is_alive()
    finally:
        stop.set()
        runner.join(10)


@pytest.mark.parametrize(
    "flag, value, error",
    [("--interval", "-1", r"interval \(--interval\) must be a positive number of seconds"),
     ("--backoff", "0", r"backoff \(--backoff\) must be a positive"),
     ("--backoff", "nan", "got nan"),
     ("--backoff-max", "1", r"backoff_max \(1 s\) must be at least backoff \(2 s\)"),
     ("--batch-size", "0", "--batch-size must be a whole number from 1 to 1000000"),
     ("--batch-size", "1000000000", "--batch-size must be a whole number from 1 to 1000000")],
)  # fmt: skip
def test_the_relay_refuses_durations_it_cannot_wait(flag: str, value: str, error: str) -> None:
    """A negative interval polled the database without a pause; a zero backoff made a
    broker blip dead rows; NaN crashed the relay at its first failed publish. A bad
    argument exits 2, as argparse's own refusals do (it exited 1, like an outage)."""
    services.require_database("default")
    with pytest.raises(CommandError, match=error) as refused:
        call_command("grousset_relay", "--once", "--app", "tests.celeryapp", flag, value,
                     verbosity=0)  # fmt: skip
    assert refused.value.returncode == 2


def test_relay_retry_delays_are_jittered_within_their_bounds() -> None:
    # Given a relay with a 2 s backoff doubling up to 600 s
    relay = outbox.Relay(app, backoff=2.0, backoff_max=600.0)
    for attempts, full in ((1, 2.0), (3, 8.0), (20, 600.0)):
        # When the delay after ``attempts`` failed publishes is drawn 500 times
        drawn = [relay.delay(attempts) for _ in range(500)]
        # Then the rows that failed together are retried at different moments, each
        # within [0.5, 1.0] * the backoff (capped at backoff_max)
        assert len(set(drawn)) > 400, attempts
        assert all(full / 2 <= d <= full for d in drawn), attempts
        assert min(drawn) < full * 0.6 and max(drawn) > full * 0.9, attempts
    # And a row (or a relay loop) failing for days still gets a delay: 2.0 ** 1024
    # overflowed, which ended the relay after 1,025 errors in a row
    assert 300.0 <= relay.delay(5000) <= 600.0


def test_admin_requeues_dead_rows_and_purge_drops_old_sent_rows(
    queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.contrib.auth.models import User

    from tests.tasks import effect

    alias = "default"
    services.require_database(alias)
    with transaction.atomic(using=alias):
        dead = outbox.enqueue(effect, ("dead",), using=alias, queue=queue)
        sent = outbox.enqueue(effect, ("old",), using=alias, queue=queue)
        pending = outbox.enqueue(effect, ("p",), using=alias, queue=queue)
    rows = OutboxMessage.objects.using(alias)
    rows.filter(pk=dead.pk).update(status="dead", attempts=10, last_error="boom")
    old = _db_now(alias) - timedelta(days=30)
    rows.filter(pk=sent.pk).update(status="sent", sent_at=old, args=[])
    user = User.objects.create_superuser(f"u{uuid.uuid4().hex[:8]}", "a@b.c", "pw")
    client = Client()
    client.force_login(user)
    # Given the outbox list filtered on dead rows
    page = client.get("/admin/celery_grousset/outboxmessage/?status=dead")
    assert page.status_code == 200 and b"boom" in page.content
    # When "requeue" is applied to the dead and the pending row
    chosen = {"action": "requeue", "_selected_action": [dead.pk, pending.pk]}
    confirm = client.post("/admin/celery_grousset/outboxmessage/", chosen)
    # Then a confirmation page lists both, the dead one to be published again, and
    # nothing changed yet (a misclick on "select all" republished every dead row)
    html = confirm.content.decode()
    assert confirm.status_code == 200 and "1 of the selected messages will be published" in html
    assert html.count("grousset-will-change") == 1 and "skip: not dead" in html
    assert rows.get(pk=dead.pk).status == "dead"
    # When it is confirmed
    client.post("/admin/celery_grousset/outboxmessage/", {**chosen, "post": "yes"})
    dead.refresh_from_db(using=alias)
    # Then the dead row is pending again with its attempts reset
    assert dead.status == "pending" and dead.attempts == 0
    # And a selection of more rows than one action may touch is refused, nothing changed
    many = {"action": "requeue", "select_across": "1", "_selected_action": [dead.pk]}
    monkeypatch.setattr("celery_grousset.outbox_admin.MAX_ACTION_ROWS", 1)
    refused = client.post("/admin/celery_grousset/outboxmessage/", many, follow=True)
    assert "Select at most 1 rows" in refused.content.decode()
    # When grousset_purge runs on the outbox only
    call_command("grousset_purge", "--outbox-only", database=alias, verbosity=0)
    # Then the sent row older than the retention is gone; the others stay
    assert not rows.filter(pk=sent.pk).exists()
    assert rows.filter(pk__in=[dead.pk, pending.pk]).count() == 2
    rows.filter(pk__in=[dead.pk, pending.pk]).delete()


def _one_id(rows: list[tuple[str, OutboxMessage]]) -> int:
    """Give every row the same id, unused in each of their databases (as message 1 of
    two producer services would be)."""
    same = 1 + max(
        OutboxMessage.objects.using(db).aggregate(m=Max("id"))["m"] or 0 for db, _ in rows
    )
    for db, row in rows:
        OutboxMessage.objects.using(db).filter(pk=row.pk).update(id=same)
        row.id = same
    return same


def test_the_same_call_enqueued_twice_runs_once_as_with_delay(queue: str) -> None:
    from tests.tasks import effect

    dbs = ("default", "postgresql")
    for db in dbs:
        services.require_database(db)
    prefix = f"twice-{uuid.uuid4().hex[:8]}-"
    # Given the same call enqueued twice (a form submitted twice; or two producer
    # services, each with its own outbox database, whose rows share an id), and a
    # different call
    rows = [(db, outbox.enqueue(effect, (f"{prefix}same",), using=db, queue=queue))
            for db in dbs]  # fmt: skip
    rows.append(("default", outbox.enqueue(effect, (f"{prefix}other",), using="default",
                                           queue=queue)))  # fmt: skip
    _one_id(rows[:2])
    try:
        # When the relays publish them, and one consumer (one journal) runs each message
        for db in dbs:
            relay(db)
        got = messages(queue)
        results = [
            effect.apply(m["args"], m["kwargs"], task_id=m["id"],
                         headers={h: m[h] for h in (KEY_HEADER,) if h in m}).get()
            for m in sorted(got, key=lambda m: m["args"][0])
        ]  # fmt: skip
        # Then the same call ran once and its second message was answered with the memo,
        # as two delay() calls would be; the other call ran too
        assert len(got) == 3
        assert effect_counts("default", prefix) == {f"{prefix}same": 1, f"{prefix}other": 1}
        assert sorted(r["key"] for r in results) == [f"{prefix}other", *[f"{prefix}same"] * 2]
    finally:
        for db, row in rows:
            OutboxMessage.objects.using(db).filter(pk=row.pk).delete()


def test_enqueue_checks_the_arguments_and_the_relay_never_retries_a_wrong_call(
    alias: str, queue: str
) -> None:
    from tests.tasks import effect

    # When a call is enqueued with arguments its task does not take
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        outbox.enqueue(effect, ("x",), {"colour": "red"}, using=alias, queue=queue)
    # Then nothing was written; and a row that names the task by name (unchecked) and
    # that the relay cannot publish for its arguments goes dead at once, not retried
    assert not OutboxMessage.objects.using(alias).filter(options__queue=queue).exists()
    with transaction.atomic(using=alias):
        row = outbox.enqueue("tests.tasks.effect", ("x",), {"colour": "red"}, using=alias,
                             queue=queue)  # fmt: skip
    stats = relay(alias)
    row.refresh_from_db(using=alias)
    assert (stats.dead, row.status, row.attempts) == (1, "dead", 1)
    assert "colour" in row.last_error and messages(queue) == []


def test_enqueue_refuses_now_what_the_relay_could_never_publish(alias: str, queue: str) -> None:
    """A call delay() refuses was written by enqueue() (the caller's transaction committed
    as if it were queued) and went dead at the relay; a misspelt key header passed for a
    @shared_task (a proxy), and args given as a bare value failed with a TypeError from
    inside the package."""
    from celery_grousset.exceptions import FingerprintError
    from tests.tasks import effect  # a @shared_task: a proxy of the task

    bad: list[tuple[type[Exception], str, tuple[Any, ...], dict[str, Any]]] = [
        (ValueError, "header", (("x",),), {"headers": {"grousset-key": "k"}}),
        (FingerprintError, "non-empty str", (("x",),), {"idempotency_key": ""}),
        (FingerprintError, "set", (({1, 2},),), {}),
        (FingerprintError, "__type__", (({"__type__": "x", "__value__": 1},),), {}),
        (InvalidArgument, "list or tuple", ("x",), {}),
    ]
    with transaction.atomic(using=alias):
        for error, needle, args, options in bad:
            with pytest.raises(error, match=needle):
                outbox.enqueue(effect, *args, using=alias, queue=queue, **options)
        with pytest.raises(FingerprintError, match="non-empty str"):  # a task by its name
            outbox.enqueue("tests.tasks.effect", ("x",), using=alias, queue=queue,
                           idempotency_key=5)  # fmt: skip
    # Then no row was written
    assert not OutboxMessage.objects.using(alias).filter(options__queue=queue).exists()


def test_a_row_carrying_celery_once_options_is_still_published(alias: str, queue: str) -> None:
    """A guarded call's ``once=`` is refused to its caller, never to the relay: a row
    enqueued by name (or by an earlier version) would go dead at every try (a review)."""
    from tests.tasks import effect

    # Given a row for a guarded task, enqueued by its name with celery-once's options
    with transaction.atomic(using=alias):
        row = outbox.enqueue(effect.name, ("once-left",), using=alias, queue=queue,
                             once={"timeout": 60})  # fmt: skip
    # When the relay runs
    relay(alias)
    # Then it is published, not dead
    row.refresh_from_db(using=alias)
    assert row.status == "sent", (row.status, row.last_error)
    assert [m["args"] for m in messages(queue)] == [["once-left"]]
    # While the caller who passes the task itself is refused at once
    with pytest.raises(TypeError, match="celery-once"), transaction.atomic(using=alias):
        outbox.enqueue(effect, ("once-left",), using=alias, queue=queue, once={"timeout": 60})


def test_a_row_stored_with_a_key_option_nothing_reads_is_still_published(
    alias: str, queue: str
) -> None:
    """``grousset_key=`` given to a call is refused to its caller; a row an earlier
    version stored with it (it was published, keyed by all its arguments) must not go
    dead at the relay."""
    from tests.tasks import effect

    # Given a row an earlier version stored with grousset_key= among its options
    with transaction.atomic(using=alias):
        row = outbox.enqueue(effect, ("key-left",), using=alias, queue=queue)
    OutboxMessage.objects.using(alias).filter(pk=row.pk).update(
        options={**row.options, "grousset_key": "order-1"})  # fmt: skip
    # When the relay runs
    relay(alias)
    # Then it is published, not dead
    row.refresh_from_db(using=alias)
    assert row.status == "sent", (row.status, row.last_error)
    assert [m["args"] for m in messages(queue)] == [["key-left"]]
    # While a caller is refused at once, told the name that works — inside a running task
    # too (the enqueue is the body's own call: the refusal reaches the body, nothing lost)
    from celery._state import _task_stack

    for in_a_task in (False, True):
        if in_a_task:
            _task_stack.push(effect)  # (as the worker's tracer does around a body)
        try:
            with pytest.raises(TypeError, match="idempotency_key"), \
                    transaction.atomic(using=alias):  # fmt: skip
                outbox.enqueue(effect, ("key-left",), using=alias, queue=queue,
                               grousset_key="order-1")  # fmt: skip
        finally:
            if in_a_task:
                _task_stack.pop()
    assert OutboxMessage.objects.using(alias).filter(options__queue=queue).count() == 1


def test_a_broker_refusing_the_vhost_stops_the_batch_at_its_first_row(
    alias: str, queue: str
) -> None:
    """RabbitMQ's NOT_ALLOWED (a vhost without permissions) is its transport's connection
    error, but not OSError or kombu's: every row of the batch was tried and charged an
    attempt, the whole backlog on its way to dead within minutes."""

    services.require_rabbitmq()
    down, a, b = two_rows_for(alias, queue, f"amqp://guest:guest@127.0.0.1:5672/no-vhost-{queue}")
    stats = relay(alias, down, backoff=60)
    a.refresh_from_db(using=alias)
    b.refresh_from_db(using=alias)
    assert stats.failed == 1 and stats.broker_down, a.last_error
    assert (a.attempts, b.attempts) == (0, 0)  # an outage: the row is charged nothing
    assert "NOT_ALLOWED" in a.last_error or "NotAllowed" in a.last_error
    OutboxMessage.objects.using(alias).filter(pk__in=[a.pk, b.pk]).delete()


def test_a_row_is_sent_only_once_the_broker_confirms_its_message(alias: str) -> None:
    """Without publisher confirms a publish returns when its bytes are in the socket: a
    network that drops them (the connection still open) lost committed messages, marked
    sent. The relay now waits for RabbitMQ's confirm, at most its confirm_timeout."""
    from kombu import Connection

    from tests.blackhole import blackhole
    from tests.tasks import effect

    services.require_rabbitmq()
    name = f"ob-confirm-{uuid.uuid4().hex[:8]}"
    with Connection(services.require_rabbitmq()) as direct:
        direct.SimpleQueue(name).close()  # routable: a message that arrives stays there
    with transaction.atomic(using=alias):
        a = outbox.enqueue(effect, ("a",), using=alias, queue=name)
        b = outbox.enqueue(effect, ("b",), using=alias, queue=name)
    try:
        with blackhole(("127.0.0.1", 5672)) as proxy:
            target = Celery("confirm", broker=f"amqp://guest:guest@127.0.0.1:{proxy.port}//",
                            set_as_current=False)  # fmt: skip
            target.conf.task_publish_retry = False
            # Given a network that starts dropping what the relay sends after its first row
            drop = proxy.dropping.set
            stats = outbox.Relay(target, using=alias, backoff=60, confirm_timeout=1.0,
                                 fault=lambda point: drop()).run(once=True)  # fmt: skip
            assert proxy.dropped > 0, "the second publish never reached the network"
        a.refresh_from_db(using=alias)
        b.refresh_from_db(using=alias)
        with Connection(services.require_rabbitmq()) as direct:
            arrived = direct.SimpleQueue(name).qsize()
        # Then only the row whose message the broker has is sent; the other is pending,
        # with the broker's silence as its error (an outage: charged no attempt)
        assert arrived == 1
        assert (a.status, b.status) == (OutboxStatus.SENT, OutboxStatus.PENDING), b.last_error
        assert b.attempts == 0 and "timed out" in b.last_error, b.last_error
        assert outbox.arguments(b)[0] == ["b"] and stats.sent == 1
    finally:
        OutboxMessage.objects.using(alias).filter(pk__in=[a.pk, b.pk]).delete()
        with Connection(services.require_rabbitmq()) as direct:
            direct.default_channel.queue_delete(name)


@pytest.mark.parametrize("db", ["postgresql", "mysql"])
def test_a_second_relay_publishes_while_the_first_holds_its_batch(db: str, queue: str) -> None:
    """By id, InnoDB sorted the due rows and locked every one it read: while one relay
    held its batch, a second one found nothing to publish (MariaDB)."""
    from tests.tasks import effect

    services.require_database(db)
    with transaction.atomic(using=db):
        rows = [outbox.enqueue(effect, (f"r{j}",), using=db, queue=queue) for j in range(6)]
    second: list[int] = []

    def run_second(point: str) -> None:  # the first relay's batch is open and locked
        def batch() -> None:
            try:
                second.append(outbox.Relay(app, using=db, batch_size=3).run_batch().sent)
            finally:
                connections.close_all()

        if not second:
            thread = threading.Thread(target=batch)
            thread.start()
            thread.join(30)

    try:
        # Given a relay in the middle of its batch of 3 of the 6 due rows
        first = outbox.Relay(app, using=db, batch_size=3, fault=run_second).run_batch()
        # Then a second relay meanwhile published the 3 others; nothing was sent twice
        assert second == [3] and first.sent == 3
        assert len(messages(queue)) == 6
    finally:
        OutboxMessage.objects.using(db).filter(pk__in=[r.pk for r in rows]).delete()


def test_a_slow_broker_does_not_hold_sqlites_write_lock_past_half_store_timeout(
    queue: str,
) -> None:
    """On SQLite a relay's batch holds the database's one write lock while it publishes:
    with a slow broker (each confirm 0.3 s) a batch of 15 held it for 4.5 s, and a claim on
    the journal meanwhile waited past STORE_TIMEOUT and was refused (a review: 120 tasks
    took 37 s instead of 2 behind a relay)."""
    from django.test import override_settings

    from celery_grousset import protect
    from celery_grousset.store import reset_stores
    from tests.tasks import effect

    alias = "default"
    with transaction.atomic(using=alias):
        rows = [outbox.enqueue(effect, (f"s{j}",), using=alias, queue=queue) for j in range(15)]
    claimed: list[Any] = []

    def claim() -> None:  # a guarded call on the journal, while the batch publishes
        started = time.monotonic()
        try:
            claimed.append(protect(f"relayed-{uuid.uuid4().hex[:8]}", lambda: "ran",
                                   max_processing_time=30, database=alias))  # fmt: skip
        except Exception as exc:
            claimed.append(exc)
        finally:
            claimed.append(time.monotonic() - started)
            connections.close_all()

    def slow(point: str) -> None:  # the broker confirms each message 0.3 s later
        if not claimed and not any(t.name == "claim" for t in threading.enumerate()):
            threading.Thread(target=claim, name="claim").start()
        time.sleep(0.3)

    try:
        with override_settings(GROUSSET={**settings.GROUSSET, "STORE_TIMEOUT": 3.0}):
            reset_stores()
            # Given 15 due rows, and a claim made as the relay's first publish is confirmed
            stats = outbox.Relay(app, using=alias, interval=0.2, fault=slow).run(once=True)
            wait = time.monotonic() + 10
            while len(claimed) < 2 and time.monotonic() < wait:
                time.sleep(0.05)
        # Then the batch let the lock go after STORE_TIMEOUT / 2 (1.5 s): the claim took it
        # (waiting under 2 s, not the 4.5 s of the whole batch) and ran
        assert claimed[0] == "ran" and claimed[1] < 2.5, claimed
        # And the relay published every row once, in more than one batch
        assert stats.sent == 15 and stats.batches >= 3 and len(messages(queue)) == 15, stats
    finally:
        reset_stores()
        OutboxMessage.objects.using(alias).filter(pk__in=[r.pk for r in rows]).delete()


def test_a_relay_once_publishes_a_row_per_batch_however_short_its_lock_budget(
    queue: str,
) -> None:
    """A batch whose lock budget (half of STORE_TIMEOUT, on SQLite) had run out before its
    first row began published nothing and left every row due: ``--once`` never ended."""
    from django.test import override_settings

    from celery_grousset.store import reset_stores
    from tests.tasks import effect

    alias, stop, done = "default", threading.Event(), []
    with transaction.atomic(using=alias):
        rows = [outbox.enqueue(effect, (f"t{j}",), using=alias, queue=queue) for j in range(3)]
    try:
        with override_settings(GROUSSET={**settings.GROUSSET, "STORE_TIMEOUT": 1e-9}):
            reset_stores()
            # Given a budget (half a nanosecond) shorter than any batch's own set-up
            relay = outbox.Relay(app, using=alias, interval=0.1)
            runner = threading.Thread(target=lambda: done.append(relay.run(stop, once=True)))
            runner.start()
            # When it runs once / Then it ends, every row sent, one per batch
            runner.join(20)
            stop.set()
            runner.join(10)
        assert done and done[0].sent == 3 and done[0].batches >= 3, done
        assert len(messages(queue)) == 3
    finally:
        reset_stores()
        OutboxMessage.objects.using(alias).filter(pk__in=[r.pk for r in rows]).delete()


def _idle_limit(alias: str, seconds: int) -> None:
    """A session idle limit on Django's connection (closed by the caller afterwards)."""
    with connections[alias].cursor() as cur:
        if connections[alias].vendor == "postgresql":
            cur.execute(f"SET idle_in_transaction_session_timeout = '{seconds}s'")
        elif connections[alias].mysql_is_mariadb:
            cur.execute(f"SET SESSION idle_transaction_timeout = {seconds}")
        else:
            pytest.skip("MySQL has no idle-in-transaction limit")


@pytest.mark.parametrize("alias", ["postgresql", "mysql"])
def test_a_slow_broker_ends_each_batch_before_a_session_idle_limit(
    alias: str, queue: str
) -> None:
    """On PostgreSQL and MariaDB a batch held its transaction, idle, for all its publishes:
    with a slow broker, an idle-in-transaction limit below that ended the session before
    "sent" was written, so every batch published its rows again, none ever marked sent
    (a review: 10 rows in the queue 3 times over, all still pending, no attempt charged).
    A batch now begins no publish after STORE_TIMEOUT / 2, as on SQLite."""
    from django.test import override_settings

    from celery_grousset.store import reset_stores
    from tests.tasks import effect

    services.require_database(alias)
    with transaction.atomic(using=alias):
        rows = [outbox.enqueue(effect, (f"i{j}",), using=alias, queue=queue) for j in range(8)]
    try:
        with override_settings(GROUSSET={**settings.GROUSSET, "STORE_TIMEOUT": 5.0}):
            reset_stores()
            # Given a session that ends once idle in a transaction for 5 s, and a broker
            # that confirms each message 1 s later (8 rows: 8 s)
            _idle_limit(alias, 5)
            relay = outbox.Relay(app, using=alias, interval=0.2, fault=lambda _: time.sleep(1))
            # When the relay runs until nothing is due
            stats = relay.run(once=True)
        # Then every row is sent, each published once, in batches of about 2.5 s
        assert stats.sent == 8 and stats.batches >= 3, stats
        assert sorted(m["args"][0] for m in messages(queue)) == [f"i{j}" for j in range(8)]
    finally:
        connections[alias].close()
        reset_stores()
        OutboxMessage.objects.using(alias).filter(pk__in=[r.pk for r in rows]).delete()


@pytest.mark.parametrize("alias", ["postgresql", "mysql"])
def test_a_batch_whose_session_ends_after_its_publishes_says_they_are_sent_again(
    alias: str, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Published rows whose batch then lost its session (an idle limit shorter than one
    publish) are published again by the next batch: the relay said only that the
    database had an error, nothing of the copies."""
    from tests.tasks import effect

    services.require_database(alias)
    with transaction.atomic(using=alias):
        rows = [outbox.enqueue(effect, (f"u{j}",), using=alias, queue=queue) for j in range(2)]
    try:
        # Given a session that ends once idle in a transaction for 1 s, and a broker
        # that confirms each message 1.5 s later
        _idle_limit(alias, 1)
        relay = outbox.Relay(app, using=alias, fault=lambda _: time.sleep(1.5))
        # When a batch publishes the rows and cannot mark them sent
        with pytest.raises(DatabaseError):
            relay.run(once=True)
        # Then an error says how many were published and not marked, and on what database
        unmarked = [r for r in caplog.records if "grousset.outbox_unmarked" in r.getMessage()]
        assert len(unmarked) == 1 and unmarked[0].levelname == "ERROR", caplog.text
        assert "count=2" in unmarked[0].getMessage(), unmarked[0].getMessage()
        assert f"database={alias}" in unmarked[0].getMessage()
        # And the rows are still pending: the next batch publishes them again
        left = OutboxMessage.objects.using(alias).filter(pk__in=[r.pk for r in rows])
        assert set(left.values_list("status", flat=True)) == {"pending"}
    finally:
        connections[alias].close()
        OutboxMessage.objects.using(alias).filter(pk__in=[r.pk for r in rows]).delete()


def _testcase_block() -> Any:
    """An atomic block as a Django TestCase opens around its test."""
    block = transaction.Atomic(None, True, False)
    block._from_testcase = True  # type: ignore[attr-defined]
    return block


def test_enqueue_refuses_a_row_outside_the_transaction_it_is_written_in(queue: str) -> None:
    from django.test import override_settings

    from tests.tasks import effect

    services.require_database("postgresql")
    # Given the journal (and so the outbox, by default) on "postgresql", and a transaction
    # open on "default" only
    grousset = {**settings.GROUSSET, "DATABASE": "postgresql"}
    mine = OutboxMessage.objects.using("postgresql").filter(options__queue=queue)
    with override_settings(GROUSSET=grousset):
        with pytest.raises(InvalidArgument) as err, transaction.atomic(using="default"):
            # When a message is enqueued without using=
            outbox.enqueue(effect, ("order-1",), queue=queue)
        # Then it is refused, naming both databases and the fix; no row was written
        assert "'default'" in str(err.value) and "'postgresql'" in str(err.value)
        assert "using='default'" in str(err.value)
        assert not mine.exists()
        # ... and so it is with a transaction open on "postgresql" too (ATOMIC_REQUESTS on
        # both, say): the row would commit with that one, apart from the caller's
        with pytest.raises(InvalidArgument) as err, transaction.atomic(using="default"), \
                transaction.atomic(using="postgresql"):  # fmt: skip
            outbox.enqueue(effect, ("order-1",), queue=queue)
        assert "apart from the one on 'default'" in str(err.value), err.value
        assert "using='default'" in str(err.value) and not mine.exists()
        # ... and a deliberate using=, or a call outside any transaction, is written
        with transaction.atomic(using="default"):
            outbox.enqueue(effect, ("order-2",), queue=queue, using="postgresql")
        outbox.enqueue(effect, ("order-3",), queue=queue)
        # ... and a Django TestCase's own blocks on both databases change nothing: the
        # caller's transaction on "default" alone is still refused
        for alias in ("default", "postgresql"):
            connections[alias].atomic_blocks.append(_testcase_block())
        connections["postgresql"].in_atomic_block = True  # as TestCase leaves it
        try:
            with pytest.raises(InvalidArgument), transaction.atomic(using="default"):
                outbox.enqueue(effect, ("order-4",), queue=queue)
        finally:
            connections["postgresql"].in_atomic_block = False
            for alias in ("default", "postgresql"):
                connections[alias].atomic_blocks.pop(0)
    assert mine.count() == 2


def test_relay_once_exits_nonzero_when_a_row_failed(alias: str, queue: str) -> None:
    from tests.tasks import effect

    # Given a good row: `grousset_relay --once` publishes it and succeeds
    with transaction.atomic(using=alias):
        outbox.enqueue(effect, ("ok",), using=alias, queue=queue)
    call_command("grousset_relay", "--once", "--app", "tests.celeryapp", "--database", alias,
                 verbosity=0)  # fmt: skip
    assert [m["args"] for m in messages(queue)] == [["ok"]]
    # When a row the broker can never take is due (a cron job runs the relay)
    with transaction.atomic(using=alias):
        outbox.enqueue("tests.tasks.effect", ("x",), {"colour": "red"}, using=alias,
                       queue=queue)  # fmt: skip
    # Then the command fails (exit code 1), naming what went wrong and where to look
    with pytest.raises(CommandError, match=r"0 message\(s\) failed .* 1 went dead.*last_error"):
        call_command("grousset_relay", "--once", "--app", "tests.celeryapp",
                     "--database", alias, verbosity=0)  # fmt: skip


def test_the_relay_command_knows_the_projects_tasks_before_it_publishes(queue: str) -> None:
    """``grousset_relay`` in a process of its own never imported the task modules (Celery
    discovers them lazily, as a worker starts): a row enqueued by name whose arguments do
    not fit its task was sent unchecked, marked sent, and dropped by the worker — the
    call lost, no dead row to alert on (a review)."""
    pg = "postgresql"
    services.require_database(pg)
    # Given a row enqueued by name with arguments its task does not take
    with transaction.atomic(using=pg):
        outbox.enqueue("tests.tasks.effect", ("a", "b", "c", "d"), using=pg, queue=queue)
    row = OutboxMessage.objects.using(pg).filter(options__queue=queue).get()
    # When the relay command runs in a process of its own, on a lazily discovering app
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "GROUSSET_TEST_DB": pg}  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "django", "grousset_relay", "--once", "--app",
                          "tests.lazyapp", "--database", pg], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    # Then the row is checked against its task: dead, said, and nothing published
    row.refresh_from_db()
    assert (row.status, run.returncode) == ("dead", 1), (row.status, run.stdout, run.stderr)
    assert "went dead" in run.stderr and messages(queue) == []


_MIGRATE = """
import json, sys, django
django.setup()
from django.core.management import call_command
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from tests import services

alias = sys.argv[1]
engine = connections.settings[alias]["ENGINE"]
recreate = (services._recreate_postgresql if "postgresql" in engine else
            services._recreate_mysql if "mysql" in engine else services._recreate_sqlite)
recreate(connections.settings[alias])
call_command("migrate", "celery_grousset", "0003", database=alias, verbosity=0)
state = MigrationExecutor(connections[alias]).loader.project_state(
    ("celery_grousset", "0003_outcome_stale_at"))
Old = state.apps.get_model("celery_grousset", "OutboxMessage")
now = timezone.now()
Old.objects.using(alias).bulk_create(
    [Old(task_name="t", task_id=str(i), created_at=now, available_at=now) for i in range(2500)])
call_command("migrate", "celery_grousset", database=alias, verbosity=0)
from celery_grousset.models import OutboxMessage
ids = list(OutboxMessage.objects.using(alias).values_list("message_id", flat=True))
print(json.dumps({"rows": len(ids), "distinct": len({i for i in ids if i is not None})}))
"""


def test_migration_gives_existing_rows_distinct_message_ids(alias: str, tmp_path: Path) -> None:
    # Given a database of its own for each backend, migrated to 0003, with 2,500 outbox rows
    # (more than one backfill batch)
    name = f"grousset_mig_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "GROUSSET_TEST_PG_NAME": name, "GROUSSET_TEST_MYSQL_NAME": name,
           "GROUSSET_TEST_SQLITE": str(tmp_path / "mig.sqlite3")}  # fmt: skip
    # When 0004 runs
    run = subprocess.run([sys.executable, "-c", _MIGRATE, alias], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    try:
        # Then every row has a message id of its own
        assert run.returncode == 0, run.stdout + run.stderr
        assert json.loads(run.stdout.strip().splitlines()[-1]) == {"rows": 2500, "distinct": 2500}
    finally:
        _drop(alias, name)


def _drop(alias: str, name: str) -> None:
    """Drop the scratch database ``name`` on ``alias``'s server (SQLite: a tmp file)."""
    from django.db import connections

    settings = connections.settings[alias]
    if "postgresql" in settings["ENGINE"]:
        from celery_grousset.store.pgdriver import driver
        pg = services.pg_connect(host=settings["HOST"], port=int(settings["PORT"]),
                                 user=settings["USER"], dbname="postgres")  # fmt: skip
        try:
            driver().execute(pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            pg.close()
    elif "mysql" in settings["ENGINE"]:
        import MySQLdb

        conn = MySQLdb.connect(host=settings["HOST"], port=int(settings["PORT"]), user="root",
                               passwd="")  # fmt: skip
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        finally:
            conn.close()


# -- end to end: real workers, real relays --------------------------------------------------


def effect_counts(alias: str, prefix: str) -> dict[str, int]:
    qs = Effect.objects.using(alias).filter(key__startswith=prefix, value="")
    return dict(qs.values_list("key").annotate(n=Count("id")).values_list("key", "n"))


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def start_relay(log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    full = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
            "GROUSSET_TEST_DB": "postgresql", **env}  # fmt: skip
    cmd = [sys.executable, "-m", "django", "grousset_relay", "--app", "tests.celeryapp",
           "--batch-size", "50", "--interval", "0.2"]  # fmt: skip
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=fh, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_outbox_20pct_rollbacks_worker_relay(queue: str) -> None:
    from tests.tasks import effect

    pg, broker = "postgresql", services.require_redis()
    services.require_database(pg)
    prefix, rng = f"rb-{uuid.uuid4().hex[:6]}-", random.Random(4)
    committed: set[str] = set()
    # Given N messages enqueued in transactions of 1-5 messages, a random 20 % rolled back
    i = 0
    while i < N:
        keys = [f"{prefix}{j}" for j in range(i, min(N, i + rng.randint(1, 5)))]
        i += len(keys)
        rollback = rng.random() < 0.2
        try:
            with transaction.atomic(using=pg):
                for key in keys:
                    outbox.enqueue(effect, (key,), using=pg, queue=queue)
                if rollback:
                    raise RuntimeError("rollback")
        except RuntimeError:
            continue
        committed.update(keys)
    # When a worker started with --grousset-relay publishes and runs them
    t0 = time.monotonic()
    with workers(queue, 1, database=pg, broker=broker, concurrency=2, extra=["--grousset-relay"]):
        wait_until(lambda: len(effect_counts(pg, prefix)) >= len(committed), 120 + N * 0.05,
                   "every committed message's effect")  # fmt: skip
        elapsed = time.monotonic() - t0
        time.sleep(1)  # a late duplicate would show now
    # Then exactly the committed messages ran, each once; nothing rolled back ran
    counts = effect_counts(pg, prefix)
    assert set(counts) == committed and set(counts.values()) == {1}
    assert 0.7 * N < len(committed) < 0.9 * N
    mine = OutboxMessage.objects.using(pg).filter(options__queue=queue)
    assert mine.count() == mine.filter(status="sent").count() == len(committed)
    print(f"\noutbox: {N} enqueued, {len(committed)} committed, all run once in {elapsed:.1f}s")


@pytest.mark.slow
def test_two_relays_one_sigkilled_mid_batch(queue: str, tmp_path: Path) -> None:
    from tests.tasks import effect

    pg, broker = "postgresql", services.require_redis()
    services.require_database(pg)
    prefix = f"kr-{uuid.uuid4().hex[:6]}-"
    keys = [f"{prefix}{j}" for j in range(N)]
    # Given N committed messages
    with transaction.atomic(using=pg):
        for key in keys:
            outbox.enqueue(effect, (key,), using=pg, queue=queue)
    mine = OutboxMessage.objects.using(pg).filter(options__queue=queue)
    arm = tmp_path / "arm"
    env = {"GROUSSET_FAULT": "outbox_published:kill", "GROUSSET_FAULT_ARM": str(arm)}
    logs = ROOT / "tests" / "artifacts" / "worker-logs"
    logs.mkdir(parents=True, exist_ok=True)
    with workers(queue, 1, database=pg, broker=broker, concurrency=2):
        # When two relays run concurrently ...
        relays = [start_relay(logs / f"relay-{queue}-{n}.log", env) for n in (1, 2)]
        try:
            wait_until(lambda: mine.filter(status="sent").count() >= N // 10, 60,
                       "the relays to be under way")  # fmt: skip
            # ... and the next row either publishes kills its relay: after the publish,
            # before its batch is marked sent
            arm.touch()
            wait_until(lambda: any(p.poll() is not None for p in relays), 30, "a relay to die")
            wait_until(lambda: not mine.filter(status="pending").exists(), 120,
                       "the surviving relay to publish the rest")  # fmt: skip
            wait_until(lambda: len(effect_counts(pg, prefix)) >= N, 120 + N * 0.05,
                       "every effect")  # fmt: skip
            time.sleep(1)
        finally:
            for p in relays:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    p.wait(20)
    # Then one relay was SIGKILLed, the other stopped cleanly on SIGTERM
    assert sorted(p.returncode for p in relays) == [-signal.SIGKILL, 0]
    # ... every message's effect ran exactly once, none lost
    counts = effect_counts(pg, prefix)
    assert set(counts) == set(keys) and set(counts.values()) == {1}
    # ... and the killed batch's published row was delivered twice, absorbed by the claim
    journal = Outcome.objects.using(pg).filter(task_name=effect.name,
                                               task_id__in=mine.values_list("task_id"))  # fmt: skip
    doubled = journal.filter(deliveries__gte=2).count()
    assert 1 <= doubled <= 50, doubled
    assert journal.count() == N and journal.aggregate(m=Max("takeovers"))["m"] == 0


def test_a_publish_error_is_stored_redacted(
    alias: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.tasks import effect

    # Given a pending message and a publish that fails with secrets in its text
    with transaction.atomic(using=alias):
        msg = outbox.enqueue(effect, ("x",), using=alias, queue=queue)

    def failing(app: Any, row: Any, **publishing: Any) -> None:
        raise ConnectionError("amqp://relay:hunter2@mq.internal// refused; token=Bearer abc.def")

    monkeypatch.setattr(outbox, "publish", failing)
    # When the relay tries it
    relay(alias, max_attempts=5, backoff=60)
    msg.refresh_from_db(using=alias)
    # Then last_error says what failed, without the password or the token
    assert msg.attempts == 0 and "ConnectionError" in msg.last_error
    assert "hunter2" not in msg.last_error and "abc.def" not in msg.last_error
    OutboxMessage.objects.using(alias).filter(pk=msg.pk).delete()


@pytest.mark.parametrize("flag", ["batch_size", "max_attempts"])
def test_a_relay_option_below_one_is_refused_naming_its_flag(flag: str) -> None:
    # When a relay is made with one of them 0 / Then the error names that one, and its flag
    with pytest.raises(InvalidArgument, match=rf"^{flag} \(--{flag.replace('_', '-')}\) must be"):
        outbox.Relay(app, using="default", **{flag: 0})


def test_a_publish_the_broker_refuses_in_an_empty_error_names_the_refusal() -> None:
    """kombu wraps a broker's nack (py-amqp's MessageNacked) in an OperationalError of
    empty text: the row's last_error and the log line said only "OperationalError: "."""
    from amqp.exceptions import MessageNacked
    from kombu.exceptions import OperationalError

    from celery_grousset.memo import error_summary

    # Given the error a refused publish raises / When it is summarized for the row and log
    try:
        try:
            raise MessageNacked()
        except MessageNacked as nack:
            raise OperationalError(str(nack)) from nack
    except OperationalError as exc:
        text = error_summary(exc)
    # Then it names what was refused under it
    assert text == "OperationalError: (raised from MessageNacked: )", text

