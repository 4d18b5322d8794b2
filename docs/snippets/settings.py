# ruff: noqa: F821
"""Getting started, step 2: the lines to add at the end of ``mysite/settings.py``.

Not a settings module of its own: ``tests/test_getting_started.py`` appends this
file to the ``settings.py`` of a project made by ``django-admin startproject``,
and ``tests/test_docs.py`` executes it over a minimal namespace.
"""

# --8<-- [start:apps]
INSTALLED_APPS += [
    "celery_grousset",  # the outcome journal: `manage.py migrate` creates its table
    "shop",  # your app with the tasks
]
# --8<-- [end:apps]

# --8<-- [start:grousset]
GROUSSET = {
    # Who deduplicates: every worker of this service shares the id (default:
    # the Celery app's name).
    "PROCESSOR_ID": "mysite",
    # The retention window: a completed call is remembered for 7 days.
    "EXPIRES_AFTER": 7 * 24 * 3600,
}
# --8<-- [end:grousset]

# --8<-- [start:celery]
CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
# Acknowledge a message after the task ran, and redeliver it when the worker
# process dies: the guard turns the redeliveries into duplicates, never into
# lost tasks.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Redis redelivers a message that is not acknowledged within visibility_timeout:
# keep it above every max_processing_time (system check celery_grousset.W001).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
# --8<-- [end:celery]

# --8<-- [start:email]
# While you try it out: print emails to the console instead of sending them.
import django

CONSOLE = "django.core.mail.backends.console.EmailBackend"
if django.VERSION >= (6, 1):  # (Django 6.1 sets up email in MAILERS; EMAIL_BACKEND is refused)
    MAILERS = {"default": {"BACKEND": CONSOLE}}
else:
    EMAIL_BACKEND = CONSOLE
# --8<-- [end:email]
