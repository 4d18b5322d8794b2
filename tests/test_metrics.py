"""Prometheus metrics: the recorder's labels, the optional extra, and a real prefork
worker serving its children's counts (multiprocess mode)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests import services
from tests.test_worker_flags import flag_worker, send
from tests.workers import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_recorder_maps_claim_outcomes_to_labels() -> None:
    from prometheus_client import CollectorRegistry

    from celery_grousset.metrics import Recorder

    # Given a recorder on a registry of its own
    registry = CollectorRegistry()
    rec = Recorder(registry)
    # When the guard reports one claim of each kind, a fence-out and a commit error
    for kind in (
        "new",
        "reclaim",
        "resumed",
        "takeover",
        "duplicate",
        "in_flight",
        "failed",
        "gave_up",
    ):
        rec.claim("t", kind, 0.002)
    rec.fenced_out("t")
    rec.commit_error("t")
    for outcome in ("completed", "completed", "failed", "fenced_out"):
        rec.finished("t", outcome, 0.003)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)  # type: ignore[no-any-return]

    # Then new/reclaim/resumed count as "new", failed as "failed_replayed"
    assert value("grousset_claims_total", task="t", outcome="new") == 3
    for outcome in (
        "takeover",
        "duplicate",
        "in_flight",
        "failed_replayed",
        "gave_up",
        "fenced_out",
    ):
        assert value("grousset_claims_total", task="t", outcome=outcome) == 1
    # And duplicates answered from the journal are detections; every claim is timed
    assert value("grousset_duplicate_detections_total", task="t") == 2
    assert value("grousset_outcome_commit_errors_total", task="t") == 1
    assert value("grousset_store_seconds_count", operation="claim") == 8
    # And completion writes are counted by outcome and timed per task
    assert value("grousset_completions_total", task="t", outcome="completed") == 2
    assert value("grousset_completions_total", task="t", outcome="failed") == 1
    assert value("grousset_completions_total", task="t", outcome="fenced_out") == 1
    assert value("grousset_completion_seconds_count", task="t") == 4
    assert value("grousset_completion_seconds_bucket", task="t", le="0.005") == 4


def test_completions_are_counted_and_timed_through_protect(processor: str) -> None:
    from prometheus_client import CollectorRegistry

    from celery_grousset import events, protect
    from celery_grousset.exceptions import FencedOut
    from celery_grousset.metrics import Recorder

    services.require_database("default")
    registry = CollectorRegistry()
    previous, events.recorder = events.recorder, Recorder(registry)
    opts = {"processor_id": processor, "database": "default"}

    def zombie() -> str:
        # stalls past max_processing_time: a second caller takes the claim over and
        # completes; this attempt's own completion write is then refused
        time.sleep(0.4)
        assert protect("zombie", lambda: "taker", max_processing_time=0.2, **opts) == "taker"
        return "zombie"

    def boom() -> None:
        raise ValueError("boom")

    try:
        # Given a recorder, when protect() completes two calls (one transactional) and
        # answers a duplicate, one attempt fails, and one zombie attempt is fenced out
        assert protect("ok", lambda: 1, max_processing_time=60, **opts) == 1
        assert protect("ok", lambda: 2, max_processing_time=60, **opts) == 1
        assert protect("tx", lambda: 3, max_processing_time=60, transactional=True, **opts) == 3
        with pytest.raises(ValueError, match="boom"):
            protect("bad", boom, max_processing_time=60, **opts)
        with pytest.raises(FencedOut):
            protect("zombie", zombie, max_processing_time=0.2, **opts)
    finally:
        events.recorder = previous

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)  # type: ignore[no-any-return]

    # Then each owned attempt's completion write is counted by how it ended
    # (completed: ok, tx and the taker; the duplicate wrote nothing) and timed
    assert value("grousset_completions_total", task="protect", outcome="completed") == 3
    assert value("grousset_completions_total", task="protect", outcome="failed") == 1
    assert value("grousset_completions_total", task="protect", outcome="fenced_out") == 1
    assert value("grousset_completion_seconds_count", task="protect") == 5
    total = value("grousset_completion_seconds_sum", task="protect")
    assert total is not None and 0 < total < 5
    # And the fence-out is also a claims outcome, as before
    assert value("grousset_claims_total", task="protect", outcome="fenced_out") == 1


def test_missing_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from celery_grousset import metrics

    # Given prometheus_client cannot be imported
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    # When metrics are requested / Then the error names the extra to install
    with pytest.raises(ImproperlyConfigured, match=r"pip install celery-grousset\[prometheus\]"):
        metrics.enable()


def test_importing_does_no_io_and_no_prometheus_import() -> None:
    # Given a fresh interpreter / When celery_grousset.metrics and .worker are imported
    code = (
        "import sys, celery_grousset.metrics, celery_grousset.worker; "
        "print('prometheus_client' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # Then prometheus_client was not imported (and Django settings were not needed)
    assert out.stdout.strip() == "False"


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def sample(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.mark.slow
def test_worker_serves_metrics_of_its_children() -> None:
    services.require_database("postgresql")
    broker = services.require_redis()
    queue, port = f"q-{uuid.uuid4().hex[:10]}", free_port()
    key, task = f"metrics-{uuid.uuid4().hex[:8]}", "tests.flagtasks.probe"
    # Given a prefork worker (2 children) started with --grousset-metrics-port
    with flag_worker(
        queue,
        database="postgresql",
        broker=broker,
        concurrency=2,
        extra=["--grousset-metrics-port", str(port)],
    ) as worker:
        # When one call is delivered 5 times (the first completes before the others)
        send(task, queue, key).get(timeout=60)  # type: ignore[attr-defined]
        for r in [send(task, queue, key) for _ in range(4)]:
            r.get(timeout=60)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while True:  # the scrape reads the children's files: allow them to land
            samples = scrape(port)
            if sample(samples, "grousset_claims_total", task=task, outcome="duplicate") == 4:
                break
            assert time.monotonic() < deadline, samples
            time.sleep(0.2)
        log = worker.text()
    # Then the parent serves the children's aggregated counts
    assert sample(samples, "grousset_claims_total", task=task, outcome="new") == 1
    assert sample(samples, "grousset_claims_total", task=task, outcome="duplicate") == 4
    assert sample(samples, "grousset_duplicate_detections_total", task=task) == 4
    count = sample(samples, "grousset_store_seconds_count", operation="claim")
    assert count is not None and count >= 5
    assert f"celery-grousset metrics on http://0.0.0.0:{port}/metrics" in log
