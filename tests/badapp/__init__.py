"""A Django app whose Celery tasks are misconfigured on purpose (``tests.checks_settings``)."""
