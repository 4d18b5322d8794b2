"""The shipped monitoring assets (celery_grousset/contrib/monitoring/): the Prometheus
alert rules pass ``promtool check rules`` and fire when they should (``promtool test
rules`` on synthetic series), and the Grafana dashboard and the rules only name metrics,
labels and outcome values that the package exports. And the log records carry their
fields as ``extra=`` for JSON formatters."""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from celery_grousset.contrib.monitoring import ALERT_RULES, DASHBOARD
from tests import services

METRIC = re.compile(r"\b(grousset_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b(grousset_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"\s*')
BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        services.unavailable("promtool", "install Debian's prometheus package")
    return path


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(ALERT_RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def dashboard_queries() -> list[str]:
    dash = dashboard()
    queries = [t["expr"] for p in walk_panels(dash["panels"]) for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def exported() -> dict[str, set[str] | None]:
    """Every metric (sample) name the package exports -> its label names: the recorder's
    counters and histograms, and the gauges of the journal collector."""
    from prometheus_client import CollectorRegistry

    from celery_grousset.metrics import GAUGES, JournalCollector, Recorder

    rec = Recorder(CollectorRegistry())
    names: dict[str, set[str] | None] = {}
    for collector in rec.collectors():
        labels = set(collector._labelnames)
        kind = collector._type
        base = collector._name
        if kind == "counter":
            names[f"{base}_total"] = labels
        elif kind == "histogram":
            names[f"{base}_bucket"] = labels | {"le"}
            names[f"{base}_sum"] = labels
            names[f"{base}_count"] = labels
        else:  # pragma: no cover - a new kind of metric needs a line here
            raise AssertionError(f"{base}: unexpected metric type {kind}")
    for family in JournalCollector().describe():  # names only: nothing is read
        assert family.type == "gauge" and family.name in GAUGES, family.name
        names[family.name] = {"database"}
    assert set(GAUGES) <= set(names)
    return names


def outcome_values() -> set[str]:
    from celery_grousset.metrics import CLAIM_LABELS, COMPLETION_OUTCOMES

    return set(CLAIM_LABELS) | set(COMPLETION_OUTCOMES)


# -- promtool ----------------------------------------------------------------------------


def test_promtool_checks_the_alert_rules() -> None:
    # Given promtool (Debian's prometheus package) / When it checks the shipped rules
    done = subprocess.run([promtool(), "check", "rules", str(ALERT_RULES)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    # Then they are valid, and every one of them was read
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


PROMTOOL_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'grousset_outcome_commit_errors_total{{task="shop.tasks.charge"}}'
        values: '0 0 0 1x30'
      - series: 'grousset_stale_claims'
        values: '0x10 1x30'
      - series: 'grousset_outbox_dead'
        values: '0x10 2x20'
      - series: 'grousset_outbox_oldest_due_seconds'
        values: '0x10 60+60x30'
      - series: 'grousset_claims_total{{task="shop.tasks.pay", outcome="fenced_out"}}'
        values: '0x5 1x40'
      - series: 'grousset_claims_total{{task="shop.tasks.pay", outcome="gave_up"}}'
        values: '0x40'
      - series: 'grousset_claims_total{{task="shop.tasks.mail", outcome="poison"}}'
        values: '0x8 1x40'
      - series: 'grousset_claims_total{{task="shop.tasks.ship", outcome="store_unavailable"}}'
        values: '0x10 1+1x10 11x20'
      - series: 'grousset_overruns_total{{task="shop.tasks.report"}}'
        values: '0x10 1x100'
    alert_rule_test:
      - eval_time: 6m
        alertname: GroussetCommitErrors
        exp_alerts:
          - exp_labels: {{severity: critical, task: shop.tasks.charge}}
      - eval_time: 2m
        alertname: GroussetCommitErrors
        exp_alerts: []
      - eval_time: 20m
        alertname: GroussetStaleClaims
        exp_alerts: []
      - eval_time: 30m
        alertname: GroussetStaleClaims
        exp_alerts:
          - exp_labels: {{severity: warning}}
      - eval_time: 12m
        alertname: GroussetOutboxDeadLetters
        exp_alerts: []
      - eval_time: 18m
        alertname: GroussetOutboxStalled
        exp_alerts: []
      - eval_time: 22m
        alertname: GroussetOutboxStalled
        exp_alerts:
          - exp_labels: {{severity: warning}}
      - eval_time: 20m
        alertname: GroussetOutboxDeadLetters
        exp_alerts:
          - exp_labels: {{severity: warning}}
      - eval_time: 10m
        alertname: GroussetFencedOut
        exp_alerts:
          - exp_labels: {{severity: warning, task: shop.tasks.pay}}
      - eval_time: 35m
        alertname: GroussetFencedOut
        exp_alerts: []
      - eval_time: 30m
        alertname: GroussetGaveUp
        exp_alerts: []
      - eval_time: 5m
        alertname: GroussetOverran
        exp_alerts: []
      - eval_time: 40m
        alertname: GroussetOverran
        exp_alerts:
          - exp_labels: {{severity: warning, task: shop.tasks.report}}
      - eval_time: 100m
        alertname: GroussetOverran
        exp_alerts: []
      - eval_time: 5m
        alertname: GroussetPoisonDeliveries
        exp_alerts: []
      - eval_time: 12m
        alertname: GroussetPoisonDeliveries
        exp_alerts:
          - exp_labels: {{severity: warning, task: shop.tasks.mail}}
      - eval_time: 30m
        alertname: GroussetPoisonDeliveries
        exp_alerts: []
      - eval_time: 13m
        alertname: GroussetClaimErrors
        exp_alerts: []
      - eval_time: 18m
        alertname: GroussetClaimErrors
        exp_alerts:
          - exp_labels: {{severity: critical, task: shop.tasks.ship}}
      - eval_time: 40m
        alertname: GroussetClaimErrors
        exp_alerts: []
  # as a worker writes them: a counter's series is served at 0 from the worker's start,
  # so the first event is an increase (a review: a series that began at its first event,
  # at 1, fired no alert); a journal outage of one minute (a blip, not paged) beside one
  # that lasts
  - interval: 1m
    input_series:
      - series: 'grousset_claims_total{{task="shop.tasks.pay", outcome="gave_up"}}'
        values: '0x5 1x60'
      - series: 'grousset_claims_total{{task="shop.tasks.pay", outcome="fenced_out"}}'
        values: '0x5 1x60'
      - series: 'grousset_claims_total{{task="shop.tasks.mail", outcome="poison"}}'
        values: '0x5 1x60'
      - series: 'grousset_outcome_commit_errors_total{{task="shop.tasks.charge"}}'
        values: '0x5 1x60'
      - series: 'grousset_overruns_total{{task="shop.tasks.report"}}'
        values: '0x5 1x100'
      - series: 'grousset_claims_total{{task="shop.tasks.blip", outcome="store_unavailable"}}'
        values: '0x5 1 3 4x60'
      - series: 'grousset_claims_total{{task="shop.tasks.down", outcome="store_unavailable"}}'
        values: '0x5 1+2x30 61x30'
    alert_rule_test:
      - eval_time: 7m
        alertname: GroussetGaveUp
        exp_alerts:
          - exp_labels: {{severity: critical, task: shop.tasks.pay}}
      - eval_time: 30m
        alertname: GroussetGaveUp
        exp_alerts: []
      - eval_time: 7m
        alertname: GroussetFencedOut
        exp_alerts:
          - exp_labels: {{severity: warning, task: shop.tasks.pay}}
      - eval_time: 7m
        alertname: GroussetPoisonDeliveries
        exp_alerts:
          - exp_labels: {{severity: warning, task: shop.tasks.mail}}
      - eval_time: 7m
        alertname: GroussetCommitErrors
        exp_alerts:
          - exp_labels: {{severity: critical, task: shop.tasks.charge}}
      - eval_time: 30m
        alertname: GroussetCommitErrors
        exp_alerts: []
      - eval_time: 30m
        alertname: GroussetOverran
        exp_alerts:
          - exp_labels: {{severity: warning, task: shop.tasks.report}}
      - eval_time: 90m
        alertname: GroussetOverran
        exp_alerts: []
      - eval_time: 8m
        alertname: GroussetClaimErrors
        exp_alerts: []
      - eval_time: 14m
        alertname: GroussetClaimErrors
        exp_alerts:
          - exp_labels: {{severity: critical, task: shop.tasks.down}}
      - eval_time: 45m
        alertname: GroussetClaimErrors
        exp_alerts: []
  # duplicates: a steady 0.01/s for a day, then 2/s; another task at a steady 1/s
  - interval: 1m
    input_series:
      - series: 'grousset_duplicate_detections_total{{task="shop.tasks.spiky"}}'
        values: '0+0.6x1500 900+120x40'
      - series: 'grousset_duplicate_detections_total{{task="shop.tasks.busy"}}'
        values: '0+60x1540'
    alert_rule_test:
      - eval_time: 1400m
        alertname: GroussetDuplicateRateSpike
        exp_alerts: []
      - eval_time: 1525m
        alertname: GroussetDuplicateRateSpike
        exp_alerts:
          - exp_labels: {{severity: warning, task: shop.tasks.spiky}}
"""


def test_alerts_fire_on_synthetic_series(tmp_path: Path) -> None:
    tool = promtool()
    # Given the shipped rules without their annotations (promtool compares annotations
    # verbatim; these tests are about when each alert fires, and with which labels)
    data = yaml.safe_load(ALERT_RULES.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(data))
    (tmp_path / "tests.yml").write_text(PROMTOOL_TESTS.format(rules="rules.yml"))
    # When promtool evaluates them over synthetic series
    done = subprocess.run([tool, "test", "rules", "tests.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    # Then commit errors, stale claims, dead letters and fence-outs alert (and stop),
    # and a duplicate spike alerts while a steady duplicate rate does not
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    tested = set(re.findall(r"alertname: (\w+)", PROMTOOL_TESTS))
    assert tested == {rule["alert"] for rule in rules()}


# -- the metric names they use -----------------------------------------------------------


def check_query(query: str, names: dict[str, set[str] | None], where: str) -> set[str]:
    """The metric names a PromQL query uses; asserts each is exported, with its labels."""
    used = set(METRIC.findall(query))
    assert used, f"{where}: no grousset metric in {query!r}"
    unknown = used - set(names)
    assert not unknown, f"{where}: {sorted(unknown)} are not exported by the package"
    known_labels: set[str] = {"le"}
    for name in used:
        known_labels |= names[name] or set()
    for name, matchers in SELECTOR.findall(query):
        for label, _, value in MATCHER.findall(matchers):
            labels = names[name]
            if labels is not None:
                assert label in labels, f"{where}: {name} has no label {label!r}"
            if label == "outcome":
                values = set(value.split("|"))
                assert values <= outcome_values(), f"{where}: unknown outcome in {value!r}"
    if all(names[name] is not None for name in used):
        for group in BY.findall(query):
            for label in filter(None, (part.strip() for part in group.split(","))):
                assert label in known_labels, f"{where}: no metric has label {label!r}"
    return used


def test_dashboard_and_rules_name_only_exported_metrics() -> None:
    names = exported()
    # Given the package's metrics: counters, histograms, and the journal gauges
    assert "grousset_completions_total" in names and "grousset_stale_claims" in names
    # When every query of the dashboard and every alert expression is read
    in_dashboard: set[str] = set()
    for query in dashboard_queries():
        in_dashboard |= check_query(query, names, "grafana-dashboard.json")
    in_rules: set[str] = set()
    for rule in rules():
        in_rules |= check_query(rule["expr"], names, f"alert {rule['alert']}")
    # Then they name only those (checked above), and the dashboard shows every one of them
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in in_dashboard}
    assert families == shown, f"not on the dashboard: {sorted(families - shown)}"
    # And the alerts cover the five cases
    assert {"grousset_duplicate_detections_total", "grousset_stale_claims",
            "grousset_claims_total", "grousset_outcome_commit_errors_total",
            "grousset_outbox_dead", "grousset_outbox_oldest_due_seconds"} <= in_rules  # fmt: skip


def test_journal_gauges_are_never_summed_across_scrape_targets() -> None:
    from celery_grousset.metrics import GAUGES

    # Given every process that serves metrics reports the same journal-wide gauges
    queries = dashboard_queries() + [rule["expr"] for rule in rules()]
    seen = 0
    for query in queries:
        for gauge in GAUGES:
            for match in re.finditer(rf"\b{gauge}\b", query):
                # Then each use takes the max per database (or overall), never a sum
                before = query[: match.start()].rstrip()
                assert before.endswith(("max by (database) (", "max(")), query
                seen += 1
    assert seen >= len(GAUGES)


def test_a_query_naming_an_unknown_metric_is_caught() -> None:
    names = exported()
    # Given queries with a typo, a label the metric lacks, an outcome that does not exist
    bad = [
        "rate(grousset_claim_total[5m])",
        'rate(grousset_duplicate_detections_total{outcome="duplicate"}[5m])',
        'rate(grousset_claims_total{outcome=~"new|reclaimed"}[5m])',
        "sum by (queue) (rate(grousset_claims_total[5m]))",
    ]
    # Then the checker rejects each of them
    for query in bad:
        with pytest.raises(AssertionError):
            check_query(query, names, "test")


def test_dashboard_is_a_grafana_model() -> None:
    dash = dashboard()
    # Given the dashboard JSON / Then it has a stable uid and a data-source variable
    assert dash["uid"] == "celery-grousset" and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = list(walk_panels(dash["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        # And every panel queries the chosen Prometheus data source
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


# -- structured logs ---------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """What a JSON log formatter does: selected record attributes as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        keep = {k: v for k, v in record.__dict__.items()
                if k.startswith("grousset") or k in ("levelname", "name")}  # fmt: skip
        return json.dumps({"message": record.getMessage(), **keep}, default=str)


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("celery_grousset")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_log_fields_travel_as_extra_for_json_formatters(
    json_log: io.StringIO, processor: str
) -> None:
    from celery_grousset import protect
    from celery_grousset.models import Outcome

    services.require_database("default")
    opts = {"processor_id": processor, "database": "default", "max_processing_time": 60}
    # Given a JSON formatter on the celery_grousset logger
    # When protect() runs a key, then gets a duplicate of it
    assert protect("json-log", lambda: 7, **opts) == 7
    assert protect("json-log", lambda: 8, **opts) == 7
    rec = Outcome.objects.using("default").get(processor_id=processor)
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    duplicates = [line for line in lines if line["message"].startswith("grousset.duplicate")]
    # Then the duplicate's record carries its fields as a dict and as attributes,
    # with their own types (an int stays an int), besides the key=value message
    assert len(duplicates) == 1
    line = duplicates[0]
    fields = line["grousset"]
    assert fields["event"] == line["grousset_event"] == "grousset.duplicate_skipped"
    assert fields["fingerprint"] == line["grousset_fingerprint"] == rec.fingerprint
    assert fields["processor"] == line["grousset_processor"] == processor
    assert fields["task"] == "protect" and fields["deliveries"] == 2
    assert fields["original_task_id"] == rec.task_id
    assert fields["completed_at"] == rec.completed_at.isoformat()
    assert "delivery" not in fields  # a None field is left out, as in the message
    assert f"fingerprint={rec.fingerprint} task=protect" in line["message"]
    assert "deliveries=2" in line["message"]


class Unprintable:
    def __str__(self) -> str:
        raise AssertionError("a field was formatted for a disabled level")

    def __format__(self, spec: str) -> str:
        return str(self)


def test_a_disabled_level_builds_nothing(json_log: io.StringIO, processor: str) -> None:
    from celery_grousset import events, guard

    # Given INFO disabled on the logger, and a field that cannot be formatted
    logging.getLogger("celery_grousset").setLevel(logging.WARNING)
    opts = guard.Options(max_processing_time=60, processor_id=processor)
    req = guard.request(opts, "f" * 64, "t", "id", "")
    # When an INFO event is logged / Then nothing was formatted, nothing written
    events._log(logging.INFO, "grousset.in_flight", req, holder=Unprintable())
    assert json_log.getvalue() == ""
    # And at an enabled level the same call does format it
    with pytest.raises(AssertionError, match="formatted"):
        events._log(logging.ERROR, "grousset.in_flight", req, holder=Unprintable())


# -- the purge beat task -------------------------------------------------------------------


def test_beat_purge_also_drops_old_sent_outbox_rows(alias: str) -> None:
    from datetime import timedelta

    from django.db import transaction

    from celery_grousset import outbox
    from celery_grousset.journal import now as _db_now
    from celery_grousset.models import OutboxMessage
    from celery_grousset.published import arguments
    from celery_grousset.tasks import purge_expired
    from tests.tasks import effect

    queue = f"purge-{uuid.uuid4().hex[:8]}"  # rows are written, never published
    with transaction.atomic(using=alias):
        made = {name: outbox.enqueue(effect, (name,), using=alias, queue=queue)
                for name in ("old_sent", "new_sent", "old_dead", "pending")}  # fmt: skip
    rows = OutboxMessage.objects.using(alias)
    now = _db_now(alias)
    # Given sent rows 8 days old and 1 day old (retention: 7 days), an old dead row and
    # a pending row
    rows.filter(pk=made["old_sent"].pk).update(status="sent", sent_at=now - timedelta(days=8))
    rows.filter(pk=made["new_sent"].pk).update(status="sent", sent_at=now - timedelta(days=1))
    rows.filter(pk=made["old_dead"].pk).update(status="dead", sent_at=now - timedelta(days=30))
    ids = [row.pk for row in made.values()]
    try:
        # When the periodic task runs with outbox=False / Then the outbox is left alone
        purge_expired.apply(kwargs={"database": alias, "outbox": False}).get()
        assert rows.filter(pk__in=ids).count() == 4
        # When it runs as beat schedules it
        purge_expired.apply(kwargs={"database": alias, "batch_size": 1}).get()
        # Then only the sent row older than the retention window is gone
        left = sorted(arguments(row)[0][0] for row in rows.filter(pk__in=ids))
        assert left == ["new_sent", "old_dead", "pending"]
    finally:
        rows.filter(pk__in=ids).delete()
