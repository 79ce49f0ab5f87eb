"""`dlq-sidecar injector`'s listener: HTTPS only, the project's HTTP limits, certificates rotated without a restart.

The server runs in the test's trio loop (:func:`sidecar.injector.server.serve_injector`) with certificates
from trustme; the client is a trio TLS stream that trusts only that CA. The CLI's exit codes are checked
on the real command.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trustme

from sidecar.http.server import Limits
from sidecar.injector.server import LIMITS, CertificateStore, serve_injector
from sidecar.injector.settings import parse_settings

POD = {
    "metadata": {"name": "orders-1", "annotations": {"dlq-sidecar.io/inject": "true"}},
    "spec": {"containers": [{"name": "app", "image": "orders:1"}]},
}


def review_body(obj: object = POD) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"kind": "Pod"},
                "resource": {"resource": "pods"},
                "operation": "CREATE",
                "namespace": "orders",
                "object": obj,
            },
        }
    ).encode()


def write_pair(ca: trustme.CA, directory: Path) -> tuple[str, str]:
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = directory / "tls.crt", directory / "tls.key"
    # Write then rename, as the kubelet swaps a mounted Secret: never a half-written file.
    for path, blob in (
        (cert, b"".join(b.bytes() for b in leaf.cert_chain_pems)),
        (key, leaf.private_key_pem.bytes()),
    ):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)
    return str(cert), str(key)


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


async def exchange(port: int, context: ssl.SSLContext, raw: bytes) -> bytes:
    """Send ``raw`` over a fresh TLS connection and read until the server closes it."""
    tcp = await trio.open_tcp_stream("127.0.0.1", port)
    stream = trio.SSLStream(tcp, context, server_hostname="127.0.0.1", https_compatible=True)
    async with stream:
        await stream.send_all(raw)
        chunks = []
        with trio.fail_after(20):
            while data := await stream.receive_some(65536):
                chunks.append(data)
    return b"".join(chunks)


def post(body: bytes, path: str = "/mutate", extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: injector\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    ).encode() + body


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


async def start(
    nursery: trio.Nursery, ca: trustme.CA, tmp_path: Path, limits: Limits = LIMITS
) -> int:
    cert, key = write_pair(ca, tmp_path)
    settings = parse_settings({"listen": "127.0.0.1:0", "tls": {"certFile": cert, "keyFile": key}})
    port: int = await nursery.start(
        lambda task_status: serve_injector(
            settings, CertificateStore(cert, key), limits=limits, task_status=task_status
        )
    )
    return port


async def test_a_review_over_https_is_answered_with_the_patch(
    ca: trustme.CA, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        port = await start(nursery, ca, tmp_path)
        answer = await exchange(port, client_context(ca), post(review_body()))
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        response = json.loads(body)["response"]
        assert response["uid"] == "u-1" and response["allowed"] is True
        patch = json.loads(base64.b64decode(response["patch"]))
        assert patch[0]["path"] == "/spec/initContainers"
        health = await exchange(
            port,
            client_context(ca),
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        assert health.startswith(b"HTTP/1.1 200 ") and health.endswith(b"ok\n")
        wrong = await exchange(port, client_context(ca), post(b"{}", path="/other"))
        assert wrong.startswith(b"HTTP/1.1 404 ")
        bad = await exchange(port, client_context(ca), post(b'{"kind": "Pod"}'))
        assert bad.startswith(b"HTTP/1.1 400 ") and b"AdmissionReview" in bad
        nursery.cancel_scope.cancel()


async def test_plain_http_gets_no_answer_and_the_listener_goes_on(
    ca: trustme.CA, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        port = await start(nursery, ca, tmp_path)
        plain = await trio.open_tcp_stream("127.0.0.1", port)
        async with plain:
            await plain.send_all(post(review_body()))
            with trio.fail_after(20):
                data = b""
                while chunk := await plain.receive_some(65536):
                    data += chunk
        assert b"HTTP/1.1 200" not in data and b"patch" not in data
        answer = await exchange(port, client_context(ca), post(review_body()))
        assert answer.startswith(b"HTTP/1.1 200 ")
        nursery.cancel_scope.cancel()


async def test_body_and_time_limits_hold_over_tls(ca: trustme.CA, tmp_path: Path) -> None:
    limits = Limits(
        max_request_bytes=64 * 1024, header_timeout_s=0.5, request_timeout_s=1.0, idle_timeout_s=5.0
    )
    async with trio.open_nursery() as nursery:
        port = await start(nursery, ca, tmp_path, limits)
        big = await exchange(port, client_context(ca), post(b"x" * (64 * 1024 + 1)))
        assert big.startswith(b"HTTP/1.1 413 "), big[:60]
        # A header block that never ends: 408 once header_timeout_s has passed.
        slow = await exchange(port, client_context(ca), b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
        assert slow.startswith(b"HTTP/1.1 408 "), slow[:60]
        nursery.cancel_scope.cancel()


async def test_a_rotated_certificate_is_served_without_a_restart(
    ca: trustme.CA, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        port = await start(nursery, ca, tmp_path)
        assert (await exchange(port, client_context(ca), post(review_body()))).startswith(
            b"HTTP/1.1 200 "
        )
        successor = trustme.CA()
        await trio.sleep(1.1)  # the files' mtimes must differ, and the store checks once a second
        write_pair(successor, tmp_path)
        with trio.fail_after(20):
            while True:
                try:
                    answer = await exchange(port, client_context(successor), post(review_body()))
                    break
                except trio.BrokenResourceError:  # the old certificate, until the next check
                    await trio.sleep(0.2)
        assert answer.startswith(b"HTTP/1.1 200 ")
        with pytest.raises(trio.BrokenResourceError):
            await exchange(port, client_context(ca), post(review_body()))
        nursery.cancel_scope.cancel()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "injector", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_refuses_a_bad_config_with_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "injector.yaml"
    config.write_text(
        "listen: 0.0.0.0:8443\ntls: {certFile: /x, keyFile: /y}\ndefaults: {app: {port: 0}}\n"
    )
    proc = run_cli("-c", str(config))
    assert proc.returncode == 2, proc.stderr
    assert f"{config}: defaults.app.port: must be between 1 and 65535" in proc.stderr
    assert "Traceback" not in proc.stderr
    config.write_text(
        "listen: 127.0.0.1:0\ntls: {certFile: /nonexistent/tls.crt, keyFile: /nonexistent/tls.key}\n"
    )
    proc = run_cli("-c", str(config))
    assert proc.returncode == 2, proc.stderr
    assert "tls: cannot load" in proc.stderr and "Traceback" not in proc.stderr
