"""The image, the chart and the injector on a node that runs pods (tests/kubenode.py).

Every pod runs the image scripts/build-image made from the Dockerfile, and the example Python app's image; the
pods reach the broker on the node IP. What is checked is what the kubelet and the sidecar did: container
states and timestamps from the API, the app's decision log from the kubelet's log files, the topics.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.kubenode import Node, host_state
from tests.node.conftest import NodeHandle

pytestmark = pytest.mark.slow

Obj = dict[str, Any]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def test_a_pod_runs_on_the_node(node: Node, unique: str) -> None:
    cluster = node.cluster
    namespace = f"p-{unique}"[:60].lower()
    cluster.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    wait_for(
        lambda: cluster.exists(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
        60,
        "the default ServiceAccount",
    )
    cluster.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": "app"},
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "image": node.app_image,
                        "imagePullPolicy": "Never",
                        "args": ["--host", "0.0.0.0", "--port", "8080"],
                    }
                ]
            },
        },
    )

    def running() -> bool:
        pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/app")
        return bool(pod.get("status", {}).get("phase") == "Running")

    wait_for(running, 120, "the pod to run")
    print(json.dumps({"node_started_s": round(node.started_s, 1)}))


def test_the_node_leaves_the_host_as_it_found_it(node_handle: NodeHandle) -> None:
    """Runs last: stops the node, then compares the host's rules, routes, links and kernel settings."""
    node_handle.stop()
    after = host_state()
    for key, before in node_handle.host_before.items():
        assert after[key] == before, f"{key} changed:\nbefore:\n{before}\nafter:\n{after[key]}"
    print(json.dumps({"node_stopped_s": round(node_handle.stopped_s or 0, 1)}))
