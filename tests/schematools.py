"""Records in the Confluent wire format for the tests: confluent-kafka's own serializers against the real
registry (tests/registry.py), for Avro, Protobuf (message classes built from a descriptor, no protoc) and
JSON Schema. Subjects by topic (``<topic>-value``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message_factory import GetMessageClass

AVRO_ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "card", "type": "string"},
    ],
}
JSON_ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer": {"type": "string"},
        "card": {"type": "string"},
    },
    "required": ["id", "customer", "card"],
}
FORMATS = ("avro", "protobuf", "json")


def _order_file() -> Any:
    """shop/order.proto: Order (id, customer, card) and, second, Refund (order_id, amount_cents)."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="shop/order.proto", package="shop", syntax="proto3"
    )
    order = fdp.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=3, label=1)  # int64
    order.field.add(name="customer", number=2, type=9, label=1)  # string
    order.field.add(name="card", number=3, type=9, label=1)
    refund = fdp.message_type.add(name="Refund")
    refund.field.add(name="order_id", number=1, type=3, label=1)
    refund.field.add(name="amount_cents", number=2, type=3, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return pool


_POOL = _order_file()
ProtoOrder = GetMessageClass(_POOL.FindMessageTypeByName("shop.Order"))
ProtoRefund = GetMessageClass(_POOL.FindMessageTypeByName("shop.Refund"))


def registry_client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url, "timeout": 10})


def serializer(client: SchemaRegistryClient, fmt: str) -> Callable[[str, dict[str, Any]], bytes]:
    """`(topic, order) -> bytes` in `fmt`, registering the schema under ``<topic>-value`` first time."""
    import json

    conf: dict[str, Any] = {"subject.name.strategy.type": "TOPIC"}
    if fmt == "avro":
        ser: Any = AvroSerializer(client, json.dumps(AVRO_ORDER), conf=conf)
    elif fmt == "json":
        ser = JSONSerializer(json.dumps(JSON_ORDER), client, conf=conf)
    else:
        ser = ProtobufSerializer(ProtoOrder, client, conf={**conf, "use.deprecated.format": False})

    def encode(topic: str, order: dict[str, Any]) -> bytes:
        value = ProtoOrder(**order) if fmt == "protobuf" else order
        data: bytes = ser(value, SerializationContext(topic, MessageField.VALUE))
        return data

    return encode


def order(n: int) -> dict[str, Any]:
    return {"id": n, "customer": f"customer-{n}", "card": f"4111-0000-0000-{n:04d}"}


def decoded_order(fmt: str, n: int) -> dict[str, Any]:
    """`order(n)` as the sidecar hands it over (Protobuf's JSON mapping writes an int64 as a string)."""
    out: dict[str, Any] = order(n)
    if fmt == "protobuf":
        out["id"] = str(n)
    return out
