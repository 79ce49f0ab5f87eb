"""The sidecar, the DLQ tools and the Helm chart's secured configs against a real SASL_SSL / mTLS broker.

The broker is `scripts/kafka start --secured` (tests/integration/conftest.py): a CA and certificates made
with openssl at start, a SCRAM-SHA-512 user created by Kafka's storage tool at format time, a SASL_SSL
listener (server-only TLS) and an mTLS listener (`ssl.client.auth=required`). Topics are created through its
PLAINTEXT listener; everything under test connects through the secured ones only.

The chart's `ci/sasl-values.yaml` and `ci/mtls-values.yaml` are rendered with the real helm binary and the
rendered config.yaml is run as it is, with only what Kubernetes would supply replaced: the Secret-backed
environment variables (credentials, bootstrap, key password), the directory the TLS Secret is mounted at
(the same file names, in a temporary directory), the app's address (the test app) and the API port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from sidecar.http.server import Response, json_response
from tests.harness import (
    Delivery,
    RecordingApp,
    Sidecar,
    free_port,
    running_app,
    running_sidecar,
    sidecar,
    wait_until,
    write_config,
)
from tests.harness import wait_until_thread as _wait_thread
from tests.integration.test_helm import CHART, find_helm, only, pod_spec, sidecar_container
from tests.kafkatools import Broker, Rec, SecuredKafka

ROOT = Path(__file__).resolve().parents[2]
TLS_MOUNT = "/etc/dlq-sidecar-tls"  # the chart's dlq-sidecar.tlsDir

pytestmark = pytest.mark.broker


def poison_app() -> RecordingApp:
    """Accepts every record except those whose value starts with b"poison", which it rejects."""

    def policy(d: Delivery) -> Response:
        if (d.value or b"").startswith(b"poison"):
            return json_response(
                {"ack": "reject", "error": {"class": "app.Poison", "message": "bad record"}}
            )
        return Response(200)

    return RecordingApp(policy=policy)


def records(n: int, poison: set[int]) -> list[Rec]:
    return [
        Rec(f"k{i}".encode(), (b"poison-" if i in poison else b"ok-") + str(i).encode())
        for i in range(n)
    ]


def kafka_section(config: dict[str, str]) -> dict[str, str]:
    """A client config without the bootstrap (write_config takes that separately)."""
    return {k: v for k, v in config.items() if k != "bootstrap.servers"}


async def wait_done(sc: Sidecar, app: RecordingApp, n: int, timeout_s: float = 90) -> None:
    await wait_until(lambda: len(app.seen()) >= n, timeout_s, f"{n} records delivered")
    await sc.wait_assigned(1)


async def wait_committed(broker: Broker, group: str, topic: str, offset: int) -> None:
    await _wait_thread(
        lambda: broker.committed(group, topic, [0])[0][0] == offset,
        60,
        f"{group} committed {topic}[0] at {offset}",
    )


def dlq_cli(secured: SecuredKafka, *argv: str) -> subprocess.CompletedProcess[str]:
    """`dlq-sidecar dlq ARGV...` as a subprocess, over SASL_SSL (`-X` for each property)."""
    config = secured.sasl_config()
    props = [a for k, v in config.items() if k != "bootstrap.servers" for a in ("-X", f"{k}={v}")]
    return subprocess.run(
        [
            sys.executable,
            *("-m", "sidecar", "dlq", argv[0], "--bootstrap", secured.sasl_ssl),
            *props,
            *argv[1:],
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )


# --- the script ---------------------------------------------------------------------------------


def test_the_secured_broker_keeps_no_ca_key_and_refuses_a_plain_client(
    secured_kafka: SecuredKafka,
) -> None:
    tls_dir = Path(secured_kafka.ca).parent
    assert sorted(p.name for p in tls_dir.glob("*.key")) == ["broker.key", "client-encrypted.key"]
    assert "ENCRYPTED PRIVATE KEY" in Path(secured_kafka.client_key).read_text()
    # The secured listeners speak only TLS: the script's plain metadata probe gets no answer.
    from tests.faults.broker import KS

    assert KS.broker_answers(secured_kafka.plain)
    assert not KS.broker_answers(secured_kafka.sasl_ssl)
    assert not KS.broker_answers(secured_kafka.mtls)


def test_secured_start_needs_a_broker_of_its_own() -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    for args, code, message in (
        (["start", "--secured"], 1, "unset KAFKA_BOOTSTRAP"),
        (["stop", "--secured"], 2, "--secured goes with start only"),
    ):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "kafka"), *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert proc.returncode == code, proc.stderr
        assert message in proc.stderr


# --- the sidecar and the DLQ tools over SASL_SSL ---------------------------------------------------


async def test_sidecar_consumes_and_dead_letters_over_sasl_ssl_then_inspect_and_replay(
    secured_kafka: SecuredKafka, unique: str, tmp_path: Path
) -> None:
    plain = Broker(secured_kafka.plain)
    secured = secured_kafka.client(secured_kafka.sasl_config())
    topic, dlq, group = f"orders-{unique}", f"dlq.orders-{unique}", f"g-{unique}"
    plain.create_topic(topic)
    # Produced over SASL_SSL: the test's own clients authenticate too.
    secured.produce(topic, records(20, poison={3, 11}))

    app = poison_app()
    async with running_sidecar(
        secured,  # the sidecar's bootstrap: the SASL_SSL listener
        tmp_path,
        app,
        topic=topic,
        group=group,
        config_name="sasl.yaml",
        kafka_extra=kafka_section(secured_kafka.sasl_config()),
        # The DLQ topic is created by the sidecar itself, over SASL_SSL.
        extra={"errors.deadletterqueue.topic.name": dlq, "errors.tolerance": "all"},
        start=False,
    ) as rig:
        async with rig.sidecar() as sc:
            await wait_done(sc, app, 20)
            await wait_committed(plain, group, topic, 20)
            code, ready = await sc.get("/readyz")
            assert code == 200, ready
            assert ready["checks"]["broker_reachable"] is True
            # Credentials never show in the status the API hands out.
            status_text = json.dumps(await sc.status())
            assert secured_kafka.sasl_password not in status_text
            assert await sc.stop() == 0
        assert secured_kafka.sasl_password not in sc.log_text()

    dead = await trio.to_thread.run_sync(lambda: secured.read_topic(dlq, 2))
    assert len(dead) == 2
    assert sorted(dict(r.headers)["__dlq.errors.offset"] for r in dead) == [b"11", b"3"]

    inspect = await trio.to_thread.run_sync(
        lambda: dlq_cli(secured_kafka, "inspect", "--topic", dlq, "--json")
    )
    assert inspect.returncode == 0, inspect.stderr
    shown = [json.loads(line) for line in inspect.stdout.splitlines() if line.strip()]
    assert len(shown) == 2, inspect.stdout
    assert "app.Poison" in inspect.stdout

    replay = await trio.to_thread.run_sync(
        lambda: dlq_cli(secured_kafka, "replay", "--from", dlq, "--name", f"r-{unique}")
    )
    assert replay.returncode == 0, replay.stderr
    # Headers-only DLQ records: the replay read the originals back from the source topic, over SASL_SSL.
    replayed = await trio.to_thread.run_sync(lambda: secured.read_topic(topic, 22))
    tail = sorted(r.value for r in replayed[20:] if r.value)
    assert tail == [b"poison-11", b"poison-3"], replay.stderr


@pytest.mark.parametrize(
    "mode",
    [
        {"errors.deadletterqueue.transactional.enable": True},
        {"engine": "share", "ordering": "none"},
    ],
    ids=["transactional-dlq", "share-engine"],
)
async def test_the_other_modes_over_sasl_ssl(
    secured_kafka: SecuredKafka, unique: str, tmp_path: Path, mode: dict[str, Any]
) -> None:
    """The transactional DLQ producer and the share consumer authenticate like the rest."""
    plain = Broker(secured_kafka.plain)
    secured = secured_kafka.client(secured_kafka.sasl_config())
    topic, dlq = f"orders-{unique}", f"dlq.orders-{unique}"
    plain.create_topic(topic)
    secured.produce(topic, records(6, poison={4}))
    app = poison_app()
    async with running_sidecar(
        secured,  # the sidecar's bootstrap: the SASL_SSL listener
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        config_name="mode.yaml",
        kafka_extra=kafka_section(secured_kafka.sasl_config()),
        extra={"errors.deadletterqueue.topic.name": dlq, "errors.tolerance": "all", **mode},
    ) as rig:
        sc = rig.sc
        await wait_until(lambda: len(app.seen()) >= 6, 90, "6 records delivered")
        # read_committed (librdkafka's default): a transactional DLQ record shows once committed.
        dead = await trio.to_thread.run_sync(lambda: secured.read_topic(dlq, 1))
        assert [dict(r.headers)["__dlq.errors.offset"] for r in dead] == [b"4"]
        assert await sc.stop() == 0


# --- the Helm chart's sasl and mtls value sets, rendered and run ---------------------------------


def render_chart(variant: str) -> list[dict[str, Any]]:
    helm = find_helm()
    if helm is None:
        pytest.fail("helm not found: run scripts/install-helm", pytrace=False)
    values = CHART / "ci" / f"{variant}-values.yaml"
    proc = subprocess.run(
        [helm, "template", "rel", str(CHART), "--namespace", "team-a", "-f", str(values)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def as_kubelet_runs_it(
    manifests: list[dict[str, Any]],
    secrets: dict[str, dict[str, str]],
    tmp_path: Path,
    app_port: int,
) -> tuple[Path, dict[str, str]]:
    """The rendered config.yaml and the sidecar's environment, as the pod would have them.

    Secret-backed variables come from `secrets` (name -> key -> value); the TLS Secret's volume is
    materialised under `tmp_path` with the Secret's keys as file names, and the config's paths under
    the mount point are moved there. The app URL and the API port are the test's.
    """
    spec = pod_spec(manifests)
    container = sidecar_container(spec)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "DLQ_KAFKA_"))}
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
        elif "value" in item:
            env[item["name"]] = item["value"]
    # Nothing listens there: spans are dropped, as with an unreachable collector.
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
    mount_dir = tmp_path / "tls-mount"
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        assert mount["mountPath"] == TLS_MOUNT, mount
        mount_dir.mkdir()
        for key, source in secrets[secret["secretName"]].items():
            shutil.copy(source, mount_dir / key)
    config = yaml.safe_load(only(manifests, "ConfigMap")["data"]["config.yaml"])
    for key, value in config["kafka"].items():
        if isinstance(value, str) and value.startswith(TLS_MOUNT + "/"):
            config["kafka"][key] = str(mount_dir / value.removeprefix(TLS_MOUNT + "/"))
            assert Path(config["kafka"][key]).is_file(), (key, value)
    config["app"] = {"url": f"http://127.0.0.1:{app_port}/records"}
    config["api"]["listen"] = f"127.0.0.1:{free_port()}"
    config["logging"] = {"level": "info", "format": "json"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, env


async def run_rendered(path: Path, env: dict[str, str], app: RecordingApp, n: int) -> Sidecar:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the harness starts the sidecar with this process's environment
    try:
        async with sidecar(path) as sc:
            await wait_done(sc, app, n)
            code, ready = await sc.get("/readyz")
            assert code == 200, ready
            assert await sc.stop() == 0
            return sc
    finally:
        os.environ.clear()
        os.environ.update(saved)


async def test_chart_sasl_values_run_against_the_secured_broker(
    secured_kafka: SecuredKafka, tmp_path: Path, unique: str
) -> None:
    manifests = render_chart("sasl")
    rendered = yaml.safe_load(only(manifests, "ConfigMap")["data"]["config.yaml"])
    assert rendered["kafka"]["security.protocol"] == "SASL_SSL"
    assert rendered["kafka"]["sasl.mechanism"] == secured_kafka.sasl_mechanism
    topic, dlq, group = (
        rendered["source"]["topics"][0],
        rendered["errors.deadletterqueue.topic.name"],
        rendered["kafka"]["group.id"],
    )
    plain = Broker(secured_kafka.plain)
    if not plain.topic_exists(topic):
        plain.create_topic(topic)
    start = plain.end_offsets(topic, [0])[0]
    plain.produce(
        topic, [Rec(b"a", f"ok-{unique}".encode()), Rec(b"b", f"poison-{unique}".encode())]
    )

    secrets = {
        "kafka-credentials": {
            "username": secured_kafka.sasl_username,
            "password": secured_kafka.sasl_password,
        },
        "kafka-endpoint": {"bootstrap.servers": secured_kafka.sasl_ssl},
        "kafka-ca": {"ca.crt": secured_kafka.ca},
    }
    app, port = poison_app(), free_port()
    path, env = as_kubelet_runs_it(manifests, secrets, tmp_path, port)
    async with running_app(app, ("tcp", "127.0.0.1", port)):
        await run_rendered(path, env, app, 2)
    await wait_committed(plain, group, topic, start + 2)
    secured = secured_kafka.client(secured_kafka.sasl_config())
    n_dead = plain.count_records(dlq)  # this test's record, and any from an earlier run
    dead = await trio.to_thread.run_sync(lambda: secured.read_topic(dlq, n_dead))
    assert str(start + 1).encode() in [dict(r.headers)["__dlq.errors.offset"] for r in dead]


async def test_chart_mtls_values_run_against_the_mtls_listener(
    secured_kafka: SecuredKafka, tmp_path: Path, unique: str
) -> None:
    manifests = render_chart("mtls")
    rendered = yaml.safe_load(only(manifests, "ConfigMap")["data"]["config.yaml"])
    assert rendered["kafka"]["security.protocol"] == "SSL"
    topic, group = rendered["source"]["topics"][0], rendered["kafka"]["group.id"]
    plain = Broker(secured_kafka.plain)
    if not plain.topic_exists(topic):
        plain.create_topic(topic)
    start = plain.end_offsets(topic, [0])[0]
    plain.produce(topic, [Rec(b"a", f"ok-{unique}-{i}".encode()) for i in range(3)])

    secrets = {
        "kafka-client-tls": {
            "ca.crt": secured_kafka.ca,
            "tls.crt": secured_kafka.client_certificate,
            "tls.key": secured_kafka.client_key,
        },
        "kafka-client-key-password": {"password": secured_kafka.client_key_password},
    }
    app, port = RecordingApp(), free_port()
    path, env = as_kubelet_runs_it(manifests, secrets, tmp_path, port)
    # The values file's bootstrap is a placeholder host: the only value changed in the config.
    config = yaml.safe_load(path.read_text())
    assert config["kafka"]["bootstrap.servers"] == "kafka.internal:9094"
    config["kafka"]["bootstrap.servers"] = secured_kafka.mtls
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    async with running_app(app, ("tcp", "127.0.0.1", port)):
        await run_rendered(path, env, app, 3)
    await wait_committed(plain, group, topic, start + 3)
    # The listener really requires the certificate: without it the same config is refused.
    del config["kafka"]["ssl.certificate.location"], config["kafka"]["ssl.key.location"]
    del config["kafka"]["ssl.key.password"]
    from sidecar.kafka.consumer_config import check_cluster_sync

    reason = await trio.to_thread.run_sync(check_cluster_sync, config["kafka"], 10.0)
    assert reason is not None


# --- a wrong password or an untrusted CA: not ready with the reason, never a crash loop ----------


@pytest.mark.parametrize(
    ("bad", "cause"),
    [("password", "authentication failed"), ("ca", "TLS failed")],
    ids=["wrong-password", "untrusted-ca"],
)
async def test_unusable_credentials_mean_not_ready_with_the_reason_not_an_exit(
    secured_kafka: SecuredKafka, unique: str, tmp_path: Path, bad: str, cause: str
) -> None:
    topic = f"orders-{unique}"
    Broker(secured_kafka.plain).create_topic(topic)
    ca_file = tmp_path / "ca.crt"  # the "mounted Secret": replaced in place below
    shutil.copy(secured_kafka.untrusted_ca if bad == "ca" else secured_kafka.ca, ca_file)
    overrides = {"ssl.ca.location": str(ca_file)}
    if bad == "password":
        overrides["sasl.password"] = "not-the-password"
    config = write_config(
        tmp_path / "bad.yaml",
        bootstrap=secured_kafka.sasl_ssl,
        group=f"g-{unique}",
        topics=[topic],
        app_url=f"http://127.0.0.1:{free_port()}/records",
        kafka_extra=kafka_section(secured_kafka.sasl_config(**overrides)),
        # With a DLQ, whose start-up check used to exit 1 after 15 s: a crash loop under Kubernetes.
        extra={"errors.deadletterqueue.topic.name": f"dlq.{topic}"},
    )
    async with sidecar(config) as sc:

        def retried() -> bool:
            lines = [line.get("msg", "") for line in sc.log_lines()]
            return sum("the Kafka cluster cannot be used" in m and cause in m for m in lines) >= 2

        # Two failed checks logged: it survived the first one, and says why each time.
        await wait_until(retried, 60, f"two start-up checks failing with {cause!r}")
        assert sc.proc.returncode is None, sc.log_text()[-2000:]
        code, ready = await sc.get("/readyz")
        assert code == 503, ready
        assert ready["checks"]["broker_reachable"] is False
        assert cause in ready["reason"], ready
        code, health = await sc.get("/healthz")
        assert code == 200, health  # alive: a liveness probe must not restart it for this
        if bad == "ca":
            # The right CA put in place (as a Secret volume update does): the next check passes.
            shutil.copy(secured_kafka.ca, ca_file)
            await sc.wait_assigned(1, timeout_s=60)
            code, ready = await sc.get("/readyz")
            assert ready["checks"]["broker_reachable"] is True, ready
            assert "reason" not in ready, ready
    assert secured_kafka.sasl_password not in sc.log_text()
