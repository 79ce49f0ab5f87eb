"""Records with schemas end to end: the real broker, the real Schema Registry (Apicurio), the sidecar
process, a real HTTP app.

For Avro, Protobuf and JSON Schema: the app gets each record's value as JSON with the schema named in
headers (single, batch, pull and CloudEvents); records that do not decode (not the wire format, an
unknown schema id, bytes the schema does not read) are in the DLQ with their original bytes and the
reason, never delivered; a registry that cannot be reached pauses intake (`/readyz` names it) and
dead-letters nothing, and everything is delivered once it answers again.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from sidecar.http.server import Request, Response, json_response
from tests.faults.proxy import PASS, RESET, FaultProxy
from tests.harness import RecordingApp, running_sidecar, wait_until
from tests.kafkatools import Broker, Rec
from tests.registry import CCOMPAT, SchemaRegistry
from tests.schematools import FORMATS, decoded_order, order, registry_client, serializer

SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json": "JSON"}


def schemas_extra(url: str, topic: str, **registry: Any) -> dict[str, Any]:
    return {
        "schemas": {
            "registry": {"url": url, "timeout.ms": 2000, **registry},
            "decode": {topic: ["value"]},
        },
        "errors.retry.delay.initial.ms": 20,
        "errors.retry.delay.max.ms": 50,
        # The DLQ records carry the record (headers-only ones point at the source's bytes).
        "errors.deadletterqueue.copy.record.enable": True,
    }


def encoded(url: str, fmt: str, topic: str, ids: range) -> list[bytes]:
    client = registry_client(url)
    try:
        encode = serializer(client, fmt)
        return [encode(topic, order(n)) for n in ids]
    finally:
        client.close()


def header(raw: tuple[tuple[str, str], ...], name: str) -> str | None:
    for key, value in raw:
        if key.lower() == name.lower():
            return value
    return None


@pytest.mark.parametrize(
    ("fmt", "engine"), [*((fmt, "consumer") for fmt in FORMATS), ("avro", "share")]
)
async def test_the_app_gets_json_and_undecodable_records_go_to_the_dlq_with_their_bytes(
    broker: Broker,
    schema_registry: SchemaRegistry,
    unique: str,
    tmp_path: Path,
    fmt: str,
    engine: str,
) -> None:
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    good = encoded(schema_registry.url, fmt, topic, range(3))
    header_bytes = good[0][:5]
    bad = {
        b'{"id": 1, "not": "wire format"}': (
            "sidecar.NotWireFormat",
            "not the Confluent wire format",
        ),
        b"\x00\x7f\xff\xff\x00" + good[0][5:]: (
            "sidecar.UnknownSchemaId",
            "is not in the registry",
        ),
        header_bytes + (b'{"id": "seven"}' if fmt == "json" else good[0][5:-2] + b"\xff"): (
            "sidecar.UndecodablePayload",
            "does not read these bytes",
        ),
    }
    # Good and bad interleaved, one partition: a bad record stops nothing behind it.
    recs = [
        Rec(b"k", good[0]),
        *[Rec(b"k", v) for v in bad],
        Rec(b"k", good[1]),
        Rec(b"k", good[2]),
    ]
    app = RecordingApp()
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        extra={
            **schemas_extra(schema_registry.url, topic),
            **({"engine": "share", "ordering": "none"} if engine == "share" else {}),
        },
        produce_first=recs,
    ) as rig:
        await wait_until(lambda: len(app.deliveries) >= 3, 60, "the three good records delivered")
        dlq = await rig.read_dlq(3)
        if engine == "consumer":
            await rig.committed_at_end()
    assert len(app.deliveries) == 3  # none of the bad ones reached the app
    for n, d in enumerate(sorted(app.deliveries, key=lambda d: d.offset)):
        assert json.loads(d.value or b"") == decoded_order(fmt, n)
        raw = d.raw_headers
        assert header(raw, "content-type") == "application/json"
        assert header(raw, "kafka-value-schema-subject") == f"{topic}-value"
        assert header(raw, "kafka-value-schema-version") == "1"
        assert header(raw, "kafka-value-schema-type") == SCHEMA_TYPES[fmt]
        assert int(header(raw, "kafka-value-schema-id") or "0") == int.from_bytes(
            good[n][1:5], "big"
        )
    assert sorted((r.value or b"") for r in dlq) == sorted(bad)  # the original bytes
    for r in dlq:
        exception_class, said = bad[r.value or b""]
        assert r.header("__dlq.errors.exception.class.name") == exception_class
        message = r.header("__dlq.errors.exception.message") or ""
        assert said in message and message.startswith("value: ")


async def test_batch_mode_names_the_schema_of_each_record(
    broker: Broker, schema_registry: SchemaRegistry, unique: str, tmp_path: Path
) -> None:
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    values = encoded(schema_registry.url, "avro", topic, range(4))
    items: list[dict[str, Any]] = []

    async def app(request: Request) -> Response:
        records = json.loads(request.body)["records"]
        items.extend(records)
        return json_response({"results": [{"id": r["id"], "ack": "accept"} for r in records]})

    extra = schemas_extra(schema_registry.url, topic)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        extra=extra,
        app_extra={"mode": "batch", "batch.max.records": 10},
        produce_first=[Rec(None, v) for v in values],
    ) as rig:
        await wait_until(lambda: len(items) >= 4, 60, "four records delivered")
        await rig.committed_at_end()
    for n, item in enumerate(sorted(items, key=lambda i: i["offset"])):
        assert json.loads(base64.b64decode(item["value"])) == decoded_order("avro", n)
        assert item["value_schema"]["subject"] == f"{topic}-value"
        assert item["value_schema"]["version"] == 1
        assert item["value_schema"]["type"] == "AVRO"
        assert "key_schema" not in item


async def test_cloudevents_carry_the_decoded_data(
    broker: Broker, schema_registry: SchemaRegistry, unique: str, tmp_path: Path
) -> None:
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    values = encoded(schema_registry.url, "protobuf", topic, range(2))
    app = RecordingApp()
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        extra=schemas_extra(schema_registry.url, topic),
        app_extra={"format": "cloudevents"},
        produce_first=[Rec(None, v) for v in values],
    ) as rig:
        await wait_until(lambda: len(app.deliveries) >= 2, 60, "two records delivered")
        await rig.committed_at_end()
    for n, d in enumerate(sorted(app.deliveries, key=lambda d: d.offset)):
        assert json.loads(d.value or b"") == decoded_order("protobuf", n)
        assert header(d.raw_headers, "content-type") == "application/json"
        assert header(d.raw_headers, "ce-schemasubject") == f"{topic}-value"
        assert header(d.raw_headers, "ce-schematype") == "PROTOBUF"


async def test_pull_mode_hands_out_json(
    broker: Broker, schema_registry: SchemaRegistry, unique: str, tmp_path: Path
) -> None:
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    values = encoded(schema_registry.url, "json", topic, range(3))
    async with running_sidecar(
        broker,
        tmp_path,
        None,
        topic=topic,
        group=f"g-{unique}",
        extra=schemas_extra(schema_registry.url, topic),
        app_extra={"mode": "pull", "url": ""},
        produce_first=[Rec(None, v) for v in values],
    ) as rig:
        got: list[dict[str, Any]] = []
        while len(got) < 3:
            code, body = await rig.sc.get("/v1/records?max=10&wait_ms=2000")
            assert code == 200, body
            got.extend(body["records"])
            acks = [{"id": r["id"], "ack": "accept"} for r in body["records"]]
            if acks:
                code, _ = await rig.sc.post_json("/v1/acks", {"acks": acks})
                assert code == 200
        await rig.committed_at_end()
    for n, item in enumerate(sorted(got, key=lambda i: i["offset"])):
        assert json.loads(base64.b64decode(item["value"])) == decoded_order("json", n)
        assert item["value_schema"]["type"] == "JSON"


async def test_an_unreachable_registry_pauses_intake_and_dead_letters_nothing(
    broker: Broker, schema_registry: SchemaRegistry, unique: str, tmp_path: Path
) -> None:
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    values = encoded(schema_registry.url, "avro", topic, range(5))
    app = RecordingApp()
    with FaultProxy(("127.0.0.1", schema_registry.port)) as proxy:
        await trio.to_thread.run_sync(proxy.set_mode, RESET)
        url = f"http://127.0.0.1:{proxy.port}{CCOMPAT}"
        async with running_sidecar(
            broker,
            tmp_path,
            app,
            topic=topic,
            group=f"g-{unique}",
            extra=schemas_extra(url, topic, properties={"max.retries": 0}),
            produce_first=[Rec(None, v) for v in values],
        ) as rig:
            sc = rig.sc

            async def registry_named() -> bool:
                code, body = await sc.get("/readyz")
                return (
                    code == 503
                    and body["checks"].get("schema_registry_reachable") is False
                    and url in body.get("reason", "")
                )

            with trio.fail_after(60):
                while not await registry_named():
                    await trio.sleep(0.1)
            assert app.deliveries == []
            assert await trio.to_thread.run_sync(lambda: broker.count_records(rig.dlq_topic)) == 0
            await trio.to_thread.run_sync(proxy.set_mode, PASS)
            await wait_until(lambda: len(app.deliveries) >= 5, 60, "five records delivered")
            await rig.committed_at_end()
            _code, body = await sc.get("/readyz")
            assert body["checks"]["schema_registry_reachable"] is True
            # Every record is done (committed to the end): none of them went to the DLQ.
            assert await trio.to_thread.run_sync(lambda: broker.count_records(rig.dlq_topic)) == 0
    assert sorted(json.loads(d.value or b"")["id"] for d in app.deliveries) == [0, 1, 2, 3, 4]


async def test_a_decoded_key_and_value_each_name_their_schema(
    broker: Broker, schema_registry: SchemaRegistry, unique: str, tmp_path: Path
) -> None:
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    client = registry_client(schema_registry.url)
    try:
        key_serializer = AvroSerializer(
            client,
            json.dumps(
                {"type": "record", "name": "OrderKey", "fields": [{"name": "id", "type": "long"}]}
            ),
            conf={"subject.name.strategy.type": "TOPIC"},
        )
        keys = [
            key_serializer({"id": n}, SerializationContext(topic, MessageField.KEY))
            for n in range(2)
        ]
        values = [serializer(client, "json")(topic, order(n)) for n in range(2)]
    finally:
        client.close()
    app = RecordingApp()
    extra = schemas_extra(schema_registry.url, topic)
    extra["schemas"]["decode"] = {topic: ["key", "value"]}
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        extra=extra,
        produce_first=[Rec(k, v) for k, v in zip(keys, values, strict=True)],
    ) as rig:
        await wait_until(lambda: len(app.deliveries) >= 2, 60, "two records delivered")
        await rig.committed_at_end()
    for n, d in enumerate(sorted(app.deliveries, key=lambda d: d.offset)):
        assert json.loads(d.key or b"") == {"id": n}
        assert json.loads(d.value or b"") == decoded_order("json", n)
        raw = d.raw_headers
        assert header(raw, "kafka-key-schema-subject") == f"{topic}-key"
        assert header(raw, "kafka-key-schema-type") == "AVRO"
        assert header(raw, "kafka-value-schema-subject") == f"{topic}-value"
        assert header(raw, "kafka-value-schema-type") == "JSON"
