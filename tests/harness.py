"""Integration harness: a real test app (HTTP over TCP or a Unix socket) and the sidecar as a real subprocess.

The app records every delivery it sees (coordinates, delivery count, headers, body, concurrency per key) and
answers with a per-test policy. The sidecar runs as users run it: `python -m sidecar run -c FILE`.

The one entry point for "a running sidecar with this app policy and config" is `running_sidecar`: it creates
the topic, serves the app (TCP or a Unix socket), writes the config, produces the records given, starts the
sidecar (a subprocess, or `run_sidecar` in this process) and waits for it; it yields a `Rig` that knows all
of them. The building blocks stay usable on their own: `serving` (an app on a transport, yielding an
`AppEndpoint`), `write_config`, `sidecar` (one subprocess), `running_app`; `sidecar_process` is the
subprocess for synchronous tests.

Small shared helpers: the waits (`wait_until`, `wait_until_thread`, `wait_status`, `wait_committed_at_end`),
answers (`json_answer`, the `by_value` policy and its `by_value_records`), `counts_by_value`, `FAST`
settings, `restartable_member` (Kafka settings for a sidecar a test kills), `transactional_dlq_writer`,
`short_tmp` (a directory short enough for a Unix socket). Kafka helpers live in tests/kafkatools.py (e.g.
`Rec.headers_by_name`, `Broker.set_group_config`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import trio
import yaml
from confluent_kafka import Message

from sidecar.core.wire import decode_kafka_header, decode_key
from sidecar.http.server import Request, Response, json_response, serve_http
from sidecar.kafka.dlq import DlqWriter
from sidecar.kafka.source import AssignedPartition, OffsetToCommit
from sidecar.ops.broker import free_port
from tests.kafkatools import Broker, Rec

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
        return self.revoked_now(partitions)

    def revoked_now(self, partitions: Sequence[tuple[str, int]]) -> Sequence[OffsetToCommit]:
        if self.revoke_commit is None:
            return []
        offset, metadata = self.revoke_commit
        return [OffsetToCommit(t, p, offset, metadata) for t, p in partitions]

    async def on_lost(self, partitions: Sequence[tuple[str, int]]) -> None:
        pass

    def on_messages(self, messages: Sequence[Message]) -> None:
        self.messages.extend(messages)

    def messages_taken(self) -> None:
        pass


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


BREAKER_KEY = "errors.deadletterqueue.circuit.breaker."


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
    extra = extra or {}
    if not any(k.startswith(BREAKER_KEY) for k in extra):
        # Most tests dead-letter most of their records on purpose, which the DLQ circuit breaker
        # (on by default) would stop; the tests of the breaker, its defaults included
        # (tests/integration/test_breaker_default.py), name one of its keys.
        cfg[BREAKER_KEY + "enable"] = False
    for k, v in extra.items():
        cfg[k] = v
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# A share consumer's close "blocks until the broker has confirmed the outstanding acknowledgements and the
# group has been left, up to roughly socket.timeout.ms" (confluent-kafka 2.16.1's ShareConsumer.close
# docstring; librdkafka's default is 60 s): a sidecar stopped just after its consumers joined was seen to
# take over 30 s. A stop is still bounded, by drain + that.
SHARE_STOP_TIMEOUT_S = 90.0


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

    async def wait_status(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        """Until `/v1/status` satisfies `predicate`; returns that status."""
        with trio.move_on_after(timeout_s):
            while True:
                st = await self.status()
                if predicate(st):
                    return st
                await trio.sleep(0.1)
        raise AssertionError(
            f"timed out after {timeout_s}s waiting for {what}: {await self.status()}"
        )

    async def wait_ready_assigned(self, timeout_s: float = 60) -> None:
        """Until the consumer owns its partitions (status lists a partition only once it has a
        committed offset or a fetched record, so ask readiness instead)."""
        with trio.move_on_after(timeout_s):
            while True:
                _code, ready = await self.get("/readyz")
                checks = ready["checks"]
                if checks.get("assigned") or checks.get("subscribed"):  # a share group: subscribed
                    # the librdkafka assignment is all-or-nothing per rebalance here: one group member
                    return
                await trio.sleep(0.1)
        raise AssertionError(f"not assigned after {timeout_s}s:\n{self.log_text()[-3000:]}")

    async def stop(self, sig: int = signal.SIGTERM, timeout_s: float | None = None) -> int:
        """Signal the sidecar and wait for its exit: 30 s, or SHARE_STOP_TIMEOUT_S with `engine: share`."""
        engine = (yaml.safe_load(self.config_path.read_text()) or {}).get("engine")
        timeout_s = timeout_s or (SHARE_STOP_TIMEOUT_S if engine == "share" else 30.0)
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        with trio.move_on_after(timeout_s):
            return await self.proc.wait()
        raise AssertionError(
            f"the sidecar did not exit within {timeout_s:.0f}s of signal {sig}; its log's end:\n"
            f"{self.log_text()[-6000:]}"
        )

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
async def sidecar(
    config_path: Path,
    *,
    wait_api: bool = True,
    command: Sequence[str] | None = None,
) -> AsyncIterator[Sidecar]:
    """The sidecar as a subprocess: `python -m sidecar` (or `command`, e.g. the console script) with
    `run -c config_path`, its output in `config_path` with a `.log` suffix. Still running when the block
    ends, it gets SIGTERM, then SIGKILL after 30 s."""
    cfg = yaml.safe_load(config_path.read_text())
    log_path = config_path.with_suffix(".log")
    log_file = open(log_path, "ab")  # noqa: SIM115 - closed below, after the process ends
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = list(command) if command is not None else [sys.executable, "-m", "sidecar"]
    proc = await trio.lowlevel.open_process(
        [*argv, "run", "-c", str(config_path)],
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


@contextmanager
def sidecar_process(config_path: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The sidecar as a subprocess for synchronous code (`python -m sidecar run -c config_path`, its
    output in `log_path`); terminated at the end (SIGTERM, then SIGKILL after 30 s)."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "run", "-c", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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


# ----------------------------------------------------------------------------- small shared helpers

# Small lock durations and backoffs keep a test well under its time budget.
FAST: dict[str, Any] = {
    "errors.retry.delay.initial.ms": 50,
    "errors.retry.delay.max.ms": 100,
    "commit.interval.ms": 100,
    "shutdown.drain.timeout.ms": 2000,
}


def json_answer(obj: object, status: int = 200) -> Response:
    """An app answer with `obj` as its JSON body."""
    return Response(status, (("Content-Type", "application/json"),), json.dumps(obj).encode())


def by_value(d: Delivery) -> Response:
    """A policy that answers by the value's prefix: `reject:...` is rejected (class
    `com.example.Invalid`, with a stack trace), `release:...` released (`com.example.Flaky`), the rest
    accepted."""
    kind = (d.value or b"").split(b":")[0]
    if kind == b"reject":
        return json_response(
            {
                "ack": "reject",
                "error": {
                    "class": "com.example.Invalid",
                    "message": f"bad order {d.offset}",
                    "stacktrace": "at line 1",
                },
            }
        )
    if kind == b"release":
        return json_response(
            {"ack": "release", "error": {"class": "com.example.Flaky", "message": "try later"}}
        )
    return Response(200)


def by_value_records(n: int, partitions: int = 3) -> list[Rec]:
    """Records for `by_value`: values `accept:i`, `reject:i`, `release:i` in turn over `partitions`,
    97 keys (every 30th record from the second has none), headers `seq`, a binary one and a repeated
    one; every 30th from the fifth also carries a forged `__dlq.errors.topic` (the sidecar must
    overwrite it, not duplicate it)."""
    kinds = ["accept", "reject", "release"]
    recs = []
    for i in range(n):
        key: bytes | None = f"k{i % 97}".encode() if i % 30 != 1 else None
        headers: tuple[tuple[str, bytes | None], ...] = (
            ("seq", str(i).encode()),
            ("bin", b"\xff\x00"),
            ("rep", b"a"),
            ("rep", b"b"),
        )
        if i % 30 == 4:
            headers = (*headers, ("__dlq.errors.topic", b"spoofed"))
        value = f"{kinds[i % 3]}:{i}".encode()
        recs.append(Rec(key=key, value=value, headers=headers, partition=i % partitions))
    return recs


def restartable_member(unique: str) -> dict[str, Any]:
    """Kafka settings for a sidecar killed and restarted in a test: a short session, and static
    membership, so a restarted sidecar takes over its dead incarnation at once."""
    return {
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "group.instance.id": f"sidecar-{unique}",
    }


def transactional_dlq_writer(bootstrap: str, group: str, transactional_id: str) -> DlqWriter:
    """A transactional DLQ writer on its own (no sidecar): copies on, no auto-creation, one partition."""
    writer = DlqWriter(
        {"bootstrap.servers": bootstrap},
        group,
        copy_record=True,
        stacktrace_max_bytes=1024,
        retries_timeout_ms=10_000,
        auto_create=False,
        topic_partitions=1,
        topic_replication_factor=1,
        transactional_id=transactional_id,
    )
    return writer


def counts_by_value(deliveries: list[Delivery]) -> dict[bytes | None, list[int]]:
    """The delivery counts each value was seen with, in arrival order."""
    out: dict[bytes | None, list[int]] = defaultdict(list)
    for d in deliveries:
        out[d.value].append(d.delivery_count)
    return out


async def produce(broker: Broker, topic: str, recs: list[Rec]) -> None:
    await trio.to_thread.run_sync(broker.produce, topic, recs)


async def wait_committed_at_end(
    broker: Broker, group: str, topic: str, partitions: int, timeout_s: float = 60
) -> None:
    """Until the group's committed offset of every partition is that partition's end offset."""
    parts = list(range(partitions))
    ends = await trio.to_thread.run_sync(broker.end_offsets, topic, parts)

    def at_end() -> bool:
        got = broker.committed(group, topic, parts)
        return all(got[p][0] == ends[p] for p in parts)

    await wait_until_thread(at_end, timeout_s, f"committed offsets at the ends {ends}")


async def wait_status(
    sc: Sidecar, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
) -> dict[str, Any]:
    return await sc.wait_status(predicate, timeout_s, what)


async def wait_assigned(sc: Sidecar, partitions: int, timeout_s: float = 60) -> None:
    """Until the consumer owns its partitions (see `Sidecar.wait_ready_assigned`)."""
    await sc.wait_ready_assigned(timeout_s)


@contextmanager
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path: Unix socket paths are limited to ~107 bytes, and pytest's
    tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="dlqs-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------- a running sidecar

Transport = Literal["tcp", "unix"]
App = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class AppEndpoint:
    """Where a test app listens: a loopback TCP port, or a Unix socket."""

    port: int | None = None
    unix_socket: str | None = None

    def url(self, path: str = "/records") -> str:
        """The `app.url` that reaches `path` (over a Unix socket, the path alone)."""
        return path if self.unix_socket else f"http://127.0.0.1:{self.port}{path}"


@asynccontextmanager
async def serving(
    app: App, transport: Transport = "tcp", *, port: int | None = None
) -> AsyncIterator[AppEndpoint]:
    """Serve `app` over TCP (on `port`, or a free one) or on a Unix socket in a short fresh directory."""
    if transport == "unix":
        with short_tmp() as sock_dir:
            sock = str(sock_dir / "app.sock")
            async with running_app(app, ("unix", sock)):  # type: ignore[arg-type]
                yield AppEndpoint(unix_socket=sock)
        return
    port = port or free_port()
    async with running_app(app, ("tcp", "127.0.0.1", port)):  # type: ignore[arg-type]
        yield AppEndpoint(port=port)


@dataclass
class InProcessSidecar:
    """`run_sidecar` in this process: the engines it reported and its exit code once it returned."""

    engines: list[Any] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)

    def request_stop(self) -> None:
        self.engines[0].stop()


@dataclass
class Rig:
    """A topic, a group, the app serving at `endpoint`, a config for them, and the sidecar running it."""

    broker: Broker
    tmp_path: Path
    topic: str
    group: str
    partitions: int
    app: Any
    endpoint: AppEndpoint
    config_path: Path
    path: str = "/records"
    extra: dict[str, Any] | None = None
    app_extra: dict[str, Any] | None = None
    kafka_extra: dict[str, Any] | None = None
    topics: list[str] = field(default_factory=list)
    _sc: Sidecar | None = None
    in_process: InProcessSidecar = field(default_factory=InProcessSidecar)

    @property
    def sc(self) -> Sidecar:
        assert self._sc is not None, "no sidecar subprocess in this rig (start=False or in_process)"
        return self._sc

    @property
    def dlq_topic(self) -> str:
        return f"dlq.{self.topic}"

    def config(self, name: str = "sidecar.yaml", **overrides: Any) -> Path:
        """Write a(nother) config for this rig's topic, group and app (`tmp_path/name`); keyword
        arguments replace `write_config`'s (`extra`, `app_extra`, `kafka_extra`, `api_listen`, ...)."""
        kwargs: dict[str, Any] = {
            "bootstrap": self.broker.bootstrap,
            "group": self.group,
            "topics": self.topics or [self.topic],
            "app_url": self.endpoint.url(self.path),
            "unix_socket": self.endpoint.unix_socket,
            "extra": self.extra,
            "app_extra": self.app_extra,
            "kafka_extra": self.kafka_extra,
            **overrides,
        }
        return write_config(self.tmp_path / name, **kwargs)

    def sidecar(self, config_path: Path | None = None, **kwargs: Any) -> Any:
        """Another sidecar subprocess (`sidecar(...)`), on this rig's config unless given one."""
        return sidecar(config_path or self.config_path, **kwargs)

    def serve_app(self) -> Any:
        """Serve the app at the rig's TCP endpoint now (after `running_sidecar(..., serve=False)`)."""
        return serving(self.app, "tcp", port=self.endpoint.port)

    async def produce(self, recs: list[Rec]) -> None:
        await produce(self.broker, self.topic, recs)

    async def committed_at_end(self, timeout_s: float = 60) -> None:
        await wait_committed_at_end(self.broker, self.group, self.topic, self.partitions, timeout_s)

    async def read_dlq(self, expected: int, timeout_s: float = 60) -> list[Rec]:
        return await trio.to_thread.run_sync(
            lambda: self.broker.read_topic(self.dlq_topic, expected, timeout_s=timeout_s)
        )


Wait = Literal["api", "assigned", "none"]


@asynccontextmanager
async def running_sidecar(
    broker: Broker,
    tmp_path: Path,
    app: Any = None,
    *,
    unique: str | None = None,
    topic: str | None = None,
    topics: list[str] | None = None,
    group: str | None = None,
    partitions: int = 1,
    transport: Transport = "tcp",
    port: int | None = None,
    path: str = "/records",
    config_name: str = "sidecar.yaml",
    extra: dict[str, Any] | None = None,
    app_extra: dict[str, Any] | None = None,
    kafka_extra: dict[str, Any] | None = None,
    api_listen: str | None = None,
    produce_first: list[Rec] | None = None,
    serve: bool = True,
    start: bool = True,
    wait: Wait = "api",
    mode: Literal["process", "in_process"] = "process",
    command: Sequence[str] | None = None,
    run_kwargs: dict[str, Any] | None = None,
) -> AsyncIterator[Rig]:
    """A running sidecar with this app and config: the one prelude of the end-to-end tests.

    In order: the topic (`topic`, or `src-{unique}` created with `partitions`; `topics` for several,
    created by the caller), the group (`group`, or
    `g-{unique}`), `app` (a `RecordingApp` by default; any handler) served over `transport`, the config
    at `tmp_path/config_name` (`write_config` with `extra`, `app_extra`, `kafka_extra`, `api_listen`),
    `produce_first` produced, then the sidecar: a subprocess (`mode="process"`, `command` instead of
    `python -m sidecar`), waited for per `wait` ("api": its API answers; "assigned": its partitions are
    assigned; "none"), or `run_sidecar` in this process (`mode="in_process"`, `run_kwargs` passed on;
    stop it with `rig.in_process.request_stop()`, the block then waits for it to return). `start=False`
    stops before the sidecar (start them with `rig.sidecar()`); `serve=False` leaves the app's TCP port
    unserved (an app that is down) until `rig.serve_app()`. Everything stops when the block ends.
    """
    if topic is None and topics:
        topic = topics[0]
    if topic is None:
        assert unique is not None, "running_sidecar needs `topic` or `unique`"
        name = f"src-{unique}"
        topic = await trio.to_thread.run_sync(
            lambda: broker.create_topic(name, partitions=partitions)
        )
    if group is None:
        assert unique is not None, "running_sidecar needs `group` or `unique`"
        group = f"g-{unique}"
    if app is None:
        app = RecordingApp()
    async with contextlib.AsyncExitStack() as stack:
        if serve:
            endpoint = await stack.enter_async_context(serving(app, transport, port=port))
        else:
            assert transport == "tcp", "an app that is down listens on TCP later"
            endpoint = AppEndpoint(port=port or free_port())
        rig = Rig(
            broker=broker,
            tmp_path=tmp_path,
            topic=topic,
            group=group,
            partitions=partitions,
            app=app,
            endpoint=endpoint,
            config_path=tmp_path / config_name,
            path=path,
            extra=extra,
            app_extra=app_extra,
            kafka_extra=kafka_extra,
            topics=list(topics or []),
        )
        rig.config(config_name, api_listen=api_listen)
        if produce_first is not None:
            await rig.produce(produce_first)
        if not start:
            yield rig
        elif mode == "in_process":
            async with _in_process(rig, run_kwargs or {}):
                yield rig
        else:
            async with sidecar(rig.config_path, wait_api=wait != "none", command=command) as sc:
                rig._sc = sc
                if wait == "assigned":
                    await sc.wait_ready_assigned()
                yield rig


@asynccontextmanager
async def _in_process(rig: Rig, run_kwargs: dict[str, Any]) -> AsyncIterator[None]:
    from sidecar.config import load_config
    from sidecar.service.daemon import run_sidecar

    cfg = load_config(rig.config_path)
    handle = rig.in_process

    async def run() -> None:
        handle.codes.append(await run_sidecar(cfg, on_engine=handle.engines.append, **run_kwargs))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        yield
