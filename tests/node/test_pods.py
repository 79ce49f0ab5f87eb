"""The image, the chart and the injector on a node that runs pods (tests/kubenode.py).

Every pod runs the image scripts/build-image made from the Dockerfile and the example Python app's image; the
pods reach the broker on the node IP. What is checked is what the kubelet and the sidecar did: container states
and timestamps from the API, the containers' log files as the kubelet wrote them, the topics and the group's
commits; for a sidecar killed by its memory limit, the alert its scraped series page (tests/node/scrapes.py).
The file's last test stops the node and compares the host with what it was before.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from tests.integration.test_helm import CHART as SIDECAR_CHART
from tests.integration.test_helm import run_helm
from tests.kafkatools import Broker, Rec
from tests.kubecluster import KubeCluster
from tests.kubenode import Node, host_state
from tests.node.conftest import NodeHandle
from tests.node.scrapes import RULES, Recording, replay

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
INJECTOR_CHART = ROOT / "deploy" / "helm" / "dlq-sidecar-injector"
Obj = dict[str, Any]
DRAIN_MS = 5000
POD_TIMEOUT_S = 180.0


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def namespace(cluster: KubeCluster, name: str, labels: dict[str, str] | None = None) -> str:
    cluster.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})
    wait_for(
        lambda: cluster.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        60,
        f"the default ServiceAccount of {name}",
    )
    return name


def pods(cluster: KubeCluster, ns: str, selector: str = "") -> list[Obj]:
    query = f"?labelSelector={selector}" if selector else ""
    found: list[Obj] = cluster.get(f"/api/v1/namespaces/{ns}/pods{query}")["items"]
    return found


def condition(pod: Obj, kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def statuses(pod: Obj) -> dict[str, Obj]:
    status = pod.get("status", {})
    return {
        s["name"]: s
        for s in status.get("initContainerStatuses", []) + status.get("containerStatuses", [])
    }


def ready_pods(cluster: KubeCluster, ns: str, selector: str, n: int) -> list[Obj]:
    def ready() -> list[Obj] | None:
        found = [
            p
            for p in pods(cluster, ns, selector)
            if condition(p, "Ready") and not p["metadata"].get("deletionTimestamp")
        ]
        return found if len(found) == n else None

    try:
        result: list[Obj] = wait_for(ready, POD_TIMEOUT_S, f"{n} ready pod(s) in {ns}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(cluster, ns)}") from None
    return result


def describe(cluster: KubeCluster, ns: str) -> str:
    """The namespace's pods' container states and its events, for a failure's message."""
    lines = []
    for pod in pods(cluster, ns):
        lines.append(f"pod {pod['metadata']['name']}: {pod.get('status', {}).get('conditions')}")
        for name, status in statuses(pod).items():
            lines.append(f"  {name}: ready={status.get('ready')} {status.get('state')}")
    for event in cluster.get(f"/api/v1/namespaces/{ns}/events")["items"][-30:]:
        lines.append(
            f"event {event['involvedObject']['name']}: {event['reason']}: {event['message']}"
        )
    return "\n".join(lines)


def container_log(node: Node, pod: Obj, container: str) -> list[tuple[str, str]]:
    """(time, line) of a container's log as the kubelet keeps it (CRI format), every restart included."""
    meta = pod["metadata"]
    folder = node.directory / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    lines: list[tuple[str, str]] = []
    for path in sorted((folder / container).glob("*.log")):
        for raw in path.read_text(errors="replace").splitlines():
            stamp, _, rest = raw.partition(" ")
            lines.append((stamp, rest.split(" ", 2)[-1]))
    return lines


def order(order_id: str, kind: str = "ok") -> Rec:
    return Rec(key=order_id.encode(), value=json.dumps({"id": order_id, "kind": kind}).encode())


def helm_run(node: Node, helm: str, *args: str) -> None:
    proc = run_helm(helm, "--kubeconfig", str(node.cluster.kubeconfig), *args)
    assert proc.returncode == 0, proc.stderr


def image_values(reference: str) -> Obj:
    repository, _, tag = reference.rpartition(":")
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


def chart_values(node: Node, group: str, topic: str, app_port: int = 8080) -> Obj:
    return {
        "app": {
            "image": image_values(node.app_image),
            "args": ["--host", "127.0.0.1", "--port", str(app_port)],
            "env": [{"name": "SIDECAR_API", "value": "http://127.0.0.1:8787"}],
            "shutdownSeconds": 2,
        },
        "sidecar": {
            "image": image_values(node.sidecar_image),
            "config": {
                "kafka": {"bootstrap.servers": node.pod_bootstrap, "group.id": group},
                "source": {"topics": [topic]},
                "commit.interval.ms": 200,
                "errors.retry.delay.initial.ms": 100,
                "errors.retry.delay.max.ms": 500,
            },
            "shutdown": {"drainTimeoutMs": DRAIN_MS, "marginSeconds": 3},
            "readinessProbe": {"periodSeconds": 1, "failureThreshold": 1},
        },
    }


def install(node: Node, helm: str, tmp_path: Path, release: str, ns: str, values: Obj) -> None:
    path = tmp_path / f"{release}-values.yaml"
    path.write_text(yaml.safe_dump(values))
    helm_run(
        node, helm, "upgrade", "--install", release, str(SIDECAR_CHART), "-n", ns, "-f", str(path)
    )


RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


class Feeder:
    """Produces ok orders at a steady pace (one producer) until stopped; `ids` is what was written."""

    def __init__(self, broker: Broker, topic: str, prefix: str, per_s: float = 20.0) -> None:
        self.ids: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                self.errors.append(str(err))

        def run() -> None:
            n = 0
            while not self._stop.wait(1 / per_s):
                rec = order(f"{prefix}-{n}")
                producer.produce(topic, key=rec.key, value=rec.value, on_delivery=delivered)
                producer.poll(0)
                self.ids.append(f"{prefix}-{n}")
                n += 1
            remaining = producer.flush(30)
            if remaining:
                self.errors.append(f"{remaining} records not flushed")

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self.errors, self.errors[:3]


@contextmanager
def feeding(broker: Broker, topic: str, prefix: str) -> Iterator[Feeder]:
    feeder = Feeder(broker, topic, prefix)
    try:
        yield feeder
    finally:
        feeder.stop()


def committed_to_end(broker: Broker, group: str, topic: str, partitions: int = 1) -> bool:
    ends = broker.end_offsets(topic, range(partitions))
    done = broker.committed(group, topic, range(partitions))
    return all(done[p][0] == ends[p] for p in ends)


def stamp(value: str) -> str:
    """An RFC 3339 time of the API (seconds) or of a CRI log line (nanoseconds), comparable as text."""
    bare = value.replace("Z", "")
    if "." not in bare:
        bare += "."  # the API's seconds: the same second, before any fraction of it
    return bare.ljust(29, "0")


# -- the chart's Deployment ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def orders(node: Node, helm: str, tmp_path_factory: pytest.TempPathFactory) -> Obj:
    """The chart installed with the example app, in a namespace enforcing the restricted standard."""
    broker = Broker(node.bootstrap)
    ns = namespace(node.cluster, "orders", RESTRICTED)
    topic = broker.create_topic("orders")
    install(
        node,
        helm,
        tmp_path_factory.mktemp("orders"),
        "orders",
        ns,
        chart_values(node, "orders-app", topic),
    )
    return {
        "ns": ns,
        "topic": topic,
        "group": "orders-app",
        "broker": broker,
        "selector": "app.kubernetes.io/instance=orders",
    }


def test_the_sidecar_starts_first_records_flow_and_a_poison_record_reaches_the_dlq(
    node: Node, orders: Obj
) -> None:
    started = time.monotonic()
    (pod,) = ready_pods(node.cluster, orders["ns"], orders["selector"], 1)
    ready_s = time.monotonic() - started
    running = {name: s["state"]["running"] for name, s in statuses(pod).items()}
    assert set(running) == {"dlq-sidecar", "app"}, statuses(pod)
    assert pod["spec"]["initContainers"][0]["restartPolicy"] == "Always"  # a native sidecar
    assert running["dlq-sidecar"]["startedAt"] <= running["app"]["startedAt"]
    # The kubelet started the app once the sidecar's startup probe (/healthz) passed: the sidecar's
    # first log line is older than the app's.
    sidecar_log = container_log(node, pod, "dlq-sidecar")
    app_log = wait_for(lambda: container_log(node, pod, "app"), 30, "the app's log")
    assert stamp(sidecar_log[0][0]) < stamp(app_log[0][0]), (sidecar_log[:2], app_log[:2])
    assert statuses(pod)["dlq-sidecar"]["started"] is True

    broker: Broker = orders["broker"]
    ids = [f"first-{n}" for n in range(20)]
    broker.produce(orders["topic"], [order(i) for i in ids[:10]] + [order("bad-1", "poison")])
    broker.produce(orders["topic"], [order(i) for i in ids[10:]])

    def accepted() -> set[str]:
        return {
            m.group(1)
            for _, line in container_log(node, pod, "app")
            if (m := re.match(r"order=(\S+) kind=ok delivery=\d+ answer=accept", line))
        }

    wait_for(lambda: set(ids) <= accepted(), 60, "the orders at the app")
    (dead,) = broker.read_topic(f"dlq.{orders['topic']}", expected=1, timeout_s=60)
    headers = dead.headers_by_name()
    assert headers["__dlq.errors.exception.class.name"] == [b"OrderValidationError"]
    assert headers["__dlq.errors.offset"] == [b"10"]
    wait_for(lambda: committed_to_end(broker, orders["group"], orders["topic"]), 30, "the commits")
    print(json.dumps({"chart_pod_ready_s": round(ready_s, 1)}))


def test_deleting_the_pod_drains_the_sidecar_after_the_app_and_loses_nothing(
    node: Node, orders: Obj
) -> None:
    cluster, ns, broker = node.cluster, orders["ns"], orders["broker"]
    (pod,) = ready_pods(cluster, ns, orders["selector"], 1)
    name = pod["metadata"]["name"]
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    # A finalizer keeps the deleted pod's object, with its containers' last states, until the test reads them.
    cluster.request(
        "PATCH",
        path,
        {"metadata": {"finalizers": ["dlq-sidecar.test/keep"]}},
        content_type="application/merge-patch+json",
    )
    with feeding(broker, orders["topic"], "del") as feeder:
        wait_for(lambda: len(feeder.ids) >= 20, 30, "records flowing")
        cluster.delete(path)
        kept: dict[str, list[tuple[str, str]]] = {}

        def both_terminated() -> dict[str, Obj] | None:
            for container in ("app", "dlq-sidecar"):
                kept[container] = container_log(node, pod, container) or kept.get(container, [])
            found = statuses(cluster.get(path))
            if all(
                "terminated" in found.get(c, {}).get("state", {}) for c in ("app", "dlq-sidecar")
            ):
                return found
            return None

        final = wait_for(both_terminated, 60, "both containers of the deleted pod to stop")
        ready_pods(cluster, ns, orders["selector"], 1)  # the Deployment's replacement
        wait_for(lambda: len(feeder.ids) >= 60, 30, "records flowing to the new pod")
    app_end = final["app"]["state"]["terminated"]
    sidecar_end = final["dlq-sidecar"]["state"]["terminated"]
    assert sidecar_end["exitCode"] == 0, sidecar_end
    assert app_end["finishedAt"] <= sidecar_end["finishedAt"], (app_end, sidecar_end)
    draining = [t for t, line in kept["dlq-sidecar"] if "draining" in line]
    assert draining, kept["dlq-sidecar"][-5:]
    # The sidecar was told to stop once the app had exited (the API's times are whole seconds).
    assert stamp(draining[0]) >= stamp(app_end["finishedAt"]), (draining, app_end)
    assert any("stopped cleanly" in line for _, line in kept["dlq-sidecar"])
    cluster.request(
        "PATCH",
        path,
        {"metadata": {"finalizers": None}},
        content_type="application/merge-patch+json",
    )

    # Nothing lost: every record is committed, and the DLQ still holds the one poison record only.
    wait_for(lambda: committed_to_end(broker, orders["group"], orders["topic"]), 60, "the commits")
    assert broker.count_records(f"dlq.{orders['topic']}") == 1


def test_the_readiness_probe_gates_the_pod_while_the_app_cannot_be_reached(
    node: Node, helm: str, tmp_path: Path
) -> None:
    cluster, broker = node.cluster, Broker(node.bootstrap)
    ns = namespace(cluster, "gated", RESTRICTED)
    # Two partitions: during the rollout below, the new pod is ready only once it has one (its
    # readiness check `assigned`), and the old one stops only once the new one is ready (maxUnavailable 0).
    topic = broker.create_topic("gated", partitions=2)
    # The app listens on 8081; the sidecar delivers to 8080: refused.
    values = chart_values(node, "gated-app", topic, app_port=8081)
    install(node, helm, tmp_path, "gated", ns, values)
    broker.produce(topic, [order("g-1")])
    selector = "app.kubernetes.io/instance=gated"

    def refused_and_running() -> Obj | None:
        for pod in pods(cluster, ns, selector):
            found = statuses(pod)
            if found.get("app", {}).get("state", {}).get("running") and any(
                "Readiness probe failed" in e.get("message", "")
                for e in cluster.get(
                    f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name={pod['metadata']['name']}"
                )["items"]
            ):
                return pod
        return None

    pod = wait_for(refused_and_running, POD_TIMEOUT_S, "a failed readiness probe")
    pod = cluster.get(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
    assert not condition(pod, "Ready"), pod["status"]["conditions"]
    assert statuses(pod)["dlq-sidecar"]["ready"] is False
    assert statuses(pod)["dlq-sidecar"]["started"] is True
    slices = cluster.get(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices")["items"]
    endpoints = [e for s in slices for e in s.get("endpoints") or []]
    assert endpoints and not any(e["conditions"].get("ready") for e in endpoints), endpoints

    # The app on the port the sidecar uses: the new pod becomes ready and the record arrives.
    install(node, helm, tmp_path, "gated", ns, chart_values(node, "gated-app", topic))
    (ready,) = ready_pods(cluster, ns, selector, 1)
    wait_for(
        lambda: any("order=g-1 kind=ok" in line for _, line in container_log(node, ready, "app")),
        60,
        "the record at the app",
    )


def test_the_restricted_standard_is_enforced_in_the_namespaces_the_pods_were_admitted_to(
    node: Node, orders: Obj
) -> None:
    cluster = node.cluster
    labels = cluster.get(f"/api/v1/namespaces/{orders['ns']}")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ready_pods(cluster, orders["ns"], orders["selector"], 1)
    with pytest.raises(Exception, match="violates PodSecurity"):
        cluster.create(
            f"/api/v1/namespaces/{orders['ns']}/pods",
            {
                "metadata": {"name": "root"},
                "spec": {"containers": [{"name": "app", "image": node.app_image}]},
            },
        )


# -- the injector ----------------------------------------------------------------------------------------------


def test_the_injector_adds_the_sidecar_and_a_rollout_loses_nothing(
    node: Node, helm: str, tmp_path: Path
) -> None:
    cluster, broker = node.cluster, Broker(node.bootstrap)
    system = namespace(cluster, "dlq-system")
    repository, _, tag = node.sidecar_image.rpartition(":")
    helm_run(
        node, helm, "install", "injector", str(INJECTOR_CHART), "-n", system,
        "--set", "replicaCount=1", "--set", f"image.repository={repository}",
        "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
        "--set", f"inject.sidecar.image.repository={repository}",
        "--set", f"inject.sidecar.image.tag={tag}", "--set", "inject.sidecar.image.pullPolicy=Never",
        "--set", f"inject.sidecar.shutdown.drainTimeoutMs={DRAIN_MS}",
    )  # fmt: skip
    ready_pods(cluster, system, "app.kubernetes.io/instance=injector", 1)

    ns = namespace(cluster, "shop", {"dlq-sidecar.io/injection": "enabled", **RESTRICTED})
    topic = broker.create_topic(
        "payments", partitions=2
    )  # the surge pod gets one (it is ready then)
    config = {
        "kafka": {"bootstrap.servers": node.pod_bootstrap, "group.id": "billing"},
        "source": {"topics": [topic]},
        "commit.interval.ms": 200,
    }
    cluster.create(
        f"/api/v1/namespaces/{ns}/configmaps",
        {"metadata": {"name": "billing"}, "data": {"config.yaml": yaml.safe_dump(config)}},
    )
    labels = {"app": "billing"}

    def template(revision: str) -> Obj:
        return {
            "metadata": {
                "labels": labels,
                "annotations": {
                    "dlq-sidecar.io/inject": "true",
                    "dlq-sidecar.io/config": "billing",
                    "revision": revision,
                },
            },
            "spec": {
                "terminationGracePeriodSeconds": 15,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 10001,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "app",
                        "image": node.app_image,
                        "imagePullPolicy": "Never",
                        "args": ["--host", "127.0.0.1", "--port", "8080", "--quiet"],
                        "env": [{"name": "SIDECAR_API", "value": "http://127.0.0.1:8787"}],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            },
        }

    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"
    cluster.create(
        deployments,
        {
            "metadata": {"name": "billing"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                },
                "template": template("1"),
            },
        },
    )
    (first,) = ready_pods(cluster, ns, "app=billing", 1)
    injected = [c["name"] for c in first["spec"].get("initContainers", [])]
    assert injected == ["dlq-sidecar"], first["spec"]
    assert statuses(first)["dlq-sidecar"]["state"].get("running"), statuses(first)

    started = time.monotonic()
    with feeding(broker, topic, "roll") as feeder:
        wait_for(lambda: len(feeder.ids) >= 20, 30, "records flowing")
        cluster.request(
            "PATCH",
            f"{deployments}/billing",
            {"spec": {"template": template("2")}},
            content_type="application/merge-patch+json",
        )

        def rolled() -> Obj | None:
            found = ready_pods(cluster, ns, "app=billing", 1)
            current = [p for p in pods(cluster, ns, "app=billing")]
            if len(current) == 1 and found[0]["metadata"]["name"] != first["metadata"]["name"]:
                return found[0]
            return None

        second = wait_for(rolled, POD_TIMEOUT_S, "the rollout")
        rollout_s = time.monotonic() - started
        during = len(feeder.ids)
        wait_for(lambda: len(feeder.ids) >= during + 20, 30, "records after the rollout")
    assert second["metadata"]["annotations"]["revision"] == "2"
    assert [c["name"] for c in second["spec"]["initContainers"]] == ["dlq-sidecar"]
    # 0 lost: every record committed (accepted, since none was dead-lettered); no innocent record in the DLQ.
    wait_for(lambda: committed_to_end(broker, "billing", topic, 2), 60, "the commits")
    assert broker.count_records(f"dlq.{topic}") == 0
    print(json.dumps({"rollout_s": round(rollout_s, 1), "records": len(feeder.ids)}))


# -- a record larger than the memory allows -------------------------------------------------------------------

MiB = 1024 * 1024
SIZED_LIMIT = "96Mi"
SIZED_BUDGET = 32 * MiB  # 55 MiB + 32 MiB + 16 KiB a partition: within 96 Mi by the sizing rule
BIG_RECORD_BYTES = 60_000_000  # over the budget; librdkafka fetches a record batch whole


def produce_big(broker: Broker, topic: str, errors: list[str]) -> None:
    value = json.dumps({"id": "big-1", "kind": "ok", "pad": "x" * BIG_RECORD_BYTES}).encode()
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "message.max.bytes": 2 * len(value)}
    )

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    producer.produce(topic, key=b"big-1", value=value, on_delivery=delivered)
    if producer.flush(60):
        errors.append("the big record was not flushed")


def runbook_sections() -> dict[str, str]:
    """docs/runbook.md's sections by heading."""
    text = (ROOT / "docs" / "runbook.md").read_text()
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"^## (\S+)\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    }


def crash_looping(sample: Any) -> bool:
    """The sample saw the sidecar's container waiting in CrashLoopBackOff."""
    return bool(
        sample.container.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
    )


def test_an_oom_killed_sidecar_is_restarted_pages_the_runbook_s_alert_and_its_remedy_works(
    node: Node, helm: str, promtool: str, tmp_path: Path
) -> None:
    """A pod sized by the sizing rule, scraped while healthy; one record larger than its budget, fetched
    whole, takes the sidecar past its limit: the kubelet restarts it (OOMKilled), the next process fetches
    the same record and is killed again. The series the node showed, replayed through promtool, page the
    alert whose runbook section says what to do about OOMKilled; the limit that section gives lets the record
    through."""
    cluster, broker = node.cluster, Broker(node.bootstrap)
    ns = namespace(cluster, "sized", RESTRICTED)
    topic = broker.create_topic("uploads", config={"max.message.bytes": str(64 * MiB)})
    values = chart_values(node, "uploads-app", topic)
    values["sidecar"]["config"]["max.buffered.bytes"] = SIZED_BUDGET
    # A killed member holds its partition until its session expires: 10 s instead of 45 keeps the
    # restarts (and the remedy's rollout) from waiting for it.
    values["sidecar"]["config"]["kafka"]["session.timeout.ms"] = 10000
    values["sidecar"]["resources"] = {
        "requests": {"cpu": "50m", "memory": SIZED_LIMIT},
        "limits": {"memory": SIZED_LIMIT},
    }
    install(node, helm, tmp_path, "sized", ns, values)
    try:
        (pod,) = ready_pods(cluster, ns, "app.kubernetes.io/instance=sized", 1)
        broker.produce(topic, [order(f"small-{n}") for n in range(5)])
        wait_for(lambda: committed_to_end(broker, "uploads-app", topic), 60, "the small records")
        sidecar_log = [line for _, line in container_log(node, pod, "dlq-sidecar")]
        assert not any("past its memory limit" in line for line in sidecar_log), sidecar_log

        with node.reach(pod["status"]["podIP"], 8788) as address:
            recording = Recording(cluster, pod, address, job="sized-dlq-sidecar")
            healthy = recording.until(
                lambda s: s.up and s.slot >= 2, 30, "three scrapes of the healthy sidecar"
            )
            assert any("dlq_sidecar_source_topic_info" in name for name in healthy.series)
            errors: list[str] = []
            producing = threading.Thread(target=produce_big, args=(broker, topic, errors))
            produced = time.monotonic()
            producing.start()
            first = recording.until(
                lambda s: s.container["restartCount"] >= 1, 120, "the first kill"
            )
            first_kill_s = time.monotonic() - produced
            producing.join(60)
            assert not errors, errors
            # The restarted sidecar gets the partition back (once the killed member's session has
            # expired), fetches the same record and is killed again: a loop that does not end.
            last = recording.until(
                lambda s: s.container["restartCount"] >= 2, 180, "the second kill"
            )
            second_kill_s = time.monotonic() - produced
            # The kubelet backs off before the next start (CrashLoopBackOff); on a fast machine the
            # samples up to the second kill may all have caught the container running.
            looping = next((s for s in recording.samples if crash_looping(s)), None)
            if looping is None:
                looping = recording.until(crash_looping, 60, "the container in CrashLoopBackOff")
        killed = first.container["lastState"]["terminated"]
        assert killed["reason"] == "OOMKilled" and killed["exitCode"] == 137, killed
        assert last.container["lastState"]["terminated"]["reason"] == "OOMKilled", last.container
        assert any(crash_looping(s) for s in recording.samples), [
            s.container.get("state") for s in recording.samples
        ]
        app = statuses(cluster.get(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}"))[
            "app"
        ]
        assert app["restartCount"] == 0 and "running" in app["state"], app
        # Nothing past the big record is committed: each new process fetches it again.
        end = broker.end_offsets(topic, [0])[0]
        assert broker.committed("uploads-app", topic, [0])[0][0] == end - 1

        # The alert: silent while healthy, DlqSidecarRestarting once killed, and no other page.
        labels = {"severity": "critical", "namespace": ns, "pod": pod["metadata"]["name"]}
        replay(
            promtool,
            recording,
            [
                {
                    "eval_time": Recording.at(healthy),
                    "alertname": "DlqSidecarRestarting",
                    "exp_alerts": [],
                },
                {
                    # Two restarts page through the CrashLoopBackOff series: once both are seen.
                    "eval_time": Recording.at(max(last, looping, key=lambda s: s.slot)),
                    "alertname": "DlqSidecarRestarting",
                    "exp_alerts": [{"exp_labels": {**labels, "topic": topic}}],
                },
            ],
            tmp_path / "promtool",
        )
        # ... which is the alert whose runbook section says what to do about an OOMKilled sidecar.
        remedies = [
            name
            for name, text in runbook_sections().items()
            if "OOMKilled:" in text.partition("**Do**")[2]
        ]
        assert remedies == ["DlqSidecarRestarting"], remedies
        (rule,) = [
            r
            for g in yaml.safe_load(RULES.read_text())["groups"]
            for r in g["rules"]
            if r.get("alert") == "DlqSidecarRestarting"
        ]
        assert rule["annotations"]["runbook_url"] == "docs/runbook.md#dlqsidecarrestarting"

        # The runbook's remedy: a limit of 55 MiB + the budget + 3 x the record's size gets it through.
        remedy = f"{55 + SIZED_BUDGET // MiB + -(-3 * BIG_RECORD_BYTES // MiB)}Mi"
        values["sidecar"]["resources"] = {
            "requests": {"cpu": "50m", "memory": remedy},
            "limits": {"memory": remedy},
        }
        raised = time.monotonic()
        install(node, helm, tmp_path, "sized", ns, values)

        def delivered_big() -> Obj | None:
            for found in pods(cluster, ns, "app.kubernetes.io/instance=sized"):
                log = container_log(node, found, "app")
                if any(re.match(r"order=big-1 kind=ok .*answer=accept", line) for _, line in log):
                    return found
            return None

        fixed = wait_for(delivered_big, POD_TIMEOUT_S, "the big record at the app")
        wait_for(lambda: committed_to_end(broker, "uploads-app", topic), 60, "its commit")
        through_s = time.monotonic() - raised
        (limits,) = [
            c["resources"]["limits"]
            for c in fixed["spec"]["initContainers"]
            if c["name"] == "dlq-sidecar"
        ]
        assert limits["memory"] == remedy, limits
        print(
            json.dumps(
                {
                    "first_kill_s": round(first_kill_s, 1),
                    "second_kill_s": round(second_kill_s, 1),
                    "scrapes": len(recording.samples),
                    "remedy_limit": remedy,
                    "remedy_through_s": round(through_s, 1),
                    "timeline": [
                        f"{Recording.at(x)} up={int(x.up)} restarts={x.container['restartCount']}"
                        f" {next(iter(x.container.get('state', {})), '')}"
                        f" {next(iter(x.container.get('state', {}).values()), {}).get('reason', '')}"
                        for x in recording.samples
                    ],
                }
            )
        )
    finally:
        helm_run(node, helm, "uninstall", "sized", "-n", ns)


def test_the_node_leaves_the_host_as_it_found_it(node_handle: NodeHandle) -> None:
    """Runs last: stops the node, then compares the host's rules, routes, links and kernel settings."""
    node_handle.stop()
    after = host_state()
    for key, before in node_handle.host_before.items():
        assert after[key] == before, f"{key} changed:\nbefore:\n{before}\nafter:\n{after[key]}"
    print(json.dumps({"node_stopped_s": round(node_handle.stopped_s or 0, 1), **after}))
