"""The chart's operating objects: PrometheusRule, ServiceMonitor, Grafana dashboard, KEDA ScaledObject.

The custom resources rendered from every `ci/*-values.yaml` variant validate against the
`openAPIV3Schema` of the CRDs of the releases named in CRD_RELEASES (vendored in tests/integration/crds
from their Go modules), with unknown fields refused as the API server's strict field validation does.
Then what the values promise: all three off by default, thresholds and scope from values, the plain
rule file equal to the chart's rules, the dashboard ConfigMap, the ScaledObject's query per engine and
its replica ceiling, and the schema refusing the HPA and the ScaledObject together. (`helm lint
--strict` and the Kubernetes schema checks of test_helm.py run over the new variants too.)

Imports: the standard library, PyYAML, jsonschema (kubernetes-validate's dependency), pytest and the
chart test's helpers.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.integration.test_helm import (
    CHART,
    CI_IDS,
    CI_VALUES,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    ROOT,
    Manifest,
    ci_file,
    k8s_validator,
    only,
    render,
    render_error,
    run_helm,
)

CRDS = Path(__file__).resolve().parent / "crds"
CRD_RELEASES = {
    "monitoring.coreos.com": "prometheus-operator v0.85.0",
    "keda.sh": "KEDA v2.21.0",
}
RULES = ROOT / "deploy" / "prometheus" / "dlq-sidecar-rules.yaml"
FULLNAME = f"{RELEASE}-dlq-sidecar"
SCOPE = f'namespace="{NAMESPACE}",service="{FULLNAME}"'


def _strict(node: Any) -> Any:
    """The schema with unknown fields refused wherever the CRD does not keep them on purpose."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def crd_schemas() -> dict[tuple[str, str], Any]:
    """(apiVersion, kind) -> the strict JSON schema of that version, from the vendored CRDs."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group = crd["spec"]["group"]
        assert group in CRD_RELEASES, path
        for version in crd["spec"]["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            # metadata is the API server's ObjectMeta, not described by CRDs.
            schema["properties"]["metadata"] = {"type": "object"}
            out[(f"{group}/{version['name']}", crd["spec"]["names"]["kind"])] = schema
    return out


SCHEMAS = crd_schemas()


def validate(manifest: Manifest) -> None:
    schema = SCHEMAS[(manifest["apiVersion"], manifest["kind"])]
    jsonschema.Draft7Validator(schema).validate(manifest)


def test_crds_are_the_named_releases() -> None:
    assert set(SCHEMAS) == {
        ("monitoring.coreos.com/v1", "PrometheusRule"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("keda.sh/v1alpha1", "ScaledObject"),
    }
    for path in CRDS.glob("monitoring.coreos.com_*.yaml"):
        annotations = yaml.safe_load(path.read_text())["metadata"]["annotations"]
        assert annotations["operator.prometheus.io/version"] == "0.85.0"


@pytest.mark.parametrize("variant", CI_VALUES, ids=CI_IDS)
def test_custom_resources_validate_against_their_crds(helm: str, variant: Path) -> None:
    kinds = set()
    for manifest in render(helm, variant):
        if manifest["apiVersion"].split("/")[0] in CRD_RELEASES:
            try:
                validate(manifest)
            except jsonschema.ValidationError as exc:
                where = ".".join(str(p) for p in exc.absolute_path)
                pytest.fail(
                    f"{manifest['kind']} invalid for {CRD_RELEASES}: {where}: {exc.message}"
                )
            kinds.add(manifest["kind"])
    if variant.name == "monitoring-values.yaml":
        assert kinds == {"PrometheusRule", "ServiceMonitor", "ScaledObject"}


def test_crd_validation_refuses_an_unknown_field(helm: str) -> None:
    """The validation is strict: a misspelt field of the ScaledObject or a rule is an error."""
    manifests = render(helm, ci_file("monitoring"))
    scaled = copy.deepcopy(only(manifests, "ScaledObject"))
    scaled["spec"]["maxReplicas"] = 3
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)
    rule = copy.deepcopy(only(manifests, "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["expression"] = "up"
    with pytest.raises(jsonschema.ValidationError):
        validate(rule)


def test_operating_objects_are_off_by_default(helm: str) -> None:
    kinds = {m["kind"] for m in render(helm, ci_file("minimal"))}
    assert not kinds & {
        "PrometheusRule",
        "ScaledObject",
        "ServiceMonitor",
        "HorizontalPodAutoscaler",
    }
    config_maps = [m for m in render(helm, ci_file("minimal")) if m["kind"] == "ConfigMap"]
    assert [m["metadata"]["name"] for m in config_maps] == [f"{FULLNAME}-sidecar"]  # no dashboard


# --- alert rules -----------------------------------------------------------------------------------


def alerts(rule: Manifest) -> dict[str, Any]:
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_prometheus_rule_takes_thresholds_labels_and_runbook_from_values(helm: str) -> None:
    rule = only(render(helm, ci_file("monitoring")), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    found = alerts(rule)
    assert "> 0.02)" in found["DlqSidecarDeadLetterRatioHigh"]["expr"]  # the variant's value
    assert found["DlqSidecarDeadLetterRatioHigh"]["expr"].endswith(">= 100")  # minimum volume
    assert found["DlqSidecarDeadLetterRateHigh"]["expr"].endswith("> 1")  # the default
    assert "> 120" in found["DlqSidecarCommitsStalled"]["expr"]
    for name, r in found.items():
        assert r["annotations"]["runbook_url"] == (
            f"https://runbooks.example.com/dlq-sidecar/runbook.md#{name.lower()}"
        )
        # scope: release -- every selector is this release's pods.
        assert SCOPE in r["expr"], name
    sets = (
        "prometheusRule.thresholds.lagMinRecords=50",
        "prometheusRule.thresholds.lagGrowingFor=45m",
        "prometheusRule.thresholds.commitsFailingSeconds=30",
    )
    changed = alerts(only(render(helm, ci_file("monitoring"), sets=sets), "PrometheusRule"))
    assert changed["DlqSidecarLagGrowing"]["expr"].count("> 50)") == 2  # both engines
    assert changed["DlqSidecarLagGrowing"]["for"] == "45m"
    assert "> 30" in changed["DlqSidecarCommitsStalled"]["expr"]


def test_runbook_url_is_absolute_unless_the_user_says_so(helm: str) -> None:
    error = render_error(helm, ci_file("monitoring"), sets=("prometheusRule.runbookUrl=",))
    assert "prometheusRule.runbookUrl is required" in error, error
    relative = ("prometheusRule.runbookUrl=docs/runbook.md",)
    error = render_error(helm, ci_file("monitoring"), sets=relative)
    assert "not an absolute http(s) URL" in error and "allowRelativeRunbookUrl" in error, error
    allowed = (*relative, "prometheusRule.allowRelativeRunbookUrl=true")
    rule = only(render(helm, ci_file("monitoring"), sets=allowed), "PrometheusRule")
    url = alerts(rule)["DlqSidecarDown"]["annotations"]["runbook_url"]
    assert url == "docs/runbook.md#dlqsidecardown"


def test_release_scope_needs_the_service_monitor(helm: str) -> None:
    """The release scope selects the ServiceMonitor's labels: without it nothing would match."""
    error = render_error(helm, ci_file("monitoring"), sets=("serviceMonitor.enabled=false",))
    assert "prometheusRule.scope release" in error and "serviceMonitor.enabled" in error, error
    scope_all = ("serviceMonitor.enabled=false", "prometheusRule.scope=all", "keda.enabled=false")
    assert only(render(helm, ci_file("monitoring"), sets=scope_all), "PrometheusRule")


def test_thresholds_that_cannot_work_with_the_sidecars_timeouts_are_refused(helm: str) -> None:
    """CommitsStalled must fire before the liveness restart resets its gauge; the fatal-exit window
    must bridge two exits of a crash loop; the restart window must hold the restart count."""
    stall = ("sidecar.config.commit\\.stall\\.timeout\\.ms=100000",)
    error = render_error(helm, ci_file("monitoring"), sets=stall)
    assert (
        "commitsFailingSeconds (120 s)" in error and "commit.stall.timeout.ms (100000 ms)" in error
    )
    assert "never fire" in error
    # 120 s + a 30 s scrape fit in 151 s; a shorter scrape fits in 125 s; a disabled stall check too.
    for sets in (
        ("sidecar.config.commit\\.stall\\.timeout\\.ms=151000",),
        (
            "sidecar.config.commit\\.stall\\.timeout\\.ms=125000",
            "serviceMonitor.interval=4s",
        ),
        ("sidecar.config.commit\\.stall\\.timeout\\.ms=0",),
    ):
        assert only(render(helm, ci_file("monitoring"), sets=sets), "PrometheusRule")
    error = render_error(
        helm, ci_file("monitoring"), sets=("prometheusRule.thresholds.fatalExitWindow=6m",)
    )
    assert "fatalExitWindow (6m)" in error and "crash-looping" in error, error
    error = render_error(
        helm, ci_file("monitoring"), sets=("prometheusRule.thresholds.restartsWindow=10m",)
    )
    assert "restartsWindow (10m)" in error, error


def test_bad_thresholds_are_refused(helm: str) -> None:
    for setting in (
        "prometheusRule.thresholds.deadLetterRatio=2",
        "prometheusRule.thresholds.lagGrowingFor=soon",
        "prometheusRule.scope=cluster",
        "prometheusRule.thresholds.lagMinimum=3",
    ):
        assert "prometheusRule" in render_error(helm, ci_file("monitoring"), sets=(setting,)), (
            setting
        )


def test_plain_rule_file_is_the_charts_rules_for_all_pods(helm: str) -> None:
    """deploy/prometheus/dlq-sidecar-rules.yaml is scripts/render-alert-rules' output, up to date."""
    rule = only(
        render(
            helm,
            ci_file("minimal"),
            sets=(
                "prometheusRule.enabled=true",
                "prometheusRule.scope=all",
                "prometheusRule.runbookUrl=docs/runbook.md",
                "prometheusRule.allowRelativeRunbookUrl=true",
            ),
        ),
        "PrometheusRule",
    )
    assert yaml.safe_load(RULES.read_text()) == rule["spec"]
    assert "namespace=" not in RULES.read_text()  # scope: all


# --- the dashboard ---------------------------------------------------------------------------------


DASHBOARD_ON = (
    "grafanaDashboard.enabled=true",
    "grafanaDashboard.annotations.grafana_folder=Kafka",
)


def test_dashboard_config_map_lints_and_validates(helm: str) -> None:
    args = ["lint", "--strict", str(CHART), "-f", str(ci_file("monitoring"))]
    for s in DASHBOARD_ON:
        args += ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0 and "[WARNING]" not in proc.stdout, proc.stdout + proc.stderr
    kubernetes_validate = k8s_validator()
    for kube in KUBE_VERSIONS:
        for m in render(helm, ci_file("monitoring"), sets=DASHBOARD_ON, kube=kube):
            if m["kind"] == "ConfigMap":
                kubernetes_validate.validate(m, kube, strict=True)


def test_dashboard_config_map_for_grafanas_sidecar(helm: str) -> None:
    manifests = render(helm, ci_file("monitoring"), sets=DASHBOARD_ON)
    [cm] = [m for m in manifests if m["metadata"]["name"] == f"{FULLNAME}-dashboard"]
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Kafka"}
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert json.loads(cm["data"]["dlq-sidecar.json"]) == json.loads(
        (CHART / "dashboards" / "dlq-sidecar.json").read_text()
    )
    elsewhere = render(
        helm, ci_file("monitoring"), sets=(*DASHBOARD_ON, "grafanaDashboard.namespace=monitoring")
    )
    [cm] = [m for m in elsewhere if m["metadata"]["name"] == f"{FULLNAME}-dashboard"]
    assert cm["metadata"]["namespace"] == "monitoring"


def test_dashboard_file_is_the_generators_output() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render-dashboard"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, "run scripts/render-dashboard: the JSON is stale"


def test_dashboard_rows_and_variables() -> None:
    dashboard = json.loads((CHART / "dashboards" / "dlq-sidecar.json").read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == [
        "Health",
        "Records",
        "Dead letters",
        "The app",
        "In flight and buffered",
        "Lag and commits",
        "Circuit breaker and isolation",
        "Local API",
    ]
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert variables == ["datasource", "cluster", "job", "namespace", "pod", "topic"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert 'namespace=~"$namespace"' in target["expr"], panel["title"]
            assert 'cluster=~"$cluster",job=~"$job"' in target["expr"], panel["title"]
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


# --- autoscaling -----------------------------------------------------------------------------------


def trigger(scaled: Manifest, kind: str = "prometheus") -> dict[str, Any]:
    [t] = scaled["spec"]["triggers"]
    assert t["type"] == kind
    result: dict[str, Any] = t["metadata"]
    return result


def test_scaled_object_scales_the_consumer_group_on_the_brokers_lag(helm: str) -> None:
    """engine: consumer: KEDA's Kafka scaler reads the group's committed-offset lag from the brokers
    (no Prometheus needed, so minReplicaCount 0 works); a fallback holds the replicas when blind."""
    manifests = render(helm, ci_file("monitoring"))
    scaled = only(manifests, "ScaledObject")
    deployment = only(manifests, "Deployment")
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert "replicas" not in deployment["spec"]  # KEDA owns the replica count
    assert scaled["spec"]["maxReplicaCount"] == 12  # the partition count
    assert scaled["spec"]["minReplicaCount"] == 1
    assert scaled["spec"]["fallback"] == {
        "failureThreshold": 3,
        "replicas": 1,
        "behavior": "currentReplicasIfHigher",
    }
    meta = trigger(scaled, "kafka")
    assert meta == {
        "bootstrapServers": "kafka:9092",
        "consumerGroup": "orders-app",
        "topic": "orders",
        "lagThreshold": "1000",
        "activationLagThreshold": "0",
        "offsetResetPolicy": "earliest",
        "allowIdleConsumers": "false",
    }
    to_zero = only(
        render(helm, ci_file("monitoring"), sets=("keda.minReplicaCount=0",)), "ScaledObject"
    )
    assert to_zero["spec"]["minReplicaCount"] == 0
    assert to_zero["spec"]["fallback"]["replicas"] == 1
    override = render(helm, ci_file("monitoring"), sets=("keda.maxReplicaCount=4",))
    assert only(override, "ScaledObject")["spec"]["maxReplicaCount"] == 4
    secured = ("sidecar.kafka.sasl.enabled=true", "sidecar.kafka.sasl.existingSecret=kafka-user")
    error = render_error(helm, ci_file("monitoring"), sets=secured)
    assert "keda.authenticationRef" in error, error
    auth = render(helm, ci_file("monitoring"), sets=(*secured, "keda.authenticationRef=kafka-auth"))
    assert only(auth, "ScaledObject")["spec"]["triggers"][0]["authenticationRef"] == {
        "name": "kafka-auth"
    }


def test_scaled_object_on_the_consumer_engines_committed_lag_metric(helm: str) -> None:
    scaled = only(
        render(helm, ci_file("monitoring"), sets=("keda.scaler=prometheus",)), "ScaledObject"
    )
    meta = trigger(scaled)
    assert meta["query"] == (
        f"sum(max by (topic, partition) (dlq_sidecar_committed_lag_records{{{SCOPE}}}))"
    )
    assert meta["threshold"] == "1000"
    assert meta["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"


def test_scaled_object_on_the_share_groups_lag_estimate(helm: str) -> None:
    scaled = only(render(helm, ci_file("share-keda")), "ScaledObject")
    assert scaled["spec"]["maxReplicaCount"] == 24  # keda.shareMaxReplicaCount, not partitions
    meta = trigger(scaled)
    assert meta["query"] == (
        f"sum(min by (topic, partition) (dlq_sidecar_share_lag_records{{{SCOPE}}}))"
    )
    assert meta["threshold"] == "500"
    auth = render(helm, ci_file("share-keda"), sets=("keda.authenticationRef=prom-auth",))
    assert only(auth, "ScaledObject")["spec"]["triggers"][0]["authenticationRef"] == {
        "name": "prom-auth"
    }
    error = render_error(helm, ci_file("share-keda"), sets=("keda.scaler=kafka",))
    assert "engine: share use keda.scaler prometheus" in error, error


def test_scaled_object_refuses_what_cannot_scale(helm: str) -> None:
    error = render_error(helm, ci_file("monitoring"), sets=("keda.partitions=null",))
    assert "keda.partitions" in error
    error = render_error(helm, ci_file("share-keda"), sets=("keda.serverAddress=",))
    assert "keda.serverAddress" in error
    error = render_error(helm, ci_file("monitoring"), sets=("keda.minReplicaCount=20",))
    assert "below keda.minReplicaCount" in error
    error = render_error(helm, ci_file("monitoring"), sets=("keda.maxReplicaCount=13",))
    assert "keda.maxReplicaCount (13) is above keda.partitions (12)" in error, error
    # The Prometheus scaler: no pod, no metric, so never from 0; and never a query that matches nothing.
    error = render_error(helm, ci_file("share-keda"), sets=("keda.minReplicaCount=0",))
    assert "keda.minReplicaCount 0 needs keda.scaler kafka" in error, error
    explicit = ("keda.scaler=prometheus", "keda.minReplicaCount=0")
    error = render_error(helm, ci_file("monitoring"), sets=explicit)
    assert "/keda/minReplicaCount" in error, error  # the schema refuses it before the templates
    error = render_error(helm, ci_file("share-keda"), sets=("serviceMonitor.enabled=false",))
    assert "needs serviceMonitor.enabled" in error, error
    own = ("serviceMonitor.enabled=false", "keda.query=sum(my_lag)")
    assert (
        trigger(only(render(helm, ci_file("share-keda"), sets=own), "ScaledObject"))["query"]
        == "sum(my_lag)"
    )


def test_schema_refuses_the_hpa_and_the_scaled_object_together(helm: str) -> None:
    error = render_error(helm, ci_file("monitoring"), sets=("autoscaling.enabled=true",))
    assert "/keda/enabled" in error, error
    # Either alone renders.
    assert only(render(helm, ci_file("tcp")), "HorizontalPodAutoscaler")
    assert only(render(helm, ci_file("monitoring")), "ScaledObject")
