"""A decoded value as JSON text.

Avro's readers hand over Python values JSON has no word for: bytes and fixed (written as Avro's JSON
encoding does, one character per byte, ISO-8859-1), decimals (their exact text), dates, times and
timestamps (ISO 8601), UUIDs (their text). Protobuf messages go through Protobuf's own JSON mapping,
with the .proto field names.
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message


def _default(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("latin-1")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Message):
        return message_dict(value)
    raise TypeError(f"a decoded {type(value).__name__} has no JSON form")


def message_dict(message: Message) -> dict[str, Any]:
    """A Protobuf message by Protobuf's JSON mapping, .proto field names, fields at their defaults too."""
    result: dict[str, Any] = json_format.MessageToDict(
        message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
    return result


def to_json(value: object) -> bytes:
    """`value` (a deserializer's result) as compact UTF-8 JSON."""
    if isinstance(value, Message):
        value = message_dict(value)
    return json.dumps(value, default=_default, separators=(",", ":"), ensure_ascii=False).encode()
