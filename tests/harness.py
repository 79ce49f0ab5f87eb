"""Integration harness: a real test app (HTTP over TCP or a Unix socket) and the sidecar as a real subprocess.

The app records every delivery it sees (coordinates, delivery count, headers, body, concurrency per key) and
answers with a per-test policy. The sidecar runs as users run it: `python -m sidecar run -c FILE`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import yaml
from confluent_kafka import Message

from sidecar.core.wire import decode_kafka_header, decode_key
from sidecar.http.server import Request, Response, serve_http
from sidecar.kafka.source import AssignedPartition, OffsetToCommit

ROOT = Path(__file__).resolve().parent.parent


class RecordingListener:
    """A KafkaSource listener that records what it is given; on revoke it commits `revoke_commit`
    (offset, metadata) for each partition, or nothing when that is None."""

    def __init__(self, revoke_commit: tuple[int, str] | None = None) -> None:
        self.revoke_commit = revoke_commit
        self.assigned: list[AssignedPartition] = []
        self.messages: list[Message] = []

    async def on_assigned(self, partitions: Sequence[AssignedPartition]) -> None:
        self.assigned.extend(partitions)

    async def on_revoked(self, partitions: Sequence[tuple[str, int]]) -> Sequence[OffsetToCommit]:
        if self.revoke_commit is None:
            return []
        offset, metadata = self.revoke_commit
        return [OffsetToCommit(t, p, offset, metadata) for t, p in partitions]

    async def on_lost(self, partitions: Sequence[tuple[str, int]]) -> None:
        pass

    async def on_messages(self, messages: Sequence[Message]) -> None:
        self.messages.extend(messages)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Delivery:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    delivery_count: int
    delivery_id: str
    raw_headers: tuple[tuple[str, str], ...]
    received_at: float


Policy = Callable[[Delivery], Awaitable[Response] | Response]


def accept(_d: Delivery) -> Response:
    return Response(200)


@dataclass
class RecordingApp:
    """A real HTTP app for the sidecar to push to."""

    policy: Policy = accept
    deliveries: list[Delivery] = field(default_factory=list)
    in_flight_by_key: dict[bytes | None, int] = field(default_factory=lambda: defaultdict(int))
    max_concurrency: int = 0
    concurrency: int = 0
    key_overlap: list[bytes | None] = field(default_factory=list)
    delay_s: float = 0.0
    changed: trio.Event = field(default_factory=trio.Event)

    async def __call__(self, request: Request) -> Response:
        value: bytes | None = None if request.header("kafka-value-null") == "true" else request.body
        d = Delivery(
            topic=request.header("kafka-topic") or "",
            partition=int(request.header("kafka-partition") or -1),
            offset=int(request.header("kafka-offset") or -1),
            key=decode_key(request.header("kafka-key"), request.header("kafka-key-encoding")),
            value=value,
            headers=[decode_kafka_header(h) for h in request.header_values("kafka-header")],
            delivery_count=int(request.header("kafka-delivery-count") or 0),
            delivery_id=request.header("kafka-delivery-id") or "",
            raw_headers=request.headers,
            received_at=time.monotonic(),
        )
        self.deliveries.append(d)
        self.concurrency += 1
        self.max_concurrency = max(self.max_concurrency, self.concurrency)
        if d.key is not None:
            self.in_flight_by_key[d.key] += 1
            if self.in_flight_by_key[d.key] > 1:
                self.key_overlap.append(d.key)
        try:
            if self.delay_s:
                await trio.sleep(self.delay_s)
            result = self.policy(d)
            if not isinstance(result, Response):
                result = await result
            return result
        finally:
            self.concurrency -= 1
            if d.key is not None:
                self.in_flight_by_key[d.key] -= 1
            self.changed.set()
            self.changed = trio.Event()

    def seen(self) -> set[tuple[int, int]]:
        return {(d.partition, d.offset) for d in self.deliveries}


@asynccontextmanager
async def running_app(
    app: RecordingApp, listen: tuple[str, Any, Any] | tuple[str, str]
) -> AsyncIterator[Any]:
    async with trio.open_nursery() as nursery:
        where = await nursery.start(serve_http, app, listen)
        yield where
        nursery.cancel_scope.cancel()


def write_config(
    path: Path,
    *,
    bootstrap: str,
    group: str,
    topics: list[str],
    app_url: str,
    unix_socket: str | None = None,
    api_listen: str | None = None,
    extra: dict[str, Any] | None = None,
    app_extra: dict[str, Any] | None = None,
    kafka_extra: dict[str, Any] | None = None,
) -> Path:
    cfg: dict[str, Any] = {
        "kafka": {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            **(kafka_extra or {}),
        },
        "source": {"topics": topics},
        "app": {
            "url": app_url,
            "unix_socket": unix_socket,
            "timeout.ms": 5000,
            **(app_extra or {}),
        },
        "share.record.lock.duration.ms": 10000,
        "errors.retry.delay.initial.ms": 50,
        "errors.retry.delay.max.ms": 200,
        "commit.interval.ms": 200,
        "shutdown.drain.timeout.ms": 5000,
        "api": {"listen": api_listen or f"127.0.0.1:{free_port()}"},
        "logging": {"level": "info", "format": "json"},
    }
    for k, v in (extra or {}).items():
        cfg[k] = v
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@dataclass
class Sidecar:
    proc: trio.Process
    config_path: Path
    api: str
    log_path: Path

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line})
        return out

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def get(self, path: str) -> tuple[int, Any]:
        host, _, port = self.api.rpartition(":")
        return await trio.to_thread.run_sync(_http_get, host, int(port), path)

    async def post_json(self, path: str, body: Any) -> tuple[int, Any]:
        host, _, port = self.api.rpartition(":")
        return await trio.to_thread.run_sync(_http_post, host, int(port), path, body)

    async def post_raw(
        self, path: str, body: bytes, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        """POST arbitrary bytes (e.g. a malformed body); returns the status and the raw body."""
        host, _, port = self.api.rpartition(":")
        return await trio.to_thread.run_sync(
            _http_post_raw, host, int(port), path, body, content_type
        )

    async def status(self) -> dict[str, Any]:
        code, body = await self.get("/v1/status")
        assert code == 200, body
        return body  # type: ignore[no-any-return]

    async def wait_assigned(self, n_partitions: int, timeout_s: float = 60) -> None:
        with trio.fail_after(timeout_s):
            while True:
                try:
                    st = await self.status()
                    if len(st["partitions"]) >= n_partitions:
                        return
                except (OSError, AssertionError, ValueError):
                    pass
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"sidecar exited early ({self.proc.returncode}):\n{self.log_text()[-3000:]}"
                    )
                await trio.sleep(0.1)

    async def wait_api(self, timeout_s: float = 30) -> None:
        with trio.fail_after(timeout_s):
            while True:
                try:
                    code, _ = await self.get("/healthz")
                    if code in (200, 503):
                        return
                except OSError:
                    pass
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"sidecar exited early ({self.proc.returncode}):\n{self.log_text()[-3000:]}"
                    )
                await trio.sleep(0.1)

    async def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        with trio.fail_after(timeout_s):
            return await self.proc.wait()

    async def wait_exit(self, timeout_s: float = 60) -> int:
        with trio.fail_after(timeout_s):
            return await self.proc.wait()


def _http_get(host: str, port: int, path: str) -> tuple[int, Any]:
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        data = resp.read()
        ctype = resp.getheader("content-type") or ""
        return resp.status, json.loads(data) if "json" in ctype else data.decode()
    finally:
        conn.close()


def _http_post(host: str, port: int, path: str, body: Any) -> tuple[int, Any]:
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request(
            "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _http_post_raw(
    host: str, port: int, path: str, body: bytes, content_type: str
) -> tuple[int, bytes]:
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@asynccontextmanager
async def sidecar(config_path: Path, *, wait_api: bool = True) -> AsyncIterator[Sidecar]:
    cfg = yaml.safe_load(config_path.read_text())
    log_path = config_path.with_suffix(".log")
    log_file = open(log_path, "ab")  # noqa: SIM115 - closed below, after the process ends
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "sidecar", "run", "-c", str(config_path)],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=str(ROOT),
        env=env,
    )
    sc = Sidecar(proc, config_path, cfg["api"]["listen"], log_path)
    try:
        if wait_api:
            await sc.wait_api()
        yield sc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with trio.move_on_after(30):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        log_file.close()


async def wait_until(
    predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05
) -> None:
    with trio.move_on_after(timeout_s):
        while not predicate():
            await trio.sleep(poll_s)
        return
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


async def wait_until_thread(
    predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.2
) -> None:
    """Like `wait_until`, for a blocking predicate (e.g. one that asks the broker)."""
    with trio.move_on_after(timeout_s):
        while not await trio.to_thread.run_sync(predicate):
            await trio.sleep(poll_s)
        return
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
