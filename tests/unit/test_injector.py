"""The injector's decision, without a server: settings, annotations, the JSONPatch for one pod, AdmissionReview.

Patches are applied with the jsonpatch library (RFC 6902, as the API server applies them), so a patch
that would not apply to the pod it was made for fails here. The Hypothesis test draws pods (containers
with and without env, mounts and ports; init containers or none; volumes) and annotation sets (good and
bad values) and checks the invariants: a pod is refused whole or patched whole, the patch applies, the
result has one sidecar, its own containers unchanged but for the app's env and mounts, and a second
review of the result changes nothing.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sidecar.config import ConfigError, load_config
from sidecar.injector.annotations import BadAnnotation, quantity, read_choices
from sidecar.injector.patch import CONTAINER_NAME, decide, grace_period_s, overlay
from sidecar.injector.review import MalformedReview, review
from sidecar.injector.settings import InjectorConfigError, parse_settings

SETTINGS = parse_settings({"tls": {"certFile": "/tls/tls.crt", "keyFile": "/tls/tls.key"}})
Pod = dict[str, Any]


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> Pod:
    base: Pod = {"containers": [{"name": "app", "image": "registry.example.com/orders:1"}]}
    base.update(spec)
    return {"metadata": {"name": "orders-1", "annotations": annotations or {}}, "spec": base}


def inject(**more: str) -> dict[str, str]:
    return {
        "dlq-sidecar.io/inject": "true",
        **{f"dlq-sidecar.io/{k.replace('_', '-')}": v for k, v in more.items()},
    }


def patched(p: Pod, namespace: str = "orders") -> Pod:
    decision = decide(p, namespace, SETTINGS)
    assert decision.allowed, decision.note
    assert decision.patch, decision.note
    result: Pod = jsonpatch.apply_patch(p, list(decision.patch))
    return result


def sidecar_of(p: Pod) -> dict[str, Any]:
    [container] = [c for c in p["spec"]["initContainers"] if c["name"] == CONTAINER_NAME]
    return dict(container)


def overlay_of(p: Pod) -> dict[str, Any]:
    args = sidecar_of(p)["args"]
    assert args[:4] == ["run", "-c", "/etc/dlq-sidecar/config.yaml", "--overlay"]
    data: dict[str, Any] = json.loads(args[4])
    return data


# -- settings ------------------------------------------------------------------------------------------


def test_settings_defaults_match_the_charts_defaults() -> None:
    s = SETTINGS.sidecar
    assert (s.api_port, s.observability_port, s.exposure) == (8787, 8788, "pod")
    assert (s.drain_timeout_ms, s.margin_s) == (20000, 5)
    assert (SETTINGS.app.port, SETTINGS.app.push_path, SETTINGS.app.shutdown_s) == (
        8080,
        "/records",
        10,
    )
    assert (SETTINGS.listen_host, SETTINGS.listen_port) == ("0.0.0.0", 8443)


@pytest.mark.parametrize(
    ("data", "path", "reason"),
    [
        ({"tls": {"certFile": "a"}}, "tls", "keyFile are required"),
        ({"tls": {"certFile": "a", "keyFile": "b"}, "extra": 1}, "extra", "unknown key"),
        ({"tls": {"certFile": "a", "keyFile": "b"}, "listen": "8443"}, "listen", "host:port"),
        (
            {
                "tls": {"certFile": "a", "keyFile": "b"},
                "defaults": {"sidecar": {"api": {"port": "x"}}},
            },
            "defaults.sidecar.api.port",
            "integer",
        ),
        (
            {"tls": {"certFile": "a", "keyFile": "b"}, "defaults": {"app": {"transport": "udp"}}},
            "defaults.app.transport",
            "tcp, unix, pull",
        ),
        (
            {
                "tls": {"certFile": "a", "keyFile": "b"},
                "defaults": {"sidecar": {"api": {"observabilityPort": 8787}}},
            },
            "defaults.sidecar.api.observabilityPort",
            "must differ",
        ),
        (
            {
                "tls": {"certFile": "a", "keyFile": "b"},
                "defaults": {"sidecar": {"startupProbe": {"enabled": "yes"}}},
            },
            "defaults.sidecar.startupProbe.enabled",
            "true or false",
        ),
    ],
)
def test_bad_settings_name_the_key_and_the_reason(data: object, path: str, reason: str) -> None:
    with pytest.raises(InjectorConfigError) as caught:
        parse_settings(data, file="injector.yaml")
    assert caught.value.path == path
    assert reason in caught.value.reason
    assert str(caught.value).startswith(f"injector.yaml: {path}: ")


# -- annotations ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "blamed", "reason"),
    [
        ({"dlq-sidecar.io/inject": "yes"}, "inject", '"true" or "false"'),
        (inject(app_port="http"), "app-port", "whole number"),
        (inject(app_port="70000"), "app-port", "1-65535"),
        (inject(app_socket="../etc/passwd"), "app-socket", "file name"),
        (inject(app_transport="udp"), "app-transport", "tcp, unix, pull"),
        (inject(app_transport="unix", app_port="8080"), "app-port", "transport tcp"),
        (inject(app_transport="tcp", app_socket="a.sock"), "app-socket", "transport unix"),
        (inject(app_transport="pull", app_push_path="/x"), "app-push-path", "push transports"),
        (inject(app_push_path="records"), "app-push-path", "absolute URL path"),
        (inject(config="Not_A_Name"), "config", "ConfigMap name"),
        (inject(cpu_request="lots"), "cpu-request", "quantity"),
        (inject(memory_request="512Mi"), "memory-request", "above the limit 256Mi"),
        (inject(memory_limit="64Mi"), "memory-limit", "above the limit 64Mi"),
        (inject(log_level="verbose"), "log-level", "debug, info, warning, error"),
        (inject(drain_timeout_ms="0"), "drain-timeout-ms", "1-3600000"),
        (inject(app_shutdown_seconds="-1"), "app-shutdown-seconds", "whole number"),
        ({**inject(), "dlq-sidecar.io/app-prot": "8080"}, "app-prot", "unknown"),
    ],
)
def test_a_bad_annotation_refuses_the_pod_naming_it(
    annotations: dict[str, str], blamed: str, reason: str
) -> None:
    decision = decide(pod(annotations), "orders", SETTINGS)
    assert not decision.allowed
    assert decision.patch == ()
    assert decision.note.startswith(f"annotation dlq-sidecar.io/{blamed}: "), decision.note
    assert reason in decision.note


def test_quantities_compare_as_kubernetes_reads_them() -> None:
    assert quantity("x", "100m") == quantity("x", "0.1")
    assert quantity("x", "1Gi") == 1024 * quantity("x", "1Mi")
    assert quantity("x", "1e3") == quantity("x", "1k")
    assert quantity("x", "1G") < quantity("x", "1Gi")
    with pytest.raises(BadAnnotation):
        quantity("x", "1.2.3")


def test_annotations_choose_over_the_defaults() -> None:
    choices = read_choices(
        inject(config="orders-dlq", app_socket="r.sock", cpu_limit="500m", log_level="debug"),
        SETTINGS,
    )
    assert (choices.config_map, choices.transport, choices.socket_name) == (
        "orders-dlq",
        "unix",
        "r.sock",
    )
    assert choices.resources["limits"] == {"memory": "256Mi", "cpu": "500m"}
    assert choices.log_level == "debug"
    defaults = read_choices(inject(), SETTINGS)
    assert (defaults.config_map, defaults.transport, defaults.app_port) == (
        "dlq-sidecar",
        "tcp",
        8080,
    )


def test_no_default_config_map_makes_the_annotation_required() -> None:
    strict = parse_settings(
        {"tls": {"certFile": "a", "keyFile": "b"}, "defaults": {"configMap": ""}}
    )
    decision = decide(pod(inject()), "orders", strict)
    assert not decision.allowed and "dlq-sidecar.io/config: is required" in decision.note


# -- the patch -----------------------------------------------------------------------------------------


def test_a_tcp_pod_gets_the_native_sidecar_the_chart_runs() -> None:
    result = patched(pod(inject(app_port="9000"), terminationGracePeriodSeconds=30))
    sidecar = sidecar_of(result)
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "sidecar-obs"}
    assert sidecar["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert overlay_of(result) == {
        "api": {"listen": "127.0.0.1:8787", "observability.listen": "0.0.0.0:8788"},
        "app": {"url": "http://127.0.0.1:9000/records"},
        "shutdown.drain.timeout.ms": 20000,
    }
    app = result["spec"]["containers"][0]
    assert app["env"] == [
        {"name": "DLQ_SIDECAR_URL", "value": "http://127.0.0.1:8787"},
        {"name": "DLQ_SIDECAR_APP_PORT", "value": "9000"},
    ]
    assert "volumeMounts" not in app
    assert {v["name"] for v in result["spec"]["volumes"]} == {
        "dlq-sidecar-config",
        "dlq-sidecar-tmp",
    }
    assert result["spec"]["terminationGracePeriodSeconds"] == 35  # 10 + 20 + 5 > 30
    assert result["metadata"]["annotations"]["dlq-sidecar.io/status"] == "injected"


def test_a_unix_socket_pod_shares_the_socket_directory() -> None:
    result = patched(
        pod(
            inject(app_socket="r.sock", app_container="worker"),
            containers=[
                {"name": "proxy", "image": "p", "env": [{"name": "A", "value": "1"}]},
                {
                    "name": "worker",
                    "image": "w",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                },
            ],
            initContainers=[{"name": "migrate", "image": "m"}],
            volumes=[{"name": "data", "emptyDir": {}}],
        )
    )
    spec = result["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["migrate", CONTAINER_NAME]
    worker = spec["containers"][1]
    assert worker["volumeMounts"][-1] == {
        "name": "dlq-sidecar-socket",
        "mountPath": "/var/run/dlq-sidecar",
    }
    assert {"name": "DLQ_SIDECAR_APP_SOCKET", "value": "/var/run/dlq-sidecar/r.sock"} in worker[
        "env"
    ]
    assert spec["containers"][0] == {
        "name": "proxy",
        "image": "p",
        "env": [{"name": "A", "value": "1"}],
    }
    assert overlay_of(result)["app"] == {
        "url": "http://localhost/records",
        "unix_socket": "/var/run/dlq-sidecar/r.sock",
    }
    assert [v["name"] for v in spec["volumes"]] == [
        "data",
        "dlq-sidecar-config",
        "dlq-sidecar-tmp",
        "dlq-sidecar-socket",
    ]


def test_a_longer_grace_period_is_kept_and_a_longer_drain_raises_it() -> None:
    assert (
        patched(pod(inject(), terminationGracePeriodSeconds=120))["spec"][
            "terminationGracePeriodSeconds"
        ]
        == 120
    )
    longer = patched(
        pod(
            inject(drain_timeout_ms="45001", app_shutdown_seconds="3"),
            terminationGracePeriodSeconds=30,
        )
    )
    assert longer["spec"]["terminationGracePeriodSeconds"] == 3 + 46 + 5


def test_pull_mode_and_log_level_reach_the_overlay() -> None:
    result = patched(pod(inject(app_transport="pull", log_level="debug")))
    data = overlay_of(result)
    assert data["app"] == {"mode": "pull"} and data["logging"] == {"level": "debug"}
    assert result["spec"]["containers"][0]["env"] == [
        {"name": "DLQ_SIDECAR_URL", "value": "http://127.0.0.1:8787"}
    ]


@pytest.mark.parametrize(
    ("p", "namespace", "note"),
    [
        (pod(), "orders", "not asked for"),
        (pod({"dlq-sidecar.io/inject": "false"}), "orders", "not asked for"),
        (pod(inject()), "kube-system", "never injected"),
        (
            pod(inject(), initContainers=[{"name": CONTAINER_NAME, "image": "x"}]),
            "orders",
            "already has",
        ),
        (
            pod(inject(), containers=[{"name": CONTAINER_NAME, "image": "x"}]),
            "orders",
            "already has",
        ),
    ],
)
def test_pods_left_alone(p: Pod, namespace: str, note: str) -> None:
    decision = decide(p, namespace, SETTINGS)
    assert decision.allowed and decision.patch == ()
    assert note in decision.note


@pytest.mark.parametrize(
    ("p", "reason"),
    [
        (pod(inject(), hostNetwork=True), "hostNetwork"),
        (pod(inject(app_container="nope")), "no container 'nope'"),
        (
            pod(
                inject(),
                containers=[{"name": "app", "image": "a", "ports": [{"containerPort": 8788}]}],
            ),
            "port 8788",
        ),
        (pod(inject(app_port="8787")), "dlq-sidecar.io/app-port: 8787 is the sidecar's port"),
        (
            pod(inject(), volumes=[{"name": "dlq-sidecar-tmp", "emptyDir": {}}]),
            "volume named 'dlq-sidecar-tmp'",
        ),
        (
            pod(
                inject(),
                containers=[
                    {
                        "name": "app",
                        "image": "a",
                        "env": [{"name": "DLQ_SIDECAR_URL", "value": "x"}],
                    }
                ],
            ),
            "already sets DLQ_SIDECAR_URL",
        ),
        (
            pod(
                inject(app_socket="s"),
                containers=[
                    {
                        "name": "app",
                        "image": "a",
                        "volumeMounts": [{"name": "v", "mountPath": "/var/run/dlq-sidecar"}],
                    }
                ],
            ),
            "already mounts something at /var/run/dlq-sidecar",
        ),
    ],
)
def test_pods_that_cannot_take_the_sidecar_are_refused_whole(p: Pod, reason: str) -> None:
    decision = decide(p, "orders", SETTINGS)
    assert not decision.allowed and decision.patch == ()
    assert reason in decision.note, decision.note


# -- Hypothesis: refused whole or patched whole, idempotent ----------------------------------------------

_ANNOTATION_VALUES = {
    "config": st.sampled_from(["orders", "team.dlq", "Bad_Name"]),
    "app-port": st.sampled_from(["8080", "9000", "8787", "0", "x"]),
    "app-socket": st.sampled_from(["app.sock", "r.sock", ".."]),
    "app-transport": st.sampled_from(["tcp", "unix", "pull", "udp"]),
    "app-push-path": st.sampled_from(["/records", "/v1/in", "nope"]),
    "app-container": st.sampled_from(["app", "side", "missing"]),
    "drain-timeout-ms": st.sampled_from(["1000", "45000", "-5"]),
    "memory-limit": st.sampled_from(["512Mi", "64Mi", "1Gi", "lots"]),
    "cpu-request": st.sampled_from(["50m", "2", "1.5.1"]),
    "log-level": st.sampled_from(["debug", "error", "loud"]),
}

_containers = st.lists(
    st.fixed_dictionaries(
        {"image": st.just("img")},
        optional={
            "env": st.lists(
                st.fixed_dictionaries(
                    {"name": st.sampled_from(["A", "B", "DLQ_SIDECAR_URL"]), "value": st.just("v")}
                ),
                max_size=2,
            ),
            "ports": st.lists(
                st.fixed_dictionaries({"containerPort": st.sampled_from([80, 8080, 8788])}),
                max_size=2,
            ),
            "volumeMounts": st.lists(
                st.fixed_dictionaries(
                    {
                        "name": st.just("data"),
                        "mountPath": st.sampled_from(["/data", "/var/run/dlq-sidecar"]),
                    }
                ),
                max_size=1,
            ),
        },
    ),
    min_size=1,
    max_size=3,
)


@st.composite
def pods(draw: st.DrawFn) -> Pod:
    containers = draw(_containers)
    for i, c in enumerate(containers):
        c["name"] = ["app", "side", "third"][i]
    spec: Pod = {"containers": containers}
    if draw(st.booleans()):
        spec["initContainers"] = [{"name": "migrate", "image": "m"}]
    if draw(st.booleans()):
        spec["volumes"] = [
            {"name": draw(st.sampled_from(["data", "dlq-sidecar-config"])), "emptyDir": {}}
        ]
    if draw(st.booleans()):
        spec["terminationGracePeriodSeconds"] = draw(st.integers(0, 200))
    chosen = draw(
        st.dictionaries(st.sampled_from(sorted(_ANNOTATION_VALUES)), st.just(""), max_size=4)
    )
    annotations = {"dlq-sidecar.io/inject": "true", "team.example.com/owner": "orders"}
    for key in chosen:
        annotations[f"dlq-sidecar.io/{key}"] = draw(_ANNOTATION_VALUES[key])
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": spec}


@hsettings(max_examples=300, deadline=None)
@given(pods())
def test_refused_whole_or_patched_whole_and_idempotent(p: Pod) -> None:
    before = copy.deepcopy(p)
    decision = decide(p, "orders", SETTINGS)
    assert p == before  # the decision never changes its input
    if not decision.allowed:
        assert decision.patch == () and decision.note
        return
    assert decision.patch, decision.note
    result: Pod = jsonpatch.apply_patch(p, list(decision.patch))
    spec, old = result["spec"], p["spec"]
    assert [c["name"] for c in spec["initContainers"]].count(CONTAINER_NAME) == 1
    assert [c["name"] for c in spec["containers"]] == [c["name"] for c in old["containers"]]
    changed = [
        i
        for i, (a, b) in enumerate(zip(spec["containers"], old["containers"], strict=True))
        if a != b
    ]
    assert len(changed) == 1  # only the app container, and only its env and mounts
    app, was = spec["containers"][changed[0]], old["containers"][changed[0]]
    assert {k: v for k, v in app.items() if k not in ("env", "volumeMounts")} == {
        k: v for k, v in was.items() if k not in ("env", "volumeMounts")
    }
    assert app["env"][: len(was.get("env", []))] == was.get("env", [])
    assert spec["terminationGracePeriodSeconds"] >= max(
        old.get("terminationGracePeriodSeconds", 0), 0
    )
    choices = read_choices(p["metadata"]["annotations"], SETTINGS)
    assert spec["terminationGracePeriodSeconds"] >= grace_period_s(SETTINGS, choices)
    assert overlay_of(result) == overlay(SETTINGS, choices)
    again = decide(result, "orders", SETTINGS)
    assert again.allowed and again.patch == () and "already has" in again.note


# -- AdmissionReview -----------------------------------------------------------------------------------


def admission_review(obj: Pod, **request: Any) -> bytes:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "orders",
            "object": obj,
            **request,
        },
    }
    return json.dumps(body).encode()


def test_review_answers_with_a_base64_json_patch_and_the_uid() -> None:
    p = pod(inject())
    answer = json.loads(review(admission_review(p), SETTINGS).body)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    result = jsonpatch.apply_patch(p, json.loads(base64.b64decode(response["patch"])))
    assert sidecar_of(result)["name"] == CONTAINER_NAME


def test_review_refuses_with_a_400_and_the_message() -> None:
    answer = json.loads(review(admission_review(pod(inject(app_port="x"))), SETTINGS).body)[
        "response"
    ]
    assert answer["allowed"] is False and "patch" not in answer
    assert answer["status"]["code"] == 400
    assert answer["status"]["message"].startswith(
        "dlq-sidecar: annotation dlq-sidecar.io/app-port: "
    )


@pytest.mark.parametrize(
    "change", [{"operation": "UPDATE"}, {"subResource": "status"}, {"kind": {"kind": "Secret"}}]
)
def test_review_allows_what_is_not_a_pod_create_unchanged(change: dict[str, Any]) -> None:
    answer = json.loads(review(admission_review(pod(inject()), **change), SETTINGS).body)[
        "response"
    ]
    assert answer == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xff",
        b"[]",
        b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 5}}',
    ],
)
def test_review_rejects_what_is_no_admission_review(body: bytes) -> None:
    with pytest.raises(MalformedReview):
        review(body, SETTINGS)


# -- run --overlay -------------------------------------------------------------------------------------

_CONFIG = """\
kafka: {bootstrap.servers: "kafka:9092", group.id: orders}
source: {topics: [orders]}
api: {listen: "127.0.0.1:9999"}
app: {url: "http://127.0.0.1:1/x", timeout.ms: 1500}
"""


def test_the_overlay_is_merged_over_the_file_key_by_key(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(_CONFIG)
    result = patched(pod(inject(app_port="9000")))
    config = load_config(path, env={}, overlay=sidecar_of(result)["args"][4])
    assert str(config.app.url) == "http://127.0.0.1:9000/records"
    assert config.app.timeout_ms == 1500  # the file's own key of the same section stays
    assert config.api.listen == "127.0.0.1:8787"
    assert config.shutdown_drain_timeout_ms == 20000


@pytest.mark.parametrize(("text", "reason"), [("[1, 2]", "mapping"), ("{a: [", "invalid YAML")])
def test_a_bad_overlay_is_a_config_error_naming_it(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(_CONFIG)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={}, overlay=text)
    assert caught.value.file == "--overlay" and reason in str(caught.value)
