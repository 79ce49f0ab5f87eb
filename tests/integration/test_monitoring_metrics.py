"""The dashboard, the alert rules and the KEDA queries name only what a running sidecar exports.

Two sidecars run side by side against the real broker, one per engine, each with the DLQ circuit
breaker and the exit record (`metrics.exit.record.path`) on: an app accepts a few records, then rejects everything with an exception class, so DLQ
records are written and the breaker trips; a request with a foreign Host header is refused by the
control API. Their `/metrics` is scraped and every metric name and label that the dashboard's queries,
variables and legends, the alert rules (expressions and annotation templates) and the rendered
ScaledObjects (with KEDA's Prometheus scaler) use must be among what they export (plus the target
labels Prometheus adds; kube-state-metrics' series the rules read are not the sidecar's).

Imports: the standard library, PyYAML, trio, pytest, the test harness and the chart test's helpers.
"""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path
from typing import Any

import trio
import yaml

from sidecar.http.server import Response
from tests.harness import (
    FAST,
    Delivery,
    RecordingApp,
    Rig,
    json_answer,
    running_sidecar,
    wait_until,
)
from tests.integration.test_helm import CHART, ROOT, ci_file, only, render
from tests.kafkatools import Broker, Rec

RULES = ROOT / "deploy" / "prometheus" / "dlq-sidecar-rules.yaml"
DASHBOARD = CHART / "dashboards" / "dlq-sidecar.json"
# Labels Prometheus adds to every series of a target (the ServiceMonitor's scrape; a plain
# Prometheus relabels the Kubernetes pod's namespace and name to the same two), and `cluster`, the
# external label a Prometheus of several clusters (or Thanos) adds.
TARGET_LABELS = {"namespace", "pod", "service", "job", "instance", "cluster"}
BREAKER = "errors.deadletterqueue.circuit.breaker."
GOOD = 12

Exported = dict[str, set[str]]  # sample name -> label names seen (declared families too, empty)


class TurningApp:
    """Accepts the first GOOD records, then rejects every one with an exception class."""

    def __init__(self) -> None:
        self.accepted = 0
        self.recording = RecordingApp(self.answer)

    def answer(self, _d: Delivery) -> Response:
        if self.accepted < GOOD:
            self.accepted += 1
            return Response(200)
        return json_answer({"ack": "reject", "error": {"class": "app.Poison", "message": "bad"}})


def exported(text: str) -> Exported:
    """Sample names and their label names from Prometheus text; families declared with no sample
    yet count by name (a counter's `_total`, a histogram's `_bucket`, `_sum`, `_count`)."""
    out: Exported = {}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            for suffix in suffixes.get(kind, ("",)):
                out.setdefault(name + suffix, set())
        elif line and not line.startswith("#"):
            m = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ", line)
            assert m, line
            labels = re.findall(r'(\w+)="', m.group(2) or "")
            out.setdefault(m.group(1), set()).update(labels)
    return out


_METRIC = re.compile(r"\bdlq_sidecar_\w+")
_MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


# kube-state-metrics' series (restarts, a Deployment's replicas): their labels are not the sidecar's.
_KSM = re.compile(r"\bkube_\w+\{[^}]*\}")


def names_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """The dlq_sidecar_ metrics an expression reads and the labels it matches or groups on."""
    expr = _KSM.sub("", expr)
    labels = set(_MATCHER.findall(expr))
    for group in _GROUPING.findall(expr):
        labels |= {part.strip() for part in group.split(",") if part.strip()}
    return set(_METRIC.findall(expr)), labels


def problems(expr: str, extra_labels: set[str], have: Exported) -> list[str]:
    """What `expr` (and the labels its legend or annotations use) names that `have` lacks."""
    metrics, labels = names_and_labels(expr)
    labels |= extra_labels
    out = [f"metric {m} is not exported" for m in sorted(metrics) if m not in have]
    known = set(TARGET_LABELS)
    for m in metrics:
        known |= have.get(m, set())
    out += [f"label {label} is on none of {sorted(metrics)}" for label in sorted(labels - known)]
    return [f"{p} (in {expr})" for p in out]


def uses() -> list[tuple[str, str, set[str]]]:
    """(where, expression, labels used beside it) of the dashboard, the rules and the ScaledObjects."""
    out: list[tuple[str, str, set[str]]] = []
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target["legendFormat"]))
            out.append((f"panel {panel['title']!r}", target["expr"], legend))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", var["query"]["query"])
            assert m, var
            out.append((f"variable {var['name']}", m.group(1), {m.group(2)}))
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            templated = " ".join(rule["annotations"].values())
            out.append(
                (
                    f"alert {rule['alert']}",
                    rule["expr"],
                    set(re.findall(r"\$labels\.(\w+)", templated)),
                )
            )
    return out


async def scrape(rig: Rig, app: TurningApp, lag_family: str) -> str:
    """Records accepted, then rejected until the breaker opens; a refused request; `/metrics` once
    it has samples of `lag_family` (the consumer reads its watermarks every second, the share
    engine's estimate every 10 s)."""
    await rig.produce([Rec(key=None, value=f"v{i}".encode()) for i in range(GOOD)])
    await wait_until(lambda: app.accepted >= GOOD, 120, "the good records accepted")
    await rig.produce([Rec(key=None, value=f"w{i}".encode()) for i in range(40)])
    await rig.sc.wait_status(
        lambda st: (
            (st["circuit_breaker"] or {}).get("state") == "open"
            and st["counters"]["dlq_written"] >= 1
        ),
        90,
        "the breaker open after a DLQ write",
    )
    host, _, port = rig.sc.api.rpartition(":")

    def foreign_host() -> int:
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("GET", "/v1/status", headers={"Host": "attacker.example"})
            return conn.getresponse().status
        finally:
            conn.close()

    assert await trio.to_thread.run_sync(foreign_host) == 403
    with trio.move_on_after(60):
        while True:
            code, text = await rig.sc.get("/metrics")
            assert code == 200
            assert isinstance(text, str)
            if f"{lag_family}{{" in text:
                return text
            await trio.sleep(0.2)
    raise AssertionError(f"no {lag_family} sample within 60 s:\n{text}")


async def test_dashboard_rules_and_scaler_use_only_exported_metrics_and_labels(
    broker: Broker, unique: str, tmp_path: Path, helm: str
) -> None:
    texts: dict[str, str] = {}

    async def one(engine: str) -> None:
        app = TurningApp()
        path = tmp_path / engine
        path.mkdir()
        extra: dict[str, Any] = {
            **FAST,
            "metrics": {"exit.record.path": str(path / "exit-record")},
            "engine": engine,
            BREAKER + "enable": True,
            BREAKER + "ratio": 0.5,
            BREAKER + "window.ms": 600_000,
            BREAKER + "min.records": 10,
            BREAKER + "cooldown.ms": 600_000,
        }
        if engine == "share":
            extra |= {"ordering": "none", "delivery.count.limit": 2}
        else:
            # Retry tiers configured (nothing is released long enough to use them): their
            # families are exported with a series per tier, as the dashboard reads them.
            extra |= {"errors.retry.tiers": ["2s", "4s"], "errors.retry.tier.threshold.ms": 1000}
        async with running_sidecar(
            broker, path, app.recording, unique=f"{unique}-{engine}", extra=extra
        ) as rig:
            lag = (
                "dlq_sidecar_committed_lag_records"
                if engine == "consumer"
                else "dlq_sidecar_share_lag_records"
            )
            texts[engine] = await scrape(rig, app, lag)

    async with trio.open_nursery() as nursery:
        for engine in ("consumer", "share"):
            nursery.start_soon(one, engine)

    have: Exported = {}
    for text in texts.values():
        for name, labels in exported(text).items():
            have.setdefault(name, set()).update(labels)
    # What the scenario made each sidecar export (so the check below is against real samples).
    consumer, share = exported(texts["consumer"]), exported(texts["share"])
    dead_lettered = {"topic", "reason", "exception_class", "dlq_topic"}
    assert dead_lettered <= consumer["dlq_sidecar_dead_lettered_total"]
    assert dead_lettered <= share["dlq_sidecar_dead_lettered_total"]
    assert {"topic"} <= share["dlq_sidecar_dlq_route_refused_total"]
    assert 'exception_class="app.Poison"' in texts["consumer"]
    assert 'dlq_sidecar_circuit_breaker_state{state="open"} 1.0' in texts["share"]
    assert {"topic", "partition"} <= consumer["dlq_sidecar_commit_lag_records"]
    assert {"topic", "partition"} <= consumer["dlq_sidecar_committed_lag_records"]
    assert {"reason"} <= consumer["dlq_sidecar_last_fatal_exit_timestamp_seconds"]
    assert "dlq_sidecar_restarts_total 0.0" in texts["share"]
    assert {"topic", "partition"} <= share["dlq_sidecar_share_lag_records"]
    assert {"listener", "reason"} <= consumer["dlq_sidecar_http_refused_total"]
    assert {"tier"} <= consumer["dlq_sidecar_tier_waiting"]
    assert {"tier"} <= consumer["dlq_sidecar_tier_written_total"]

    prometheus_scaler = ("keda.scaler=prometheus",)
    scaled = [
        only(render(helm, ci_file("monitoring"), sets=prometheus_scaler), "ScaledObject"),
        only(render(helm, ci_file("share-keda")), "ScaledObject"),
    ]
    found = uses() + [
        ("ScaledObject", so["spec"]["triggers"][0]["metadata"]["query"], set()) for so in scaled
    ]
    assert len(found) >= 40
    wrong = [f"{where}: {p}" for where, expr, extra in found for p in problems(expr, extra, have)]
    assert not wrong, "\n".join(wrong)


def test_the_check_catches_an_unknown_metric_or_label() -> None:
    have: Exported = {"dlq_sidecar_ready": set(), "dlq_sidecar_dead_lettered_total": {"topic"}}
    assert problems("sum by (pod) (dlq_sidecar_ready)", set(), have) == []
    assert problems("dlq_sidecar_readyy == 0", set(), have)
    assert problems('sum by (topic) (dlq_sidecar_ready{pod=~"x"})', set(), have)
    assert problems("rate(dlq_sidecar_dead_lettered_total[5m])", {"exception_class"}, have)
    assert not problems('rate(dlq_sidecar_dead_lettered_total{topic="a"}[5m])', {"pod"}, have)
