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
