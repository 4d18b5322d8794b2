"""Prometheus metrics: the recorder's labels, the optional extra, and a real prefork
worker serving its children's counts (multiprocess mode)."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import Ignore, Reject
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
    rec.counted("t", "fenced_out")
    rec.counted("t", "store_unavailable")
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
        from tests.test_protect import another_caller  # (another caller takes it over)

        taker = another_caller(lambda: protect("zombie", lambda: "taker",
                                                max_processing_time=0.2, **opts))  # fmt: skip
        assert taker == "taker"
        return "zombie"

    def boom() -> None:
        raise ValueError("boom")

    def again() -> None:  # what self.retry() and autoretry_for raise
        from celery.exceptions import Retry

        raise Retry("again", when=10)

    def replaced() -> None:  # what self.replace() raises, and a task dropping its delivery
        raise Ignore()

    def requeued() -> None:
        raise Reject("not now", requeue=True)

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
        with pytest.raises(Exception, match="again"):  # one attempt asks Celery to retry
            protect("retry", again, max_processing_time=60, **opts)
        with pytest.raises(Ignore):
            protect("replaced", replaced, max_processing_time=60, **opts)
        with pytest.raises(Reject, match="not now"):
            protect("requeued", requeued, max_processing_time=60, **opts)
    finally:
        events.recorder = previous

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)  # type: ignore[no-any-return]

    # Then each owned attempt's completion write is counted by how it ended
    # (completed: ok, tx and the taker; the duplicate wrote nothing) and timed
    assert value("grousset_completions_total", task="protect", outcome="completed") == 3
    assert value("grousset_completions_total", task="protect", outcome="failed") == 1
    assert value("grousset_completions_total", task="protect", outcome="fenced_out") == 1
    # (a retry is not a failure: a review saw every retried call counted as one)
    assert value("grousset_completions_total", task="protect", outcome="retried") == 1
    # (nor are Celery's other control-flow exits: they are counted as what they are)
    assert value("grousset_completions_total", task="protect", outcome="ignored") == 1
    assert value("grousset_completions_total", task="protect", outcome="rejected") == 1
    assert value("grousset_completion_seconds_count", task="protect") == 8
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


def metrics_worker(queue: str, port: int, broker: str, *extra: str) -> Any:
    """A prefork worker (2 children) on PostgreSQL serving its metrics on ``port`` (with a
    default max_processing_time for the flag app's task without one: without it the
    worker does not start)."""
    return flag_worker(
        queue, database="postgresql", broker=broker, concurrency=2,
        extra=["--grousset-metrics-port", str(port), "--grousset-metrics-addr", "127.0.0.1",
               "--grousset-max-processing-time", "30", *extra],
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("batch", [False, True], ids=["in-children", "worker-claim"])
def test_worker_serves_metrics_of_its_children(batch: bool) -> None:
    from celery_grousset.metrics import GAUGES
    from celery_grousset.models import Outcome

    services.require_database("postgresql")
    broker = services.require_redis()
    queue, port = f"q-{uuid.uuid4().hex[:10]}", free_port()
    key, task = f"metrics-{uuid.uuid4().hex[:8]}", "tests.flagtasks.probe"
    failing = "tests.flagtasks.refused"
    # Given a prefork worker (2 children) started with --grousset-metrics-port; with
    # --grousset-batch the claims are made in the parent
    with metrics_worker(queue, port, broker, *(["--grousset-batch"] if batch else [])) as worker:
        # When one call is delivered 5 times (the first completes before the others), and
        # a call whose failure is memoized 3 times (its duplicates take the per-task path
        # with --grousset-batch: the child claims again, and only the child counts it)
        # (one at a time: with --grousset-batch, copies that come in one claim pass are
        # one claim, counted once)
        for _ in range(5):
            send(task, queue, key).get(timeout=60)  # type: ignore[attr-defined]
        sent = []
        for _ in range(3):
            sent.append(send(failing, queue, key))
            with pytest.raises(ValueError, match="refused"):
                sent[-1].get(timeout=60)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while True:  # the scrape reads the children's files: allow them to land
            samples = scrape(port)
            if sample(samples, "grousset_claims_total", task=task, outcome="duplicate") == 4 \
                    and sample(samples, "grousset_duplicate_detections_total", task=failing):
                break
            assert time.monotonic() < deadline, samples
            time.sleep(0.2)
        log = worker.text()
    # Then the parent serves the children's aggregated counts (and its own: the claims
    # it made with --grousset-batch), on the address asked for
    assert f"celery-grousset metrics on http://127.0.0.1:{port}/metrics" in log, log
    assert sample(samples, "grousset_claims_total", task=task, outcome="new") == 1
    assert sample(samples, "grousset_claims_total", task=task, outcome="duplicate") == 4
    assert sample(samples, "grousset_duplicate_detections_total", task=task) == 4
    # And each claim is counted once, where it was acted on (a review saw a duplicate the
    # parent passed on to a child counted by both)
    assert sample(samples, "grousset_claims_total", task=failing, outcome="new") == 1
    assert sample(samples, "grousset_claims_total", task=failing,
                  outcome="failed_replayed") == 2  # fmt: skip
    assert sample(samples, "grousset_duplicate_detections_total", task=failing) == 2
    assert log.count("grousset.duplicate_skipped") == 4 + 2, log
    # and once in the journal: with --grousset-batch, the decision the parent's claim
    # made is carried to the child, which does not claim (and count) the delivery again
    row = Outcome.objects.using("postgresql").get(task_name=failing, task_id=sent[0].id)
    assert (row.deliveries, row.duplicates) == (3, 2)
    count = sample(samples, "grousset_store_seconds_count", operation="claim")
    assert count is not None and count >= 5
    # And the counters the alert rules watch are served at 0 before their first event
    # (a review: a series that appeared at 1 gave the rules' increase() nothing)
    for name, labels in (("grousset_claims_total", {"outcome": "gave_up"}),
                         ("grousset_claims_total", {"outcome": "fenced_out"}),
                         ("grousset_outcome_commit_errors_total", {}),
                         ("grousset_overruns_total", {})):  # fmt: skip
        assert sample(samples, name, task=task, **labels) == 0, (name, labels)
    # And the parent serves the journal gauges of the worker's database
    for gauge in GAUGES:
        value = sample(samples, gauge, database="postgresql")
        assert value is not None and value >= 0, gauge


@pytest.mark.slow
def test_a_worker_replacing_its_children_folds_their_counts_into_one_file() -> None:
    import glob
    import re

    services.require_database("postgresql")
    broker = services.require_redis()
    queue, port = f"q-{uuid.uuid4().hex[:10]}", free_port()
    task, calls = "tests.flagtasks.probe", 12
    # Given a prefork worker with metrics whose children each run one task, then are
    # replaced (--max-tasks-per-child 1)
    with metrics_worker(queue, port, broker, "--max-tasks-per-child", "1") as worker:
        # When 12 distinct calls run (12 children, each leaving its counts behind)
        for i in range(calls):
            send(task, queue, f"fold-{uuid.uuid4().hex[:8]}-{i}").get(timeout=60)  # type: ignore[attr-defined]
        found = re.search(r"multiprocess dir (\S+)\)", worker.text())
        assert found, worker.text()

        def files(kind: str) -> list[str]:
            return glob.glob(os.path.join(found.group(1), f"{kind}_*.db"))

        deadline = time.monotonic() + 20
        while True:  # a child just replaced is reaped, then folded at the next scrape
            samples = scrape(port)
            if len(files("counter")) <= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        kept = {kind: files(kind) for kind in ("counter", "histogram")}
        children = worker.children()
        listening = _listening_socket(port)
        held = {pid: _holds(pid, listening) for pid in children}
    # Then every call is counted once (the dead children's counts kept, none twice)
    assert sample(samples, "grousset_claims_total", task=task, outcome="new") == calls
    count = sample(samples, "grousset_store_seconds_count", operation="claim")
    assert count == calls, count
    # And the files are those of the live processes and one folded file per kind, not
    # one per child that ever lived (each scrape read them all: 0.1 ms each, for ever)
    for kind, names in kept.items():
        assert len(names) <= 4, (kind, names)
        assert any(n.endswith(f"{kind}_folded.db") for n in names), (kind, names)
    # And no pool child holds the metrics port (a child left behind by a parent killed
    # with -9 kept it, and the restarted worker could not start on it)
    assert children and held == dict.fromkeys(children, False), held


def test_scrapes_at_once_never_fail_nor_go_down_while_dead_processes_are_folded(
    tmp_path: Path,
) -> None:
    import shutil

    from prometheus_client import CollectorRegistry

    from celery_grousset import metrics_fold

    # Given the files a process leaves when it counts one call and one latency, then exits
    seed = tmp_path / "seed"
    seed.mkdir()
    script = ("from prometheus_client import Counter, Histogram\n"
              "Counter('t_calls', 'calls').inc()\n"
              "Histogram('t_seconds', 'seconds').observe(0.1)\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60,
                   env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(seed)})  # fmt: skip
    made = {kind: next(seed.glob(f"{kind}_*.db")) for kind in ("counter", "histogram")}
    served = tmp_path / "served"
    served.mkdir()
    registry = CollectorRegistry()
    metrics_fold.collector(registry, str(served))
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    errors: list[BaseException] = []
    seen: list[list[tuple[float, float]]] = [[], []]
    done = threading.Event()

    def read() -> tuple[float, float]:
        values = {s.name: s.value for f in registry.collect() for s in f.samples}
        return values.get("t_calls_total", 0.0), values.get("t_seconds_sum", 0.0)

    def scrape(into: list[tuple[float, float]]) -> None:
        while not done.is_set():
            try:
                into.append(read())
            except BaseException as exc:  # (what a scrape would answer)
                errors.append(exc)

    threads = [threading.Thread(target=scrape, args=(into,)) for into in seen]
    for t in threads:
        t.start()
    # When 30 batches of 40 dead processes' files land while two scrapes run at once
    calls = 0
    try:
        for batch in range(30):
            for i in range(40):
                pid = pid_max + 1 + batch * 40 + i  # (above pid_max: never alive)
                for kind, src in made.items():
                    part = served / f"{kind}_{pid}.part"
                    shutil.copy(src, part)
                    os.rename(part, served / f"{kind}_{pid}.db")  # (whole, at once)
                calls += 1
            time.sleep(0.01)
    finally:
        done.set()
        for t in threads:
            t.join(30)
    # Then no scrape failed (a file folded away under a scrape that listed it), none saw a
    # counter go down (counted twice, then once; or a float sum added in another order),
    # and every call is counted once, from the folded files alone
    assert not errors, errors[:3]
    for values in seen:
        assert values and all(a <= b for a, b in itertools.pairwise(values))
    assert read() == (calls, pytest.approx(0.1 * calls))
    assert sorted(p.name for p in served.glob("*.db")) == [
        "counter_folded.db", "histogram_folded.db"]
    # And when the files add up to one rounding step less (the same values added in
    # another order), the scrape still serves what it served before: never a "reset"
    from prometheus_client.mmap_dict import MmapedDict

    folded = MmapedDict(str(served / "counter_folded.db"))
    try:
        (key, value, *_), = MmapedDict.read_all_values_from_file(str(served / "counter_folded.db"))
        folded.write_value(key, value - value * 2**-52, 0.0)
    finally:
        folded.close()
    assert read()[0] == calls


def _listening_socket(port: int) -> str:
    """The inode of the socket listening on ``port`` (/proc/net/tcp), as fds name it."""
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
                return f"socket:[{fields[9]}]"
    raise AssertionError(f"nothing listens on port {port}")


def _holds(pid: int, socket_name: str) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(os.readlink(fd) == socket_name for fd in fds.iterdir())


def test_a_worker_whose_metrics_port_is_taken_names_the_port_and_the_fix() -> None:
    from tests.test_worker_flags import start_flag_worker

    services.require_database("postgresql")
    broker = services.require_redis()
    queue = f"q-{uuid.uuid4().hex[:10]}"
    # Given the metrics port held by another process (another worker on this host)
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        # When a worker starts with --grousset-metrics-port on it
        with pytest.raises(RuntimeError, match="worker exited with 1") as refused:
            start_flag_worker(
                queue, database="postgresql", broker=broker, concurrency=1,
                extra=["--grousset-metrics-port", str(port),
                       "--grousset-max-processing-time", "30"],
            ).kill()  # fmt: skip
    # Then it does not start, and says which port, why, and what to do (no traceback)
    text = str(refused.value)
    assert f"cannot serve metrics on port {port}" in text, text
    assert "its own --grousset-metrics-port" in text and "Traceback" not in text, text


# -- the journal gauges ------------------------------------------------------------------------


def claim_row(alias: str, processor: str, *, aged: timedelta | None = None) -> str:
    """An in-flight claim through the store; ``aged``: started (and stale) that long ago."""
    from django.db.models import F

    from celery_grousset.claim import ClaimRequest
    from celery_grousset.models import Outcome
    from celery_grousset.store import get_store

    fp = uuid.uuid4().hex + uuid.uuid4().hex
    get_store(alias).claim(ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name="tests.gauged", task_id=str(uuid.uuid4()),
        token=uuid.uuid4().hex, worker="w@host", args_repr="()", max_processing_time=60.0,
        expires_after=7 * 86400.0, max_takeovers=3,
    ))  # fmt: skip
    if aged is not None:
        Outcome.objects.using(alias).filter(processor_id=processor, fingerprint=fp).update(
            started_at=F("started_at") - aged, stale_at=F("stale_at") - aged
        )
    return fp


def gauge_values(registry: object, alias: str) -> dict[str, float]:
    """Scrape ``registry`` as Prometheus does; the journal gauges of ``alias``."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.labels == {"database": alias}}  # fmt: skip


@pytest.fixture
def outbox_rows(alias: str) -> Iterator[list[int]]:
    """Outbox rows made by the test (never published), deleted afterwards."""
    from celery_grousset.models import OutboxMessage

    made: list[int] = []
    yield made
    OutboxMessage.objects.using(alias).filter(pk__in=made).delete()


def test_journal_gauges_are_scraped_from_real_rows(
    alias: str, processor: str, outbox_rows: list[int]
) -> None:
    from django.db import transaction
    from prometheus_client import CollectorRegistry

    from celery_grousset import outbox
    from celery_grousset.claim import ClaimRequest
    from celery_grousset.metrics import GAUGES, JournalCollector
    from celery_grousset.models import OutboxMessage
    from celery_grousset.store import get_store
    from celery_grousset.store.base import Completion
    from tests.tasks import effect

    def scrape() -> dict[str, float]:
        registry = CollectorRegistry()  # a fresh registry and collector: nothing cached
        registry.register(JournalCollector([alias]))
        return gauge_values(registry, alias)

    from celery_grousset.journal import now
    from celery_grousset.models import Outcome

    t0, before = now(alias), scrape()
    assert set(before) == set(GAUGES)
    # Given three in-flight claims (one fresh; one stale for 2 h; one started 400 days
    # ago, older than any other row of the journal) and one completed call
    claim_row(alias, processor)
    claim_row(alias, processor, aged=timedelta(hours=2))
    claim_row(alias, processor, aged=timedelta(days=400))
    done, token = uuid.uuid4().hex + uuid.uuid4().hex, uuid.uuid4().hex
    get_store(alias).claim(ClaimRequest(
        processor_id=processor, fingerprint=done, task_name="tests.gauged", task_id="t-done",
        token=token, worker="w", args_repr="()", max_processing_time=60.0,
        expires_after=86400.0, max_takeovers=3,
    ))  # fmt: skip
    get_store(alias).finish(processor, done, token, Completion("completed"))
    # and three outbox rows: two pending, one dead
    with transaction.atomic(using=alias):
        rows = [outbox.enqueue(effect, (n,), using=alias, queue="gauges-never-published")
                for n in ("a", "b", "c")]  # fmt: skip
    outbox_rows.extend(row.pk for row in rows)
    OutboxMessage.objects.using(alias).filter(pk=rows[2].pk).update(status="dead")
    # (one of the pending rows due for 300 s, no relay publishing it)
    OutboxMessage.objects.using(alias).filter(pk=rows[0].pk).update(
        available_at=now(alias) - timedelta(seconds=300))
    # When a fresh registry with the collector is scraped
    after = scrape()
    # (another test's claim may have turned stale meanwhile: the gauges count them all)
    others = Outcome.objects.using(alias).filter(
        status="in_flight", stale_at__gt=t0, stale_at__lte=now(alias)
    ).exclude(processor_id=processor).count()
    # Then the gauges count the new in-flight claims, the stale ones among them (each
    # row's own stale_at), the oldest claim's age on the database clock, and the outbox
    delta = {name: after[name] - before[name] for name in GAUGES}
    assert delta["grousset_in_flight_claims"] == 3
    assert delta["grousset_stale_claims"] - others == 2
    assert delta["grousset_outbox_pending"] == 2
    assert delta["grousset_outbox_dead"] == 1
    assert after["grousset_outbox_oldest_due_seconds"] >= 300
    oldest = after["grousset_oldest_in_flight_seconds"]
    assert 400 * 86400 <= oldest < 400 * 86400 + 3600


def test_journal_gauges_are_cached_and_capped(
    alias: str, processor: str, outbox_rows: list[int]
) -> None:
    from django.db import connections, transaction
    from django.test.utils import CaptureQueriesContext
    from prometheus_client import CollectorRegistry

    from celery_grousset import outbox
    from celery_grousset.metrics import JournalCollector
    from tests.tasks import effect

    for _ in range(3):
        claim_row(alias, processor)
    # Given a collector that keeps what it read for 60 s
    registry = CollectorRegistry()
    registry.register(JournalCollector([alias], ttl=60))
    first = gauge_values(registry, alias)
    # When a row is added and a scrape storm comes
    with transaction.atomic(using=alias):
        outbox_rows.append(outbox.enqueue(effect, ("x",), using=alias, queue="gauges-x").pk)
    with CaptureQueriesContext(connections[alias]) as queries:
        storm = [gauge_values(registry, alias) for _ in range(20)]
    # Then the database was not read again: every scrape got the cached values
    assert len(queries) == 0
    assert all(values == first for values in storm)
    # And a collector capped at 2 rows reports at most 2 (the bounded count)
    capped = CollectorRegistry()
    capped.register(JournalCollector([alias], ttl=0, cap=2))
    values = gauge_values(capped, alias)
    assert values["grousset_in_flight_claims"] == 2
    assert 1 <= values["grousset_outbox_pending"] <= 2


def test_journal_gauges_never_fail_a_scrape(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django.db import OperationalError
    from prometheus_client import CollectorRegistry

    from celery_grousset import journal
    from celery_grousset.metrics import GAUGES, JournalCollector

    services.require_database("default")
    real = journal.gauges

    def down(alias: str, cap: int) -> dict[str, float]:
        raise OperationalError("connection to server at 127.0.0.1:5432 failed")

    registry = CollectorRegistry()
    registry.register(JournalCollector(["default"], ttl=0))
    # Given a journal database that cannot be read
    monkeypatch.setattr(journal, "gauges", down)
    caplog.set_level(logging.DEBUG, logger="celery_grousset")
    # When it is scraped three times / Then no gauge sample, no exception, one warning
    for _ in range(3):
        assert gauge_values(registry, "default") == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "grousset.gauges_unavailable database=default" in warnings[0].getMessage()
    assert "OperationalError" in warnings[0].getMessage()
    # When it can be read again / Then the gauges are back
    monkeypatch.setattr(journal, "gauges", real)
    assert len(gauge_values(registry, "default")) == len(GAUGES)
    # And the next outage warns again (once)
    monkeypatch.setattr(journal, "gauges", down)
    for _ in range(2):
        assert gauge_values(registry, "default") == {}
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_enable_registers_the_gauges_for_a_web_process() -> None:
    from prometheus_client import CollectorRegistry

    from celery_grousset import metrics

    services.require_database("default")
    registry = CollectorRegistry()
    # Given a web process that enables metrics on the registry its metrics view serves
    rec = metrics.enable(registry, fresh=True)
    try:
        # When that registry is scraped / Then the journal gauges of GROUSSET["DATABASE"]
        # are served with the counters; enabling twice registers them once
        assert metrics.enable(registry) is rec
        assert metrics.register_gauges(registry) is None
        values = gauge_values(registry, "default")
        assert set(values) == set(metrics.GAUGES)
    finally:
        metrics.disable()
        rec.unregister()
        metrics._recorder = None


def test_the_gauges_cover_every_journal_database_by_default() -> None:
    from django.conf import settings
    from prometheus_client import CollectorRegistry

    import tests.tasks  # noqa: F401  (effect_on_mysql: its journal on the "mysql" alias)
    from celery_grousset.metrics import GAUGES, JournalCollector

    default = str(settings.GROUSSET["DATABASE"])
    for alias in (default, "mysql"):
        services.require_database(alias)
    # Given a collector registered as a worker registers it (no databases named)
    registry = CollectorRegistry()
    registry.register(JournalCollector(ttl=0))
    # When it is scraped / Then GROUSSET["DATABASE"] and a task's own journal database
    # both have their gauges (a stale claim there raises GroussetStaleClaims too)
    for alias in (default, "mysql"):
        assert set(gauge_values(registry, alias)) == set(GAUGES), alias


def test_a_killed_workers_metrics_directory_is_swept_at_the_next_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    from celery_grousset.metrics import DIR_PREFIX
    from celery_grousset.worker import swept_dirs

    # Given the directories a worker killed with -9 left (its pid gone), a live worker's,
    # and names that are not ours
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    for name in (f"{DIR_PREFIX}{dead}-abc", f"{DIR_PREFIX}{os.getpid()}-def",
                 f"{DIR_PREFIX}old", "something-else"):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "counter_1.db").write_bytes(b"x")
    # When a worker starts with metrics / Then only the dead worker's directory goes
    assert swept_dirs(str(tmp_path)) == [str(tmp_path / f"{DIR_PREFIX}{dead}-abc")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{DIR_PREFIX}{os.getpid()}-def", f"{DIR_PREFIX}old", "something-else"]
    )


def test_a_poison_delivery_is_counted_for_the_alert(journal: str) -> None:
    from prometheus_client import CollectorRegistry

    from celery_grousset import events
    from celery_grousset.exceptions import PoisonDelivery
    from celery_grousset.metrics import Recorder
    from tests.tasks import effect

    registry = CollectorRegistry()
    previous, events.recorder = events.recorder, Recorder(registry)
    key = f"poison-{uuid.uuid4().hex[:8]}"
    try:
        # Given metrics are on / When a call with a poison task id is refused, and a
        # good call of the same task runs
        refused = effect.apply((key,), task_id="t" * 300)
        effect.apply((key,)).get()
    finally:
        events.recorder = previous
    # Then the refusal is counted once as a poison claim outcome (the alert's series)
    assert isinstance(refused.result, PoisonDelivery)
    poison = {"task": effect.name, "outcome": "poison"}
    assert registry.get_sample_value("grousset_claims_total", poison) == 1
    fresh = {"task": effect.name, "outcome": "new"}
    assert registry.get_sample_value("grousset_claims_total", fresh) == 1


#: another session's lock that makes a read of the journal wait
TABLE_LOCK = {
    "postgresql": ("LOCK TABLE celery_grousset_outcome IN ACCESS EXCLUSIVE MODE", None),
    "mysql": ("LOCK TABLES celery_grousset_outcome WRITE", "UNLOCK TABLES"),
}


@pytest.mark.parametrize("name", list(TABLE_LOCK))
def test_journal_gauges_behind_a_table_lock_give_up_within_their_budget(
    name: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scrape read the gauges with no time limit: behind another session's table lock
    it waited for the lock (a review: an 18.5 s scrape, and a Prometheus scrape timeout
    that lost the counters too). The reads now stop after journal.GAUGE_BUDGET."""
    from django.db import connections, transaction
    from prometheus_client import CollectorRegistry

    from celery_grousset import journal
    from celery_grousset.metrics import JournalCollector

    services.require_database(name)
    lock, unlock = TABLE_LOCK[name]
    held, done = threading.Event(), threading.Event()

    def hold() -> None:  # another session holds the journal locked for up to 20 s
        try:
            with transaction.atomic(using=name), connections[name].cursor() as cur:
                cur.execute(lock)
                held.set()
                done.wait(20)
                if unlock:
                    cur.execute(unlock)
        finally:
            connections[name].close()

    holder = threading.Thread(target=hold)
    holder.start()
    registry = CollectorRegistry()
    registry.register(JournalCollector([name], ttl=0))
    caplog.set_level(logging.WARNING, logger="celery_grousset")
    try:
        assert held.wait(10)
        # When the gauges are scraped with a budget of 1 s
        monkeypatch.setattr(journal, "GAUGE_BUDGET", 1.0)
        started = time.monotonic()
        values = gauge_values(registry, name)
        took = time.monotonic() - started
    finally:
        done.set()
        holder.join()
    # Then the scrape answered within about that, without the gauges, and said why
    assert took < 4.0, took
    assert values == {}
    assert any("grousset.gauges_unavailable database=" + name in r.getMessage()
               for r in caplog.records), caplog.text  # fmt: skip
