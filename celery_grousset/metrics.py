"""Prometheus metrics (optional extra: ``pip install celery-grousset[prometheus]``).

=========================================  =========  ====================================
metric                                     type       labels
=========================================  =========  ====================================
``grousset_claims_total``                  counter    ``task``, ``outcome``: one of
                                                      :data:`CLAIM_LABELS`
``grousset_duplicate_detections_total``    counter    ``task``
``grousset_outcome_commit_errors_total``   counter    ``task``
``grousset_store_seconds``                 histogram  ``operation`` (``claim``)
``grousset_completions_total``             counter    ``task``, ``outcome``: one of
                                                      ``COMPLETION_OUTCOMES``
``grousset_completion_seconds``            histogram  ``task``
``grousset_overruns_total``                counter    ``task``
=========================================  =========  ====================================

:data:`GAUGES` (in-flight and stale claims, oldest in-flight age, outbox pending / dead /
oldest due; label ``database``) are read on scrape by a :class:`JournalCollector` that
:func:`enable` registers and a worker's parent serves; the shipped dashboard and alert
rules (``celery_grousset/contrib/monitoring/``) use them.

Nothing happens at import: :func:`enable` imports ``prometheus_client`` and makes the
guard report to a :class:`Recorder` (``celery_grousset.events.recorder``). A prefork
worker (``--grousset-metrics-port N``) counts in its pool children and serves from its
parent, in prometheus_client's multiprocess mode (:class:`WorkerMetrics`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

from celery_grousset import events
from celery_grousset.claim import Kind
from celery_grousset.exceptions import ConfigurationError

logger = logging.getLogger("celery_grousset")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
DIR_PREFIX = "grousset-metrics-"  #: + the worker's pid: the directory of its counters

#: ``Kind`` values (what a claim found) → the ``outcome`` label
OUTCOMES = {
    "new": "new",
    "reclaim": "new",
    "resumed": "new",
    "duplicate": "duplicate",
    "takeover": "takeover",
    "in_flight": "in_flight",
    "failed": "failed_replayed",
    "gave_up": "gave_up",
}
#: every ``outcome`` of ``grousset_claims_total``: a claim's decision (``OUTCOMES``
#: merges some), a completion refused because the claim was taken over, a claim the
#: journal did not answer (``store_unavailable``: the delivery waits and retries), or a
#: call it can never record (``poison``: rejected, never run)
CLAIM_LABELS = (*dict.fromkeys(OUTCOMES.get(k.value, k.value) for k in Kind if k is not Kind.BYPASSED), "fenced_out", "store_unavailable", "poison")  # noqa: E501  # fmt: skip
#: the claim outcomes the alert rules watch: a worker serves them at 0 from its start
ALERTED = ("fenced_out", "gave_up", "poison", "store_unavailable")
#: outcomes that are a duplicate delivery answered from the journal
DUPLICATES = frozenset({"duplicate", "failed_replayed"})
#: claim latency buckets (seconds): a claim is a single round trip, usually < 5 ms
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: what an owned attempt's completion write did: ``grousset_completions_total``'s outcome
COMPLETION_OUTCOMES = ("completed", "failed", "retried", "ignored", "rejected", "fenced_out")
#: The gauges (:class:`JournalCollector`), label ``database``: read on scrape, the same
#: journal-wide values in every process that serves them (aggregate with ``max``).
GAUGE_HELP = {
    "grousset_in_flight_claims": "Claims held by a running attempt (counted up to a cap).",
    "grousset_stale_claims": "In-flight claims past their stale_at: holder dead or stuck.",
    "grousset_oldest_in_flight_seconds": "Age of the oldest in-flight claim (0: none).",
    "grousset_outbox_pending": "Outbox rows waiting to be published (counted up to a cap).",
    "grousset_outbox_dead": "Outbox rows that failed max_attempts publishes (up to a cap).",
    "grousset_outbox_oldest_due_seconds": "Wait of the oldest due outbox row (0: none).",
}
GAUGES = tuple(GAUGE_HELP)
#: seconds a scrape reuses the gauges an earlier one read (once per period and process)
GAUGE_TTL = 5.0


def client() -> ModuleType:
    """``prometheus_client``, imported now, or a clear error naming the extra."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(
            "celery-grousset metrics need prometheus-client: "
            "pip install celery-grousset[prometheus]"
        ) from exc
    if os.environ.get(MULTIPROC_ENV):
        _multiprocess_values()
    return prometheus_client


def _multiprocess_values() -> None:
    """prometheus_client imported before the multiprocess directory was set (by user
    code, in the worker parent): new metrics take multiprocess values."""
    from prometheus_client import values

    if values.ValueClass is values.MutexValue:
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


class Recorder:
    """Counts what the guard reports. Never raises into a task."""

    def __init__(self, registry: Any = None) -> None:
        pc = client()
        kw: dict[str, Any] = {} if registry is None else {"registry": registry}
        self.registry = registry if registry is not None else pc.REGISTRY

        def counter(name: str, doc: str, *labels: str) -> Any:
            return pc.Counter(name, doc, ["task", *labels], **kw)

        def histogram(name: str, doc: str, label: str) -> Any:
            return pc.Histogram(name, doc, [label], buckets=BUCKETS, **kw)

        self.claims = counter(
            "grousset_claims", "Deliveries of guarded tasks by what their claim found.", "outcome"
        )
        self.duplicates = counter(
            "grousset_duplicate_detections",
            "Duplicate deliveries answered from the journal without running the task.",
        )
        self.commit_errors = counter(
            "grousset_outcome_commit_errors",
            "Outcomes that could not be written (store unavailable after the effect).",
        )
        self.store_seconds = histogram(
            "grousset_store_seconds", "Time spent in journal store operations.", "operation"
        )
        self.completions = counter(
            "grousset_completions",
            "Owned attempts by how their completion write ended: "
            + ", ".join(COMPLETION_OUTCOMES) + ".",
            "outcome",
        )
        self.overruns = counter(
            "grousset_overruns",
            "Owned attempts whose body ran longer than max_processing_time (their outcome "
            "was written: no duplicate took the claim over meanwhile).",
        )
        self.completion_seconds = histogram(
            "grousset_completion_seconds",
            "Time spent writing an attempt's outcome to the journal.",
            "task",
        )

    def zero(self, tasks: Sequence[str]) -> None:
        """The alerted events of ``tasks`` at 0: the rules' increase() sees the first."""
        for task in tasks:
            self.commit_errors.labels(task=task), self.overruns.labels(task=task)
            for outcome in ALERTED:
                self.claims.labels(task=task, outcome=outcome)

    def collectors(self) -> tuple[Any, ...]:
        return (self.claims, self.duplicates, self.commit_errors, self.store_seconds,
                self.completions, self.completion_seconds, self.overruns)  # fmt: skip

    def claim(self, task: str, outcome: str, seconds: float) -> None:
        try:
            label = OUTCOMES.get(outcome, outcome)
            self.claims.labels(task=task, outcome=label).inc()
            if label in DUPLICATES:
                self.duplicates.labels(task=task).inc()
            self.store_seconds.labels(operation="claim").observe(seconds)
        except Exception:  # metrics must never break a task
            logger.debug("celery-grousset: could not record a claim metric", exc_info=True)

    def counted(self, task: str, outcome: str) -> None:
        """``fenced_out``, ``store_unavailable`` or ``poison``: a claim outcome no decision
        counts."""
        try:
            self.claims.labels(task=task, outcome=outcome).inc()
        except Exception:
            logger.debug("celery-grousset: could not record %s", outcome, exc_info=True)

    def finished(self, task: str, outcome: str, seconds: float) -> None:
        try:
            self.completions.labels(task=task, outcome=outcome).inc()
            self.completion_seconds.labels(task=task).observe(seconds)
        except Exception:
            logger.debug("celery-grousset: could not record a completion", exc_info=True)

    def overran(self, task: str) -> None:
        self._inc(self.overruns, task, "an overrun")

    def commit_error(self, task: str) -> None:
        self._inc(self.commit_errors, task, "a commit error")

    def _inc(self, counter: Any, task: str, what: str) -> None:
        try:
            counter.labels(task=task).inc()
        except Exception:
            logger.debug("celery-grousset: could not record %s", what, exc_info=True)

    def unregister(self) -> None:
        for collector in self.collectors():
            with contextlib.suppress(KeyError):
                self.registry.unregister(collector)


class JournalCollector:
    """A prometheus_client collector of the journal gauges (:data:`GAUGES`) of
    ``databases`` (default: each journal database, :func:`checks.journal_databases`).
    A scrape reads them with :func:`celery_grousset.journal.gauges` (counts stop at ``cap``,
    default ``journal.GAUGE_CAP``) and reuses them for ``ttl`` seconds; a scrape that
    comes while another one reads gets the values read last. A database that cannot be
    read yields no sample and logs one warning (until it can be read again): it never
    fails the scrape. Registering reads nothing."""

    def __init__(self, databases: Sequence[str] | None = None, *, ttl: float = GAUGE_TTL,
                 cap: int | None = None) -> None:  # fmt: skip
        self.databases, self.ttl, self.cap = tuple(databases or ()), ttl, cap
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, dict[str, float] | None]] = {}
        self._failing: set[str] = set()

    def describe(self) -> list[Any]:
        return list(self._families({}))

    def collect(self) -> Iterator[Any]:
        if self._lock.acquire(blocking=False):
            try:
                read = {alias: self._values(alias) for alias in self._aliases()}
            finally:
                self._lock.release()
        else:  # another scrape is reading them: the values read last
            read = {alias: values for alias, (_, values) in self._cache.items()}
        yield from self._families(read)

    def _families(self, read: dict[str, dict[str, float] | None]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        for name, doc in GAUGE_HELP.items():
            family = GaugeMetricFamily(name, doc, labels=["database"])
            for alias, values in read.items():
                if values is not None:
                    family.add_metric([alias], values[name])
            yield family

    def _aliases(self) -> tuple[str, ...]:
        if self.databases:
            return self.databases
        try:
            from celery_grousset.checks import journal_databases

            return tuple(journal_databases())
        except Exception as exc:  # settings broken: the checks say why
            self._failed("?", exc)
            return ()

    def _values(self, alias: str) -> dict[str, float] | None:
        read_at, values = self._cache.get(alias, (None, None))
        if read_at is not None and time.monotonic() - read_at < self.ttl:
            return values
        try:
            from celery_grousset import journal

            values = journal.gauges(alias, self.cap or journal.GAUGE_CAP)
            self._failing.discard(alias)
        except Exception as exc:  # a scrape never fails on the journal
            values = None
            self._failed(alias, exc)
        self._cache[alias] = (time.monotonic(), values)
        return values

    def _failed(self, alias: str, exc: BaseException) -> None:
        level = logging.DEBUG if alias in self._failing else logging.WARNING
        self._failing.add(alias)
        events.emit(level, "grousset.gauges_unavailable",
                    {"database": alias, "error": events.error_text(exc)})  # fmt: skip


def register_gauges(
    registry: Any = None, databases: Sequence[str] | None = None
) -> JournalCollector | None:
    """Register a :class:`JournalCollector` on ``registry`` (default: prometheus_client's
    global registry); None when that registry has the gauges already."""
    pc = client()
    collector = JournalCollector(databases)
    try:
        (pc.REGISTRY if registry is None else registry).register(collector)
    except ValueError:  # "Duplicated timeseries": registered before
        return None
    return collector


_recorder: Recorder | None = None


def enable(registry: Any = None, *, fresh: bool = False, gauges: bool = True) -> Recorder:
    """Report the guard's events to Prometheus in this process (idempotent), and, with
    ``gauges``, register the journal gauges (:class:`JournalCollector`) on the same
    registry: call it in a web process to serve them with its other metrics.

    ``registry``: where the metrics register (default: prometheus_client's global
    registry). ``fresh``: drop a recorder inherited from a parent process first.
    """
    global _recorder
    if _recorder is not None and fresh:
        _recorder.unregister()
        _recorder = None
    if _recorder is None:
        _recorder = Recorder(registry)
    if gauges:
        register_gauges(_recorder.registry)
    events.recorder = _recorder
    return _recorder


def disable() -> None:  # (the metrics stay registered)
    events.recorder = None


# -- the worker's side: multiprocess mode ------------------------------------------------


def _child_init(**kwargs: Any) -> None:
    """``worker_process_init``: each pool child counts into its own files (the parent
    serves the journal gauges)."""
    enable(fresh=True, gauges=False)


def _child_shutdown(pid: int | None = None, **kwargs: Any) -> None:
    """``worker_process_shutdown``: live gauges of this child are dropped."""
    path = os.environ.get(MULTIPROC_ENV)
    if path and "prometheus_client" in sys.modules:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid(), path)  # type: ignore[no-untyped-call]


class WorkerMetrics:
    """The metrics endpoint of one worker (``--grousset-metrics-port``)."""

    def __init__(self, port: int, addr: str = "0.0.0.0") -> None:
        self.port, self.addr = port, addr
        self.path: str | None = None
        self._server: Any = None

    def prepare(self) -> None:
        """In the worker parent, before the pool forks: the counters' directory, hooks."""
        from celery import signals

        path = os.environ.get(MULTIPROC_ENV)
        if not path:
            path = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")  # (swept_dirs)
            os.environ[MULTIPROC_ENV] = path
            atexit.register(_remove_dir, path, os.getpid())
        os.makedirs(path, exist_ok=True)
        self.path = path
        client()  # set after the directory: values created from now on are per process
        signals.worker_process_init.connect(
            _child_init, weak=False, dispatch_uid="celery_grousset.metrics.init"
        )
        signals.worker_process_shutdown.connect(
            _child_shutdown, weak=False, dispatch_uid="celery_grousset.metrics.exit"
        )

    def start(self, *, in_process: bool, tasks: Sequence[str] = ()) -> None:
        """Serve (``tasks``: zeros); ``in_process``: counts too (solo/threads, WORKER_CLAIM)."""
        pc = client()
        from celery_grousset import metrics_fold

        recorder = enable(gauges=False)
        recorder.zero(tasks)
        if not in_process:  # (its zeros written, the children count)
            disable()
        registry = pc.CollectorRegistry()
        metrics_fold.collector(registry, str(self.path))  # (dead children's files folded)
        register_gauges(registry)
        served = pc.start_http_server(self.port, addr=self.addr, registry=registry)
        self._server = served[0] if isinstance(served, tuple) else None
        if self._server is not None:  # a pool child forked from now on does not hold the port
            os.register_at_fork(after_in_child=self._server.socket.close)
        logger.info("celery-grousset metrics on http://%s:%d/metrics (multiprocess dir %s)",
                    self.addr, self.port, self.path)  # fmt: skip

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


def _remove_dir(path: str, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked child that runs atexit hooks
        shutil.rmtree(path, ignore_errors=True)
