"""The alert rules replayed through `promtool test rules` with the files of tests/promtool.

The chart's rules are rendered by the real helm with the default scope (`release`: release `rel`,
namespace `team-a`) and with `scope: all`; each rendering is written, without annotations, as
rules.yaml (and with them as rules-annotated.yaml) beside a copy of every file of tests/promtool, and
the real promtool (3.16.0) tests each file. Before it runs, every `eval_time` of a test group gets an
empty expectation for each alert the group does not list at that time, so a scenario gives the page
it should and no other. Files named `*.release.yaml` run against the release scope only.

Also checked: each alert has a test in which it fires, one in which it stays silent, and is silent
in the zero-traffic group; a wrong expectation fails promtool; and the summaries of a few alerts,
rendered by promtool with the annotations (the files' rules have none).

Imports: the standard library, PyYAML, pytest and the chart tests' helpers.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_alert_rules import run_promtool
from tests.integration.test_helm import ROOT, ci_file, only, render

FILES = ROOT / "tests" / "promtool"
RUNBOOK_URL = "https://runbooks.example.com/dlq-sidecar/runbook.md"
SCOPES = ("release", "all")


def rendered(helm: str, scope: str) -> dict[str, Any]:
    rule = only(
        render(
            helm,
            ci_file("minimal"),
            sets=(
                "serviceMonitor.enabled=true",
                "prometheusRule.enabled=true",
                f"prometheusRule.scope={scope}",
                f"prometheusRule.runbookUrl={RUNBOOK_URL}",
            ),
        ),
        "PrometheusRule",
    )
    spec: dict[str, Any] = rule["spec"]
    return spec


def alert_names(spec: dict[str, Any]) -> list[str]:
    return [r["alert"] for g in spec["groups"] for r in g["rules"] if "alert" in r]


def without_annotations(spec: dict[str, Any]) -> dict[str, Any]:
    bare = copy.deepcopy(spec)
    for group in bare["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return bare


def rule_files() -> list[Path]:
    return sorted(p for p in FILES.glob("*.yaml"))


def completed(doc: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """`doc` with every alert not listed at an eval_time of a group expected silent then."""
    out = copy.deepcopy(doc)
    for group in out["tests"]:
        checks = group.setdefault("alert_rule_test", [])
        listed: dict[str, set[str]] = {}
        for check in checks:
            listed.setdefault(str(check["eval_time"]), set()).add(check["alertname"])
        for when, have in listed.items():
            checks.extend(
                {"eval_time": when, "alertname": name, "exp_alerts": []}
                for name in names
                if name not in have
            )
    return out


def run_file(promtool: str, spec: dict[str, Any], path: Path, where: Path) -> str:
    """promtool's output for one test file against `spec`; fails the test when promtool does."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "rules.yaml").write_text(yaml.safe_dump(without_annotations(spec), sort_keys=False))
    (where / "rules-annotated.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    doc = completed(yaml.safe_load(path.read_text()), alert_names(spec))
    target = where / path.name
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = run_promtool(promtool, "test", "rules", str(target))
    assert proc.returncode == 0, f"{path.name} ({where.name}):\n{proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("scope", SCOPES)
def test_each_file_gives_the_pages_it_should_and_no_other(
    helm: str, promtool: str, tmp_path: Path, scope: str
) -> None:
    spec = rendered(helm, scope)
    files = [p for p in rule_files() if scope == "release" or not p.name.endswith(".release.yaml")]
    assert len(files) >= 2
    for path in files:
        run_file(promtool, spec, path, tmp_path / scope)


def test_every_alert_fires_somewhere_and_is_silent_with_zero_traffic(helm: str) -> None:
    names = alert_names(rendered(helm, "release"))
    assert len(names) >= 14
    fires: set[str] = set()
    silent: set[str] = set()
    zero: set[str] = set()
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["tests"]:
            for check in group.get("alert_rule_test", []):
                (fires if check["exp_alerts"] else silent).add(check["alertname"])
                if group["name"] == "zero traffic" and not check["exp_alerts"]:
                    zero.add(check["alertname"])
    assert set(names) <= fires, f"never seen firing: {sorted(set(names) - fires)}"
    assert set(names) <= silent, f"never expected silent: {sorted(set(names) - silent)}"
    assert set(names) <= zero, f"not in the zero-traffic group: {sorted(set(names) - zero)}"


def test_an_alert_the_file_does_not_expect_fails_it(
    helm: str, promtool: str, tmp_path: Path
) -> None:
    """The added "no other page" checks bite: the crash loop expected to page nothing is a failure."""
    spec = rendered(helm, "release")
    doc = yaml.safe_load((FILES / "scenarios.yaml").read_text())
    [group] = [g for g in doc["tests"] if g["name"] == "crash loop"]
    group["alert_rule_test"] = [
        c for c in group["alert_rule_test"] if c["alertname"] != "DlqSidecarDlqWriteFailing"
    ]
    doc["tests"] = [group]
    broken = tmp_path / "src" / "broken.yaml"
    broken.parent.mkdir()
    broken.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(AssertionError, match="DlqSidecarDlqWriteFailing"):
        run_file(promtool, spec, broken, tmp_path / "run")


def _series(metric: str, pod: str, values: str, **labels: str) -> dict[str, str]:
    base = {"namespace": "team-a", "service": "rel-dlq-sidecar", "job": "rel-dlq-sidecar"}
    if pod:
        base["pod"] = f"rel-dlq-sidecar-x-{pod}"
    text = ",".join(f'{k}="{v}"' for k, v in {**base, **labels}.items())
    return {"series": f"{metric}{{{text}}}", "values": values}


def test_summaries_render_with_the_alerts_labels_and_values(
    helm: str, promtool: str, tmp_path: Path
) -> None:
    """The annotation templates, rendered by promtool for a few alerts ($labels, $value, humanize)."""
    spec = rendered(helm, "release")
    by_name = {r["alert"]: r for g in spec["groups"] for r in g["rules"]}

    def expect(name: str, summary: str, **labels: str) -> dict[str, Any]:
        rule = by_name[name]
        return {
            "exp_labels": {"severity": rule["labels"]["severity"], "namespace": "team-a", **labels},
            "exp_annotations": {
                "summary": summary,
                "description": rule["annotations"]["description"],
                "runbook_url": f"{RUNBOOK_URL}#{name.lower()}",
            },
        }

    pod = {"pod": "rel-dlq-sidecar-x-bad", "topic": "orders"}
    info = {"topic": "orders", "engine": "consumer", "group": "orders-app"}
    group = {
        "interval": "1m",
        "input_series": [
            _series("up", "bad", "1x10"),
            _series("dlq_sidecar_source_topic_info", "bad", "1x10", **info),
            _series("dlq_sidecar_commits_failing_seconds", "bad", "0 60 120 180 240"),
            _series(
                "dlq_sidecar_broker_archived_without_dlq_total", "bad", "0 3x9", topic="orders"
            ),
            _series(
                "dlq_sidecar_share_lag_records", "sa", "0+500x40", topic="orders", partition="0"
            ),
        ],
        "alert_rule_test": [
            {
                "eval_time": "4m",
                "alertname": "DlqSidecarCommitsStalled",
                "exp_alerts": [
                    expect(
                        "DlqSidecarCommitsStalled",
                        "team-a/rel-dlq-sidecar-x-bad: every offset commit has failed for 4m 0s"
                        " (source topic orders)",
                        **pod,
                    )
                ],
            },
            {
                "eval_time": "4m",
                "alertname": "DlqSidecarBrokerArchivedWithoutDlq",
                "exp_alerts": [
                    expect(
                        "DlqSidecarBrokerArchivedWithoutDlq",
                        "team-a/rel-dlq-sidecar-x-bad: the broker archived 3 records of topic"
                        " orders with no DLQ record",
                        **pod,
                    )
                ],
            },
            {
                "eval_time": "30m",
                "alertname": "DlqSidecarLagGrowing",
                "exp_alerts": [
                    expect(
                        "DlqSidecarLagGrowing",
                        "team-a/rel-dlq-sidecar (share group): lag of topic orders keeps growing",
                        job="rel-dlq-sidecar",
                        topic="orders",
                    )
                ],
            },
            {
                "eval_time": "30m",
                "alertname": "DlqSidecarAbsent",
                "exp_alerts": [
                    expect(
                        "DlqSidecarAbsent",
                        "team-a/rel-dlq-sidecar: Prometheus scrapes no dlq-sidecar of this release",
                        service="rel-dlq-sidecar",
                    )
                ],
            },
        ],
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    path = tmp_path / "summaries.yaml"
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [group]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = run_promtool(promtool, "test", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
