"""Records with schemas keep their bytes, and the DLQ tools read them: the real broker, the real Schema
Registry, the sidecar process, a real HTTP app, `dlq-sidecar dlq` in process.

A decoded record released to a retry tier, then rejected: the tier record, the DLQ record and the record
replayed from the DLQ all carry the original wire-format bytes, never a re-encoding; the app got JSON on
both attempts. `dlq inspect` shows the DLQ's values decoded with their subject and version, redacts the
fields it is told to (and then hides the raw bytes), filters on a decoded field, and shows a value that does
not decode as bytes with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from sidecar.http.server import Response
from tests.harness import (
    Delivery,
    RecordingApp,
    json_answer,
    running_sidecar,
    wait_until,
    wait_until_thread,
)
from tests.integration.test_dlqtool import _json_lines, dlq_cli
from tests.kafkatools import Broker, Rec
from tests.registry import SchemaRegistry
from tests.schematools import decoded_order, order, registry_client, serializer


async def test_tiers_dlq_and_replay_keep_the_bytes_and_inspect_decodes(
    broker: Broker,
    schema_registry: SchemaRegistry,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The table's columns are as wide as the terminal says (COLUMNS): give the payload room to be read.
    monkeypatch.setenv("COLUMNS", "400")
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    target = await trio.to_thread.run_sync(lambda: broker.create_topic(f"replayed-{unique}"))
    client = registry_client(schema_registry.url)
    try:
        encode = serializer(client, "avro")
        values = [encode(topic, order(n)) for n in range(3)]
    finally:
        client.close()
    not_wire = b"plain text, no schema"
    seen: dict[int, int] = {}

    def policy(d: Delivery) -> Response:
        # First attempt: released past the tier threshold (to the 500 ms tier); then rejected.
        seen[d.offset] = seen.get(d.offset, 0) + 1
        if seen[d.offset] == 1:
            return json_answer({"ack": "release", "retry_after_ms": 400})
        return json_answer({"ack": "reject"})

    app = RecordingApp(policy=policy)
    extra = {
        "schemas": {"registry": {"url": schema_registry.url}, "decode": {topic: ["value"]}},
        "errors.deadletterqueue.copy.record.enable": True,
        "errors.retry.tiers": ["500ms"],
        "errors.retry.tier.threshold.ms": 100,
    }
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        extra=extra,
        produce_first=[*(Rec(b"k", v) for v in values), Rec(b"k", not_wire)],
    ) as rig:
        # The DLQ topic is created by the first DLQ write, after the second attempts' answers.
        await wait_until_thread(
            lambda: broker.topic_exists(rig.dlq_topic) and broker.count_records(rig.dlq_topic) >= 4,
            60,
            "four DLQ records",
        )
        dlq = await rig.read_dlq(4)
        await wait_until(
            lambda: len(app.deliveries) >= 6, 60, "two attempts of each decoded record"
        )
    tier_topic = f"dlq.{topic}.retry.500ms"
    tier = await trio.to_thread.run_sync(lambda: broker.read_topic(tier_topic, 3))
    assert sorted(r.value or b"" for r in tier) == sorted(values)  # the wire-format bytes
    assert sorted(r.value or b"" for r in dlq) == sorted([*values, not_wire])
    # The app got JSON on both attempts (the second read back from the tier, decoded again).
    for d in app.deliveries:
        n = json.loads(d.value or b"")["id"]
        assert json.loads(d.value or b"") == decoded_order("avro", n)
    assert sorted(seen.values()) == [2, 2, 2]

    dlq_topic = rig.dlq_topic
    code, out, err = await dlq_cli(
        broker, "replay", "--from", dlq_topic, "--to", target, "--name", f"r-{unique}"
    )
    assert code == 0, err
    replayed = await trio.to_thread.run_sync(lambda: broker.read_topic(target, 4))
    assert sorted(r.value or b"" for r in replayed) == sorted([*values, not_wire])

    # A dry run shows what it would replay decoded (and redacted), and filters on a decoded field.
    code, out, err = await dlq_cli(
        broker, "replay", "--from", dlq_topic, "--to", target, "--name", f"dry-{unique}",
        "--dry-run", "--registry", schema_registry.url, "--redact", "card",
        "--field", "customer=customer-2",
    )  # fmt: skip
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith("would replay ")]
    assert f'; value {topic}-value v1: {{"id":2,"customer":"customer-2","card":"***"}}' in line
    assert "would replay 1 of 1 matching records" in out

    # inspect: decoded, the schema named, `card` redacted (and the raw bytes hidden with it).
    code, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq_topic, "--json", "--registry", schema_registry.url,
        "--redact", "card",
    )  # fmt: skip
    assert code == 0, err
    lines = _json_lines(out)
    decoded = [line for line in lines if "value_decoded" in line]
    assert len(decoded) == 3
    for line in decoded:
        n = line["value_decoded"]["id"]
        assert line["value_decoded"] == {**order(n), "card": "***"}
        assert line["value_schema"]["subject"] == f"{topic}-value"
        assert line["value_schema"]["version"] == 1
        assert line["value"] == {"redacted": True, "size": len(values[n])}
        assert order(n)["card"] not in json.dumps(line)
    (plain,) = [line for line in lines if "value_not_decoded" in line]
    assert plain["value"]["text"] == not_wire.decode()
    assert "sidecar.NotWireFormat" in plain["value_not_decoded"]

    # A filter on a decoded field; on a redacted one, nothing matches but "***".
    code, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq_topic, "--json", "--registry", schema_registry.url,
        "--field", "customer=customer-1",
    )  # fmt: skip
    assert code == 0, err
    (one,) = _json_lines(out)
    assert one["value_decoded"]["id"] == 1
    code, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq_topic, "--json", "--registry", schema_registry.url,
        "--redact", "card", "--field", f"card={order(1)['card']}",
    )  # fmt: skip
    assert code == 0, err
    assert _json_lines(out) == []

    # The table: the decoded value and its schema in the payload column.
    code, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq_topic, "--registry", schema_registry.url,
    )  # fmt: skip
    assert code == 0, err
    # The payload column (the last), its wrapped lines joined.
    payload = "".join(
        line.split("│")[-2].strip() for line in out.splitlines() if line.count("│") > 2
    )
    assert f'{topic}-valuev1:{{"id":1,"customer":"customer-1"' in payload.replace(" ", "")
    assert "notdecoded:sidecar.NotWireFormat" in payload.replace(" ", "")


async def test_inspect_decodes_keys_and_headers_only_records_from_their_source(
    broker: Broker, schema_registry: SchemaRegistry, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Avro keys and values on the source; the DLQ holds headers-only records (copy off, as the DLQ
    writer builds them) and one copy. `dlq inspect` decodes the headers-only records' key and value
    read back from the source (`decoded_from_source`), the copy's key and value from the DLQ record,
    filters and redacts them alike, and says a deleted source offset's payload is gone."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from sidecar.core.deadletter import FailedRecord
    from sidecar.core.outcome import CAUSE_REJECTED
    from sidecar.kafka.dlq.record import build_dlq_record

    source = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    dlq = await trio.to_thread.run_sync(lambda: broker.create_topic(f"dlq.src-{unique}"))
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
            key_serializer({"id": n}, SerializationContext(source, MessageField.KEY))
            for n in range(4)
        ]
        values = [serializer(client, "avro")(source, order(n)) for n in range(4)]
    finally:
        client.close()
    broker.produce(source, [Rec(k, v, partition=0) for k, v in zip(keys, values, strict=True)])
    dead = []
    for offset in range(4):
        failed = FailedRecord(
            topic=source,
            partition=0,
            offset=offset,
            key=keys[offset],
            value=values[offset],
            headers=(),
            group="orders-app",
            delivery_count=1,
            cause=CAUSE_REJECTED,
            exception_class="com.example.Invalid",
            exception_message=f"order {offset}",
        )
        copy = offset == 3  # the last one is a copy; the others hold headers only
        rec = build_dlq_record(failed, dlq, 1, copy, 4096)
        assert rec.copied is copy
        dead.append(Rec(key=rec.key, value=rec.value, headers=tuple(rec.headers), partition=0))
    broker.produce(dlq, dead)

    rc, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq, "--json", "--registry", schema_registry.url
    )
    assert rc == 0, err
    rows = sorted(_json_lines(out), key=lambda r: r["source_offset"])
    assert [r["headers_only"] for r in rows] == [True, True, True, False]
    for n, r in enumerate(rows):
        assert r["value_decoded"] == order(n)
        assert r["value_schema"]["subject"] == f"{source}-value"
        assert r["key_decoded"] == {"id": n}
        assert r["key_schema"]["subject"] == f"{source}-key"
        assert r["key_schema"]["type"] == "AVRO"
        assert r.get("decoded_from_source", False) is (n < 3)
        assert r["payload_gone"] is None

    rc, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq, "--json", "--registry", schema_registry.url,
        "--field", "customer=customer-1", "--redact", "card",
    )  # fmt: skip
    assert rc == 0, err
    (row,) = _json_lines(out)
    assert row["source_offset"] == 1 and row["headers_only"]
    assert row["value_decoded"] == {**order(1), "card": "***"}
    assert order(1)["card"] not in out

    # The table: the key and the value, from the source.
    monkeypatch.setenv("COLUMNS", "400")
    rc, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq, "--registry", schema_registry.url,
        "--field", "id=2",
    )  # fmt: skip
    assert rc == 0, err
    assert f"(from the source) key {source}-key v1:" in " ".join(out.split())

    # Retention takes the first two: their payload is gone, the rest still decode.
    for fut in broker.admin.delete_records([TopicPartition(source, 0, 2)]).values():
        fut.result(timeout=30)
    rc, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq, "--json", "--registry", schema_registry.url
    )
    assert rc == 0, err
    rows = sorted(_json_lines(out), key=lambda r: r["source_offset"])
    for n, r in enumerate(rows):
        if n < 2:
            assert r["payload_gone"].startswith(f"payload gone: source offset {source}[0]@{n}")
            assert "value_decoded" not in r
        else:
            assert r["payload_gone"] is None and r["value_decoded"] == order(n)


async def test_fields_the_schema_tags_sensitive_are_redacted_by_default(
    broker: Broker, schema_registry: SchemaRegistry, unique: str
) -> None:
    """An Avro schema whose `card` field carries `"confluent:tags": ["PII"]`, registered in the real
    registry (Apicurio keeps the text as registered): `dlq inspect` shows card as *** with no
    option, names the tagged fields in value_schema.sensitive and hides the raw bytes;
    `--show-tagged` shows it."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from sidecar.core.deadletter import FailedRecord
    from sidecar.core.outcome import CAUSE_REJECTED
    from sidecar.kafka.dlq.record import build_dlq_record
    from tests.schematools import AVRO_ORDER

    source = f"src-{unique}"
    dlq = await trio.to_thread.run_sync(lambda: broker.create_topic(f"dlq.src-{unique}"))
    tagged = {
        **AVRO_ORDER,
        "fields": [
            {**f, "confluent:tags": ["PII"]} if f["name"] == "card" else f
            for f in AVRO_ORDER["fields"]
        ],
    }
    client = registry_client(schema_registry.url)
    try:
        ser = AvroSerializer(
            client, json.dumps(tagged), conf={"subject.name.strategy.type": "TOPIC"}
        )
        value = ser(order(5), SerializationContext(source, MessageField.VALUE))
    finally:
        client.close()
    failed = FailedRecord(
        topic=source, partition=0, offset=0, key=None, value=value, headers=(),
        group="orders-app", delivery_count=1, cause=CAUSE_REJECTED,
    )  # fmt: skip
    rec = build_dlq_record(failed, dlq, 1, True, 4096)
    broker.produce(dlq, [Rec(key=rec.key, value=rec.value, headers=tuple(rec.headers))])

    rc, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq, "--json", "--registry", schema_registry.url
    )
    assert rc == 0, err
    (row,) = _json_lines(out)
    assert row["value_decoded"] == {**order(5), "card": "***"}
    assert row["value_schema"]["sensitive"] == ["card"]
    assert row["value"] == {"redacted": True, "size": len(value)}
    assert order(5)["card"] not in out

    rc, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq, "--json", "--registry", schema_registry.url,
        "--show-tagged",
    )  # fmt: skip
    assert rc == 0, err
    (row,) = _json_lines(out)
    assert row["value_decoded"] == order(5)
    assert "sensitive" not in row["value_schema"]


async def test_the_apps_custom_dlq_value_is_encoded_with_the_configured_subject(
    broker: Broker, schema_registry: SchemaRegistry, unique: str, tmp_path: Path
) -> None:
    """`schemas.dlq.value.subject` names an Avro subject (registered here, never by the sidecar):
    the app's custom DLQ value (KIP-1034, JSON text) is written in the wire format with its latest
    schema, and reads back with confluent-kafka's deserializer; a value that is not JSON and one
    that does not fit the schema are written as the app gave them, with the reason in a header."""
    import base64

    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from sidecar.kafka.dlq import H_VALUE_NOT_ENCODED

    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    subject = f"dlq-value-{unique}"
    dlq_schema = {
        "type": "record",
        "name": "DlqValue",
        "fields": [{"name": "reason", "type": "string"}, {"name": "order_id", "type": "long"}],
    }
    client = registry_client(schema_registry.url)
    client.register_schema(subject, Schema(json.dumps(dlq_schema), "AVRO"))
    custom = {
        0: json.dumps({"reason": "no such customer", "order_id": 0}).encode(),
        1: b"not json",
        2: json.dumps({"reason": "no order id"}).encode(),
    }

    def policy(d: Delivery) -> Response:
        value_b64 = base64.b64encode(custom[d.offset]).decode()
        return json_answer({"ack": "reject", "dlq": {"value_b64": value_b64}})

    extra = {
        "schemas": {"registry": {"url": schema_registry.url}, "dlq.value.subject": {topic: subject}}
    }
    try:
        async with running_sidecar(
            broker,
            tmp_path,
            RecordingApp(policy=policy),
            topic=topic,
            group=f"g-{unique}",
            extra=extra,
            produce_first=[Rec(b"k", f"v{n}".encode()) for n in range(3)],
        ) as rig:
            await wait_until_thread(
                lambda: (
                    broker.topic_exists(rig.dlq_topic) and broker.count_records(rig.dlq_topic) >= 3
                ),
                60,
                "three DLQ records",
            )
            records = await rig.read_dlq(3)
            log = rig.sc.log_text()
        by_offset = {int(r.header("__dlq.errors.offset") or -1): r for r in records}
        encoded = by_offset[0]
        assert encoded.value is not None and encoded.value[0] == 0  # the wire format
        assert encoded.header(H_VALUE_NOT_ENCODED) is None
        read = AvroDeserializer(client)(
            encoded.value, SerializationContext(rig.dlq_topic, MessageField.VALUE)
        )
        assert read == {"reason": "no such customer", "order_id": 0}

        assert by_offset[1].value == b"not json"
        assert "is not JSON text" in (by_offset[1].header(H_VALUE_NOT_ENCODED) or "")
        assert by_offset[2].value == custom[2]
        assert f"does not fit the latest schema of {subject}" in (
            by_offset[2].header(H_VALUE_NOT_ENCODED) or ""
        )
        assert "is written as the app gave it" in log
    finally:
        client.close()


async def test_protobuf_fields_tagged_sensitive_are_redacted_by_default(
    broker: Broker, schema_registry: SchemaRegistry, unique: str
) -> None:
    """A Protobuf order whose `card` field has `(confluent.field_meta).tags = "PII"`, registered by
    confluent-kafka's ProtobufSerializer in the real registry: `dlq inspect` shows card as ***."""
    from confluent_kafka.schema_registry.common.protobuf import _init_pool
    from confluent_kafka.schema_registry.confluent import meta_pb2
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    from sidecar.core.deadletter import FailedRecord
    from sidecar.core.outcome import CAUSE_REJECTED
    from sidecar.kafka.dlq.record import build_dlq_record

    field_meta = getattr(meta_pb2, "field_meta")  # noqa: B009
    tag = unique[-8:]  # a package name: letters and digits
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"shop/tagged_{tag}.proto",
        package=f"shop{tag}",
        syntax="proto3",
        dependency=["confluent/meta.proto"],
    )
    message = fdp.message_type.add(name="Order")
    message.field.add(name="id", number=1, type=3, label=1)
    message.field.add(name="customer", number=2, type=9, label=1)
    card = message.field.add(name="card", number=3, type=9, label=1)
    card.options.Extensions[field_meta].tags.append("PII")
    pool = descriptor_pool.DescriptorPool()
    _init_pool(pool)
    pool.Add(fdp)
    order_class = GetMessageClass(pool.FindMessageTypeByName(f"shop{tag}.Order"))

    source = f"src-{unique}"
    dlq = await trio.to_thread.run_sync(lambda: broker.create_topic(f"dlq.src-{unique}"))
    client = registry_client(schema_registry.url)
    try:
        ser = ProtobufSerializer(
            order_class,
            client,
            conf={"subject.name.strategy.type": "TOPIC", "use.deprecated.format": False},
        )
        value = ser(order_class(**order(3)), SerializationContext(source, MessageField.VALUE))
    finally:
        client.close()
    failed = FailedRecord(
        topic=source, partition=0, offset=0, key=None, value=value, headers=(),
        group="orders-app", delivery_count=1, cause=CAUSE_REJECTED,
    )  # fmt: skip
    rec = build_dlq_record(failed, dlq, 1, True, 4096)
    broker.produce(dlq, [Rec(key=rec.key, value=rec.value, headers=tuple(rec.headers))])

    rc, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq, "--json", "--registry", schema_registry.url
    )
    assert rc == 0, err
    (row,) = _json_lines(out)
    assert row["value_schema"]["type"] == "PROTOBUF"
    assert row["value_decoded"] == {"id": "3", "customer": "customer-3", "card": "***"}
    assert row["value_schema"]["sensitive"] == ["card"]
    assert order(3)["card"] not in out
