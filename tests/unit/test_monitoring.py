"""The Grafana dashboard and the Prometheus alert rules in deploy/monitoring/ load, have the structure
their tools expect, and query only metrics the worker exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from neardup.stream.metrics import Metrics

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
DURATION = re.compile(r"^(\d+[smhdwy])+$")
METRIC_NAME = re.compile(r"\bneardup_[a-zA-Z0-9_]*")

# The series names prometheus_client writes for each kind of metric family: a counter's family name
# has no _total, a histogram's has none of its series' suffixes.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def dashboard() -> dict[str, Any]:
    return json.loads((MONITORING / "grafana-dashboard.json").read_text())


def rule_file() -> dict[str, Any]:
    return yaml.safe_load((MONITORING / "alerts.yaml").read_text())


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those folded into rows."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def dashboard_queries() -> list[str]:
    board = dashboard()
    exprs = [t["expr"] for p in panels(board["panels"]) for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["query"]["query"])
    return exprs


def alert_exprs() -> list[str]:
    return [rule["expr"] for group in rule_file()["groups"] for rule in group["rules"]]


def exported_series() -> set[str]:
    families = Metrics().registry.collect()
    return {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}


def unknown_metrics(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)} - exported_series()


def test_dashboard_has_panels_with_promql_targets() -> None:
    board = dashboard()
    assert board["title"] and board["uid"]
    found = [p for p in panels(board["panels"]) if p["type"] != "row"]
    assert len(found) >= 8
    for panel in found:
        assert panel["title"] and panel["targets"], panel.get("title")
        for target in panel["targets"]:
            assert target["refId"]
            assert METRIC_NAME.search(target["expr"]) or target["expr"].startswith("sum(up{"), target
    assert len({p["id"] for p in found}) == len(found)


def test_alerts_have_the_rule_file_structure() -> None:
    groups = rule_file()["groups"]
    assert groups
    names = []
    for group in groups:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule.get("alert")
            assert DURATION.match(rule["for"]), rule["alert"]
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            names.append(rule["alert"])
    assert len(names) == len(set(names))
    assert any("up{" in expr for expr in alert_exprs())


def test_queries_name_only_exported_metrics() -> None:
    assert unknown_metrics(dashboard_queries()) == set()
    assert unknown_metrics(alert_exprs()) == set()


def test_every_exported_metric_is_on_the_dashboard() -> None:
    used = {name for expr in dashboard_queries() for name in METRIC_NAME.findall(expr)}
    for family in Metrics().registry.collect():
        assert any(family.name + suffix in used for suffix in SUFFIXES[family.type]), family.name


@pytest.mark.parametrize(
    ("expr", "unknown"),
    [
        ("sum(rate(neardup_verdict_total[5m]))", {"neardup_verdict_total"}),  # misspelt
        ("rate(neardup_verdicts[5m])", {"neardup_verdicts"}),  # a counter's family name is no series
        ("neardup_latency_seconds > 1", {"neardup_latency_seconds"}),  # nor a histogram's
        ("sum by (le) (rate(neardup_latency_seconds_bucket[5m]))", set()),
        ("neardup_consumer_lag > 0 and neardup_offset_gap_messages_total > 0", set()),
    ],
)
def test_the_metric_check_catches_names_the_worker_does_not_export(expr: str, unknown: set[str]) -> None:
    assert unknown_metrics([expr]) == unknown


def test_every_alert_is_explained_in_the_operations_doc() -> None:
    """deploy/docs/operations.md, "Alerts": one row per rule, in the rule file's order."""
    doc = (MONITORING.parent / "docs" / "operations.md").read_text()
    section = doc.split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0]
    explained = re.findall(r"^\| `(Neardup\w+)` \|", section, flags=re.M)
    assert explained == [rule["alert"] for group in rule_file()["groups"] for rule in group["rules"]]
