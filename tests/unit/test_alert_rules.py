"""The shipped alert rules and dashboard: ``promtool check rules`` and ``promtool test
rules`` (Prometheus' own rule tests, in ``deploy/prometheus/icegate-rules.test.yml``), and
every metric they name is one the exporter renders; the documentation's table of metrics
(docs/reference/monitoring.md) names every family the exporter renders, and only those.
(Each dashboard query is run against a real Prometheus in
``tests/surfaces/test_monitoring.py``.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from icegate_dagster.maintenance.log.totals import OperationTotals, TotalsView
from icegate_dagster.monitoring.metrics import ExporterState, render, render_live
from icegate_dagster.monitoring.snapshot import SOURCES, DaemonBeat, Snapshot, SourceState
from tests.surfaces.prometheus_server import dashboard_targets
from tests.unit.test_monitoring import _figures

REPO = Path(__file__).resolve().parents[2]
METRICS_PAGE = REPO / "docs" / "reference" / "monitoring.md"
RULES = REPO / "deploy" / "prometheus" / "icegate-rules.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "icegate-rules.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "icegate-maintenance.json"
PROMTOOL = Path("/usr/bin/promtool")
#: The dashboard row whose panels need ``serve --operation-detail``, as its title says.
DETAIL_OPTION = "--operation-detail"
#: The last cell of a metric rendered only with that option, in the docs' table.
DETAIL_OPTION_CELL = "with `--operation-detail`"
#: What PromQL names that is not a metric: functions, keywords, Prometheus' own series.
NOT_METRICS = {
    "sum", "count", "by", "on", "ignoring", "group_left", "increase", "rate", "time",
    "bottomk", "topk", "vector", "or", "and", "unless", "absent", "up", "ALERTS",
}  # fmt: skip


def _promtool(*args: str) -> str:
    assert PROMTOOL.exists(), "promtool is missing: run scripts/setup.sh --test"
    done = subprocess.run(
        [str(PROMTOOL), *args], capture_output=True, text=True, check=False, cwd=RULES.parent
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_checks_the_rules() -> None:
    assert "SUCCESS: 13 rules found" in _promtool("check", "rules", str(RULES))


def test_promtool_rule_tests_pass() -> None:
    """Each alert fires where it should and nowhere else (the seed's four thresholds against
    the exported config values, unhealthy for 6 h, stale, repeated failures, unreadable,
    quarantine, the exporter down, absent or stale, a source down)."""
    assert "SUCCESS" in _promtool("test", "rules", str(RULE_TESTS))
    tested = {
        test["alertname"]
        for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for test in group.get("alert_rule_test", [])
    }
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    assert alerts == tested


def _exported(*, operation_detail: bool) -> set[str]:
    """Every series name the exporter renders (a snapshot with every part present), by
    default or with the operation detail."""
    optimize = OperationTotals(1, 0, 500, {}, 1.0, "completed", 500)
    snapshot = Snapshot(
        taken_at=1300.0,
        tables=(_figures(totals={"optimize": optimize}),),
        sources={name: SourceState(True) for name in SOURCES},
        log=TotalsView({("lakehouse.logs", "optimize"): optimize}, None, 1, 1),
        daemons=(DaemonBeat("SENSOR", 1.0, True),),
        has_wal=True,
    )
    text = (
        render(snapshot, operation_detail=operation_detail).decode()
        + render_live(ExporterState(1300.0, 1, 0, 2.5)).decode()
    )
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def _names(expr: str) -> set[str]:
    # label_values(selector, label), by (labels), on(labels), ignoring(labels): no metrics.
    expr = re.sub(r",\s*\w+\)$", ")", expr.replace("label_values", ""))
    expr = re.sub(r"\b(by|on|ignoring)\s*\([^)]*\)", "", expr)
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_strings = re.sub(r'"[^"]*"', "", without_labels)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_strings)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", without_ranges))
    return {w for w in words if w not in NOT_METRICS and not w.startswith("__")}


def test_the_rules_and_the_dashboard_name_only_exported_metrics() -> None:
    """The rules, the variables and every panel read only what the exporter renders by
    default, but for the panels of the row marked ``--operation-detail``, which read what
    it renders with that option."""
    exported = _exported(operation_detail=False)
    detailed = _exported(operation_detail=True)
    rules = [
        rule["expr"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    ]
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [(title, target["expr"]) for title, target in dashboard_targets(dashboard["panels"])]
    detail_rows = [p["title"] for p in dashboard["panels"] if DETAIL_OPTION in p["title"]]
    assert len(detail_rows) == 1, detail_rows
    by_default = [expr for row, expr in panels if DETAIL_OPTION not in row]
    variables = [v["definition"] for v in dashboard["templating"]["list"]]
    unknown = sorted(
        name
        for expr in [*rules, *by_default, *variables]
        for name in _names(expr)
        if name not in exported
    )
    assert unknown == []
    detail_only = [expr for row, expr in panels if DETAIL_OPTION in row]
    assert detail_only
    assert sorted(n for e in detail_only for n in _names(e) if n not in detailed) == []
    # Every panel asks the one Prometheus data source the dashboard is imported with.
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert panel["targets"], panel["title"]


def test_the_docs_list_every_metric_the_exporter_renders() -> None:
    """The table of the Metrics section of the documentation matches the code both ways."""
    text = METRICS_PAGE.read_text()
    start = text.index("\n## Metrics\n")
    section = text[start : text.index("\n## ", start + 1)]
    table = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name for line in table for name in re.findall(r"`([a-z_]+)`", line.split("|")[1])}
    assert named == _exported(operation_detail=False) | _exported(operation_detail=True)
    # Its last column says which are rendered only with the option.
    detail_only = {
        name
        for line in table
        if line.rstrip(" |").endswith(DETAIL_OPTION_CELL)
        for name in re.findall(r"`([a-z_]+)`", line.split("|")[1])
    }
    assert detail_only == _exported(operation_detail=True) - _exported(operation_detail=False)
