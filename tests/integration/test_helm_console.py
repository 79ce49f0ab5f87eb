"""The chart's optional console (deploy/helm/dlq-sidecar/templates/console.yaml): off by default;
when on, a Deployment and a ClusterIP Service of its own that the workload's selectors never match,
read-only unless a token Secret is given, valid for the Kubernetes schemas the chart supports.

Renders with the real helm (the `helm` fixture) and the helpers of tests/integration/test_helm.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.test_helm import (
    KUBE_VERSIONS,
    ci_file,
    k8s_validator,
    only,
    render,
    render_error,
)

ON = ("console.enabled=true",)
WITH_TOKEN = (*ON, "console.token.existingSecret=console-token")


def _console(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [
        m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith("-console")
    ]
    return found


def _container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = _console(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = container
    return result


def test_the_console_is_off_by_default(helm: str) -> None:
    manifests = render(helm, ci_file("tcp"))
    assert not [m for m in manifests if m["metadata"]["name"].endswith("-console")]


def test_the_console_is_read_only_without_a_token_secret(helm: str) -> None:
    container = _container(render(helm, ci_file("tcp"), sets=ON))
    args = container["args"]
    assert args[0] == "console" and "--read-only" in args
    assert args[args.index("--host") + 1] == "0.0.0.0"  # the pod IP, behind a ClusterIP Service
    assert args[args.index("--bootstrap") + 1]  # the sidecar config's kafka bootstrap servers
    assert "env" not in container


def test_a_token_secret_enables_redrives(helm: str) -> None:
    container = _container(render(helm, ci_file("tcp"), sets=WITH_TOKEN))
    assert "--read-only" not in container["args"]
    [env] = container["env"]
    assert env["name"] == "DLQ_CONSOLE_TOKEN"
    assert env["valueFrom"]["secretKeyRef"] == {"name": "console-token", "key": "token"}


def test_the_console_has_its_own_selector_and_service(helm: str) -> None:
    manifests = render(helm, ci_file("tcp"), sets=WITH_TOKEN)
    workload = only(
        [m for m in manifests if not m["metadata"]["name"].endswith("-console")], "Service"
    )
    deployment = _console(manifests, "Deployment")
    service = _console(manifests, "Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # The workload's Service (and PDB, autoscalers: the same selector) never routes to the console.
    assert not workload["spec"]["selector"].items() <= pod_labels.items()
    [port] = service["spec"]["ports"]
    assert port["port"] == 8686 and port["targetPort"] == "console"
    container = _container(manifests)
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_the_console_objects_validate_against_kubernetes_schemas(helm: str, kube: str) -> None:
    kubernetes_validate = k8s_validator()
    for kind in ("Deployment", "Service"):
        manifest = _console(render(helm, ci_file("tcp"), sets=WITH_TOKEN, kube=kube), kind)
        kubernetes_validate.validate(manifest, kube, strict=True)


def test_the_console_uses_the_sidecars_sasl_and_tls_settings(helm: str) -> None:
    manifests = render(helm, ci_file("sasl"), sets=ON)
    container = _container(manifests)
    args = container["args"]
    props = {
        args[i + 1].split("=", 1)[0]: args[i + 1].split("=", 1)[1]
        for i, a in enumerate(args)
        if a == "-X"
    }
    assert props["security.protocol"] == "SASL_SSL"
    # Credentials as placeholders the console reads from its environment: never on the command line.
    assert props["sasl.password"] == "${DLQ_KAFKA_SASL_PASSWORD}"
    assert props["ssl.ca.location"].startswith("/etc/dlq-sidecar-tls/")
    env = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert env["DLQ_KAFKA_SASL_PASSWORD"] == "kafka-credentials"
    assert (
        "KAFKA_BOOTSTRAP" in env
    )  # the sidecar's secretEnv: the bootstrap servers' ${KAFKA_BOOTSTRAP}
    spec = _console(manifests, "Deployment")["spec"]["template"]["spec"]
    [tls] = [v for v in spec["volumes"] if "secret" in v]
    assert tls["secret"]["secretName"] == "kafka-ca"
    kubernetes_validate = k8s_validator()
    kubernetes_validate.validate(_console(manifests, "Deployment"), KUBE_VERSIONS[0], strict=True)


def test_console_values_are_checked(helm: str) -> None:
    assert "console" in render_error(helm, ci_file("tcp"), sets=(*ON, "console.port=0"))
    assert "console" in render_error(helm, ci_file("tcp"), sets=(*ON, "console.nope=1"))
