"""Records with schemas, the parts without a registry: the wire format's header, a decoded value as JSON,
and the ``schemas:`` section's keys (each bad value named by its path, with the reason)."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import uuid
from typing import Any

import pytest

from sidecar.config import ConfigError, dump_config, parse_config
from sidecar.core.wire import (
    CloudEventsFormat,
    SchemaRef,
    cloudevent_attributes,
    format_batch_request,
    format_cloudevents_batch_body,
    format_single_request,
)
from sidecar.kafka.schemas.jsonvalue import to_json
from sidecar.kafka.schemas.wire import (
    NOT_WIRE_FORMAT,
    Undecodable,
    message_indexes,
    schema_id_of,
)
from sidecar.ops.dlq.errors import UsageError
from sidecar.ops.dlq.payloads import Payload, PayloadReader, parse_field_filter, redact
from tests.unit.test_config import patched
from tests.unit.test_wire import ParsedRequest, make_record, parse_single

# ---------------------------------------------------------------------------------------------
# The wire format


def test_the_schema_id_is_the_four_bytes_after_the_magic_byte() -> None:
    assert schema_id_of(b"\x00\x00\x00\x01\x02payload") == 258
    assert schema_id_of(b"\x00\x00\x00\x00\x07") == 7


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b'{"id": 1}', "the first byte is 0x7b"),
        (b"\x00\x00\x01", "3 bytes, fewer than the 5"),
        (b"", "0 bytes"),
    ],
)
def test_bytes_without_the_header_are_not_the_wire_format(data: bytes, said: str) -> None:
    found = schema_id_of(data)
    assert isinstance(found, Undecodable)
    assert found.exception_class == NOT_WIRE_FORMAT
    assert said in found.message


def test_protobuf_message_indexes() -> None:
    header = b"\x00\x00\x00\x00\x09"
    assert message_indexes(header + b"\x00rest") == ((0,), 6)
    # Two indexes (count 2 zig-zagged is 4): [1, 2] zig-zagged are 2, 4.
    assert message_indexes(header + b"\x04\x02\x04rest") == ((1, 2), 8)
    with pytest.raises(ValueError, match="past the end"):
        message_indexes(header + b"\x04\x02")
    with pytest.raises(ValueError, match="past the end"):
        message_indexes(header)


# ---------------------------------------------------------------------------------------------
# JSON


def test_avro_values_json_has_no_word_for_are_written_as_text() -> None:
    value = {
        "raw": b"\x00\xff",
        "amount": decimal.Decimal("12.50"),
        "at": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "day": datetime.date(2026, 1, 2),
        "id": uuid.UUID(int=1),
        "text": "é",
    }
    back = json.loads(to_json(value))
    assert back == {
        "raw": "\u0000\u00ff",
        "amount": "12.50",
        "at": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "id": "00000000-0000-0000-0000-000000000001",
        "text": "é",
    }


def test_a_value_with_no_json_form_is_refused() -> None:
    with pytest.raises(TypeError, match="no JSON form"):
        to_json({"x": object()})


# ---------------------------------------------------------------------------------------------
# The schemas: section


def _config(schemas: dict[str, Any]) -> Any:
    return parse_config(patched({"schemas": schemas}), env={})


def test_off_by_default() -> None:
    config = parse_config(patched({}), env={})
    assert not config.schemas.enabled
    assert config.schemas.cache_max_schemas == 1000


def test_a_decoded_topic_with_its_registry() -> None:
    config = _config(
        {
            "registry": {
                "url": "http://127.0.0.1:8081",
                "timeout.ms": 2500,
                "properties": {"basic.auth.user.info": "u:secret", "max.retries": 1},
            },
            "decode": {"orders": ["key", "value"]},
            "cache.max.schemas": 10,
            "redact": ["card", "customer.email"],
            "dlq.value.subject": {"orders": "orders-dlq-value"},
        }
    )
    schemas = config.schemas
    assert schemas.dlq_value_subject == {"orders": "orders-dlq-value"}
    assert schemas.enabled
    assert schemas.decode["orders"] == frozenset({"key", "value"})
    assert schemas.registry.timeout_ms == 2500
    assert schemas.registry.properties["max.retries"] == 1
    assert schemas.redact == ("card", "customer.email")
    dumped = dump_config(config)["schemas"]
    assert dumped["registry"]["properties"]["basic.auth.user.info"] == "***"
    assert dumped["decode"] == {"orders": ["key", "value"]}
    assert (
        parse_config(
            patched({"schemas": dump_config(config, mask_secrets=False)["schemas"]}), env={}
        )
        == config
    )


@pytest.mark.parametrize(
    ("schemas", "path", "reason"),
    [
        (
            {"decode": {"payments": ["value"]}, "registry": {"url": "http://r:8081"}},
            "schemas.decode.payments",
            "not a source topic",
        ),
        ({"decode": {"orders": ["value"]}}, "schemas.registry.url", "required"),
        (
            {"decode": {"orders": ["body"]}, "registry": {"url": "http://r"}},
            "schemas.decode.orders",
            "key or value",
        ),
        ({"decode": {"orders": []}}, "schemas.decode.orders", "a list of key and/or value"),
        ({"decode": {"orders": ["value", "value"]}}, "schemas.decode.orders", "listed twice"),
        ({"registry": {"url": "r:8081"}}, "schemas.registry.url", "http://"),
        ({"registry": {"timeout.ms": 0}}, "schemas.registry.timeout.ms", "100"),
        (
            {"registry": {"properties": {"basic.auth.userinfo": "x"}}},
            "schemas.registry.properties.basic.auth.userinfo",
            "not a Schema Registry client property",
        ),
        (
            {"registry": {"properties": {"url": "http://x"}}},
            "schemas.registry.properties.url",
            "schemas.registry.url",
        ),
        ({"cache.max.schemas": 0}, "schemas.cache.max.schemas", "1"),
        ({"redact": ["a..b"]}, "schemas.redact[0]", "dotted path"),
        (
            {"dlq.value.subject": {"payments": "p-dlq"}, "registry": {"url": "http://r"}},
            "schemas.dlq.value.subject.payments",
            "not a source topic",
        ),
        ({"dlq.value.subject": {"orders": "o-dlq"}}, "schemas.registry.url", "required"),
        ({"dlq.value.subject": {"orders": ""}}, "schemas.dlq.value.subject.orders", ""),
        ({"unknown": 1}, "schemas.unknown", ""),
    ],
)
def test_a_bad_key_is_named_with_the_reason(
    schemas: dict[str, Any], path: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _config(schemas)
    assert info.value.path == path
    assert reason in str(info.value)


# ---------------------------------------------------------------------------------------------
# The app's requests name the schema


_VALUE_SCHEMA = SchemaRef("orders-value", 3, 42, "AVRO")


def _header(request: ParsedRequest, name: str) -> str | None:
    return next((v for k, v in request.headers if k.lower() == name.lower()), None)


def test_a_decoded_value_is_sent_as_json_with_its_schema() -> None:
    request = parse_single(make_record(value=b'{"id":1}', value_schema=_VALUE_SCHEMA))
    assert request.body == b'{"id":1}'
    assert _header(request, "Content-Type") == "application/json"
    assert _header(request, "Kafka-Value-Schema-Subject") == "orders-value"
    assert _header(request, "Kafka-Value-Schema-Version") == "3"
    assert _header(request, "Kafka-Value-Schema-Id") == "42"
    assert _header(request, "Kafka-Value-Schema-Type") == "AVRO"
    assert _header(request, "Kafka-Key-Schema-Id") is None


def test_an_undecoded_record_is_sent_byte_exact_as_before() -> None:
    record = make_record()
    assert format_single_request(record, "h", "/r") == format_single_request(
        record._replace(key_schema=None, value_schema=None), "h", "/r"
    )
    request = parse_single(record)
    assert _header(request, "Content-Type") == "application/octet-stream"
    assert not [k for k, _ in request.headers if "schema" in k.lower()]


def test_a_subject_that_is_no_header_value_is_left_out() -> None:
    schema = SchemaRef("orders\r\nX-Injected: 1", 1, 7, "JSON")
    request = parse_single(make_record(value=b"{}", value_schema=schema))
    assert _header(request, "Kafka-Value-Schema-Id") == "7"
    assert _header(request, "Kafka-Value-Schema-Subject") is None
    assert _header(request, "X-Injected") is None


def test_a_batch_item_names_the_schema_of_key_and_value() -> None:
    key_schema = SchemaRef("orders-key", 1, 5, "JSON")
    raw = format_batch_request(
        [
            make_record(
                key=b'"k"', key_schema=key_schema, value=b"[1]", value_schema=_VALUE_SCHEMA
            ),
            make_record(offset=43),
        ],
        "h",
        "/r",
    )
    first, second = json.loads(raw.split(b"\r\n\r\n", 1)[1])["records"]
    assert first["key_schema"] == {"subject": "orders-key", "version": 1, "id": 5, "type": "JSON"}
    assert first["value_schema"] == {
        "subject": "orders-value",
        "version": 3,
        "id": 42,
        "type": "AVRO",
    }
    assert json.loads(base64.b64decode(first["value"])) == [1]
    assert "key_schema" not in second and "value_schema" not in second


def test_cloudevents_of_a_decoded_value() -> None:
    ce = CloudEventsFormat("kafka://c/{topic}", "t")
    record = make_record(value=b'{"id":1}', value_schema=_VALUE_SCHEMA)
    attributes = cloudevent_attributes(record, ce)
    assert attributes["datacontenttype"] == "application/json"
    assert attributes["schemasubject"] == "orders-value"
    assert attributes["schemaid"] == "42"
    (event,) = json.loads(format_cloudevents_batch_body([record], ce))
    assert event["data"] == {"id": 1}
    assert "data_base64" not in event


# ---------------------------------------------------------------------------------------------
# The DLQ tools: redaction and filters on decoded fields


def test_redaction_by_name_at_any_depth_and_by_path() -> None:
    value = {
        "card": "4111",
        "customer": {"email": "a@b", "card": "5500", "name": "Ann"},
        "items": [{"card": "x", "sku": 1}],
        "email": "top@b",
    }
    out = redact(value, frozenset({"card"}), frozenset({"customer.email"}))
    assert out == {
        "card": "***",
        "customer": {"email": "***", "card": "***", "name": "Ann"},
        "items": [{"card": "***", "sku": 1}],
        "email": "top@b",  # a path redacts that path only
    }
    assert value["card"] == "4111"  # the input is left as it was


def test_a_field_filter_compares_text_and_json() -> None:
    reader = PayloadReader(None, (), (("customer.id", "42"), ("tags.0", "vip")))
    ok = Payload({"customer": {"id": 42}, "tags": ["vip"]}, {"subject": "s", "version": 1, "id": 1})
    assert reader.matches(ok)
    assert not reader.matches(Payload({"customer": {"id": 41}, "tags": ["vip"]}, ok.schema))
    assert not reader.matches(Payload({"tags": ["vip"]}, ok.schema))  # missing
    assert not reader.matches(Payload(reason="not the wire format"))
    assert not reader.matches(None)
    assert PayloadReader(None).matches(None)  # no filter: everything


def test_a_field_filter_needs_path_and_value() -> None:
    assert parse_field_filter("a.b=") == ("a.b", "")
    assert parse_field_filter("a=b=c") == ("a", "b=c")
    with pytest.raises(UsageError, match="PATH=VALUE"):
        parse_field_filter("novalue")


def test_fields_a_schema_tags_sensitive_are_found_in_avro_and_json_schema() -> None:
    from sidecar.kafka.schemas.tags import sensitive_paths

    address = {
        "type": "record",
        "name": "Address",
        "fields": [
            {"name": "street", "type": "string", "confluent:tags": ["pii"]},
            {"name": "city", "type": "string"},
        ],
    }
    avro = {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "card", "type": "string", "confluent:tags": ["PII"]},
            {"name": "note", "type": "string", "confluent:tags": ["internal"]},
            {"name": "home", "type": ["null", address]},
            {"name": "work", "type": ["null", "Address"]},  # a named type, defined above
            {"name": "lines", "type": {"type": "array", "items": {
                "type": "record", "name": "Line",
                "fields": [{"name": "secret", "type": "string", "confluent:tags": ["SENSITIVE"]}],
            }}},
        ],
    }  # fmt: skip
    assert sensitive_paths("AVRO", json.dumps(avro)) == {
        "card",
        "home.street",
        "work.street",
        "lines.secret",
    }
    schema = {
        "type": "object",
        "properties": {
            "card": {"type": "string", "confluent:tags": ["PCI"]},
            "customer": {
                "type": "object",
                "properties": {"email": {"type": "string", "confluent:tags": ["PII"]}},
            },
            "items": {
                "type": "array",
                "items": {"properties": {"ssn": {"confluent:tags": ["PHI"]}}},
            },
            "id": {"type": "integer"},
        },
    }
    assert sensitive_paths("JSON", json.dumps(schema)) == {"card", "customer.email", "items.ssn"}
    assert sensitive_paths("PROTOBUF", "syntax = 'proto3';") == frozenset()
    assert sensitive_paths("AVRO", "not json") == frozenset()
    # A schema that names itself does not loop.
    node = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "next", "type": ["null", "Node"]}],
    }
    assert sensitive_paths("AVRO", json.dumps(node)) == frozenset()


def test_protobuf_fields_tagged_with_field_meta_are_found() -> None:
    from confluent_kafka.schema_registry.common.protobuf import _init_pool
    from confluent_kafka.schema_registry.confluent import meta_pb2
    from google.protobuf import descriptor_pb2, descriptor_pool

    from sidecar.kafka.schemas.tags import protobuf_sensitive

    field_meta = getattr(meta_pb2, "field_meta")  # noqa: B009
    fdp = descriptor_pb2.FileDescriptorProto(
        name="shop/tagged.proto",
        package="shop",
        syntax="proto3",
        dependency=["confluent/meta.proto"],
    )
    customer = fdp.message_type.add(name="Customer")
    email = customer.field.add(name="email", number=1, type=9, label=1)
    email.options.Extensions[field_meta].tags.append("pii")
    customer.field.add(name="name", number=2, type=9, label=1)
    order = fdp.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=3, label=1)
    card = order.field.add(name="card", number=2, type=9, label=1)
    card.options.Extensions[field_meta].tags.append("PCI")
    order.field.add(name="customer", number=3, type=11, label=1, type_name=".shop.Customer")
    pool = descriptor_pool.DescriptorPool()
    _init_pool(pool)
    pool.Add(fdp)
    found = protobuf_sensitive(pool.FindFileByName("shop/tagged.proto"))
    assert found == {"email", "card", "customer.email"}
