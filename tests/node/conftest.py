"""The node the tests of this folder share (tests/kubenode.py), and the host's state around it.

One node per session (the tests of this folder are one file, so one worker has it): etcd, the control plane,
containerd and the kubelet v1.37.2 from the cache scripts/install-kube fills, the image scripts/build-image
makes. ``host_before`` is the host's iptables rules, routes, links and kernel settings before the node started;
the last test stops the node and compares.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.images import sidecar_image
from tests.integration.conftest import helm, promtool  # noqa: F401 - the chart tests' tools, here too
from tests.kubecluster import kube_bin_dir
from tests.kubenode import Node, cache_dir, host_state, runtime_root, start_node

NODE_BINARIES = ("kubelet", "kube-controller-manager", "kube-scheduler")


class NodeHandle:
    """The running node, and the means to stop it before the session ends (the host check does)."""

    def __init__(self, node: Node, stack: ExitStack, host_before: dict[str, str]) -> None:
        self.node = node
        self.host_before = host_before
        self.stopped_s: float | None = None
        self._stack = stack

    def stop(self) -> None:
        if self.stopped_s is None:
            started = time.monotonic()
            self._stack.close()
            self.stopped_s = time.monotonic() - started


@pytest.fixture(scope="session")
def node_handle() -> Iterator[NodeHandle]:
    bin_dir = kube_bin_dir()
    missing = [
        name
        for name in NODE_BINARIES
        if bin_dir is None or not os.access(Path(bin_dir) / name, os.X_OK)
    ]
    if bin_dir is None or missing or not (runtime_root() / "usr" / "bin" / "containerd").exists():
        pytest.fail(
            f"the node's parts are missing ({missing or 'etcd/kube-apiserver/containerd'} in "
            f"{cache_dir()}): run scripts/install-kube",
            pytrace=False,
        )
    image = sidecar_image(save=True)
    assert image.archive is not None
    host_before = host_state()
    stack = ExitStack()
    node = stack.enter_context(start_node(Path(bin_dir), image.archive, image.reference))
    handle = NodeHandle(node, stack, host_before)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def node(node_handle: NodeHandle) -> Node:
    return node_handle.node
