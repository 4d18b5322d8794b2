"""Django settings for the test suite.

Three journal databases side by side, one alias each, so that one pytest run
holds every behaviour test to PostgreSQL, SQLite and MariaDB:

* ``default`` — SQLite file (``GROUSSET_TEST_SQLITE``, default under /tmp)
* ``postgresql`` — 127.0.0.1:5432, database ``grousset_test``
* ``mysql`` — 127.0.0.1:3306 (MariaDB), database ``grousset_test``

``GROUSSET_TEST_DB`` picks the journal alias for worker processes.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

# `make test` runs the suite in parallel processes (pytest-xdist, one test file per
# process at a time): the first keeps the names below, each other process gets databases,
# a scratch folder and Redis databases of its own. Set in the environment, so the worker
# processes a test starts (and the bench it runs) inherit them.
_slot = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
if _slot:
    _redis = {1: (3, 4), 2: (1, 2)}  # 9-15 are the chaos suite's, the suite's and bench's
    if _slot not in _redis:
        raise RuntimeError(f"tests/settings.py: at most {len(_redis) + 1} parallel test "
                           f"processes (pytest -n), not {_slot + 1}")  # fmt: skip
    for _var, _value in {
        "GROUSSET_TEST_PG_NAME": f"grousset_test_gw{_slot}",
        "GROUSSET_TEST_MYSQL_NAME": f"grousset_test_gw{_slot}",
        "GROUSSET_TEST_TMP": os.path.join(tempfile.gettempdir(), f"grousset-tests-gw{_slot}"),
        "GROUSSET_TEST_BROKER": f"redis://127.0.0.1:6379/{_redis[_slot][0]}",
        "GROUSSET_TEST_BACKEND": f"redis://127.0.0.1:6379/{_redis[_slot][1]}",
        "BENCH_PG_NAME": f"grousset_bench_gw{_slot}",
        "BENCH_MYSQL_NAME": f"grousset_bench_gw{_slot}",
        "BENCH_TMP": os.path.join(tempfile.gettempdir(), f"grousset-bench-gw{_slot}"),
    }.items():
        os.environ.setdefault(_var, _value)

_tmp = os.environ.get("GROUSSET_TEST_TMP") or os.path.join(tempfile.gettempdir(), "grousset-tests")
os.makedirs(_tmp, exist_ok=True)

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_grousset",
    "tests.ledger",
]
if os.environ.get("GROUSSET_TEST_WITHOUT_APP"):  # a project that forgot the app
    INSTALLED_APPS.remove("celery_grousset")
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = os.environ.get("GROUSSET_TEST_AUTO_FIELD", "django.db.models.AutoField")

# GROUSSET_TEST_PG_DRIVER=psycopg2: hide psycopg 3, so that Django — and with it the
# store — runs PostgreSQL on psycopg2, as in a project that only has psycopg2.
PG_DRIVER = os.environ.get("GROUSSET_TEST_PG_DRIVER", "")
if PG_DRIVER == "psycopg2":
    import sys

    sys.modules["psycopg"] = None  # type: ignore[assignment]  # `import psycopg` fails
elif PG_DRIVER not in ("", "psycopg"):
    raise ValueError(f"GROUSSET_TEST_PG_DRIVER must be psycopg or psycopg2, not {PG_DRIVER!r}")

PG_NAME = os.environ.get("GROUSSET_TEST_PG_NAME", "grousset_test")
MYSQL_NAME = os.environ.get("GROUSSET_TEST_MYSQL_NAME", "grousset_test")

DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("GROUSSET_TEST_SQLITE", os.path.join(_tmp, "journal.sqlite3")),
        "OPTIONS": {"timeout": 10},
        "TEST": {
            "NAME": os.environ.get("GROUSSET_TEST_SQLITE", os.path.join(_tmp, "journal.sqlite3"))
        },
    },
    "postgresql": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": PG_NAME,
        "USER": os.environ.get("GROUSSET_TEST_PG_USER", "postgres"),
        "HOST": os.environ.get("GROUSSET_TEST_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("GROUSSET_TEST_PG_PORT", "5432"),
        "TEST": {"NAME": PG_NAME},
    },
    # The partitioned journal (docs/scale.md): its own database, converted by
    # tests/services.require_partitioned.
    "pgpart": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": f"{PG_NAME}_part",
        "USER": os.environ.get("GROUSSET_TEST_PG_USER", "postgres"),
        "HOST": os.environ.get("GROUSSET_TEST_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("GROUSSET_TEST_PG_PORT", "5432"),
        "TEST": {"NAME": f"{PG_NAME}_part"},
    },
    # A journal converted with rows in it, by tests/test_partition.py.
    "pgconvert": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": f"{PG_NAME}_convert",
        "USER": os.environ.get("GROUSSET_TEST_PG_USER", "postgres"),
        "HOST": os.environ.get("GROUSSET_TEST_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("GROUSSET_TEST_PG_PORT", "5432"),
        "TEST": {"NAME": f"{PG_NAME}_convert"},
    },
    "mysql": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": MYSQL_NAME,
        "USER": "root",
        "PASSWORD": "",
        "HOST": os.environ.get("GROUSSET_TEST_MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ.get("GROUSSET_TEST_MYSQL_PORT", "3306"),
        "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
        "TEST": {"NAME": MYSQL_NAME},
    },
}



def bouncer_database(port: int | str) -> dict[str, object]:
    """The suite's PostgreSQL database through tests/test_pgbouncer.py's PgBouncer, set
    up as docs/configuration.md says for a pooler (psycopg 3: ``prepare_threshold``)."""
    try:
        import psycopg  # noqa: F401

        options: dict[str, object] = {"prepare_threshold": None}
    except ImportError:  # psycopg2 has no such option (nor psycopg 3's own naming)
        options = {}
    return {**DATABASES["postgresql"], "PORT": str(port), "OPTIONS": options}


if os.environ.get("GROUSSET_TEST_PGBOUNCER_PORT"):  # that test's racer processes
    DATABASES["bouncer"] = bouncer_database(os.environ["GROUSSET_TEST_PGBOUNCER_PORT"])

GROUSSET = {
    "DATABASE": os.environ.get("GROUSSET_TEST_DB", "default"),
    "STORE_TIMEOUT": float(os.environ.get("GROUSSET_TEST_STORE_TIMEOUT", "5")),
    # GROUSSET_TEST_WORKER_CLAIM=1: every test worker claims in its main process (the
    # chaos suite run with the switch on: `GROUSSET_TEST_WORKER_CLAIM=1 make chaos`)
    "WORKER_CLAIM": os.environ.get("GROUSSET_TEST_WORKER_CLAIM") == "1",
    "JOURNAL_LAYOUT": os.environ.get("GROUSSET_TEST_LAYOUT", "table"),
}
for _name in ("WORKER_CLAIM_FLUSH_DELAY", "WORKER_CLAIM_RENEW_AFTER"):  # worker tests
    if os.environ.get(f"GROUSSET_TEST_{_name}"):
        GROUSSET[_name] = float(os.environ[f"GROUSSET_TEST_{_name}"])

CELERY_BROKER_URL = os.environ.get("GROUSSET_TEST_BROKER", "redis://127.0.0.1:6379/14")
CELERY_RESULT_BACKEND = os.environ.get("GROUSSET_TEST_BACKEND", "redis://127.0.0.1:6379/15")
