"""The runbook's control-API command, run as written against a real sidecar that requires a token.

docs/runbook.md gives one Python command for the control API inside the pod (the image has no curl), with the
path as its last word: `/v1/status`, or `/v1/breaker/close` (a POST). Both are run here with the token in $DLQ_SIDECAR_API_TOKEN, as the
chart sets it in the sidecar container, against a sidecar with `api.token` and the DLQ circuit breaker on (the
port is the test's instead of the chart's 8787); without the token the sidecar answers 401. Its `dlq inspect`
command (bootstrap, SASL over TLS, the CA) reads a topic of the secured test broker.

Imports: the standard library, trio, pytest, the test harness.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import trio

from tests.harness import FAST, free_port, running_sidecar
from tests.integration.test_helm import ROOT
from tests.kafkatools import Broker, Rec, SecuredKafka

RUNBOOK = ROOT / "docs" / "runbook.md"
TOKEN = "runbook-token-0123456789abcdef"
BREAKER = "errors.deadletterqueue.circuit.breaker."


def api_command() -> tuple[str, str]:
    """The Python program of the runbook's `kubectl exec ... python -c '...' PATH`, and its PATH."""
    m = re.search(r"-c dlq-sidecar -- python -c '\n(.*?)' (/v1/\S+)\n", RUNBOOK.read_text(), re.S)
    assert m, "the runbook's control-API command"
    return m.group(1), m.group(2)


def run(program: str, path: str, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DLQ_SIDECAR_API_TOKEN"}
    if token is not None:
        env["DLQ_SIDECAR_API_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-c", program, path],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


async def test_the_runbooks_status_and_breaker_commands_work_with_the_token(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    extra = {**FAST, BREAKER + "enable": True, "api": {"listen": listen, "token": TOKEN}}
    async with running_sidecar(broker, tmp_path, unique=unique, extra=extra, wait="assigned"):
        program, path = api_command()
        assert path == "/v1/status"
        program = program.replace("127.0.0.1:8787", listen)
        proc = await trio.to_thread.run_sync(run, program, path, TOKEN)
        assert proc.returncode == 0, proc.stderr
        body = json.loads(proc.stdout)
        assert body["engine"] == "consumer" and body["circuit_breaker"]["state"] == "closed"

        refused = await trio.to_thread.run_sync(run, program, path, None)
        assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr

        # "with /v1/breaker/close as its last word": a POST the sidecar takes.
        proc = await trio.to_thread.run_sync(run, program, "/v1/breaker/close", TOKEN)
        assert proc.returncode == 0, proc.stderr
        closed = json.loads(proc.stdout)
        assert closed["circuit_breaker"]["state"] == "closed", closed


def inspect_command() -> str:
    """The shell program of the runbook's `kubectl exec ... sh -c '...'` for `dlq inspect`."""
    m = re.search(
        r"-c dlq-sidecar -- sh -c '(dlq-sidecar dlq inspect .*?)'\n", RUNBOOK.read_text(), re.S
    )
    assert m, "the runbook's dlq inspect command"
    return m.group(1)


async def test_the_runbooks_dlq_inspect_reads_a_sasl_ssl_cluster(
    secured_kafka: SecuredKafka, unique: str
) -> None:
    """The command as written (BOOTSTRAP, TOPIC and the CA's path filled in), with the credentials in the
    environment variables the chart gives the sidecar container."""
    topic = f"dlq.{unique}"
    plain = Broker(secured_kafka.plain)
    await trio.to_thread.run_sync(lambda: plain.create_topic(topic))
    await trio.to_thread.run_sync(plain.produce, topic, [Rec(key=b"k", value=b"v")])
    program = (
        inspect_command()
        .replace("dlq.TOPIC", topic)
        .replace("BOOTSTRAP", secured_kafka.sasl_ssl)
        .replace("SCRAM-SHA-512", secured_kafka.sasl_mechanism)
        .replace("/etc/dlq-sidecar-tls/ca.crt", secured_kafka.ca)
    )
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "DLQ_KAFKA_SASL_USERNAME": secured_kafka.sasl_username,
        "DLQ_KAFKA_SASL_PASSWORD": secured_kafka.sasl_password,
    }
    env.pop("KAFKA_BOOTSTRAP", None)
    proc = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            ["sh", "-c", program], env=env, capture_output=True, text=True, timeout=120, check=False
        )
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 record" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
