"""The injector's chart (deploy/helm/dlq-sidecar-injector) rendered, and the injected sidecar against the chart's.

Every `ci/*-values.yaml` is linted (`helm lint --strict`), rendered and validated against the strict
Kubernetes 1.29 and 1.37 schemas (cert-manager's kinds excepted: they are CRDs). Then the container
the injector adds is compared field by field with the one the dlq-sidecar chart renders from the same
values: the injector's config comes from this chart's ConfigMap, and the dlq-sidecar chart gets the
same `sidecar:` and `app:` values. They must be equal except for the three documented differences
(sidecar.injector.patch): the owned keys passed as `--overlay` (which must equal what the chart writes
into its own config.yaml), `XDG_STATE_HOME=/tmp`, and seccomp on the container instead of the pod.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest
import yaml

from sidecar.injector.patch import CONTAINER_NAME, decide
from sidecar.injector.settings import InjectorSettings, parse_settings
from tests.integration.test_helm import CHART as SIDECAR_CHART
from tests.integration.test_helm import k8s_validator, run_helm

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "dlq-sidecar-injector"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
CI_IDS = [p.name.removesuffix("-values.yaml") for p in CI_VALUES]
KUBE_VERSIONS = ("1.29.0", "1.37.0")
Manifest = dict[str, Any]


def render(
    helm: str, chart: Path, *files: Path, sets: tuple[str, ...] = (), kube: str = "1.29.0"
) -> list[Manifest]:
    args = ["template", "rel", str(chart), "--namespace", "platform", "--kube-version", kube]
    for f in files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def only(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def injector_settings(manifests: list[Manifest]) -> InjectorSettings:
    return parse_settings(yaml.safe_load(only(manifests, "ConfigMap")["data"]["config.yaml"]))


@pytest.fixture(params=CI_VALUES, ids=CI_IDS)
def variant(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


def test_lint_strict(helm: str, variant: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(variant))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "[WARNING]" not in output and "[ERROR]" not in output, output


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_manifests_validate_against_kubernetes_schemas(helm: str, variant: Path, kube: str) -> None:
    kubernetes_validate = k8s_validator()
    validated = set()
    for manifest in render(helm, CHART, variant, kube=kube):
        if manifest["apiVersion"].startswith("cert-manager.io/"):
            continue  # cert-manager's CRDs: not in the Kubernetes schemas
        try:
            kubernetes_validate.validate(manifest, kube, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{manifest['kind']} invalid for Kubernetes {kube}: {path}: {exc.message}")
        validated.add(manifest["kind"])
    assert {
        "Deployment",
        "Service",
        "ConfigMap",
        "MutatingWebhookConfiguration",
        "ServiceAccount",
    } <= validated


def test_the_values_schema_is_closed(helm: str) -> None:
    for key in ("replicas=3", "webhook.failurPolicy=Ignore", "inject.sidecar.imag.tag=x"):
        proc = run_helm(helm, "template", "rel", str(CHART), "--set", key)
        assert proc.returncode != 0 and "additional properties" in proc.stderr, key
    proc = run_helm(helm, "template", "rel", str(CHART), "--set", "webhook.failurePolicy=Sometimes")
    assert proc.returncode != 0


def test_every_rendered_injector_config_is_accepted(helm: str, variant: Path) -> None:
    settings = injector_settings(render(helm, CHART, variant))
    assert settings.tls_cert_file == "/etc/dlq-sidecar-injector/tls/tls.crt"


def test_the_webhook_and_its_workload(helm: str) -> None:
    manifests = render(helm, CHART)
    kinds = {m["kind"] for m in manifests}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}, (
        "no RBAC: it reads nothing"
    )
    [webhook] = only(manifests, "MutatingWebhookConfiguration")["webhooks"]
    assert webhook["failurePolicy"] == "Fail" and webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["sideEffects"] == "None" and webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    selector = webhook["namespaceSelector"]
    assert selector["matchLabels"] == {"dlq-sidecar.io/injection": "enabled"}
    assert {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["kube-system", "platform"],
    } in (selector["matchExpressions"])
    assert webhook["objectSelector"]["matchExpressions"] == [
        {"key": "dlq-sidecar.io/inject", "operator": "NotIn", "values": ["false"]}
    ]
    assert webhook["clientConfig"]["service"] == {
        "name": "rel-dlq-sidecar-injector",
        "namespace": "platform",
        "path": "/mutate",
        "port": 443,
    }
    secret = only(manifests, "Secret")
    assert webhook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    deployment = only(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["dlq-sidecar.io/inject"] == "false"  # never sent its own pods
    assert pod["spec"]["automountServiceAccountToken"] is False
    [container] = pod["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert only(manifests, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_cert_manager_mode_has_no_chart_generated_secret(helm: str) -> None:
    manifests = render(helm, CHART, CHART / "ci" / "cert-manager-values.yaml")
    assert not [m for m in manifests if m["kind"] == "Secret"]
    webhook = only(manifests, "MutatingWebhookConfiguration")
    assert webhook["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "platform/rel-dlq-sidecar-injector"
    }
    assert "caBundle" not in webhook["webhooks"][0]["clientConfig"]
    certificate = only(manifests, "Certificate")
    assert certificate["spec"]["secretName"] == "rel-dlq-sidecar-injector-tls"
    assert certificate["spec"]["issuerRef"] == {
        "name": "internal-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_a_webhook_url_goes_into_the_certificate(helm: str) -> None:
    manifests = render(helm, CHART, CHART / "ci" / "out-of-cluster-values.yaml")
    [webhook] = only(manifests, "MutatingWebhookConfiguration")["webhooks"]
    assert (
        webhook["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate"
        and "service" not in webhook["clientConfig"]
    )
    assert webhook["failurePolicy"] == "Ignore"


# -- the injected container against the chart's --------------------------------------------------------

# (injector ci values, pod annotations, the dlq-sidecar chart's app values they mean)
CASES = [
    ("default", {"dlq-sidecar.io/app-port": "9000"}, {"transport": "tcp", "port": 9000}),
    (
        "default",
        {"dlq-sidecar.io/app-socket": "r.sock"},
        {"transport": "unix", "socketName": "r.sock"},
    ),
    ("default", {"dlq-sidecar.io/app-transport": "pull"}, {"transport": "pull"}),
    ("hardened", {}, {"transport": "unix", "socketName": "records.sock", "shutdownSeconds": 20}),
    (
        "hardened",
        {
            "dlq-sidecar.io/app-port": "8081",
            "dlq-sidecar.io/app-push-path": "/in",
            "dlq-sidecar.io/drain-timeout-ms": "9000",
        },
        {"transport": "tcp", "port": 8081, "pushPath": "/in", "shutdownSeconds": 20},
    ),
]


def chart_values(settings: InjectorSettings, app: dict[str, Any], drain_ms: int) -> dict[str, Any]:
    """The dlq-sidecar chart's values that mean what ``settings`` (and the pod's choices) mean."""
    s = settings.sidecar

    def probe(p: Any) -> dict[str, Any]:
        return {
            "enabled": p.enabled,
            "periodSeconds": p.period_s,
            "failureThreshold": p.failure_threshold,
            "timeoutSeconds": p.timeout_s,
        }

    return {
        "service": {"enabled": s.exposure == "pod"},
        "app": {"image": {"repository": "registry.example.com/orders"}, **app},
        "sidecar": {
            "image": {
                "repository": s.image.repository,
                "tag": s.image.tag,
                "digest": s.image.digest,
                "pullPolicy": s.image.pull_policy,
            },
            "api": {
                "port": s.api_port,
                "observabilityPort": s.observability_port,
                "exposure": s.exposure,
            },
            "shutdown": {"drainTimeoutMs": drain_ms, "marginSeconds": s.margin_s},
            "resources": {k: dict(v) for k, v in s.resources.items()},
            "startupProbe": probe(s.startup_probe),
            "livenessProbe": probe(s.liveness_probe),
            "readinessProbe": probe(s.readiness_probe),
            "config": {
                "kafka": {"bootstrap.servers": "kafka:9092", "group.id": "orders"},
                "source": {"topics": ["orders"]},
            },
        },
    }


@pytest.mark.parametrize(
    ("ci", "annotations", "app"),
    CASES,
    ids=[f"{c[0]}-{c[2]['transport']}-{i}" for i, c in enumerate(CASES)],
)
def test_the_injected_sidecar_is_the_charts_field_by_field(
    helm: str, tmp_path: Path, ci: str, annotations: dict[str, str], app: dict[str, Any]
) -> None:
    settings = injector_settings(render(helm, CHART, CHART / "ci" / f"{ci}-values.yaml"))
    pod = {
        "metadata": {
            "name": "orders-1",
            "annotations": {
                "dlq-sidecar.io/inject": "true",
                "dlq-sidecar.io/config": "orders",
                **annotations,
            },
        },
        "spec": {
            "containers": [{"name": "app", "image": "registry.example.com/orders:latest"}],
            "terminationGracePeriodSeconds": 1,
        },
    }
    decision = decide(pod, "orders", settings)
    assert decision.allowed and decision.patch, decision.note
    injected = jsonpatch.apply_patch(pod, list(decision.patch))["spec"]
    drain_ms = int(
        annotations.get("dlq-sidecar.io/drain-timeout-ms", settings.sidecar.drain_timeout_ms)
    )
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values(settings, app, drain_ms)))
    charted = render(helm, SIDECAR_CHART, values)
    chart_pod = only(charted, "Deployment")["spec"]["template"]["spec"]
    [chart_container] = [c for c in chart_pod["initContainers"] if c["name"] == CONTAINER_NAME]
    [ours] = [c for c in injected["initContainers"] if c["name"] == CONTAINER_NAME]

    # The three documented differences, then nothing else.
    assert ours["args"][:-2] == chart_container["args"] and ours["args"][-2] == "--overlay"
    owned = json.loads(ours["args"][-1])
    assert ours["env"] == [*chart_container["env"], {"name": "XDG_STATE_HOME", "value": "/tmp"}]
    assert ours["securityContext"] == {
        **chart_container["securityContext"],
        "seccompProfile": chart_pod["securityContext"]["seccompProfile"],
    }
    for key in sorted(set(ours) | set(chart_container)):
        if key not in ("args", "env", "securityContext"):
            assert ours.get(key) == chart_container.get(key), key

    # The overlay is what the chart writes into its own config.yaml for those keys.
    config = yaml.safe_load(only(charted, "ConfigMap")["data"]["config.yaml"])
    assert owned.pop("logging", None) == (
        {"level": settings.log_level} if settings.log_level else None
    )
    assert owned == {k: config[k] for k in ("api", "app", "shutdown.drain.timeout.ms")}

    # Volumes (but the ConfigMap's name, the team's own), the app's env and mounts, the grace period.
    def named(volumes: list[Manifest]) -> list[Manifest]:
        return [{**v, "configMap": {"name": "-"}} if "configMap" in v else v for v in volumes]

    assert named(injected["volumes"]) == named(chart_pod["volumes"])
    [chart_app] = chart_pod["containers"]
    assert injected["containers"][0]["env"] == chart_app["env"]
    assert injected["containers"][0].get("volumeMounts") == chart_app.get("volumeMounts")
    assert injected["terminationGracePeriodSeconds"] == chart_pod["terminationGracePeriodSeconds"]


def test_one_set_of_defaults_in_the_two_charts_and_the_injector(helm: str) -> None:
    """The injector's built-in defaults, its chart's `inject` values and the dlq-sidecar chart's values.yaml
    describe the same sidecar: a default changed in one place only fails here."""
    rendered = injector_settings(render(helm, CHART))
    builtin = parse_settings({"tls": {"certFile": "a", "keyFile": "b"}}).sidecar
    assert dataclasses.replace(rendered.sidecar, image=builtin.image) == builtin
    chart = yaml.safe_load((SIDECAR_CHART / "values.yaml").read_text())["sidecar"]
    ours = rendered.sidecar
    assert (chart["api"]["port"], chart["api"]["observabilityPort"], chart["api"]["exposure"]) == (
        ours.api_port,
        ours.observability_port,
        ours.exposure,
    )
    assert chart["shutdown"] == {
        "drainTimeoutMs": ours.drain_timeout_ms,
        "marginSeconds": ours.margin_s,
    }
    assert chart["resources"] == ours.resources
    for key, probe in (
        ("startupProbe", ours.startup_probe),
        ("livenessProbe", ours.liveness_probe),
        ("readinessProbe", ours.readiness_probe),
    ):
        assert chart[key] == {
            "enabled": probe.enabled,
            "periodSeconds": probe.period_s,
            "failureThreshold": probe.failure_threshold,
            "timeoutSeconds": probe.timeout_s,
        }, key
    app = yaml.safe_load((SIDECAR_CHART / "values.yaml").read_text())["app"]
    assert (
        app["transport"],
        app["port"],
        app["socketName"],
        app["pushPath"],
        app["shutdownSeconds"],
    ) == (
        rendered.app.transport,
        rendered.app.port,
        rendered.app.socket_name,
        rendered.app.push_path,
        rendered.app.shutdown_s,
    )
    assert (
        rendered.sidecar.image.tag
        == yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    )
