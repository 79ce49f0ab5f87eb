"""The Confluent wire format's header, and why a record does not decode.

A value written by a Schema Registry serializer starts with the magic byte 0 and the schema id (4 bytes,
big-endian); a Protobuf value then carries the message indexes (zig-zag varints: a count, then each index;
a single 0 for the file's first message). Pure: no registry, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

MAGIC_BYTE = 0
HEADER_BYTES = 5

# The exception class names a record that does not decode is dead-lettered with
# (`__dlq.errors.exception.class.name`), one for each reason.
NOT_WIRE_FORMAT = "sidecar.NotWireFormat"  # no magic byte and schema id
UNKNOWN_SCHEMA_ID = "sidecar.UnknownSchemaId"  # the registry has no schema of that id
UNDECODABLE_PAYLOAD = "sidecar.UndecodablePayload"  # the bytes do not read with their schema
UNREADABLE_SCHEMA = "sidecar.UnreadableSchema"  # the registry's schema could not be parsed


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Why a key or value does not decode: an exception class name above and a message saying which."""

    exception_class: str
    message: str


def schema_id_of(data: bytes) -> int | Undecodable:
    """The schema id of wire-format `data`, or why `data` is not in the wire format."""
    if len(data) < HEADER_BYTES:
        return Undecodable(
            NOT_WIRE_FORMAT,
            f"not the Confluent wire format: {len(data)} bytes, fewer than the {HEADER_BYTES} of its header",
        )
    if data[0] != MAGIC_BYTE:
        return Undecodable(
            NOT_WIRE_FORMAT,
            f"not the Confluent wire format: the first byte is 0x{data[0]:02x}, not the magic byte 0x00",
        )
    return int.from_bytes(data[1:HEADER_BYTES], "big", signed=True)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint at `pos`: its value and the position after it."""
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("the Protobuf message indexes run past the end of the value")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def message_indexes(data: bytes) -> tuple[tuple[int, ...], int]:
    """A Protobuf value's message indexes (after the header) and where its message starts.

    Raises ValueError when they are cut short or out of range."""
    count, pos = _varint(data, HEADER_BYTES)
    if count == 0:
        return (0,), pos
    if count < 0 or count > 64:
        raise ValueError(f"{count} Protobuf message indexes: not a valid header")
    indexes = []
    for _ in range(count):
        index, pos = _varint(data, pos)
        if index < 0:
            raise ValueError(f"a negative Protobuf message index ({index})")
        indexes.append(index)
    return tuple(indexes), pos
