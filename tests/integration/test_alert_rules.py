"""The alert rules and the dashboard's queries, checked by the real promtool (Prometheus 3.16.0).

`promtool check rules` on the plain rule file (deploy/prometheus/dlq-sidecar-rules.yaml) and on the
chart's rendered PrometheusRule; every dashboard query, turned into a recording rule, through the same
parser; every alert's severity, summary and runbook section. (`promtool test rules`: the files of
tests/promtool, run by test_promtool_rules.py.)

promtool is found through $DLQ_PROMTOOL, ~/.cache/dlq-sidecar/bin/promtool or PATH;
`scripts/install-promtool` (run by `make tools`) builds it. A missing tool fails these tests.

Imports: the standard library, PyYAML, pytest and the chart test's helpers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.integration.test_helm import CHART, ROOT, ci_file, only, render

RULES = ROOT / "deploy" / "prometheus" / "dlq-sidecar-rules.yaml"
DASHBOARD = CHART / "dashboards" / "dlq-sidecar.json"
RUNBOOK = ROOT / "docs" / "runbook.md"


def find_promtool() -> str | None:
    explicit = os.environ.get("DLQ_PROMTOOL")
    if explicit:
        return explicit
    cached = Path.home() / ".cache" / "dlq-sidecar" / "bin" / "promtool"
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("promtool")


def run_promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, check=False, timeout=120
    )


def rules() -> dict[str, dict[str, Any]]:
    """The plain file's alerts by name."""
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def test_promtool_is_the_pinned_release(promtool: str) -> None:
    proc = run_promtool(promtool, "--version")
    assert "version 3.16.0" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_check_rules_accepts_the_plain_file(promtool: str) -> None:
    proc = run_promtool(promtool, "check", "rules", "--lint-fatal", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout, proc.stdout


def test_check_rules_accepts_the_rendered_prometheus_rule(
    helm: str, promtool: str, tmp_path: Path
) -> None:
    rule = only(render(helm, ci_file("monitoring")), "PrometheusRule")
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    proc = run_promtool(promtool, "check", "rules", "--lint-fatal", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_rules_refuses_a_broken_expression(promtool: str, tmp_path: Path) -> None:
    """The check is real: a typo in PromQL fails it."""
    doc = yaml.safe_load(RULES.read_text())
    doc["groups"][0]["rules"][0]["expr"] += " +"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = run_promtool(promtool, "check", "rules", str(path))
    assert proc.returncode != 0


# Grafana's variables, as a dashboard would expand them.
_GRAFANA_VARS = {
    "$__rate_interval": "2m",
    "$__range": "1h",
    "$cluster": ".*",
    "$job": ".*",
    "$namespace": ".*",
    "$pod": ".*",
    "$topic": ".*",
}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) of every dashboard target."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def test_every_dashboard_query_parses(promtool: str, tmp_path: Path) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 25
    records = []
    for n, (_title, query) in enumerate(queries):
        expr = query
        for var, value in _GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        records.append({"record": f"dashboard:query_{n}", "expr": expr})
    path = tmp_path / "dashboard.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    proc = run_promtool(promtool, "check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _slug(heading: str) -> str:
    """A Markdown heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_severity_summary_and_a_runbook_section(helm: str) -> None:
    anchors = {
        _slug(line.lstrip("#")) for line in RUNBOOK.read_text().splitlines() if line.startswith("#")
    }
    url = "https://runbooks.example.com/dlq-sidecar/runbook.md"
    rule = only(
        render(helm, ci_file("monitoring"), sets=(f"prometheusRule.runbookUrl={url}",)),
        "PrometheusRule",
    )
    found = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert len(found) >= 14
    assert set(rules()) == set(found) - {"DlqSidecarAbsent"}  # the plain file: scope all
    for name, r in found.items():
        assert r["labels"]["severity"] in {"critical", "warning"}, name
        summary = r["annotations"]["summary"]
        if name != "DlqSidecarAbsent":  # no pod exists to name
            assert "$labels.pod" in summary and "$labels.topic" in summary, name
        assert r["annotations"]["runbook_url"] == f"{url}#{name.lower()}", name
        assert name.lower() in anchors, f"{name}: no section in {RUNBOOK}"
    for name, r in rules().items():
        assert r["annotations"]["runbook_url"] == f"docs/runbook.md#{name.lower()}", name


def test_every_panel_the_runbook_names_is_on_the_dashboard() -> None:
    """The runbook names panels as `panel "Title"`; each must be a panel of the dashboard."""
    titles = {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    named = {
        " ".join(m.split())
        for m in re.findall(r'panel\s+"([^"]+)"', RUNBOOK.read_text())
        if m != "..."
    }
    assert len(named) >= 12
    assert named <= titles, f"not on the dashboard: {sorted(named - titles)}"
