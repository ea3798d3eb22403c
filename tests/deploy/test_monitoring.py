"""``deploy/prometheus`` and ``deploy/grafana``: the rules and the dashboard parse, use only metric
names /metrics exposes (or the journal and limits metrics named by their issues) and only configured
names as labels, never the client's model; promtool accepts them when it is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY

import infra.metrics  # noqa: F401 - registers the metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
SCRAPE = ROOT / "deploy" / "prometheus" / "prometheus.example.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "toolrelay.json"
#: Metrics other issues add (the audit journal, the limits): named here, defined there.
ELSEWHERE = {"toolrelay_journal_backlog_bytes", "toolrelay_limits_fail_open_total"}
ALLOWED_LABELS = {"tenant", "route", "upstream", "path", "outcome", "cause", "kind", "le", "instance", "pod", "job"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool"}


def exposed_names() -> set[str]:
    """Every sample name /metrics can show for the toolrelay metrics."""
    names = set()
    for family in REGISTRY.collect():
        if not family.name.startswith("toolrelay_"):
            continue
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


def _balanced(expr: str) -> bool:
    depth = {"(": 0, "{": 0, "[": 0}
    pairs = {")": "(", "}": "{", "]": "["}
    for ch in re.sub(r'"[^"]*"', '""', expr):
        if ch in depth:
            depth[ch] += 1
        elif ch in pairs:
            depth[pairs[ch]] -= 1
            if depth[pairs[ch]] < 0:
                return False
    return not any(depth.values())


def check_expr(expr: str, known: set[str]) -> None:
    """Names, labels and brackets of one PromQL expression."""
    assert _balanced(expr), expr
    for name in re.findall(r"\b(toolrelay[_:][a-z0-9_:]+)", expr):
        assert name in known, f"unknown metric {name} in {expr}"
    grouped = re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr)
    matched = re.findall(r"[{,]\s*([a-z_]+)\s*(?:=~|!~|!=|=)", re.sub(r'"[^"]*"', '""', expr))
    labels = {label.strip() for group in grouped for label in group.split(",") if label.strip()} | set(matched)
    assert labels <= ALLOWED_LABELS, labels - ALLOWED_LABELS
    assert "model" not in labels


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_alert_rules_use_exposed_metrics_and_configured_names_only() -> None:
    rules = _rules()
    recorded = {rule["record"] for rule in rules if "record" in rule}
    known = exposed_names() | ELSEWHERE | recorded
    alerts = [rule for rule in rules if "alert" in rule]
    assert {a["alert"] for a in alerts} >= {"ToolrelayUpstreamCorruptionHigh", "ToolrelayRequestsExhausted",
                                            "ToolrelayRetriesHigh", "ToolrelayAddedLatencyHigh",
                                            "ToolrelayJournalNotDraining", "ToolrelayLimitsFailingOpen"}
    for rule in rules:
        check_expr(rule["expr"], known)
    for alert in alerts:
        assert alert["labels"]["severity"] in ("info", "warning", "critical") and alert["annotations"]["summary"]
    text = RULES.read_text()
    assert "toolrelay_journal_backlog_bytes" in text and "toolrelay_limits_fail_open_total" in text


def test_promtool_accepts_the_rules_and_the_scrape_example_when_installed(tmp_path: Path) -> None:
    """Debian's prometheus package ships promtool; CI machines without it still run the checks above."""
    promtool = shutil.which("promtool")
    if promtool is None:
        assert yaml.safe_load(SCRAPE.read_text())["rule_files"] == ["alerts.yml"]
        return
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False)  # noqa: S603
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    token = tmp_path / "token"
    token.write_text("t")
    (tmp_path / "alerts.yml").write_text(RULES.read_text())
    config = tmp_path / "prometheus.yml"
    config.write_text(SCRAPE.read_text().replace("/etc/prometheus/toolrelay-metrics-token", str(token)))
    done = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, check=False)  # noqa: S603
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_grafana_dashboard_charts_the_issue_figures_from_exposed_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    known = exposed_names() | ELSEWHERE
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    for expr in exprs:
        check_expr(expr.replace("$__rate_interval", "5m"), known)
    titles = " ".join(p["title"] for p in panels).lower()
    for figure in ("corruption rate by upstream and route", "retries", "exhausted", "added latency",
                   "journal backlog", "limits failing open"):
        assert figure in titles, figure
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "tenant", "route", "upstream"}
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
