"""app.format: cloudevents end to end: the real broker, the sidecar process, a real HTTP app.

The app reads each request with the official CloudEvents SDK (binary mode in single mode, the
JSON format for each event of a batch), over TCP and over a Unix socket. Records carrying a
CloudEvent in Kafka's binary binding are produced with the SDK's Kafka binding. The answers are
the same as in raw format: a release is redelivered (with the same ``id``), a reject goes to the
DLQ, and everything ends committed.
"""

from __future__ import annotations

import datetime
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from sidecar.http.server import Request, Response, serve_http
from tests.harness import free_port, sidecar, wait_until, wait_until_thread, write_config
from tests.kafkatools import Broker, Rec

FAST: dict[str, Any] = {
    "errors.retry.delay.initial.ms": 50,
    "errors.retry.delay.max.ms": 100,
    "commit.interval.ms": 100,
}
JSON = {"Content-Type": "application/json"}


@dataclass
class CloudEventsApp:
    """Parses every request with the SDK; ``answer`` decides per event (default accept)."""

    batch: bool
    events: list[tuple[Any, dict[str, str]]] = field(default_factory=list)  # (event, headers)
    bodies: list[dict[str, Any]] = field(default_factory=list)  # raw batch items
    content_types: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    release_once: set[str] = field(default_factory=set)  # ce ids to release on first sight
    reject: set[str] = field(default_factory=set)  # ce ids to reject

    def _ack(self, event: Any) -> str:
        if event.get_id() in self.reject:
            return "reject"
        if event.get_id() in self.release_once:
            self.release_once.discard(event.get_id())
            return "release"
        return "accept"

    async def __call__(self, request: Request) -> Response:
        headers = dict(request.headers)
        self.content_types.append(headers.get("content-type", ""))
        try:
            if self.batch:
                items = json.loads(request.body)
                results = []
                for item in items:
                    event = JSONFormat().read(CloudEvent, json.dumps(item).encode())
                    self.events.append((event, headers))
                    self.bodies.append(item)
                    results.append({"id": item["deliveryid"], "ack": self._ack(event)})
                body = json.dumps({"results": results}).encode()
                return Response(200, tuple(JSON.items()), body)
            message = ce_http.HTTPMessage(headers, request.body)
            event = ce_http.from_http(message, JSONFormat(), CloudEvent)
        except Exception as exc:  # the test asserts there were none
            self.failures.append(f"{type(exc).__name__}: {exc}")
            return Response(400)
        self.events.append((event, headers))
        body = json.dumps({"ack": self._ack(event)}).encode()
        return Response(200, tuple(JSON.items()), body)


@contextmanager
def short_tmp() -> Iterator[Path]:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="dlqs-ce-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@asynccontextmanager
async def serving(app: CloudEventsApp, transport: str) -> AsyncIterator[dict[str, Any]]:
    """The app on TCP or a Unix socket; yields the write_config arguments that reach it."""
    with short_tmp() as sock_dir:
        async with trio.open_nursery() as nursery:
            if transport == "tcp":
                port = free_port()
                await nursery.start(serve_http, app, ("tcp", "127.0.0.1", port))
                yield {"app_url": f"http://127.0.0.1:{port}/events"}
            else:
                sock = str(sock_dir / "app.sock")
                await nursery.start(serve_http, app, ("unix", sock))
                yield {"app_url": "/events", "unix_socket": sock}
            nursery.cancel_scope.cancel()


def source_records() -> list[Rec]:
    """A plain record, one with a content type, one already a CloudEvent (Kafka binary binding)."""
    produced = CloudEvent(
        {
            "id": "order-17-placed",
            "source": "/shop/checkout",
            "type": "com.shop.order.placed",
            "subject": "order 17",
            "datacontenttype": "application/json",
            "time": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
        },
        {"order": 17},
    )
    kafka_message = ce_kafka.to_binary(produced, JSONFormat())
    return [
        Rec(key=b"k-0", value=b"\x00raw bytes\xff"),
        Rec(key=b"k-1", value=b'{"n": 1}', headers=(("content-type", b"application/json"),)),
        Rec(
            key=b"order-17", value=kafka_message.value, headers=tuple(kafka_message.headers.items())
        ),
    ]


def record_time(broker: Broker, topic: str, offset: int) -> datetime.datetime:
    """The timestamp the broker holds for a record, as the datetime ``time`` must carry."""
    (rec,) = [r for r in broker.read_topic(topic, 3) if r.offset == offset]
    assert rec.timestamp_ms is not None
    seconds, millis = divmod(rec.timestamp_ms, 1000)
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).replace(microsecond=millis * 1000)


async def run_case(
    broker: Broker, unique: str, tmp_path: Path, transport: str, mode: str
) -> tuple[CloudEventsApp, str, str]:
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    group = f"g-{unique}"
    app = CloudEventsApp(batch=mode == "batch")
    app.release_once = {f"{topic}/0/1"}
    app.reject = {f"{topic}/0/0"}
    async with serving(app, transport) as where:
        cfg = write_config(
            tmp_path / "sidecar.yaml",
            bootstrap=broker.bootstrap,
            group=group,
            topics=[topic],
            extra={**FAST, "errors.deadletterqueue.topic.name": f"dlq.{topic}"},
            app_extra={"mode": mode, "format": "cloudevents", "cloudevents.type": "t.{topic}"},
            **where,
        )
        await trio.to_thread.run_sync(broker.produce, topic, source_records())
        async with sidecar(cfg) as sc:
            # Three records, one of them released once: four events in all.
            await wait_until(lambda: len(app.events) >= 4, 60, "every record and the redelivery")
            dlq = await trio.to_thread.run_sync(lambda: broker.read_topic(f"dlq.{topic}", 1))
            await wait_until_thread(
                lambda: broker.committed(group, topic, [0])[0][0] == 3, 60, "committed to the end"
            )
            assert await sc.stop() == 0
    assert not app.failures
    assert len(dlq) == 1
    assert dict(dlq[0].headers)["__dlq.errors.offset"] == b"0"  # the rejected one
    return app, topic, broker.bootstrap.split(",")[0]


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_single_mode_sends_binary_mode_cloudevents(
    broker: Broker, unique: str, tmp_path: Path, transport: str
) -> None:
    app, topic, cluster = await run_case(broker, unique, tmp_path, transport, "single")
    by_id: dict[str, list[tuple[Any, dict[str, str]]]] = {}
    for event, headers in app.events:
        by_id.setdefault(event.get_id(), []).append((event, headers))
    assert sorted(by_id) == sorted([f"{topic}/0/0", f"{topic}/0/1", "order-17-placed"])

    plain, headers = by_id[f"{topic}/0/0"][0]
    assert plain.get_specversion() == "1.0"
    assert plain.get_source() == f"kafka://{cluster}/{topic}"
    assert plain.get_type() == f"t.{topic}"
    assert plain.get_time() == record_time(broker, topic, 0)
    assert plain.get_extension("partitionkey") == "k-0"
    assert plain.get_data() == b"\x00raw bytes\xff"
    assert headers["content-type"] == "application/octet-stream"
    assert headers["kafka-offset"] == "0"  # the sidecar's own metadata stay

    # Released once, delivered again: the same event id, a higher delivery count.
    attempts = by_id[f"{topic}/0/1"]
    assert [h["kafka-delivery-count"] for _, h in attempts] == ["1", "2"]
    assert attempts[0][1]["content-type"] == "application/json"
    assert attempts[1][0].get_data() == {"n": 1}

    mapped, headers = by_id["order-17-placed"][0]
    assert mapped.get_source() == "/shop/checkout"
    assert mapped.get_type() == "com.shop.order.placed"
    assert mapped.get_subject() == "order 17"
    assert mapped.get_time() == datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    assert mapped.get_extension("partitionkey") == "order-17"
    assert mapped.get_data() == {"order": 17}


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_batch_mode_sends_a_cloudevents_json_batch(
    broker: Broker, unique: str, tmp_path: Path, transport: str
) -> None:
    app, topic, cluster = await run_case(broker, unique, tmp_path, transport, "batch")
    assert set(app.content_types) == {"application/cloudevents-batch+json"}
    ids = [event.get_id() for event, _ in app.events]
    assert sorted(set(ids)) == sorted([f"{topic}/0/0", f"{topic}/0/1", "order-17-placed"])
    assert ids.count(f"{topic}/0/1") == 2
    items = {item["id"]: item for item in app.bodies}
    plain = items[f"{topic}/0/0"]
    assert plain["source"] == f"kafka://{cluster}/{topic}"
    assert plain["kafkaoffset"] == "0" and plain["kafkatopic"] == topic
    assert plain["time"] == record_time(broker, topic, 0).isoformat(
        timespec="milliseconds"
    ).replace("+00:00", "Z")
    redelivered = [item for item in app.bodies if item["id"] == f"{topic}/0/1"]
    assert [item["deliverycount"] for item in redelivered] == [1, 2]
    assert len({item["deliveryid"] for item in redelivered}) == 2
    mapped = next(event for event, _ in app.events if event.get_id() == "order-17-placed")
    assert mapped.get_source() == "/shop/checkout"
    assert mapped.get_datacontenttype() == "application/json"
    assert mapped.get_data() == b'{"order": 17}'  # data_base64: byte-exact


async def test_the_share_engine_sends_the_same_cloudevents(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    app = CloudEventsApp(batch=False)
    app.reject = {f"{topic}/0/0"}
    async with serving(app, "tcp") as where:
        cfg = write_config(
            tmp_path / "sidecar.yaml",
            bootstrap=broker.bootstrap,
            group=f"g-{unique}",
            topics=[topic],
            extra={
                **FAST,
                "engine": "share",
                "ordering": "none",
                "errors.deadletterqueue.topic.name": f"dlq.{topic}",
            },
            app_extra={"format": "cloudevents"},
            **where,
        )
        await trio.to_thread.run_sync(broker.produce, topic, source_records())
        async with sidecar(cfg) as sc:
            await wait_until(lambda: len(app.events) >= 3, 120, "every record")
            dlq = await trio.to_thread.run_sync(lambda: broker.read_topic(f"dlq.{topic}", 1))
            assert await sc.stop() == 0
    assert not app.failures
    ids = sorted(event.get_id() for event, _ in app.events)
    assert ids == sorted([f"{topic}/0/0", f"{topic}/0/1", "order-17-placed"])
    plain = next(event for event, _ in app.events if event.get_id() == f"{topic}/0/0")
    assert plain.get_type() == "dlq-sidecar.kafka.record"  # the default type
    assert len(dlq) == 1 and dict(dlq[0].headers)["__dlq.errors.offset"] == b"0"
