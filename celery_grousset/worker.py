"""Worker flags and the worker bootstep.

``install(app)`` (call it in your ``proj/celery.py``, next to
``app.autodiscover_tasks()``) adds seven options to ``celery worker``:

=====================================  ===================================================
``--grousset-processor-id ID``         default ``processor_id`` of this worker's tasks
``--grousset-max-processing-time S``   default ``max_processing_time`` (seconds)
``--grousset-metrics-port PORT``       serve Prometheus metrics on this port
``--grousset-metrics-addr ADDR``       ... on this address (default 0.0.0.0: all)
``--grousset-bypass``                  EMERGENCY: run every task unguarded, logging loudly
``--grousset-relay``                   publish the transactional outbox from this worker
``--grousset-batch``                   claim in the main process (``WORKER_CLAIM``)
=====================================  ===================================================

The flags are defaults: a task's own option wins (precedence: per call > task >
worker flag > ``settings.GROUSSET`` > built-in default). Celery builds the worker's
command line right after it imports the app module, so ``install(app)`` must run
there: an app imported later (from Django's app registry, say) is too late. The
bootstep's ``__init__`` runs in the worker parent while the worker is built, before
the pool forks its children, so everything it sets is inherited by them.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps

from celery_grousset.revoked import give_requests
from celery_grousset.startcheck import (
    guarded_names,
    log_schema_problems,
    warn_unenforced_time_limits,
)

logger = logging.getLogger("celery_grousset")

BYPASS_WARNING = "celery-grousset BYPASS is ON: tasks run unguarded"
FLAG_NAMES = (
    "grousset_processor_id", "grousset_max_processing_time", "grousset_metrics_port",
    "grousset_metrics_addr", "grousset_bypass", "grousset_relay", "grousset_batch",
)  # fmt: skip


#: the heading of the flags in ``celery worker --help``
HELP_GROUP = "celery-grousset Options"


def _option(*args: Any, **kwargs: Any) -> Any:
    """A plain ``click.Option`` carrying the ``help_group`` attribute that Celery's help
    formatter groups by. Not Celery's own option class: importing ``celery.bin.base``
    compiles a syntax highlighter, about 0.1 s added to every process that imports the
    app (``manage.py`` commands, web servers) for flags only ``celery worker`` reads."""
    from click import Option

    option = Option(*args, **kwargs)
    option.help_group = HELP_GROUP  # type: ignore[attr-defined]
    return option


def _options() -> list[Any]:
    return [
        _option(
            ("--grousset-processor-id",),
            default=None,
            metavar="ID",
            help="Default processor_id of guarded tasks (who deduplicates).",
        ),
        _option(
            ("--grousset-max-processing-time",),
            type=float,
            default=None,
            metavar="SECONDS",
            help="Default max_processing_time of guarded tasks (seconds).",
        ),
        _option(
            ("--grousset-metrics-port",),
            type=int,
            default=None,
            metavar="PORT",
            help="Serve Prometheus metrics of this worker on PORT "
            "(needs celery-grousset[prometheus]).",
        ),
        _option(
            ("--grousset-metrics-addr",),
            default="0.0.0.0",
            metavar="ADDR",
            help="The address the metrics listen on (default 0.0.0.0, every interface; "
            "127.0.0.1: this host only).",
        ),
        _option(
            ("--grousset-bypass",),
            is_flag=True,
            default=False,
            help="EMERGENCY ONLY: run every task unguarded (no deduplication, no "
            "journal), logging a warning per task.",
        ),
        _option(
            ("--grousset-relay",),
            is_flag=True,
            default=False,
            help="Publish the transactional outbox (GROUSSET['DATABASE']) from a thread "
            "of this worker, like `manage.py grousset_relay`.",
        ),
        _option(
            ("--grousset-batch/--no-grousset-batch",),
            default=None,
            help="Claim guarded tasks in the worker's main process, before the pool runs "
            "them (default: GROUSSET['WORKER_CLAIM'], off).",
        ),
    ]


class GroussetStep(bootsteps.StartStopStep):
    """Applies the ``--grousset-*`` flags in the worker parent before the pool forks."""

    label = "celery-grousset"

    def __init__(
        self,
        parent: Any,
        grousset_processor_id: str | None = None,
        grousset_max_processing_time: float | None = None,
        grousset_metrics_port: int | None = None,
        grousset_metrics_addr: str = "0.0.0.0",
        grousset_bypass: bool = False,
        grousset_relay: bool = False,
        grousset_batch: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(parent, **kwargs)
        from django.core.exceptions import ImproperlyConfigured

        from celery_grousset.conf import seconds

        app = parent.app
        defaults = dict(getattr(app.conf, "grousset_worker", None) or {})
        if grousset_processor_id:
            defaults["processor_id"] = str(grousset_processor_id)
        if grousset_max_processing_time is not None:
            try:
                defaults["max_processing_time"] = seconds(
                    grousset_max_processing_time, name="--grousset-max-processing-time"
                )
            except ImproperlyConfigured as exc:  # (a traceback named the flag last)
                logger.critical("celery-grousset: this worker does not start: %s", exc)
                raise SystemExit(1) from None
        if defaults:
            app.conf.grousset_worker = defaults
        if grousset_bypass:
            app.conf.grousset_bypass = True
        self.bypass = bool(grousset_bypass)
        self.defaults = defaults
        self.metrics: Any = None
        self.relay_wanted = bool(grousset_relay)
        self.relay: Any = None
        if grousset_metrics_port is not None:
            from celery_grousset.metrics import WorkerMetrics

            swept_dirs()  # a worker killed with -9 ran no atexit: its directory stayed
            self.metrics = WorkerMetrics(int(grousset_metrics_port), grousset_metrics_addr)
            self.metrics.prepare()
        # Django's checks ran before this step: they cached the options without these defaults
        from celery_grousset.task import reset_resolved_options

        reset_resolved_options()
        give_requests(app)  # a revoke's terminate releases once the process has exited
        if getattr(parent, "time_limit", None) and app.conf.task_time_limit is None:
            # `celery worker --time-limit N`: its tasks' default hard limit, which Celery
            # keeps on the worker, not in app.conf, where check E002 reads it
            app.conf.task_time_limit = parent.time_limit
        if not (self.bypass or _settings_bypass()):  # unguarded: the options do not matter
            refuse_configuration_errors(type(parent).__module__.startswith("celery.contrib"))
            warn_unenforced_time_limits(parent)
            from celery.signals import worker_ready  # a thread: a slow database never
            # holds the worker's start up
            worker_ready.connect(_check_schema, weak=False, dispatch_uid="celery_grousset.schema")
        self.claimed = _worker_claim(app, grousset_batch)

    def start(self, parent: Any) -> None:
        if self.bypass or _settings_bypass():
            logger.warning(
                "%s (no deduplication, no journal) — turn it off as soon as "
                "the journal's database is back",
                BYPASS_WARNING,
            )
        if self.claimed and getattr(parent, "use_eventloop", True) is False:
            logger.warning("celery-grousset: WORKER_CLAIM is on, but this worker has no event "
                           "loop (a gevent or eventlet pool, or a transport without one): "
                           "every request is claimed in the pool, as with it off")  # fmt: skip
        elif self.claimed:
            names = " ".join(self.claimed)
            logger.info("celery-grousset claims in the main process for: %s", names)
        if self.defaults:
            logger.info(
                "celery-grousset worker defaults: %s",
                " ".join(f"{k}={v}" for k, v in sorted(self.defaults.items())),
            )
        if self.metrics is not None:
            try:
                # the parent records too when it claims (WORKER_CLAIM) or runs the tasks
                self.metrics.start(in_process=bool(self.claimed) or not _forks(parent),
                                   tasks=guarded_names(parent.app))
            except OSError as exc:  # the port is taken, or not ours to bind
                logger.critical(
                    "celery-grousset: this worker does not start: cannot serve metrics on "
                    "port %d: %s. Another process (another worker on this host?) may hold "
                    "it: give each worker its own --grousset-metrics-port.",
                    self.metrics.port, exc.strerror or exc,
                )  # fmt: skip
                raise SystemExit(1) from None
        if self.relay_wanted and self.relay is None:
            from celery_grousset.outbox_thread import RelayThread

            self.relay = RelayThread(parent.app)
            self.relay.start_when_ready()  # after the pool has forked

    def stop(self, parent: Any) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        if self.relay is not None:
            self.relay.stop()
            self.relay = None

    def terminate(self, parent: Any) -> None:
        self.stop(parent)


def _forks(worker: Any) -> bool:
    """True when tasks run in forked pool children (prefork)."""
    try:
        from celery.concurrency.prefork import TaskPool
    except ImportError:  # pragma: no cover
        return False
    return isinstance(getattr(worker, "pool", None), TaskPool)


def _worker_claim(app: Any, flag: bool | None) -> list[str]:
    """``--grousset-batch`` (else ``WORKER_CLAIM``): give the guarded tasks the
    main-process claim; the tasks it applies to (none while bypass is on)."""
    from celery_grousset.conf import grousset_settings

    if flag is None:
        try:
            flag = bool(grousset_settings.WORKER_CLAIM)
        except Exception:  # invalid settings: every guarded task fails closed on its own
            flag = False
    if not flag:
        return []
    if getattr(app.conf, "grousset_bypass", False) or _settings_bypass():
        return []
    from celery_grousset.batch_claim import enable

    return enable(app)


def refuse_configuration_errors(in_process: bool = False) -> None:
    """The worker logs the system checks' warnings about ``GROUSSET`` and the tasks, and
    does not start while they find an error in ``GROUSSET``
    or in a guarded task's options (its flags applied): a delivery of such a task would
    fail before its claim and, acknowledged as failed, be lost (or, for ``E002``, run
    without its guarantee). Celery's Django fixup runs the checks too, but ignores what
    they find. The messages wait in the broker for a worker started after the fix. An
    in-process test worker (``start_worker``, ``in_process``) only logs them: its
    messages are the test's own, and the process holds every test's tasks."""
    from celery_grousset.checks import check_tasks
    from celery_grousset.install import app_missing

    messages = [*app_missing(), *check_tasks()]
    for message in messages:
        if not message.is_serious() and not message.is_silenced():
            logger.warning("%s", message)
    errors = [m for m in messages if m.is_serious() and not m.is_silenced()]
    if not errors or in_process:
        for message in errors:
            logger.warning("%s", message)
        return
    for message in errors:
        logger.critical("%s", message)
    logger.critical(
        "celery-grousset: this worker does not start: %d configuration error(s) above "
        "(`manage.py check` lists them too). With them the tasks concerned would fail "
        "before their claim, acknowledged and lost, or lose their guarantee. Fix them and "
        "start the worker again; the messages wait in the broker.",
        len(errors),
    )
    raise SystemExit(1)


def _check_schema(**kwargs: Any) -> None:
    threading.Thread(target=log_schema_problems, name="grousset-schema", daemon=True).start()


def swept_dirs(tmp: str | None = None) -> list[str]:
    """Remove the metrics directories (``grousset-metrics-<pid>-…``) of this user's
    workers that are gone (killed: no atexit ran); return them."""
    import os
    import shutil
    import tempfile

    from celery_grousset.metrics import DIR_PREFIX

    root, gone = tmp or tempfile.gettempdir(), []
    for name in os.listdir(root):
        pid = name[len(DIR_PREFIX) :].split("-", 1)[0]
        path = os.path.join(root, name)
        if not (name.startswith(DIR_PREFIX) and pid.isdigit()) or _alive(int(pid)):
            continue
        if os.stat(path).st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _settings_bypass() -> bool:
    try:
        from celery_grousset.conf import grousset_settings

        return bool(grousset_settings.BYPASS)
    except Exception:  # settings not configured: only the flag counts
        return False


def install(app: Any) -> None:
    """Add the ``--grousset-*`` worker flags and the bootstep to ``app`` (idempotent)."""
    present = {getattr(option, "name", None) for option in app.user_options["worker"]}
    for option in _options():
        if option.name not in present:
            app.user_options["worker"].add(option)
    app.steps["worker"].add(GroussetStep)
    from django.core import checks

    from celery_grousset.install import app_missing

    checks.register(app_missing)  # E020 in `manage.py check` without the app


def install_active_apps() -> None:
    """:func:`install` on every Celery app created so far and every app finalized later
    (for a Django ``AppConfig.ready()``: gives the bootstep, too late for the flags)."""
    from celery import _state

    for app in list(_state._get_active_apps()):  # type: ignore[attr-defined]
        install(app)
    _state.connect_on_app_finalize(install)
