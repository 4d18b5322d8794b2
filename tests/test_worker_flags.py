"""The ``--grousset-*`` worker flags, on real ``celery worker`` processes.

Workers run ``-A tests.flagapp`` (the test app with ``install(app)`` and the tasks
of ``tests.flagtasks``); tasks are sent by name so the pytest process never imports
the task without ``max_processing_time``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from celery_grousset.models import Outcome
from celery_grousset.worker import BYPASS_WARNING
from tests import services
from tests.ledger.models import Effect
from tests.workers import ROOT, Worker, start_worker

FLAG_APP = "tests.flagapp"


def start_flag_worker(
    queue: str,
    *,
    database: str,
    broker: str,
    extra: list[str],
    concurrency: int = 1,
    ready_timeout: float = 60,
) -> Worker:
    """``celery -A tests.flagapp worker …`` (tests.workers.start_worker, other app)."""
    return start_worker(
        queue, database=database, broker=broker, concurrency=concurrency, extra=extra,
        ready_timeout=ready_timeout, app=FLAG_APP, drop_env=("PROMETHEUS_MULTIPROC_DIR",),
    )  # fmt: skip


@contextmanager
def flag_worker(queue: str, **kwargs: object) -> Iterator[Worker]:
    worker = start_flag_worker(queue, **kwargs)  # type: ignore[arg-type]
    try:
        yield worker
    finally:
        worker.stop()


def send(name: str, queue: str, *args: object) -> object:
    from tests.celeryapp import app

    return app.send_task(name, args=list(args), queue=queue)


def effects(alias: str, key: str) -> int:
    return Effect.objects.using(alias).filter(key=key).count()


def test_help_shows_the_flags() -> None:
    # Given the test app with install(app) / When `celery worker --help` runs
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", FLAG_APP, "worker", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then the seven flags are listed under their own heading
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "--grousset-processor-id",
        "--grousset-max-processing-time",
        "--grousset-metrics-port",
        "--grousset-metrics-addr",
        "--grousset-bypass",
        "--grousset-relay",
        "--grousset-batch",
        "--no-grousset-batch",
    ):
        assert flag in proc.stdout
    assert "celery-grousset Options" in proc.stdout


def test_installing_the_flags_leaves_the_celery_command_line_unimported() -> None:
    # Given the test app, whose module calls install(app) (as a project's celery.py does)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    code = (
        f"import sys, {FLAG_APP} as m; "
        "assert any(o.name == 'grousset_batch' for o in m.app.user_options['worker']); "
        "print(sorted(n for n in ('celery.bin.base', 'pygments') if n in sys.modules))"
    )
    # When a process that is not `celery worker` imports it (manage.py, a web server)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    # Then the flags are there without Celery's command line (and its syntax highlighter,
    # about 0.1 s of every start) being imported
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_install_is_idempotent() -> None:
    from celery import Celery, _state

    from celery_grousset.worker import GroussetStep, install

    # Given a fresh app / When install() runs twice
    app = Celery("grousset-idempotent", set_as_current=False, fixups=[])
    install(app)
    install(app)
    # Then each flag and the bootstep are there once
    names = sorted(option.name for option in app.user_options["worker"])
    assert names == sorted(
        [
            "grousset_processor_id",
            "grousset_max_processing_time",
            "grousset_metrics_port",
            "grousset_metrics_addr",
            "grousset_bypass",
            "grousset_relay",
            "grousset_batch",
        ]
    )
    assert list(app.steps["worker"]) == [GroussetStep]
    _state._apps.discard(app)  # type: ignore[attr-defined]  # not seen by other tests' checks


@pytest.fixture(scope="module")
def pg() -> str:
    services.require_database("postgresql")
    return "postgresql"


@pytest.fixture(scope="module")
def redis_url() -> str:
    return services.require_redis()


@pytest.fixture(scope="module")
def flagged(pg: str, redis_url: str) -> Iterator[tuple[str, str, Worker]]:
    """One worker (2 children) started with a processor id and a max_processing_time."""
    queue = f"q-{uuid.uuid4().hex[:10]}"
    processor = f"ops-{uuid.uuid4().hex[:8]}"
    extra = ["--grousset-processor-id", processor, "--grousset-max-processing-time", "5"]
    with flag_worker(queue, database=pg, broker=redis_url, extra=extra, concurrency=2) as w:
        yield queue, processor, w


@pytest.mark.slow
def test_processor_id_flag_names_the_journal_rows(
    flagged: tuple[str, str, Worker], pg: str
) -> None:
    queue, processor, worker = flagged
    key = f"proc-{uuid.uuid4().hex[:8]}"
    # Given a worker started with --grousset-processor-id
    # When a task without its own processor_id runs (twice: the second is a duplicate)
    first = send("tests.flagtasks.probe", queue, key).get(timeout=60)  # type: ignore[attr-defined]
    again = send("tests.flagtasks.probe", queue, key).get(timeout=60)  # type: ignore[attr-defined]
    # Then the attempt ran as that processor, the journal row carries it, and the
    # duplicate got the memo without a second effect
    assert first["processor_id"] == processor and again == first
    rec = Outcome.objects.using(pg).get(fingerprint=first["fingerprint"])
    assert rec.processor_id == processor and rec.deliveries == 2
    assert effects(pg, key) == 1
    assert f"processor_id={processor}" in worker.text()


@pytest.mark.slow
def test_max_processing_time_flag_runs_a_task_without_one(
    flagged: tuple[str, str, Worker], pg: str
) -> None:
    queue, processor, _ = flagged
    key = f"mpt-{uuid.uuid4().hex[:8]}"
    # Given a worker started with --grousset-max-processing-time 5
    # When a guarded task that sets no max_processing_time runs
    value = send("tests.flagtasks.unbounded", queue, key).get(timeout=60)  # type: ignore[attr-defined]
    # Then it ran guarded with the worker's default, and completed in the journal
    assert value["max_processing_time"] == 5.0
    rec = Outcome.objects.using(pg).get(fingerprint=value["fingerprint"])
    assert rec.status == "completed" and rec.processor_id == processor
    assert effects(pg, key) == 1


@pytest.mark.slow
def test_the_worker_warns_of_a_task_given_guard_options_without_the_guard(
    flagged: tuple[str, str, Worker], pg: str
) -> None:
    queue, _, worker = flagged
    # Given the app's task forgot_base: max_processing_time given, base=GroussetTask not
    # Then the worker warned at start, naming it and the fix (system check W011)
    log = worker.text()
    assert "tests.flagtasks.forgot_base: (celery_grousset.W011)" in log, log[-3000:]
    assert "base=GroussetTask" in log
    # And the warning is true: two deliveries of one call run its effect twice
    key = f"forgot-{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        send("tests.flagtasks.forgot_base", queue, key).get(timeout=60)  # type: ignore[attr-defined]
    assert effects(pg, key) == 2


@pytest.mark.slow
def test_bypass_flag_runs_unguarded_and_logs_loudly(pg: str, redis_url: str) -> None:
    queue = f"q-{uuid.uuid4().hex[:10]}"
    key = f"bypass-{uuid.uuid4().hex[:8]}"
    # Given a worker started with --grousset-bypass
    with flag_worker(queue, database=pg, broker=redis_url, extra=["--grousset-bypass"]) as w:
        # Then it warned at start
        assert BYPASS_WARNING in w.text()
        # When the same call is delivered twice
        results = [send("tests.flagtasks.probe", queue, key) for _ in range(2)]
        values = [r.get(timeout=60) for r in results]  # type: ignore[attr-defined]
        log = w.text()
    # Then both ran unguarded (two effects, fence 0: no claim), each with a BYPASS line,
    # still seeing the call's fingerprint, and nothing was written to the journal
    assert [v["fence"] for v in values] == [0, 0]
    assert values[0]["fingerprint"] == values[1]["fingerprint"] is not None
    assert effects(pg, key) == 2
    for r in results:
        assert f"grousset.BYPASS task=tests.flagtasks.probe task_id={r.id}" in log  # type: ignore[attr-defined]
    task_ids = [r.id for r in results]  # type: ignore[attr-defined]
    assert not Outcome.objects.using(pg).filter(task_id__in=task_ids).exists()


@pytest.mark.slow
def test_a_bad_max_processing_time_flag_stops_the_worker_naming_it(pg: str, redis_url: str) -> None:
    """--grousset-max-processing-time -5 ended the worker in a traceback."""
    queue = f"q-{uuid.uuid4().hex[:10]}"
    # When a worker starts with a negative default claim time
    with pytest.raises(RuntimeError, match="worker exited with 1") as refused:
        start_flag_worker(queue, database=pg, broker=redis_url,
                          extra=["--grousset-max-processing-time", "-5"]).kill()  # fmt: skip
    # Then it does not start, and says why in one line, naming the flag: no traceback
    text = str(refused.value)
    assert "this worker does not start" in text and "--grousset-max-processing-time" in text
    assert "Traceback" not in text, text

