"""Dapr's sidecar (daprd) with its Kafka pub/sub component, as the side-by-side runs start it.

``daprd_binary`` finds (or builds, once, into the cache) daprd v1.14.0 with ``scripts/install-daprd``.
``DaprSetup`` is one daprd's resources: a Kafka pub/sub component (``rawPayload``, so the app gets each
record's value as it is, in a CloudEvent's ``data_base64``), a declarative subscription with a
dead-letter topic (and, for ``bulk``, bulk subscribe), and a resiliency policy retrying the app's
RETRY answers. ``running_daprd`` runs daprd standalone (``--resources-path``, no placement or scheduler
service, every port its own) in front of the bench app and stops it; ``wait_group_assigned`` waits
until the consumer group it joined has every partition assigned.

Dapr's Kafka client is IBM/sarama v1.42.2, whose newest known Kafka version is 3.6.0: the component's
``version: 3.6.0`` makes it speak protocol versions a Kafka 4.x broker still serves (Kafka 4.0 removed
the oldest, KIP-896; sarama picks its request versions from that setting, 2.0.0 by default).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.measure import ROOT
from sidecar.ops.broker.ports import free_port  # below the ephemeral range

DAPR_VERSION = "1.14.0"
# The component's `version`: the Kafka protocol level sarama speaks (see the module docstring).
SARAMA_KAFKA_VERSION = "3.6.0"
PUBSUB = "kafka-pubsub"


def daprd_binary() -> str:
    """daprd's path: built once by ``scripts/install-daprd`` into ~/.cache/dlq-sidecar/bin."""
    override = os.environ.get("DLQ_DAPRD")
    if override:
        return override
    done = subprocess.run(
        [str(ROOT / "scripts" / "install-daprd")], check=True, capture_output=True, text=True
    )
    return done.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class DaprSetup:
    """What one daprd reads: its component, subscription and resiliency policy."""

    bootstrap: str
    topic: str
    group: str
    app_port: int
    dlq_topic: str | None = None
    bulk: bool = False
    bulk_max_messages: int = 100  # the sidecar's batch mode: app.batch.max.records 100
    bulk_max_await_ms: int = 5  # ... and its 5 ms linger
    retries: int = 3  # resiliency: the app's RETRY answered again up to this many times
    retry_ms: int = 50  # ... this long apart (the sidecar's errors.retry.delay.initial.ms: 50)
    session_timeout_s: int | None = None  # the component's sessionTimeout (default 10 s)

    def component(self) -> str:
        metadata = {
            "brokers": self.bootstrap,
            "consumerGroup": self.group,
            "clientId": self.group,
            "authType": "none",
            "initialOffset": "oldest",
            "version": SARAMA_KAFKA_VERSION,
        }
        if self.session_timeout_s:
            metadata["sessionTimeout"] = f"{self.session_timeout_s}s"
            metadata["heartbeatInterval"] = f"{max(1, self.session_timeout_s // 3)}s"
        return yaml_doc(
            "dapr.io/v1alpha1",
            "Component",
            PUBSUB,
            {
                "type": "pubsub.kafka",
                "version": "v1",
                "metadata": [{"name": k, "value": v} for k, v in metadata.items()],
            },
        )

    def subscription(self) -> str:
        spec: dict[str, object] = {
            "pubsubname": PUBSUB,
            "topic": self.topic,
            "routes": {"default": "/dapr-bulk" if self.bulk else "/dapr"},
            "metadata": {"rawPayload": "true"},
        }
        if self.dlq_topic:
            spec["deadLetterTopic"] = self.dlq_topic
        if self.bulk:
            spec["bulkSubscribe"] = {
                "enabled": True,
                "maxMessagesCount": self.bulk_max_messages,
                "maxAwaitDurationMs": self.bulk_max_await_ms,
            }
        return yaml_doc("dapr.io/v2alpha1", "Subscription", "bench", spec)

    def resiliency(self) -> str:
        return yaml_doc(
            "dapr.io/v1alpha1",
            "Resiliency",
            "bench",
            {
                "policies": {
                    "retries": {
                        "appRetry": {
                            "policy": "constant",
                            "duration": f"{self.retry_ms}ms",
                            "maxRetries": self.retries,
                        }
                    }
                },
                "targets": {"components": {PUBSUB: {"inbound": {"retry": "appRetry"}}}},
            },
        )

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "component.yaml").write_text(self.component())
        (directory / "subscription.yaml").write_text(self.subscription())
        (directory / "resiliency.yaml").write_text(self.resiliency())
        return directory


def yaml_doc(api_version: str, kind: str, name: str, spec: dict[str, object]) -> str:
    """A Kubernetes-style resource; JSON is YAML, so no YAML writer is needed."""
    return json.dumps(
        {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec},
        indent=1,
    )


@contextlib.contextmanager
def running_daprd(
    setup: DaprSetup, directory: str, name: str, *, daprd: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """daprd standalone in front of the app at ``setup.app_port``; SIGTERM (then SIGKILL) at the end.

    Its log is ``<directory>/dapr-<name>.log``."""
    resources = setup.write(Path(directory) / f"dapr-{name}")
    log_path = os.path.join(directory, f"dapr-{name}.log")
    # A port picked free can be taken by another process before daprd binds it (tests run in
    # parallel): daprd then exits at once ("address already in use"); start it again on new ports.
    for _attempt in range(BIND_ATTEMPTS):
        http_port = free_port()
        command = [
            daprd or daprd_binary(),
            "--app-id", f"bench-{name}",
            "--app-port", str(setup.app_port),
            "--app-protocol", "http",
            "--app-channel-address", "127.0.0.1",
            "--resources-path", str(resources),
            "--dapr-http-port", str(http_port),
            "--dapr-grpc-port", str(free_port()),
            "--dapr-internal-grpc-port", str(free_port()),
            "--metrics-port", str(free_port()),
            "--dapr-listen-addresses", "127.0.0.1",
            "--placement-host-address", "",
            "--scheduler-host-address", "",
            "--log-level", "warn",
        ]  # fmt: skip
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        if not _lost_a_port(proc, http_port, f"bench-{name}", log_path):
            break
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


BIND_ATTEMPTS = 3


def _lost_a_port(proc: subprocess.Popen[bytes], http_port: int, app_id: str, log_path: str) -> bool:
    """Whether daprd exited because a port it was given was taken meanwhile; waits until its HTTP
    API (bound once its other ports are) answers as this daprd (its metadata names ``app_id``: a
    process that took the port first answers otherwise, or not at all), it exits, or 15 s pass."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return "address already in use" in Path(log_path).read_text(errors="replace")
        if _metadata_id(http_port) == app_id:
            return False
        time.sleep(0.05)
    return False


def _metadata_id(http_port: int) -> str | None:
    """The app id daprd's metadata API on ``http_port`` gives, or None."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=1)
    try:
        conn.request("GET", "/v1.0/metadata")
        response = conn.getresponse()
        if response.status != 200:
            return None
        body = json.loads(response.read())
        return str(body.get("id")) if isinstance(body, dict) else None
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def dapr_log_tail(directory: str, name: str, chars: int = 1500) -> str:
    path = Path(directory) / f"dapr-{name}.log"
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def group_assigned(bootstrap: str, group: str, partitions: int) -> bool:
    """Whether consumer group ``group`` is stable with ``partitions`` partitions assigned."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        described = admin.describe_consumer_groups([group], request_timeout=5)[group].result(
            timeout=10
        )
    except Exception:
        return False
    if str(described.state).rsplit(".", 1)[-1] != "STABLE":
        return False
    assigned = sum(len(m.assignment.topic_partitions) for m in described.members)
    return assigned >= partitions


def wait_group_assigned(
    bootstrap: str,
    group: str,
    partitions: int,
    proc: subprocess.Popen[bytes],
    timeout_s: float = 90,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daprd exited ({proc.returncode}) before its group was assigned")
        if group_assigned(bootstrap, group, partitions):
            return
        time.sleep(0.2)
    raise TimeoutError(f"daprd's group {group} had no assignment after {timeout_s:g} s")
