"""The example apps (examples/python, examples/node, examples/go) against the real sidecar and broker.

Each app runs as its own process, exactly as its README says, over TCP and over a Unix socket. The
outcomes are checked from three sides: the app's own decision log, the sidecar's counters, and the
DLQ topic's records and `__dlq.errors.*` headers.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.harness import ROOT, free_port, sidecar, wait_until, write_config
from tests.kafkatools import Broker, Rec

EXAMPLES = ROOT / "examples"
LANGUAGES = ["python", "node", "go"]
DELIVERY_LIMIT = 4

N_OK, N_POISON, N_FLAKY, N_SLOW = 30, 4, 4, 4


@pytest.fixture(scope="session")
def go_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go example, built once per session (go build, as its README's `go run .` would)."""
    out = tmp_path_factory.mktemp("go-example") / "orders"
    proc = subprocess.run(
        ["go", "build", "-o", str(out), "."],
        cwd=EXAMPLES / "go",
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, f"go build failed:\n{proc.stderr}"
    return out


def app_command(lang: str, go_binary: Path) -> list[str]:
    if lang == "python":
        return [sys.executable, str(EXAMPLES / "python" / "app.py")]
    if lang == "node":
        node = shutil.which("node")
        assert node, "node is not installed"
        return [node, str(EXAMPLES / "node" / "app.js")]
    return [str(go_binary)]


def flag(lang: str, name: str) -> str:
    return f"-{name}" if lang == "go" else f"--{name}"


@contextmanager
def example_app(
    lang: str, go_binary: Path, tmp_path: Path, transport: str, api: str
) -> Iterator[tuple[str, str | None, Path]]:
    """Start an example app; yields (app url, unix socket or None, its stdout log)."""
    log_path = tmp_path / f"{lang}-app.log"
    cmd = app_command(lang, go_binary)
    sock: str | None = None
    if transport == "unix":
        sock = str(tmp_path / f"{lang}.sock")
        cmd += [flag(lang, "unix"), sock]
    else:
        cmd += [flag(lang, "port"), "0"]
    sidecar_api = api if api.startswith("unix:") else f"http://{api}"
    env = {**os.environ, "SIDECAR_API": sidecar_api, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 30
            first = ""
            while time.monotonic() < deadline:
                first = log_path.read_text().partition("\n")[0]
                if "listening on" in first:
                    break
                assert proc.poll() is None, f"{lang} app exited:\n{log_path.read_text()}"
                time.sleep(0.05)
            match = re.search(r"listening on (\S+)", first)
            assert match, f"{lang} app did not start:\n{log_path.read_text()}"
            where = match.group(1)
            url = "http://localhost/records" if sock else f"{where}/records"
            if sock:
                assert where == f"unix:{sock}"
            yield url, sock, log_path
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if sock:
        assert not Path(sock).exists(), f"{lang} app left its socket file behind"


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=5)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def _get_status(api: str) -> dict[str, Any] | None:
    """GET /v1/status from the sidecar's API (host:port or unix:/path); None while it is not up."""
    if api.startswith("unix:"):
        conn: http.client.HTTPConnection = _UnixHTTPConnection(api.removeprefix("unix:"))
    else:
        host, _, port = api.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/v1/status")
        response = conn.getresponse()
        body = response.read()
        return json.loads(body) if response.status == 200 else None  # type: ignore[no-any-return]
    except OSError:
        return None
    finally:
        conn.close()


async def api_status(api: str) -> dict[str, Any]:
    while (status := await trio.to_thread.run_sync(_get_status, api)) is None:
        await trio.sleep(0.1)
    return status


def orders() -> list[Rec]:
    recs: list[tuple[str, dict[str, object]]] = []
    recs += [(f"ok-{i}", {"kind": "ok"}) for i in range(N_OK)]
    recs += [(f"poison-{i}", {"kind": "poison"}) for i in range(N_POISON)]
    recs += [(f"flaky-{i}", {"kind": "flaky"}) for i in range(N_FLAKY)]
    recs += [(f"slow-{i}", {"kind": "slow"}) for i in range(N_SLOW)]
    # Never recovers: released at every attempt until the delivery limit archives it.
    recs += [("hopeless-0", {"kind": "flaky", "fails": 99})]
    out = [
        Rec(key=f"customer-{i % 7}".encode(), value=json.dumps({"id": oid, **body}).encode())
        for i, (oid, body) in enumerate(recs)
    ]
    out.append(Rec(key=b"customer-x", value=b"not json"))
    return out


DECISION = re.compile(r"^order=(\S+) kind=(\S+) delivery=(\d+) answer=(\w+)$")
ACKED = re.compile(r"^order=(\S+) acked=accept (result|error)=(.*)$")


def parse_app_log(text: str) -> tuple[dict[str, list[tuple[int, str]]], dict[str, str]]:
    """Per order id: [(delivery count, answer)], and the result of each deferred ack."""
    decisions: dict[str, list[tuple[int, str]]] = defaultdict(list)
    acked: dict[str, str] = {}
    for line in text.splitlines():
        if m := DECISION.match(line):
            decisions[m.group(1)].append((int(m.group(3)), m.group(4)))
        elif m := ACKED.match(line):
            acked[m.group(1)] = f"{m.group(2)}={m.group(3)}"
    return decisions, acked


def header_map(rec: Rec) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in rec.headers}


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("lang", LANGUAGES)
async def test_example_app_outcomes(
    lang: str, transport: str, broker: Broker, unique: str, tmp_path: Path, go_binary: Path
) -> None:
    topic = await trio.to_thread.run_sync(broker.create_topic, f"orders-{unique}", 3)
    dlq_topic = f"dlq.{topic}"
    group = f"g-{unique}"
    # Over Unix sockets, both ways: the sidecar pushes to the app's socket and the app acks on the
    # sidecar's API socket (a pod sharing an emptyDir volume).
    api = f"unix:{tmp_path / 'api.sock'}" if transport == "unix" else f"127.0.0.1:{free_port()}"
    recs = orders()
    total = len(recs)
    with example_app(lang, go_binary, tmp_path, transport, api) as (url, sock, app_log):
        cfg = write_config(
            tmp_path / "sidecar.yaml",
            bootstrap=broker.bootstrap,
            group=group,
            topics=[topic],
            app_url=url,
            unix_socket=sock,
            api_listen=api,
            extra={"delivery.count.limit": DELIVERY_LIMIT},
        )
        await trio.to_thread.run_sync(broker.produce, topic, recs)
        async with sidecar(cfg, wait_api=False) as sc:
            done = 0
            with trio.move_on_after(90):
                while done < total:
                    await trio.sleep(0.1)
                    status = await api_status(api)
                    counters = status["counters"]
                    done = counters["delivered"].get("accept", 0) + sum(
                        counters["archived"].values()
                    )
            assert done >= total, (
                f"{done}/{total} done: {status}\n{app_log.read_text()[-2000:]}\n{sc.log_text()[-2000:]}"
            )

            # Every decision and deferred ack is in the app's log before the app stops (it may log
            # after it answered).
            def logged() -> bool:
                decisions, acked = parse_app_log(app_log.read_text())
                lines = sum(len(v) for v in decisions.values())
                return len(acked) >= N_SLOW and lines >= counters["attempts"]

            await wait_until(logged, 30, "the app's log lines for every answer", poll_s=0.1)
            assert await sc.stop() == 0, sc.log_text()[-3000:]
        text = app_log.read_text()

    decisions, acked = parse_app_log(text)
    # ok: accepted once, at the first delivery.
    for i in range(N_OK):
        assert decisions[f"ok-{i}"] == [(1, "accept")], (counters, sc.log_text()[-3000:])
    # poison: rejected once, never redelivered.
    for i in range(N_POISON):
        assert decisions[f"poison-{i}"] == [(1, "reject")]
    # flaky: released at deliveries 1 and 2, accepted at the 3rd.
    for i in range(N_FLAKY):
        assert decisions[f"flaky-{i}"] == [(1, "release"), (2, "release"), (3, "accept")]
    # slow: deferred once, then accepted through POST /v1/acks, which the sidecar answered "ok".
    for i in range(N_SLOW):
        assert decisions[f"slow-{i}"] == [(1, "deferred")]
        assert acked[f"slow-{i}"] == "result=ok"
    # hopeless: released at every attempt up to the limit.
    assert decisions["hopeless-0"] == [(n, "release") for n in range(1, DELIVERY_LIMIT + 1)]
    assert decisions["?"] == [(1, "reject")]

    assert counters["delivered"] == {
        "accept": N_OK + N_FLAKY + N_SLOW,
        "reject": N_POISON + 1,
        "release": 2 * N_FLAKY + DELIVERY_LIMIT,
    }
    assert counters["archived"] == {"rejected": N_POISON + 1, "delivery_count_exceeded": 1}
    assert counters["dlq_written"] == N_POISON + 2
    assert counters["expired_answers"] == 0

    dlq = await trio.to_thread.run_sync(broker.read_topic, dlq_topic, N_POISON + 2, 30.0)
    assert len(dlq) == N_POISON + 2
    by_class: dict[str, list[dict[str, str]]] = defaultdict(list)
    for rec in dlq:
        h = header_map(rec)
        assert h["__dlq.errors.topic"] == topic
        assert h["__dlq.errors.group"] == group
        by_class[h["__dlq.errors.exception.class.name"]].append(h)
    poison = by_class["OrderValidationError"]
    assert len(poison) == N_POISON
    for h in poison:
        assert re.fullmatch(
            r"order poison-\d: quantity must be positive", h["__dlq.errors.exception.message"]
        )
        assert h["__dlq.errors.message"] == "Offset rejected by client."
        assert h["__dlq.errors.delivery.count"] == "1"
        assert h["__dlq.errors.exception.stacktrace"].strip()
    (parse_error,) = by_class["OrderParseError"]
    assert parse_error["__dlq.errors.message"] == "Offset rejected by client."
    # Archived at the limit: the last release's error travels into the DLQ record.
    (hopeless,) = [
        h for hs in by_class.values() for h in hs if h not in poison and h is not parse_error
    ]
    assert hopeless["__dlq.errors.message"] == "Offset delivery count exceeded the threshold."
    assert hopeless["__dlq.errors.delivery.count"] == str(DELIVERY_LIMIT)
    assert hopeless["__dlq.errors.exception.class.name"] == "InventoryUnavailable"
    assert hopeless["__dlq.errors.exception.message"] == (
        f"inventory service timed out (delivery {DELIVERY_LIMIT})"
    )
