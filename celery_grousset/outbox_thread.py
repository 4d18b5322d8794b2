"""The outbox relay in a worker: ``celery worker --grousset-relay`` runs a :class:`Relay`
in a daemon thread (docs/producer.md)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import connections

from celery_grousset import events
from celery_grousset.outbox import Relay


class RelayThread(threading.Thread):
    """A relay running in a daemon thread (the worker bootstep's ``--grousset-relay``).

    In a prefork worker, :meth:`start_when_ready` starts it once the worker is ready,
    after the pool has forked its children: a child forked while this thread holds a
    lock (an import, say) would inherit the lock held, forever.
    """

    def __init__(self, app: Any, **options: Any) -> None:
        super().__init__(name="grousset-relay", daemon=True)
        self.relay = Relay(app, **options)
        self.stop_event = threading.Event()
        connections[self.relay.alias]  # import the database backend now, before any fork

    def start_when_ready(self) -> None:
        """Start on Celery's ``worker_ready`` signal (once)."""
        from celery.signals import worker_ready

        def ready(**kwargs: Any) -> None:
            if not self.is_alive() and not self.stop_event.is_set() and self.ident is None:
                self.start()

        self._ready = ready  # the signal holds receivers weakly
        worker_ready.connect(ready)

    def run(self) -> None:
        try:
            self.relay.run(self.stop_event)
        except Exception:  # pragma: no cover - logged, never kills the worker
            events.emit(logging.ERROR, "grousset.outbox_relay_crashed",
                        {"database": self.relay.alias}, exc_info=True)  # fmt: skip
        finally:
            connections.close_all()

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout)
