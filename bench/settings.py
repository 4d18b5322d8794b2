"""Django settings for the benchmarks (``DJANGO_SETTINGS_MODULE=bench.settings``).

The same three journal aliases as the test suite (``default`` = SQLite file,
``postgresql``, ``mysql``), on databases of their own so a benchmark never drops
a test session's database:

* ``BENCH_PG_NAME`` / ``GROUSSET_TEST_PG_NAME`` (default ``grousset_bench``)
* ``BENCH_MYSQL_NAME`` / ``GROUSSET_TEST_MYSQL_NAME`` (default ``grousset_bench``)
* ``BENCH_TMP`` / ``GROUSSET_TEST_TMP`` holds the SQLite file (default /tmp/grousset-bench)

``BENCH_GROUSSET_DB`` picks the journal alias of the worker (one per variant).
"""

from __future__ import annotations

import os
import tempfile


def _env(*names: str, default: str) -> str:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return default


TMP = _env("BENCH_TMP", "GROUSSET_TEST_TMP",
           default=os.path.join(tempfile.gettempdir(), "grousset-bench"))  # fmt: skip
os.makedirs(TMP, exist_ok=True)

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "celery_grousset",
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

PG_NAME = _env("BENCH_PG_NAME", "GROUSSET_TEST_PG_NAME", default="grousset_bench")
MYSQL_NAME = _env("BENCH_MYSQL_NAME", "GROUSSET_TEST_MYSQL_NAME", default="grousset_bench")
SQLITE_NAME = os.path.join(TMP, "bench-journal.sqlite3")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": SQLITE_NAME,
        "OPTIONS": {"timeout": 10},
    },
    "postgresql": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": PG_NAME,
        "USER": os.environ.get("BENCH_PG_USER", "postgres"),
        "HOST": os.environ.get("BENCH_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_PG_PORT", "5432"),
    },
    # the partitioned layout's scratch database (python -m bench.scale_ab)
    "pgpart": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": PG_NAME + "_part",
        "USER": os.environ.get("BENCH_PG_USER", "postgres"),
        "HOST": os.environ.get("BENCH_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_PG_PORT", "5432"),
    },
    "mysql": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": MYSQL_NAME,
        "USER": "root",
        "PASSWORD": "",
        "HOST": os.environ.get("BENCH_MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_MYSQL_PORT", "3306"),
        "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
    },
}

GROUSSET = {
    "DATABASE": os.environ.get("BENCH_GROUSSET_DB", "postgresql"),
    "MAX_PROCESSING_TIME": 60,
    # "durable" (the default, what the targets are measured with) or "async" (opt-in knob)
    "CLAIM_COMMIT": os.environ.get("BENCH_CLAIM_COMMIT", "durable"),
    # the opt-in main-process claim (the grousset-pg-batch variant)
    "WORKER_CLAIM": os.environ.get("BENCH_WORKER_CLAIM") == "1",
    # its flush delay (seconds; default 0): BENCH_WORKER_CLAIM_FLUSH_DELAY=0.002
    "WORKER_CLAIM_FLUSH_DELAY": float(os.environ.get("BENCH_WORKER_CLAIM_FLUSH_DELAY", "0")),
}

#: Redis db 12 for the broker, db 11 for results (and the Redis-based competitors).
CELERY_BROKER_URL = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/12")
CELERY_RESULT_BACKEND = os.environ.get("BENCH_BACKEND", "redis://127.0.0.1:6379/11")
