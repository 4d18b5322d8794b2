"""Monitoring assets shipped with celery-grousset: a Grafana dashboard and Prometheus
alert rules over the metrics of :mod:`celery_grousset.metrics`.

The files are part of the installed package; find them with::

    python -c "from celery_grousset.contrib import monitoring as m; print(m.DASHBOARD)"

``grafana-dashboard.json``: import it in Grafana (Dashboards → New → Import) and pick
your Prometheus data source. ``prometheus-alerts.yml``: add its path to ``rule_files``
in ``prometheus.yml`` (check it with ``promtool check rules``).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the Grafana dashboard (JSON model, data source chosen on import)
DASHBOARD = HERE / "grafana-dashboard.json"
#: the Prometheus alerting rules (a ``groups:`` file for ``rule_files``)
ALERT_RULES = HERE / "prometheus-alerts.yml"

__all__ = ["ALERT_RULES", "DASHBOARD"]
