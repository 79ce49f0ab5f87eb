"""The registry adapter (sidecar.kafka.schemas) against a real Schema Registry (Apicurio, Confluent API):
Avro, Protobuf and JSON Schema records written by confluent-kafka's serializers are decoded to JSON with
the schema named; unknown ids, bytes the schema does not read and bytes not in the wire format each say
which; an unreachable registry raises, not a record's problem; the cache keeps at most its bound."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from sidecar.kafka.schemas.catalog import Catalog, RegistrySettings, RegistryUnreachable
from sidecar.kafka.schemas.decoder import Decoded, DecodedRecord, MissingSchema, SchemaDecoder
from sidecar.kafka.schemas.wire import (
    NOT_WIRE_FORMAT,
    UNDECODABLE_PAYLOAD,
    UNKNOWN_SCHEMA_ID,
    Undecodable,
)
from tests.registry import SchemaRegistry
from tests.schematools import (
    FORMATS,
    ProtoRefund,
    decoded_order,
    order,
    registry_client,
    serializer,
)


@pytest.fixture
def client(schema_registry: SchemaRegistry) -> Iterator[SchemaRegistryClient]:
    """A client for the tests' own serializers, closed after the test (its sockets with it)."""
    made = registry_client(schema_registry.url)
    yield made
    made.close()


@pytest.fixture
def decoders() -> Iterator[Callable[..., SchemaDecoder]]:
    """`(url, topics, capacity=10, **properties) -> SchemaDecoder`, each closed after the test."""
    made: list[SchemaDecoder] = []

    def make(
        url: str, topics: list[str], capacity: int = 10, timeout_s: float = 5.0, **properties: int
    ) -> SchemaDecoder:
        catalog = Catalog(RegistrySettings(url, timeout_s, properties), capacity)
        made.append(SchemaDecoder(catalog, {t: frozenset({"value"}) for t in topics}))
        return made[-1]

    yield make
    for decoder in made:
        decoder.close()


async def decode(decoder: SchemaDecoder, topic: str, value: bytes) -> DecodedRecord | Undecodable:
    found = decoder.decode_record(topic, None, value)
    if isinstance(found, MissingSchema):
        await decoder.load(found.schema_id)
        found = decoder.decode_record(topic, None, value)
    assert not isinstance(found, MissingSchema)
    return found


def test_both_listeners_are_on_loopback(schema_registry: SchemaRegistry) -> None:
    assert schema_registry.proc is not None
    listening = subprocess.run(
        ["ss", "-Hltnp"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    mine = [line for line in listening if f"pid={schema_registry.proc.pid}," in line]
    assert len(mine) >= 2, listening  # the API and the management port
    for line in mine:
        local = line.split()[3]
        assert local.rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]"), line


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_record_is_decoded_to_json_with_its_schema_named(
    schema_registry: SchemaRegistry,
    client: SchemaRegistryClient,
    decoders: Callable[..., SchemaDecoder],
    unique: str,
    fmt: str,
) -> None:
    encode = serializer(client, fmt)
    decoder = decoders(schema_registry.url, [unique])
    found = await decode(decoder, unique, encode(unique, order(7)))
    assert isinstance(found, DecodedRecord) and isinstance(found.value, Decoded)
    assert found.key is None
    assert json.loads(found.value.json) == decoded_order(fmt, 7)
    assert found.value.subject == f"{unique}-value"
    assert found.value.version == 1
    assert found.value.schema_type == {"avro": "AVRO", "protobuf": "PROTOBUF", "json": "JSON"}[fmt]
    # A second record of the same schema decodes without a load.
    again = decoder.decode_record(unique, None, encode(unique, order(8)))
    assert isinstance(again, DecodedRecord) and again.value is not None
    assert json.loads(again.value.json) == decoded_order(fmt, 8)
    assert decoder.catalog.loads == 1


async def test_a_protobuf_record_of_the_files_second_message(
    schema_registry: SchemaRegistry,
    client: SchemaRegistryClient,
    decoders: Callable[..., SchemaDecoder],
    unique: str,
) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = ProtobufSerializer(
        ProtoRefund,
        client,
        conf={"subject.name.strategy.type": "TOPIC", "use.deprecated.format": False},
    )
    value = ser(
        ProtoRefund(order_id=3, amount_cents=250), SerializationContext(unique, MessageField.VALUE)
    )
    decoder = decoders(schema_registry.url, [unique])
    found = await decode(decoder, unique, value)
    assert isinstance(found, DecodedRecord) and found.value is not None
    assert json.loads(found.value.json) == {"order_id": "3", "amount_cents": "250"}


@pytest.mark.parametrize("fmt", FORMATS)
async def test_records_that_do_not_decode_say_why(
    schema_registry: SchemaRegistry,
    client: SchemaRegistryClient,
    decoders: Callable[..., SchemaDecoder],
    unique: str,
    fmt: str,
) -> None:
    encode = serializer(client, fmt)
    good = encode(unique, order(1))
    decoder = decoders(schema_registry.url, [unique])
    header = good[:5]
    # JSON Schema: valid JSON that the schema refuses; Avro and Protobuf: a body cut short.
    bad_body = header + (b'{"id": "seven"}' if fmt == "json" else good[5:-3] + b"\xff")
    cases = {
        b'{"id": 1}': (NOT_WIRE_FORMAT, "not the Confluent wire format"),
        b"\x00\x7f\xff\xff\xf0" + good[5:]: (UNKNOWN_SCHEMA_ID, "is not in the registry"),
        bad_body: (UNDECODABLE_PAYLOAD, "does not read these bytes"),
    }
    for value, (exception_class, said) in cases.items():
        found = await decode(decoder, unique, value)
        assert isinstance(found, Undecodable), (value, found)
        assert found.exception_class == exception_class
        assert said in found.message and found.message.startswith("value: ")


async def test_an_unreachable_registry_raises_and_keeps_nothing(
    decoders: Callable[..., SchemaDecoder], unique: str
) -> None:
    from sidecar.ops.broker import free_port

    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    decoder = decoders(url, [unique], timeout_s=1.0, **{"max.retries": 0})
    found = decoder.decode_record(unique, None, b"\x00\x00\x00\x00\x01\x02")
    assert found == MissingSchema(1)
    with pytest.raises(RegistryUnreachable) as info:
        await decoder.load(1)
    assert info.value.url == url
    assert len(decoder.catalog) == 0
    assert decoder.decode_record(unique, None, b"\x00\x00\x00\x00\x01\x02") == MissingSchema(1)


async def test_the_cache_keeps_at_most_its_bound(
    schema_registry: SchemaRegistry,
    client: SchemaRegistryClient,
    decoders: Callable[..., SchemaDecoder],
    unique: str,
) -> None:
    topics = [f"{unique}-{n}" for n in range(3)]
    values = [
        serializer(client, fmt)(topic, order(1)) for topic, fmt in zip(topics, FORMATS, strict=True)
    ]
    decoder = decoders(schema_registry.url, topics, capacity=2)
    for topic, value in zip(topics, values, strict=True):
        assert isinstance(await decode(decoder, topic, value), DecodedRecord)
    assert len(decoder.catalog) == 2
    # The first schema was dropped (least recently used): it is loaded again.
    assert isinstance(decoder.decode_record(topics[0], None, values[0]), MissingSchema)
    assert isinstance(decoder.decode_record(topics[2], None, values[2]), DecodedRecord)
