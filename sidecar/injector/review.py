"""AdmissionReview (``admission.k8s.io/v1``) in and out: the bytes the API server sends, the bytes it gets.

Owns `review` (the request, response and refusal shapes: its docstring) and `MalformedReview`.

Pure: imports the standard library and `sidecar.injector.patch`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.core.errors import SidecarError
from sidecar.injector.patch import Decision, decide
from sidecar.injector.settings import InjectorSettings

__all__ = ["API_VERSION", "MalformedReview", "Reviewed", "review"]

API_VERSION = "admission.k8s.io/v1"


class MalformedReview(SidecarError, ValueError):
    """A request body that is not an ``admission.k8s.io/v1`` AdmissionReview with a request."""


@dataclass(frozen=True, slots=True)
class Reviewed:
    """The response body and what was decided, for the log line."""

    body: bytes
    decision: Decision
    namespace: str
    name: str


def _request(body: bytes) -> Mapping[str, Any]:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedReview(f"not JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise MalformedReview("not a JSON object")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != "AdmissionReview":
        raise MalformedReview(f"expected an {API_VERSION} AdmissionReview")
    request = data.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise MalformedReview("no request with a uid")
    return request


def review(body: bytes, settings: InjectorSettings) -> Reviewed:
    """The AdmissionReview response to ``body``; MalformedReview when it is none.

    ::

        request   {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "request": {"uid": ..., "kind": {"kind": "Pod"}, "resource": {"resource": "pods"},
                               "operation": "CREATE", "namespace": ..., "object": <the pod>, ...}}
        response  {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": <the request's>, "allowed": true,
                                "patchType": "JSONPatch", "patch": <base64 of the JSON patch>}}
        refusal   ... "response": {"uid": ..., "allowed": false,
                                   "status": {"code": 400, "reason": "BadRequest", "message": ...}}

    Anything but a pod CREATE (the webhook is registered for those only) is allowed unchanged. A body that
    is not an AdmissionReview is :class:`MalformedReview` (the server answers 400, and the API server
    applies the webhook's failurePolicy).
    """
    request = _request(body)
    kind = request.get("kind") or {}
    resource = request.get("resource") or {}
    pod = request.get("object")
    namespace = str(request.get("namespace") or "")
    is_pod_create = (
        request.get("operation") == "CREATE"
        and isinstance(kind, Mapping)
        and kind.get("kind") == "Pod"
        and isinstance(resource, Mapping)
        and resource.get("resource") == "pods"
        and not request.get("subResource")
        and isinstance(pod, Mapping)
    )
    name = ""
    if is_pod_create:
        assert isinstance(pod, Mapping)
        metadata = pod.get("metadata") or {}
        if isinstance(metadata, Mapping):
            name = str(metadata.get("name") or metadata.get("generateName") or "")
            namespace = namespace or str(metadata.get("namespace") or "")
        decision = decide(pod, namespace, settings)
    else:
        decision = Decision(True, note="not a pod CREATE")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "code": 400,
            "reason": "BadRequest",
            "message": f"dlq-sidecar: {decision.note}",
        }
    elif decision.patch:
        patch = json.dumps(list(decision.patch), separators=(",", ":")).encode()
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch).decode("ascii")
    out = {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
    return Reviewed(json.dumps(out, separators=(",", ":")).encode(), decision, namespace, name)
