"""Celery's in-process test worker under Django's test runner (docs/testing.md).

``celery.contrib.testing.worker.start_worker`` — as Celery's Django documentation shows
it, in a test class's ``setUpClass`` — runs each delivery in a thread of its own, whose
Django connections no test case marks: a delivery there would claim in a database the
test may not use (the one in your settings) or outlive a rolled-back ``TestCase``. While
such a worker runs in a process where Django's test environment is set up, each of its
deliveries is judged by the connections of the thread that started it, as a guarded call
in that thread is (``testcase_check.refuse_leaks``); the refused task fails with
``DatabaseOperationForbidden``, which its result's ``get()`` raises. Under pytest, the
plugin's own check (``celery_grousset.contrib.pytest``) takes precedence while a test runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from celery_grousset import guard
from celery_grousset.testcase_check import refuse_leaks, this_threads_connections

_checks: dict[int, Callable[[str], None]] = {}  # id(worker) -> the check it installed


def _in_test_environment() -> bool:
    """Django's test environment is set up (``setup_test_environment`` made the test
    outbox; a worker process of ``celery worker`` never has one)."""
    from django.core import mail

    return hasattr(mail, "outbox")


def worker_started(sender: Any = None, **kwargs: Any) -> None:
    """``worker_init``, in the thread that starts the worker: under Django's test runner,
    check each delivery against this thread's connections while the worker runs."""
    if guard.test_database_check is not None or not _in_test_environment():
        return  # the pytest plugin checks, or not a test's process
    starter, held = threading.current_thread(), this_threads_connections()

    def check(alias: str) -> None:
        here = threading.current_thread() is starter
        refuse_leaks(alias, None if here else held.get(alias))

    _checks[id(sender)] = guard.test_database_check = check


def worker_stopped(sender: Any = None, worker: Any = None, **kwargs: Any) -> None:
    """``worker_shutdown``, or Celery's ``test_worker_stopped`` (``start_worker`` stops its
    worker without the former; its sender is the app): the check ends with the worker."""
    check = _checks.pop(id(worker if worker is not None else sender), None)
    if check is not None and guard.test_database_check is check:
        guard.test_database_check = None


def connect() -> None:
    from celery import signals

    signals.worker_init.connect(worker_started, weak=False, dispatch_uid="celery_grousset.tw")
    signals.worker_shutdown.connect(worker_stopped, weak=False, dispatch_uid="celery_grousset.tw")
    from celery.contrib.testing import worker as testing

    testing.test_worker_stopped.connect(worker_stopped, weak=False,
                                        dispatch_uid="celery_grousset.tw")  # fmt: skip
