"""The alert rules and the dashboard's queries, checked by the real promtool (Prometheus 3.16.0).

`promtool check rules` on the plain rule file (deploy/prometheus/dlq-sidecar-rules.yaml) and on the
chart's rendered PrometheusRule; every dashboard query, turned into a recording rule, through the same
parser; and `promtool test rules` with synthetic series under which each alert fires for one pod and
stays silent for another (or before its `for:`), with the labels and summaries expected.

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

import pytest
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


@pytest.fixture(scope="module")
def promtool() -> str:
    path = find_promtool()
    if path is None:
        pytest.fail(
            "promtool not found ($DLQ_PROMTOOL, ~/.cache/dlq-sidecar/bin/promtool, PATH): "
            "run scripts/install-promtool",
            pytrace=False,
        )
    return path


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


def test_every_alert_has_severity_summary_and_a_runbook_section() -> None:
    anchors = {
        _slug(line.lstrip("#")) for line in RUNBOOK.read_text().splitlines() if line.startswith("#")
    }
    found = rules()
    assert len(found) >= 10
    for name, rule in found.items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        summary = rule["annotations"]["summary"]
        assert "$labels.pod" in summary and "$labels.topic" in summary, name
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/runbook.md", name
        assert anchor == name.lower() and anchor in anchors, f"{name}: no section in {RUNBOOK}"


# --- promtool test rules ---------------------------------------------------------------------------

NS = "shop"


def series(metric: str, pod: str, values: str, **labels: str) -> dict[str, str]:
    text = ",".join(
        f'{k}="{v}"' for k, v in {"namespace": NS, "pod": pod, "job": "dlq", **labels}.items()
    )
    return {"series": f"{metric}{{{text}}}", "values": values}


def topics(pod: str, *names: str, minutes: int = 60) -> list[dict[str, str]]:
    return [
        series(
            "dlq_sidecar_source_topic_info",
            pod,
            f"1x{minutes}",
            topic=t,
            engine="consumer",
            group="orders-app",
        )
        for t in names
    ]


def expect(
    rule: dict[str, Any], pod: str, topic: str, summary: str, **labels: str
) -> dict[str, Any]:
    return {
        "exp_labels": {
            "severity": rule["labels"]["severity"],
            "namespace": NS,
            "pod": pod,
            "topic": topic,
            **labels,
        },
        "exp_annotations": {
            "summary": f"{NS}/{pod}: {summary}",
            "description": rule["annotations"]["description"],
            "runbook_url": rule["annotations"]["runbook_url"],
        },
    }


def share_group_alert(rule: dict[str, Any]) -> dict[str, Any]:
    """The lag alert of the share group behind Service `share` (no pod: the group's lag)."""
    return {
        "exp_labels": {"severity": "warning", "namespace": NS, "job": "share", "topic": "orders"},
        "exp_annotations": {
            "summary": f"{NS}/share (share group): lag of topic orders keeps growing",
            "description": rule["annotations"]["description"],
            "runbook_url": rule["annotations"]["runbook_url"],
        },
    }


def cases(r: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One promtool test group per alert: series for a firing pod `bad` and a silent pod `good`."""
    failing = r["DlqSidecarDlqWriteFailing"]
    ratio = r["DlqSidecarDeadLetterRatioHigh"]
    rate = r["DlqSidecarDeadLetterRateHigh"]
    breaker = r["DlqSidecarCircuitBreakerOpen"]
    stalled = r["DlqSidecarCommitsStalled"]
    app = r["DlqSidecarAppUnreachable"]
    lag = r["DlqSidecarLagGrowing"]
    iso = r["DlqSidecarIsolationPassLong"]
    ready = r["DlqSidecarNotReady"]
    archived = r["DlqSidecarBrokerArchivedWithoutDlq"]
    dlq = "dlq_sidecar_dead_lettered_total"
    why = {"reason": "rejected", "exception_class": "app.Poison"}
    return [
        {
            "name": "DlqSidecarDlqWriteFailing",
            "input_series": [
                *topics("bad", "orders", "payments"),
                *topics("good", "orders"),
                *topics("unwritable", "orders"),
                series("dlq_sidecar_dlq_failed_total", "bad", "0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1"),
                series("dlq_sidecar_dlq_failed_total", "good", "0x60"),
                series("dlq_sidecar_dlq_failed_total", "unwritable", "0x60"),
                series("dlq_sidecar_readiness_check", "bad", "1x60", check="dlq_writable"),
                series("dlq_sidecar_readiness_check", "good", "1x60", check="dlq_writable"),
                series("dlq_sidecar_readiness_check", "good", "0x60", check="assigned"),
                series(
                    "dlq_sidecar_readiness_check", "unwritable", "1 1 1 0x57", check="dlq_writable"
                ),
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": failing["alert"], "exp_alerts": []},
                {"eval_time": "4m", "alertname": failing["alert"], "exp_alerts": []},  # `for:`
                {
                    "eval_time": "6m",
                    "alertname": failing["alert"],
                    "exp_alerts": [
                        expect(failing, p, t, f"DLQ writes are failing (source topic {t})")
                        for p, t in (
                            ("bad", "orders"),
                            ("bad", "payments"),
                            ("unwritable", "orders"),
                        )
                    ],
                },
                # Ten minutes after the one failure (and the pod still writable): over.
                {
                    "eval_time": "14m",
                    "alertname": failing["alert"],
                    "exp_alerts": [
                        expect(
                            failing,
                            "unwritable",
                            "orders",
                            "DLQ writes are failing (source topic orders)",
                        )
                    ],
                },
            ],
        },
        {
            "name": "DlqSidecarDeadLetterRate and Ratio",
            "input_series": [
                # bad: 2 DLQ records/s of 10 answers/s (20%); good: 0.5/s of 100/s (0.5%).
                series(dlq, "bad", "0+120x40", topic="orders", **why),
                series(
                    "dlq_sidecar_records_delivered_total",
                    "bad",
                    "0+600x40",
                    topic="orders",
                    outcome="accept",
                ),
                series(dlq, "good", "0+30x40", topic="orders", **why),
                series(
                    "dlq_sidecar_records_delivered_total",
                    "good",
                    "0+6000x40",
                    topic="orders",
                    outcome="accept",
                ),
            ],
            "alert_rule_test": [
                {
                    "eval_time": "8m",
                    "alertname": rate["alert"],
                    "exp_alerts": [],
                },  # `for:` not over
                {
                    "eval_time": "25m",
                    "alertname": rate["alert"],
                    "exp_alerts": [
                        expect(rate, "bad", "orders", "2 DLQ records/s from topic orders")
                    ],
                },
                {
                    "eval_time": "25m",
                    "alertname": ratio["alert"],
                    "exp_alerts": [
                        expect(
                            ratio,
                            "bad",
                            "orders",
                            "20% of the records of topic orders go to the DLQ",
                        )
                    ],
                },
            ],
        },
        {
            "name": "DlqSidecarCircuitBreakerOpen",
            "input_series": [
                *topics("bad", "orders"),
                *topics("good", "orders"),
                *topics("disabled", "orders"),  # no breaker: no state series at all
                # open, half-open (a probe), open again: still not closed throughout.
                series("dlq_sidecar_circuit_breaker_state", "bad", "1 1 0x30", state="closed"),
                series(
                    "dlq_sidecar_circuit_breaker_state", "bad", "0 0 1 1 1 0 0 1x30", state="open"
                ),
                series(
                    "dlq_sidecar_circuit_breaker_state",
                    "bad",
                    "0 0 0 0 0 1 1 0x30",
                    state="half_open",
                ),
                series("dlq_sidecar_circuit_breaker_state", "good", "1x30", state="closed"),
                series("dlq_sidecar_circuit_breaker_state", "good", "0x30", state="open"),
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": breaker["alert"], "exp_alerts": []},
                {
                    "eval_time": "10m",
                    "alertname": breaker["alert"],
                    "exp_alerts": [
                        expect(
                            breaker,
                            "bad",
                            "orders",
                            "the DLQ circuit breaker is not closed (source topic orders)",
                        )
                    ],
                },
            ],
        },
        {
            "name": "DlqSidecarCommitsStalled",
            "input_series": [
                *topics("bad", "orders"),
                *topics("good", "orders"),
                series("dlq_sidecar_commits_failing_seconds", "bad", "0 0 60 120 180 240"),
                series("dlq_sidecar_commits_failing_seconds", "good", "0 30 60 90 0 0"),
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": stalled["alert"], "exp_alerts": []},
                {
                    "eval_time": "5m",
                    "alertname": stalled["alert"],
                    "exp_alerts": [
                        expect(
                            stalled,
                            "bad",
                            "orders",
                            "every offset commit has failed for 4m 0s (source topic orders)",
                        )
                    ],
                },
            ],
        },
        {
            "name": "DlqSidecarAppUnreachable",
            "input_series": [
                *topics("bad", "orders"),
                *topics("blip", "orders"),
                series("dlq_sidecar_app_reachable", "bad", "1 0x20"),
                series("dlq_sidecar_app_reachable", "blip", "1 0 1x20"),  # one scrape down
            ],
            "alert_rule_test": [
                {
                    "eval_time": "5m",
                    "alertname": app["alert"],
                    "exp_alerts": [
                        expect(
                            app,
                            "bad",
                            "orders",
                            "the app does not accept connections (source topic orders)",
                        )
                    ],
                }
            ],
        },
        {
            "name": "DlqSidecarLagGrowing",
            "input_series": [
                series(
                    "dlq_sidecar_commit_lag_records",
                    "bad",
                    "0+200x60",
                    topic="orders",
                    partition="0",
                ),
                series(
                    "dlq_sidecar_commit_lag_records",
                    "bad",
                    "0+10x60",
                    topic="orders",
                    partition="1",
                ),
                series(
                    "dlq_sidecar_commit_lag_records",
                    "steady",
                    "5000x60",
                    topic="orders",
                    partition="0",
                ),
                series(
                    "dlq_sidecar_commit_lag_records",
                    "small",
                    "0+10x60",
                    topic="orders",
                    partition="0",
                ),
                # A share group of two pods: the group's lag is the smaller estimate (growing), not
                # the larger one of the pod that lost the partition; another group's small lag is quiet.
                *[
                    series(
                        "dlq_sidecar_share_lag_records",
                        pod,
                        values,
                        topic="orders",
                        partition="0",
                        job=job,
                    )
                    for pod, job, values in (
                        ("share-a", "share", "0+500x60"),
                        ("share-b", "share", "0+900x60"),
                        ("quiet-a", "quiet", "0+10x60"),
                        ("quiet-b", "quiet", "0+5000x60"),
                    )
                ],
            ],
            "alert_rule_test": [
                {"eval_time": "12m", "alertname": lag["alert"], "exp_alerts": []},
                {
                    "eval_time": "40m",
                    "alertname": lag["alert"],
                    "exp_alerts": [
                        expect(lag, "bad", "orders", "lag of topic orders keeps growing"),
                        share_group_alert(lag),
                    ],
                },
            ],
        },
        {
            "name": "DlqSidecarIsolationPassLong",
            "input_series": [
                *topics("bad", "orders"),
                *topics("good", "orders"),
                series("dlq_sidecar_isolation_active", "bad", "1x40"),
                series("dlq_sidecar_isolation_active", "good", "1x5 0x35"),
            ],
            "alert_rule_test": [
                {
                    "eval_time": "20m",
                    "alertname": iso["alert"],
                    "exp_alerts": [
                        expect(
                            iso,
                            "bad",
                            "orders",
                            "an isolation pass has run long (source topic orders)",
                        )
                    ],
                }
            ],
        },
        {
            "name": "DlqSidecarNotReady",
            "input_series": [
                *topics("bad", "orders"),
                *topics("good", "orders"),
                series("dlq_sidecar_ready", "bad", "1 0x40"),
                series("dlq_sidecar_ready", "good", "1 0x5 1x35"),
            ],
            "alert_rule_test": [
                {"eval_time": "6m", "alertname": ready["alert"], "exp_alerts": []},
                {
                    "eval_time": "20m",
                    "alertname": ready["alert"],
                    "exp_alerts": [
                        expect(
                            ready, "bad", "orders", "the sidecar is not ready (source topic orders)"
                        )
                    ],
                },
            ],
        },
        {
            "name": "DlqSidecarBrokerArchivedWithoutDlq",
            "input_series": [
                series(
                    "dlq_sidecar_broker_archived_without_dlq_total",
                    "bad",
                    "0 0 3x40",
                    topic="orders",
                ),
                series(
                    "dlq_sidecar_broker_archived_without_dlq_total", "good", "0x40", topic="orders"
                ),
            ],
            "alert_rule_test": [
                {
                    "eval_time": "5m",
                    "alertname": archived["alert"],
                    "exp_alerts": [
                        expect(
                            archived,
                            "bad",
                            "orders",
                            "the broker archived records of topic orders with no DLQ record",
                        )
                    ],
                },
                {"eval_time": "30m", "alertname": archived["alert"], "exp_alerts": []},
            ],
        },
    ]


def test_each_alert_fires_for_its_condition_and_stays_silent_otherwise(
    promtool: str, tmp_path: Path
) -> None:
    r = rules()
    groups = cases(r)
    tested = {t["alertname"] for g in groups for t in g["alert_rule_test"]}
    assert tested == set(r), "every alert has a test"
    for alert in r:
        checks = [t for g in groups for t in g["alert_rule_test"] if t["alertname"] == alert]
        assert any(t["exp_alerts"] for t in checks), f"{alert} never fires"
        fired = {a["exp_labels"].get("pod") for t in checks for a in t["exp_alerts"]}
        assert "good" not in fired, alert
    shutil.copy(RULES, tmp_path / "rules.yaml")
    spec = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", **{k: v for k, v in g.items() if k != "name"}} for g in groups
        ],
    }
    path = tmp_path / "rules_test.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = run_promtool(promtool, "test", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_wrong_expectation_fails_promtool(promtool: str, tmp_path: Path) -> None:
    """The rule tests can fail: the silent pod expected to alert is a failure."""
    r = rules()
    [group] = [g for g in cases(r) if g["name"] == "DlqSidecarNotReady"]
    check = group["alert_rule_test"][-1]
    check["exp_alerts"].append(
        expect(
            r["DlqSidecarNotReady"],
            "good",
            "orders",
            "the sidecar is not ready (source topic orders)",
        )
    )
    shutil.copy(RULES, tmp_path / "rules.yaml")
    spec = {
        "rule_files": ["rules.yaml"],
        "tests": [{"interval": "1m", **{k: v for k, v in group.items() if k != "name"}}],
    }
    path = tmp_path / "rules_test.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = run_promtool(promtool, "test", "rules", str(path))
    assert proc.returncode != 0
    assert "good" in proc.stdout + proc.stderr
