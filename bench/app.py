"""The benchmark's Celery app: one task per variant, the same body for all.

``celery -A bench.app worker`` with ``DJANGO_SETTINGS_MODULE=bench.settings``, so
Celery's Django fixup is active for every variant (as in a Django project).
Every task takes ``(key, sleep)``, calls :func:`bench.probe.effect` once per
effect, sleeps ``sleep`` seconds (the I/O-like body) and returns ``key``.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import psycopg  # noqa: F401 - imported before the fork, like every variant's modules
from aws_lambda_powertools.utilities.idempotency import (
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.persistence.cache import (
    CachePersistenceLayer,
)
from celery import Celery
from celery_once import QueueOnce  # type: ignore[import-untyped]

from bench import probe
from celery_grousset import GroussetTask

QUEUE = os.environ.get("BENCH_QUEUE", "bench")
#: Redis for the competitors' own state (celery-once locks, Powertools records)
STATE_URL = os.environ.get("BENCH_BACKEND", "redis://127.0.0.1:6379/11")

app = Celery("bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
if os.environ.get("BENCH_WORKER_CLAIM") == "1":  # WORKER_CLAIM acts through the worker step
    from celery_grousset.worker import install

    install(app)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
    task_default_queue=QUEUE,
    result_expires=3600,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 3600},
    ONCE={
        "backend": "celery_once.backends.Redis",
        "settings": {"url": STATE_URL, "default_timeout": 3600},
    },
)


def body(key: str, sleep: float) -> str:
    """The effect: counted, then an optional I/O-like pause."""
    probe.effect(key)
    if sleep:
        time.sleep(sleep)
    return key


@app.task(name="bench.plain")
def plain(key: str, sleep: float = 0.0) -> str:
    """Plain Celery: no deduplication at all."""
    return body(key, sleep)


@app.task(name="bench.grousset", base=GroussetTask, max_processing_time=60)
def grousset(key: str, sleep: float = 0.0) -> str:
    """celery-grousset; the journal is ``GROUSSET["DATABASE"]`` (``BENCH_GROUSSET_DB``)."""
    return body(key, sleep)


# -- the floor a careful team writes first: raw psycopg, INSERT … ON CONFLICT + UPDATE ----

RAW_TABLE = "bench_raw_claim"
RAW_DDL = (
    f"CREATE TABLE IF NOT EXISTS {RAW_TABLE} (key text PRIMARY KEY, status text NOT NULL, "
    "claimed_at timestamptz NOT NULL DEFAULT now())"
)
_raw: dict[str, Any] = {"pid": 0, "conn": None}


def raw_connection() -> Any:
    """One autocommit psycopg connection per process (opened after fork)."""
    conn = _raw["conn"]
    if _raw["pid"] != os.getpid() or conn is None or conn.closed:
        import psycopg
        from django.conf import settings

        db = settings.DATABASES["postgresql"]
        conn = psycopg.connect(host=str(db["HOST"]), port=str(db["PORT"]), user=str(db["USER"]),
                               dbname=str(db["NAME"]), autocommit=True)  # fmt: skip
        _raw.update(pid=os.getpid(), conn=conn)
    return conn


@app.task(name="bench.raw_pg")
def raw_pg(key: str, sleep: float = 0.0) -> str | None:
    """Hand-rolled claim: INSERT … ON CONFLICT DO NOTHING RETURNING, run, UPDATE."""
    conn = raw_connection()
    claimed = conn.execute(
        f"INSERT INTO {RAW_TABLE} (key, status) VALUES (%s, 'in_flight') "
        "ON CONFLICT DO NOTHING RETURNING 1",
        (key,),
    ).fetchone()
    if claimed is None:
        return None  # a duplicate: skipped (no memo)
    result = body(key, sleep)
    conn.execute(f"UPDATE {RAW_TABLE} SET status = 'done' WHERE key = %s", (key,))
    return result


# -- celery-once: a Redis lock taken at publish time, cleared after the run --------------


@app.task(name="bench.once", base=QueueOnce, once={"graceful": True})
def once(key: str, sleep: float = 0.0) -> str:
    """celery-once ``QueueOnce`` (Redis backend)."""
    return body(key, sleep)


# -- AWS Lambda Powertools idempotency, Redis persistence layer ---------------------------
# (imported above, before the fork, so that no variant pays an import inside the timing)

_powertools: dict[str, Any] = {"pid": 0, "fn": None}


# Outside AWS Lambda there is no context to register: silence that per-process warning.
warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")


def _powertools_fn() -> Any:
    if _powertools["pid"] != os.getpid():
        layer = CachePersistenceLayer(url=STATE_URL)
        config = IdempotencyConfig(event_key_jmespath="key", expires_after_seconds=3600)

        @idempotent_function(  # type: ignore[untyped-decorator]
            data_keyword_argument="order", persistence_store=layer, config=config
        )
        def process(order: dict[str, Any]) -> str:
            return body(order["key"], order["sleep"])

        _powertools.update(pid=os.getpid(), fn=process)
    return _powertools["fn"]


@app.task(name="bench.powertools")
def powertools(key: str, sleep: float = 0.0) -> str:
    """Powertools ``idempotent_function`` with ``CachePersistenceLayer`` (Redis)."""
    return str(_powertools_fn()(order={"key": key, "sleep": sleep}))
