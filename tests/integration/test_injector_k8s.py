"""Both charts installed into a real Kubernetes API server, and the injector called by it over TLS.

One etcd and kube-apiserver for the module (tests/kubecluster.py; built by scripts/install-kube). helm
talks to it with a kubeconfig holding a static admin token.

* The dlq-sidecar chart is installed with every `ci/*-values.yaml`, after the vendored CRDs
  (tests/integration/crds), so the server itself accepts ServiceMonitor, PrometheusRule and ScaledObject.
* The injector chart is installed with `webhook.url` pointing at an injector that runs here as a local
  process (`dlq-sidecar injector`) with the certificate and config the chart generated, read back from the
  server. A Service cannot reach it: the API server resolves a webhook Service through its Endpoints,
  and Endpoints refuse loopback addresses. The API server calls that URL over TLS and checks it against
  the chart's caBundle.
* There is no kubelet or controller-manager: the stored Pod is what is checked. A Deployment's Pod is
  created the way the ReplicaSet controller would, from a ReplicaSet made from the Deployment's template,
  with ownerReferences. The opted-in namespace enforces the restricted Pod Security Standard, so every
  injected pod stored there passed it.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from sidecar.ops.broker import free_port
from tests.integration.test_helm import CHART as SIDECAR_CHART
from tests.integration.test_helm import run_helm
from tests.kubecluster import ApiError, KubeCluster, kube_bin_dir, start_cluster

ROOT = Path(__file__).resolve().parents[2]
INJECTOR_CHART = ROOT / "deploy" / "helm" / "dlq-sidecar-injector"
CRDS = sorted((Path(__file__).parent / "crds").glob("*.yaml"))
APPS = "apps"  # opted in, restricted Pod Security Standard enforced
PLAIN = "plain"  # not opted in
SYSTEM = "dlq-system"  # the injector's release namespace
RELEASE = "inj"

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    bin_dir = kube_bin_dir()
    if bin_dir is None:
        pytest.fail(
            "etcd and kube-apiserver not found ($DLQ_KUBE_BIN, ~/.cache/dlq-sidecar/bin): run scripts/install-kube",
            pytrace=False,
        )
    with start_cluster(tmp_path_factory.mktemp("kube"), bin_dir) as started:
        yield started


def helm_in(cluster: KubeCluster, helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_helm(helm, "--kubeconfig", str(cluster.kubeconfig), *args)


def app_container(name: str = "app", **more: Any) -> Obj:
    """A container that meets the restricted Pod Security Standard."""
    return {
        "name": name,
        "image": "registry.example.com/orders:1",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        **more,
    }


def pod_spec(*containers: Obj, **more: Any) -> Obj:
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": list(containers) or [app_container()],
        **more,
    }


def new_pod(
    name: str,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": pod_spec(**spec),
    }


def create_pod(cluster: KubeCluster, namespace: str, pod: Obj) -> Obj:
    stored: Obj = cluster.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    return stored


def sidecars(pod: Obj) -> list[Obj]:
    return [c for c in pod["spec"].get("initContainers", []) if c["name"] == "dlq-sidecar"]


# -- the dlq-sidecar chart ---------------------------------------------------------------------------------


def test_the_sidecar_chart_installs_with_every_ci_values_file(
    cluster: KubeCluster, helm: str
) -> None:
    cluster.apply_crds(CRDS)
    variants = sorted((SIDECAR_CHART / "ci").glob("*-values.yaml"))
    assert len(variants) >= 5
    for values in variants:
        name = values.name.removesuffix("-values.yaml")
        namespace = f"chart-{name}"
        proc = helm_in(
            cluster,
            helm,
            "install",
            name,
            str(SIDECAR_CHART),
            "-n",
            namespace,
            "--create-namespace",
            "-f",
            str(values),
        )
        assert proc.returncode == 0, f"{values.name}: {proc.stderr}"
        [deployment] = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments")["items"]
        [sidecar] = sidecars(deployment["spec"]["template"])
        assert sidecar["restartPolicy"] == "Always", values.name
    monitored = cluster.get(
        "/apis/monitoring.coreos.com/v1/namespaces/chart-monitoring/prometheusrules"
    )["items"]
    assert monitored, "the monitoring variant's PrometheusRule was stored"
    assert cluster.get("/apis/keda.sh/v1alpha1/namespaces/chart-share-keda/scaledobjects")["items"]


# -- the injector -------------------------------------------------------------------------------------------


class Injector:
    """The `dlq-sidecar injector` process, with the chart's config and certificate."""

    def __init__(self, cluster: KubeCluster, directory: Path, port: int) -> None:
        self.cluster, self.directory, self.port = cluster, directory, port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        name = f"{RELEASE}-dlq-sidecar-injector"
        secret = self.cluster.get(f"/api/v1/namespaces/{SYSTEM}/secrets/{name}-tls")["data"]
        config = yaml.safe_load(
            self.cluster.get(f"/api/v1/namespaces/{SYSTEM}/configmaps/{name}")["data"][
                "config.yaml"
            ]
        )
        for key in ("tls.crt", "tls.key", "ca.crt"):
            (self.directory / key).write_bytes(base64.b64decode(secret[key]))
        config["listen"] = f"127.0.0.1:{self.port}"
        config["tls"] = {
            "certFile": str(self.directory / "tls.crt"),
            "keyFile": str(self.directory / "tls.key"),
        }
        (self.directory / "injector.yaml").write_text(yaml.safe_dump(config))
        with (self.directory / "injector.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sidecar",
                    "injector",
                    "-c",
                    str(self.directory / "injector.yaml"),
                    "--shutdown-delay",
                    "0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        context = ssl.create_default_context(cafile=str(self.directory / "ca.crt"))
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, (self.directory / "injector.log").read_text()
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{self.port}/healthz", context=context, timeout=5
                ) as r:
                    if r.status == 200:
                        return
            except OSError:
                assert time.monotonic() < deadline, "the injector did not answer /healthz"
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(timeout=30) == 0
        self.proc = None

    def log(self) -> str:
        return (self.directory / "injector.log").read_text()


@pytest.fixture(scope="module")
def injector(
    cluster: KubeCluster, helm: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Injector]:
    port = free_port()
    proc = helm_in(
        cluster, helm, "install", RELEASE, str(INJECTOR_CHART), "-n", SYSTEM, "--create-namespace",
        "--set", f"webhook.url=https://127.0.0.1:{port}/mutate", "--set", "webhook.timeoutSeconds=10",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cluster.namespace(
        APPS,
        {"dlq-sidecar.io/injection": "enabled", "pod-security.kubernetes.io/enforce": "restricted"},
    )
    cluster.namespace(PLAIN)
    config = (
        "kafka: {bootstrap.servers: kafka:9092, group.id: orders}\nsource: {topics: [orders]}\n"
    )
    cluster.create(
        f"/api/v1/namespaces/{APPS}/configmaps",
        {"metadata": {"name": "orders"}, "data": {"config.yaml": config}},
    )
    running = Injector(cluster, tmp_path_factory.mktemp("injector"), port)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def test_why_the_webhook_is_a_url_here_endpoints_refuse_loopback(
    cluster: KubeCluster, injector: Injector
) -> None:
    """The chart's default clientConfig is its Service; the API server reaches a Service through its
    Endpoints, and those cannot point at this machine's loopback, where the injector runs in the tests."""
    with pytest.raises(ApiError) as refused:
        cluster.create(
            f"/api/v1/namespaces/{SYSTEM}/endpoints",
            {
                "metadata": {"name": "loopback"},
                "subsets": [
                    {"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": injector.port}]}
                ],
            },
        )
    assert refused.value.status == 422 and "loopback" in refused.value.message, (
        refused.value.message
    )


ANNOTATED = {
    "dlq-sidecar.io/inject": "true",
    "dlq-sidecar.io/config": "orders",
    "dlq-sidecar.io/app-port": "9000",
}


def test_an_annotated_pod_is_stored_with_the_sidecar(
    cluster: KubeCluster, injector: Injector, tmp_path: Path
) -> None:
    stored = create_pod(
        cluster, APPS, new_pod("orders-1", ANNOTATED, terminationGracePeriodSeconds=30)
    )
    [sidecar] = sidecars(stored)
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert stored["metadata"]["annotations"]["dlq-sidecar.io/status"] == "injected"
    assert stored["spec"]["terminationGracePeriodSeconds"] == 35
    volumes = {v["name"]: v for v in stored["spec"]["volumes"]}
    assert volumes["dlq-sidecar-config"]["configMap"]["name"] == "orders"
    app = stored["spec"]["containers"][0]
    assert {"name": "DLQ_SIDECAR_APP_PORT", "value": "9000"} in app["env"]
    # The namespace really enforces the restricted standard: the same pod without its hardening is refused.
    loose = new_pod("loose", ANNOTATED)
    del loose["spec"]["securityContext"], loose["spec"]["containers"][0]["securityContext"]
    with pytest.raises(ApiError) as refused:
        create_pod(cluster, APPS, loose)
    assert refused.value.status == 403 and "restricted" in refused.value.message
    # The stored sidecar's command line is one the real sidecar accepts, with the team's ConfigMap.
    config = tmp_path / "config.yaml"
    config.write_text(
        cluster.get(f"/api/v1/namespaces/{APPS}/configmaps/orders")["data"]["config.yaml"]
    )
    args = sidecar["args"]
    assert args[:3] == ["run", "-c", "/etc/dlq-sidecar/config.yaml"]
    check = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config", "-c", str(config), *args[3:], "--print"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    effective = json.loads(check.stdout)
    assert effective["app"]["url"] == "http://127.0.0.1:9000/records", effective["app"]


def test_a_deployments_pod_gets_the_sidecar_and_the_deployment_does_not(
    cluster: KubeCluster, injector: Injector
) -> None:
    labels = {"app": "billing"}
    template = {
        "metadata": {
            "labels": labels,
            "annotations": {
                "dlq-sidecar.io/inject": "true",
                "dlq-sidecar.io/config": "orders",
                "dlq-sidecar.io/app-socket": "billing.sock",
            },
        },
        "spec": pod_spec(app_container("billing")),
    }
    deployment = cluster.create(
        f"/apis/apps/v1/namespaces/{APPS}/deployments",
        {
            "metadata": {"name": "billing"},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
        },
    )
    assert not sidecars(deployment["spec"]["template"])  # pods are mutated, not their templates
    # What the Deployment and ReplicaSet controllers would do: a ReplicaSet owned by the Deployment,
    # then a Pod from its template, owned by the ReplicaSet.
    template_hash = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
    rs_labels = {**labels, "pod-template-hash": template_hash}
    rs_template = {**template, "metadata": {**template["metadata"], "labels": rs_labels}}

    def owner(obj: Obj, kind: str, api_version: str) -> list[Obj]:
        uid, name = obj["metadata"]["uid"], obj["metadata"]["name"]
        return [
            {
                "apiVersion": api_version,
                "kind": kind,
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]

    replica_set = cluster.create(
        f"/apis/apps/v1/namespaces/{APPS}/replicasets",
        {
            "metadata": {
                "name": f"billing-{template_hash}",
                "labels": rs_labels,
                "ownerReferences": owner(deployment, "Deployment", "apps/v1"),
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": rs_labels},
                "template": rs_template,
            },
        },
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"billing-{template_hash}-",
            "labels": rs_labels,
            "annotations": rs_template["metadata"]["annotations"],
            "ownerReferences": owner(replica_set, "ReplicaSet", "apps/v1"),
        },
        "spec": rs_template["spec"],
    }
    stored = create_pod(cluster, APPS, pod)
    [sidecar] = sidecars(stored)
    assert {"name": "dlq-sidecar-socket", "mountPath": "/var/run/dlq-sidecar"} in sidecar[
        "volumeMounts"
    ]
    billing = stored["spec"]["containers"][0]
    assert {
        "name": "DLQ_SIDECAR_APP_SOCKET",
        "value": "/var/run/dlq-sidecar/billing.sock",
    } in billing["env"]
    assert {"name": "dlq-sidecar-socket", "mountPath": "/var/run/dlq-sidecar"} in billing[
        "volumeMounts"
    ]
    assert stored["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"


def test_pods_that_did_not_ask_or_are_outside_are_untouched(
    cluster: KubeCluster, injector: Injector
) -> None:
    plain = create_pod(cluster, APPS, new_pod("no-annotation"))
    assert "initContainers" not in plain["spec"]
    elsewhere = create_pod(cluster, PLAIN, new_pod("not-opted-in", ANNOTATED))
    assert "initContainers" not in elsewhere["spec"]
    # Labelled out: the objectSelector keeps it from the injector altogether.
    out = create_pod(
        cluster, APPS, new_pod("opted-out", ANNOTATED, labels={"dlq-sidecar.io/inject": "false"})
    )
    assert "initContainers" not in out["spec"]
    assert "opted-out" not in injector.log()


def test_a_pod_that_has_the_sidecar_is_left_alone(cluster: KubeCluster, injector: Injector) -> None:
    own = {"name": "dlq-sidecar", "image": "dlq-sidecar:0.1.0", "restartPolicy": "Always", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}  # fmt: skip
    stored = create_pod(cluster, APPS, new_pod("has-one", ANNOTATED, initContainers=[own]))
    assert len(sidecars(stored)) == 1 and sidecars(stored)[0]["image"] == "dlq-sidecar:0.1.0"
    assert "dlq-sidecar.io/status" not in stored["metadata"]["annotations"]


def test_a_bad_annotation_is_refused_with_its_name_and_reason(
    cluster: KubeCluster, injector: Injector
) -> None:
    with pytest.raises(ApiError) as refused:
        create_pod(
            cluster, APPS, new_pod("bad", {**ANNOTATED, "dlq-sidecar.io/memory-limit": "lots"})
        )
    assert refused.value.status == 400
    assert "denied the request" in refused.value.message
    assert (
        "annotation dlq-sidecar.io/memory-limit: must be a Kubernetes quantity"
        in refused.value.message
    )
    assert not cluster.exists(f"/api/v1/namespaces/{APPS}/pods/bad")


class Labeler:
    """A second mutating webhook, called after the injector (webhooks run in name order): it adds a label,
    so the API server calls the injector again (reinvocationPolicy IfNeeded)."""

    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        leaf = self.ca.issue_cert("127.0.0.1")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        leaf.configure_cert(context)
        self.calls = 0
        labeler = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))[
                    "request"
                ]
                labeler.calls += 1
                patch = [{"op": "add", "path": "/metadata/labels/relabelled", "value": "yes"}]
                body = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {
                            "uid": request["uid"],
                            "allowed": True,
                            "patchType": "JSONPatch",
                            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                        },
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def configuration(self) -> Obj:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "zz-labeler"},
            "webhooks": [
                {
                    "name": "labeler.test.dlq-sidecar.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "Never",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.port}/label",
                        "caBundle": base64.b64encode(self.ca.cert_pem.bytes()).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "objectSelector": {"matchLabels": {"relabel": "yes"}},
                }
            ],
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def test_a_later_webhook_makes_the_api_server_call_the_injector_again(
    cluster: KubeCluster, injector: Injector, tmp_path: Path
) -> None:
    labeler = Labeler(tmp_path)
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    cluster.create(path, labeler.configuration())
    try:
        stored = create_pod(
            cluster, APPS, new_pod("reinvoked", ANNOTATED, labels={"relabel": "yes"})
        )
    finally:
        cluster.delete(f"{path}/zz-labeler")
        labeler.close()
    assert labeler.calls == 1 and stored["metadata"]["labels"]["relabelled"] == "yes"
    assert len(sidecars(stored)) == 1
    log = injector.log()
    assert f"injected the sidecar into pod {APPS}/reinvoked" in log
    assert f"left pod {APPS}/reinvoked alone: already has a dlq-sidecar container" in log, log[
        -2000:
    ]


def webhook_ca(cluster: KubeCluster) -> tuple[str, str]:
    [config] = cluster.get(
        f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations?labelSelector=app.kubernetes.io/instance={RELEASE}"
    )["items"]
    secret = cluster.get(f"/api/v1/namespaces/{SYSTEM}/secrets/{RELEASE}-dlq-sidecar-injector-tls")
    return config["webhooks"][0]["clientConfig"]["caBundle"], secret["data"]["ca.crt"]


def test_failure_policy_with_the_injector_stopped_and_an_upgrade_keeps_the_ca(
    cluster: KubeCluster, helm: str, injector: Injector
) -> None:
    ca_before = webhook_ca(cluster)
    assert ca_before[0] == ca_before[1]
    injector.stop()
    # Fail (the default): no pod is created in an opted-in namespace while no injector answers.
    with pytest.raises(ApiError) as refused:
        create_pod(cluster, APPS, new_pod("while-down", ANNOTATED))
    assert "failed calling webhook" in refused.value.message, refused.value.message
    with pytest.raises(ApiError) as refused:  # annotated or not: every pod there is sent
        create_pod(cluster, APPS, new_pod("plain-while-down"))
    assert "failed calling webhook" in refused.value.message, refused.value.message
    assert not cluster.exists(f"/api/v1/namespaces/{APPS}/pods/while-down")
    proc = helm_in(
        cluster,
        helm,
        "upgrade",
        RELEASE,
        str(INJECTOR_CHART),
        "-n",
        SYSTEM,
        "--reuse-values",
        "--set",
        "webhook.failurePolicy=Ignore",
    )
    assert proc.returncode == 0, proc.stderr
    assert webhook_ca(cluster) == ca_before, "helm upgrade must keep the chart's CA"
    # Ignore: the pod is created, without the sidecar.
    admitted = create_pod(cluster, APPS, new_pod("while-down", ANNOTATED))
    assert not sidecars(admitted)
    # And the injector with the kept certificate is trusted again.
    injector.start()
    assert sidecars(create_pod(cluster, APPS, new_pod("after-upgrade", ANNOTATED)))


def test_uninstall_leaves_nothing_behind(
    cluster: KubeCluster, helm: str, injector: Injector
) -> None:
    proc = helm_in(cluster, helm, "uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "60s")
    assert proc.returncode == 0, proc.stderr
    selector = f"labelSelector=app.kubernetes.io/instance={RELEASE}"
    leftover = {
        path: cluster.get(f"{path}?{selector}")["items"]
        for path in (
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            f"/api/v1/namespaces/{SYSTEM}/secrets",
            f"/api/v1/namespaces/{SYSTEM}/configmaps",
            f"/api/v1/namespaces/{SYSTEM}/services",
            f"/api/v1/namespaces/{SYSTEM}/serviceaccounts",
            f"/apis/apps/v1/namespaces/{SYSTEM}/deployments",
            f"/apis/policy/v1/namespaces/{SYSTEM}/poddisruptionbudgets",
        )
    }
    assert {path: items for path, items in leftover.items() if items} == {}
    assert (
        cluster.get(f"/api/v1/namespaces/{SYSTEM}/secrets?labelSelector=owner=helm,name={RELEASE}")[
            "items"
        ]
        == []
    )
    # Without the webhook, an annotated pod in the opted-in namespace is just a pod.
    assert not sidecars(create_pod(cluster, APPS, new_pod("after-uninstall", ANNOTATED)))
