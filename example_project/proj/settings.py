"""Settings of the example project, read from the environment (django-environ).

With nothing set, everything lives under ``.demo/`` at the repository root
(``GROUSSET_DEMO_DIR`` moves it): a SQLite database, a server-less broker
(kombu's ``filesystem://`` transport) and Celery's file result backend. On real
servers::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/shop \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/0  python manage.py migrate
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import django
import environ
from celery.schedules import crontab

env = environ.Env()

#: The repository root (``manage.py`` lives there).
BASE_DIR = Path(__file__).resolve().parents[2]
#: Where the server-less defaults keep their files.
DEMO_DIR = Path(env.str("GROUSSET_DEMO_DIR", default=str(BASE_DIR / ".demo"))).resolve()

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="example-project-not-secret")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_grousset",
    "shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "proj.urls"
WSGI_APPLICATION = "proj.wsgi.application"
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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# -- database: the journal lives next to the shop's tables --------------------------------
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{DEMO_DIR / 'db.sqlite3'}"),
}
if "sqlite" in DATABASES["default"]["ENGINE"]:
    os.makedirs(DEMO_DIR, exist_ok=True)
    _sqlite_options: dict[str, object] = {"timeout": 20}  # seconds to wait for the write lock
    if django.VERSION >= (5, 1):
        # Take the write lock at BEGIN: no "database is locked" on a read→write upgrade;
        # WAL: readers never wait for the writer (system check celery_grousset.W005).
        _sqlite_options["transaction_mode"] = "IMMEDIATE"
        _sqlite_options["init_command"] = "PRAGMA journal_mode=WAL;"
    DATABASES["default"]["OPTIONS"] = {**DATABASES["default"].get("OPTIONS", {}),
                                       **_sqlite_options}  # fmt: skip

# -- celery-grousset -----------------------------------------------------------------------
GROUSSET = {
    "DATABASE": "default",  # the journal's database alias
    "PROCESSOR_ID": "shop",  # who deduplicates: every worker of this service shares it
    "EXPIRES_AFTER": timedelta(days=7),  # remember completed calls this long
    "ON_IN_FLIGHT": "retry",  # a duplicate of a running call is re-queued, not run
    "STORE_TIMEOUT": 10.0,  # seconds before the journal counts as unavailable (fail closed)
    "REDACT_KEYS": ("email",),  # hidden in args_repr, logs and the admin
}

# -- Celery (app.config_from_object("django.conf:settings", namespace="CELERY")) ------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem"):
    # A server-less broker: one folder of message files, shared by producers and workers.
    _broker = DEMO_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker / "queue"),
        "data_folder_out": str(_broker / "queue"),  # the same folder: in == out
        "processed_folder": str(_broker / "processed"),
        "store_processed": True,
        "control_folder": str(_broker / "control"),
        "polling_interval": 0.1,
    }
    for _folder in ("queue", "processed", "control"):
        os.makedirs(_broker / _folder, exist_ok=True)
else:
    # Redis / SQS redeliver an unacknowledged message after visibility_timeout: keep it
    # above every task's max_processing_time (system check celery_grousset.W001).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}

CELERY_RESULT_BACKEND = env.str(
    "CELERY_RESULT_BACKEND", default=f"file://{DEMO_DIR / 'results'}"
)
if CELERY_RESULT_BACKEND.startswith("file://"):
    os.makedirs(CELERY_RESULT_BACKEND.removeprefix("file://"), exist_ok=True)
CELERY_RESULT_EXPIRES = timedelta(days=1)
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_TASK_DEFAULT_QUEUE", default="celery")

# At-least-once delivery: ack after the task ran, redeliver when a worker child dies.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Seconds the worker waits for a killed pool process's result before it declares the job
# lost (and, with reject_on_worker_lost, hands the message back to the broker).
CELERY_WORKER_LOST_WAIT = env.float("CELERY_WORKER_LOST_WAIT", default=10.0)

CELERY_BEAT_SCHEDULE = {
    "grousset-purge-expired": {
        # forget completed records past their expires_on, in batches
        "task": "celery_grousset.purge_expired",
        "schedule": crontab(minute=0),  # hourly
    },
}
