"""What the injector does to one pod: the sidecar container, its volumes, and the JSONPatch that adds them.

Owns `decide`, the whole decision for one pod (left alone, refused, or a patch that applies whole),
`sidecar_container` (the chart's container, and the three ways it differs: its docstring) and
`grace_period_s`.

Pure: no I/O, no clock; imports the standard library and the injector's `annotations` and `settings`
modules only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.injector.annotations import (
    APP_CONTAINER,
    APP_PORT,
    STATUS,
    Choices,
    Refusal,
    read_choices,
    wants_injection,
)
from sidecar.injector.settings import InjectorSettings, ProbeSettings

__all__ = ["CONTAINER_NAME", "Decision", "decide", "sidecar_container", "sidecar_volumes"]

CONTAINER_NAME = "dlq-sidecar"
CONFIG_DIR = "/etc/dlq-sidecar"
SOCKET_DIR = "/var/run/dlq-sidecar"
CONFIG_VOLUME = "dlq-sidecar-config"
TMP_VOLUME = "dlq-sidecar-tmp"
SOCKET_VOLUME = "dlq-sidecar-socket"
NEVER_INJECTED = frozenset({"kube-system"})
# What the API server gives a pod that sets no grace period.
DEFAULT_GRACE_S = 30

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer for one pod: ``patch`` empty and ``allowed`` true means left alone (``note`` says why)."""

    allowed: bool
    patch: tuple[Json, ...] = ()
    note: str = ""


def _probe(settings: InjectorSettings, path: str, probe: ProbeSettings) -> Json:
    s = settings.sidecar
    if s.exposure == "pod":
        action: Json = {"httpGet": {"path": path, "port": "sidecar-obs"}}
    else:
        code = (
            f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{s.api_port}{path}', "
            f"timeout={probe.timeout_s})"
        )
        action = {"exec": {"command": ["python", "-c", code]}}
    return {
        **action,
        "periodSeconds": probe.period_s,
        "failureThreshold": probe.failure_threshold,
        "timeoutSeconds": probe.timeout_s,
    }


def overlay(settings: InjectorSettings, choices: Choices) -> Json:
    """The config keys the injector owns, merged over the ConfigMap's (``run --overlay``)."""
    s = settings.sidecar
    api: Json = {"listen": f"127.0.0.1:{s.api_port}"}
    if s.exposure == "pod":
        api["observability.listen"] = f"0.0.0.0:{s.observability_port}"
    app: Json
    if choices.transport == "pull":
        app = {"mode": "pull"}
    elif choices.transport == "unix":
        app = {
            "url": f"http://localhost{choices.push_path}",
            "unix_socket": f"{SOCKET_DIR}/{choices.socket_name}",
        }
    else:
        app = {"url": f"http://127.0.0.1:{choices.app_port}{choices.push_path}"}
    out: Json = {"api": api, "app": app, "shutdown.drain.timeout.ms": choices.drain_timeout_ms}
    if choices.log_level:
        out["logging"] = {"level": choices.log_level}
    return out


def sidecar_container(settings: InjectorSettings, choices: Choices) -> Json:
    """The sidecar container, an item of the pod's ``initContainers``.

    The container is the one the dlq-sidecar chart runs (its ``dlq-sidecar.container`` template): a native
    sidecar (an init container with ``restartPolicy: Always``, started and past its startup probe before the
    app's containers start, stopped after them), the same probes, ports, resources and mounts, and the
    restricted Pod Security Standard on the container itself (non-root, no privilege escalation, read-only
    root filesystem, every capability dropped, seccomp ``RuntimeDefault``: the pod's own settings are the
    app's, so the container may not lean on them). Three things differ, because the ConfigMap is the team's
    own and not rendered by the chart:

    * the keys the chart derives (``api.listen``, ``api.observability.listen``, ``app.url``,
      ``app.unix_socket`` or ``app.mode: pull``, ``shutdown.drain.timeout.ms``, and ``logging.level`` when
      chosen) are passed as ``run --overlay <JSON>``, merged over the ConfigMap's config.yaml;
    * ``XDG_STATE_HOME=/tmp`` puts ``share.journal.path: auto`` in the ``/tmp`` emptyDir, where the chart
      writes ``/tmp/share-journal`` into its own ConfigMap;
    * ``seccompProfile: RuntimeDefault`` is set on the container (the chart sets it on its pod).

    The grace-period rule: the pod's ``terminationGracePeriodSeconds`` becomes at least the app's shutdown
    plus the drain timeout (whole seconds, rounded up) plus the margin, never less than it was.
    """
    s = settings.sidecar
    container: Json = {
        "name": CONTAINER_NAME,
        "image": s.image.reference,
        "imagePullPolicy": s.image.pull_policy,
        "restartPolicy": "Always",
        "args": [
            "run",
            "-c",
            f"{CONFIG_DIR}/config.yaml",
            "--overlay",
            json.dumps(overlay(settings, choices), separators=(",", ":"), sort_keys=True),
        ],
    }
    if s.exposure == "pod":
        container["ports"] = [
            {"name": "sidecar-obs", "containerPort": s.observability_port, "protocol": "TCP"}
        ]
    container["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "XDG_STATE_HOME", "value": "/tmp"},
    ]
    for key, path, probe in (
        ("startupProbe", "/healthz", s.startup_probe),
        ("livenessProbe", "/healthz", s.liveness_probe),
        ("readinessProbe", "/readyz", s.readiness_probe),
    ):
        if probe.enabled:
            container[key] = _probe(settings, path, probe)
    if choices.resources:
        container["resources"] = {k: dict(v) for k, v in choices.resources.items()}
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    mounts: list[Json] = [
        {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
    ]
    if choices.transport == "unix":
        mounts.append({"name": SOCKET_VOLUME, "mountPath": SOCKET_DIR})
    container["volumeMounts"] = mounts
    return container


def sidecar_volumes(choices: Choices) -> list[Json]:
    """The pod volumes the sidecar needs (as the chart's ``dlq-sidecar.volumes``)."""
    volumes: list[Json] = [
        {"name": CONFIG_VOLUME, "configMap": {"name": choices.config_map}},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    if choices.transport == "unix":
        volumes.append({"name": SOCKET_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})
    return volumes


def app_env(settings: InjectorSettings, choices: Choices) -> list[Json]:
    """The app container's variables (as the chart's ``dlq-sidecar.appEnv``)."""
    env: list[Json] = [
        {"name": "DLQ_SIDECAR_URL", "value": f"http://127.0.0.1:{settings.sidecar.api_port}"}
    ]
    if choices.transport == "unix":
        env.append(
            {"name": "DLQ_SIDECAR_APP_SOCKET", "value": f"{SOCKET_DIR}/{choices.socket_name}"}
        )
    elif choices.transport == "tcp":
        env.append({"name": "DLQ_SIDECAR_APP_PORT", "value": str(choices.app_port)})
    return env


def grace_period_s(settings: InjectorSettings, choices: Choices) -> int:
    """The app's shutdown, then the sidecar's drain (rounded up to whole seconds), then the margin.

    :func:`decide` is the whole decision for one pod: left alone (not asked, already has the container, in
    kube-system), refused (:class:`sidecar.injector.annotations.Refusal`, nothing patched), or a patch that
    applies as a whole. Pure: no I/O, no clock; imports the standard library and the injector's
    `annotations` and `settings` modules only.
    """
    drain_s = -(-choices.drain_timeout_ms // 1000)
    return choices.app_shutdown_s + drain_s + settings.sidecar.margin_s


# -- the decision ----------------------------------------------------------------------------------


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Refusal(f"{where} is not a list")
    return value


def _names(items: Sequence[Any]) -> set[str]:
    return {str(item.get("name")) for item in items if isinstance(item, Mapping)}


def _escape(key: str) -> str:
    """A JSON Pointer reference token (RFC 6901): ``~`` then ``/`` escaped."""
    return key.replace("~", "~0").replace("/", "~1")


def _append(path: str, existing: list[Any] | None, items: Sequence[Json]) -> list[Json]:
    """JSONPatch operations that append ``items`` to the list at ``path`` (created when absent)."""
    if existing is None:
        return [{"op": "add", "path": path, "value": list(items)}]
    return [{"op": "add", "path": f"{path}/-", "value": item} for item in items]


def _has_sidecar(spec: Mapping[str, Any]) -> bool:
    for key in ("initContainers", "containers"):
        if CONTAINER_NAME in _names(_list(spec.get(key), f"spec.{key}")):
            return True
    return False


def decide(pod: Mapping[str, Any], namespace: str, settings: InjectorSettings) -> Decision:
    """The injector's answer for a pod being created in ``namespace``."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if not isinstance(metadata, Mapping) or not isinstance(spec, Mapping):
        return Decision(False, note="the object is not a pod (metadata or spec is not a mapping)")
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        return Decision(False, note="metadata.annotations is not a mapping")
    try:
        if not wants_injection(annotations):
            return Decision(True, note='not asked for (no dlq-sidecar.io/inject: "true")')
        if namespace in NEVER_INJECTED:
            return Decision(True, note=f"namespace {namespace} is never injected")
        if _has_sidecar(spec):
            return Decision(True, note=f"already has a {CONTAINER_NAME} container")
        choices = read_choices(annotations, settings)
        return Decision(True, tuple(_patch(spec, settings, choices)), note="injected")
    except Refusal as exc:
        return Decision(False, note=str(exc))


def _patch(spec: Mapping[str, Any], settings: InjectorSettings, choices: Choices) -> list[Json]:
    if spec.get("hostNetwork") is True:
        raise Refusal(
            "hostNetwork pods are not injected: the sidecar's loopback control API would be shared "
            "with the node"
        )
    containers = _list(spec.get("containers"), "spec.containers")
    if not containers:
        raise Refusal("the pod has no containers")
    names = [str(c.get("name")) if isinstance(c, Mapping) else "" for c in containers]
    if choices.app_container is None:
        index = 0
    elif choices.app_container in names:
        index = names.index(choices.app_container)
    else:
        raise Refusal(
            f"annotation {APP_CONTAINER}: no container {choices.app_container!r} in the pod "
            f"(containers: {', '.join(names)})"
        )
    app = containers[index]
    if not isinstance(app, Mapping):
        raise Refusal(f"spec.containers[{index}] is not a mapping")

    # Containers of a pod share one network namespace: the sidecar's ports must be free.
    s = settings.sidecar
    taken = {
        int(port["containerPort"]): str(container.get("name"))
        for key in ("containers", "initContainers")
        for container in _list(spec.get(key), f"spec.{key}")
        if isinstance(container, Mapping)
        for port in _list(container.get("ports"), "ports")
        if isinstance(port, Mapping) and isinstance(port.get("containerPort"), int)
    }
    ours = {s.api_port: "the control API"}
    if s.exposure == "pod":
        ours[s.observability_port] = "the observability listener"
    if choices.transport == "tcp" and choices.app_port in ours:
        raise Refusal(
            f"annotation {APP_PORT}: {choices.app_port} is the sidecar's port for {ours[choices.app_port]}"
        )
    for port, what in sorted(ours.items()):
        if port in taken:
            raise Refusal(
                f"container {taken[port]!r} uses port {port}, the sidecar's port for {what}"
            )

    volumes = spec.get("volumes")
    new_volumes = sidecar_volumes(choices)
    clash = _names(_list(volumes, "spec.volumes")) & _names(new_volumes)
    if clash:
        raise Refusal(f"the pod already has a volume named {sorted(clash)[0]!r}")
    env = app.get("env")
    new_env = app_env(settings, choices)
    clash = _names(_list(env, "env")) & _names(new_env)
    if clash:
        raise Refusal(
            f"container {names[index]!r} already sets {sorted(clash)[0]}: the injector sets it"
        )
    mounts = app.get("volumeMounts")
    new_mounts: list[Json] = []
    if choices.transport == "unix":
        if any(
            isinstance(m, Mapping) and m.get("mountPath") == SOCKET_DIR
            for m in _list(mounts, "volumeMounts")
        ):
            raise Refusal(f"container {names[index]!r} already mounts something at {SOCKET_DIR}")
        new_mounts.append({"name": SOCKET_VOLUME, "mountPath": SOCKET_DIR})

    ops: list[Json] = []
    ops += _append(
        "/spec/initContainers", spec.get("initContainers"), [sidecar_container(settings, choices)]
    )
    ops += _append("/spec/volumes", volumes, new_volumes)
    ops += _append(f"/spec/containers/{index}/env", env, new_env)
    if new_mounts:
        ops += _append(f"/spec/containers/{index}/volumeMounts", mounts, new_mounts)
    current = spec.get("terminationGracePeriodSeconds")
    needed = grace_period_s(settings, choices)
    if not isinstance(current, int) or current < needed:
        op = "replace" if "terminationGracePeriodSeconds" in spec else "add"
        ops.append({"op": op, "path": "/spec/terminationGracePeriodSeconds", "value": needed})
    ops.append(
        {"op": "add", "path": f"/metadata/annotations/{_escape(STATUS)}", "value": "injected"}
    )
    return ops
