"""The container image built from the repository's Dockerfile (scripts/build-image), run with podman.

As the Helm chart runs it: a read-only root file system, UID/GID 10001, its configuration mounted read-only,
the host's network (the session's broker and the example app on loopback). Checked: /healthz and /readyz, an
order through to the app and a poison order through to the DLQ, SIGTERM while a deferred answer is pending
(the drain finishes it, commits and the container exits 0), and that the process runs the core compiled by
mypyc (its start-up line, and the core's extension modules mapped into the running process).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import ROOT, free_port, write_config
from tests.images import BuiltImage, podman_command, podman_run_command, sidecar_image
from tests.kafkatools import Broker, Rec

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def image() -> BuiltImage:
    return sidecar_image()


def http_get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def answers(port: int, path: str, status: int) -> bool:
    try:
        return http_get(port, path)[0] == status
    except OSError:
        return False


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """The example Python app on loopback; yields (its port, the sidecar API port it acks to, its log)."""
    port, api_port = free_port(), free_port()
    log_path = tmp_path / "app.log"
    env = {**os.environ, "SIDECAR_API": f"http://127.0.0.1:{api_port}", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "python" / "app.py"), "--port", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for(lambda: "listening on" in log_path.read_text(), 30, "the example app")
        yield port, api_port, log_path
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def order(order_id: str, kind: str) -> Rec:
    return Rec(key=order_id.encode(), value=json.dumps({"id": order_id, "kind": kind}).encode())


def test_the_image_runs_read_only_as_10001_drains_on_sigterm_and_runs_the_compiled_core(
    image: BuiltImage,
    app: tuple[int, int, Path],
    broker: Broker,
    unique: str,
    tmp_path: Path,
) -> None:
    app_port, api_port, app_log = app
    topic = broker.create_topic(f"orders-{unique}")
    dlq = f"dlq.{topic}"
    group = f"g-{unique}"
    config = write_config(
        tmp_path / "config.yaml",
        bootstrap=broker.bootstrap,
        group=group,
        topics=[topic],
        app_url=f"http://127.0.0.1:{app_port}/records",
        api_listen=f"127.0.0.1:{api_port}",
    )
    config.chmod(0o644)
    name = f"dlq-sidecar-{unique}"[:60]
    log_path = tmp_path / "sidecar.log"
    command = podman_run_command(
        image.reference,
        name,
        "--read-only",
        "--user",
        "10001:10001",
        "--network",
        "host",
        "-v",
        f"{config}:/etc/dlq-sidecar/config.yaml:ro",
    )
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: answers(api_port, "/healthz", 200) or proc.poll() is not None,
            START_TIMEOUT_S,
            "/healthz",
        )
        assert proc.poll() is None, f"the container exited:\n{log_path.read_text()}"
        wait_for(lambda: answers(api_port, "/readyz", 200), START_TIMEOUT_S, "/readyz")

        # The process is the image's own user, on a read-only root.
        whoami = subprocess.run(
            podman_command("exec", name, "sh", "-c", "id -u; id -g; touch /usr/probe 2>&1; true"),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split("\n")
        assert whoami[:2] == ["10001", "10001"], whoami
        assert "Read-only file system" in whoami[2], whoami

        # What runs is the compiled core: its start-up line says so, and the core's extension
        # modules are mapped into process 1 (the sidecar: the image's entrypoint, exec form).
        wait_for(lambda: "dlq-sidecar running" in log_path.read_text(), 30, "the start-up line")
        running = [
            json.loads(line)
            for line in log_path.read_text().splitlines()
            if "dlq-sidecar running" in line
        ]
        assert "(compiled core)" in running[0]["msg"], running[0]
        assert running[0]["core"] == "compiled", running[0]
        maps = subprocess.run(
            podman_command("exec", name, "cat", "/proc/1/maps"),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        mapped = set(re.findall(r"/(?:site|dist)-packages/(\S+\.so)$", maps, re.MULTILINE))
        core = {path.partition(".")[0] for path in mapped if path.startswith("sidecar/core/")}
        expected = {"sidecar/core/_native__mypyc", "sidecar/core/ledger/machine"}
        assert expected <= core, sorted(mapped)

        broker.produce(topic, [order("o-1", "ok"), order("o-2", "poison")])
        dead = broker.read_topic(dlq, expected=1, timeout_s=60)
        headers = dead[0].headers_by_name()
        assert headers["__dlq.errors.offset"] == [b"1"], headers  # o-2, the poison order
        assert headers["__dlq.errors.exception.class.name"] == [b"OrderValidationError"]
        wait_for(lambda: "order=o-1 kind=ok" in app_log.read_text(), 30, "order o-1 at the app")

        # SIGTERM while a deferred answer is pending: the drain waits for the app's ack.
        broker.produce(topic, [order("o-3", "slow")])
        wait_for(lambda: "order=o-3 kind=slow" in app_log.read_text(), 30, "order o-3 at the app")
        subprocess.run(podman_command("kill", "--signal", "TERM", name), check=True, timeout=30)
        assert proc.wait(60) == 0, log_path.read_text()
        assert "order=o-3 acked=accept" in app_log.read_text()
        committed = broker.committed(group, topic, [0])[0][0]
        assert committed == 3, f"committed offset {committed} after the drain, 3 records"
        assert len(broker.read_topic(dlq, expected=2, timeout_s=3)) == 1
    finally:
        if proc.poll() is None:
            subprocess.run(podman_command("rm", "-f", "-t", "0", name), check=False, timeout=60)
            proc.wait(30)
