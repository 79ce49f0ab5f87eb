"""One record's key and value decoded for the app, or why not, or which schema must be loaded first.

`SchemaDecoder.decode_record` never blocks: a schema id the catalog has yet to load comes back as
`MissingSchema`, and the caller awaits `load` (a worker thread) and asks again. `load` raises
`RegistryUnreachable` when the registry cannot be used: not the record's fault, so the caller pauses
and tries again instead of dead-lettering. A null key or value stays null; a field whose topic does not
decode it is left as it is (None in the result).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import trio

from sidecar.kafka.schemas.catalog import PROTOBUF, Catalog, LoadedSchema, RegistryUnreachable
from sidecar.kafka.schemas.jsonvalue import to_json
from sidecar.kafka.schemas.wire import (
    UNDECODABLE_PAYLOAD,
    Undecodable,
    message_indexes,
    schema_id_of,
)

__all__ = [
    "Decoded",
    "DecodedRecord",
    "MissingSchema",
    "RegistryUnreachable",
    "SchemaDecoder",
    "Undecodable",
    "decode_blocking",
]

KEY = "key"
VALUE = "value"
FIELDS = (KEY, VALUE)


@dataclass(frozen=True, slots=True)
class Decoded:
    """A key or value as JSON, with the schema that read it."""

    json: bytes
    schema_id: int
    schema_type: str
    subject: str
    version: int  # 0 when the registry listed no version for the id
    sensitive: frozenset[str] = frozenset()  # fields the schema tags sensitive (dotted paths)


@dataclass(frozen=True, slots=True)
class MissingSchema:
    """The schema of this id has to be loaded (`SchemaDecoder.load`) before the record decodes."""

    schema_id: int


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """A record's decoded key and value; None where the field is not decoded (off, or null)."""

    key: Decoded | None
    value: Decoded | None


class SchemaDecoder:
    """The decoding the config asks for: per source topic, which of key and value."""

    def __init__(self, catalog: Catalog, topics: Mapping[str, frozenset[str]]) -> None:
        self.catalog = catalog
        self.topics = dict(topics)

    def decodes(self, topic: str) -> bool:
        return bool(self.topics.get(topic))

    def decode_field(
        self, topic: str, field: str, data: bytes | None
    ) -> Decoded | Undecodable | MissingSchema | None:
        """One field of a record of `topic`: None when it is not decoded (off, or null)."""
        if data is None or field not in self.topics.get(topic, ()):
            return None
        schema_id = schema_id_of(data)
        if isinstance(schema_id, Undecodable):
            return Undecodable(schema_id.exception_class, f"{field}: {schema_id.message}")
        entry = self.catalog.get(schema_id)
        if entry is None:
            return MissingSchema(schema_id)
        if isinstance(entry, Undecodable):
            return Undecodable(entry.exception_class, f"{field}: {entry.message}")
        return _decode(entry, topic, field, data)

    def decode_record(
        self, topic: str, key: bytes | None, value: bytes | None
    ) -> DecodedRecord | Undecodable | MissingSchema:
        """Key and value of a record of `topic`; the key's problem first when both have one."""
        decoded_key = self.decode_field(topic, KEY, key)
        if isinstance(decoded_key, Undecodable | MissingSchema):
            return decoded_key
        decoded_value = self.decode_field(topic, VALUE, value)
        if isinstance(decoded_value, Undecodable | MissingSchema):
            return decoded_value
        return DecodedRecord(decoded_key, decoded_value)

    async def load(self, schema_id: int) -> None:
        """Load the schema of `schema_id` on a worker thread. Raises RegistryUnreachable."""
        await trio.to_thread.run_sync(self.catalog.load, schema_id, abandon_on_cancel=True)

    def close(self) -> None:
        self.catalog.close()


def decode_blocking(
    catalog: Catalog, data: bytes, field: str, topic: str = ""
) -> Decoded | Undecodable:
    """One key or value decoded whatever its topic, its schema loaded first if need be (blocking: the
    operator tools). Raises RegistryUnreachable."""
    schema_id = schema_id_of(data)
    if isinstance(schema_id, Undecodable):
        return schema_id
    entry = catalog.load(schema_id)  # the kept one when it is there
    if isinstance(entry, Undecodable):
        return entry
    return _decode(entry, topic, field, data)


def _decode(entry: LoadedSchema, topic: str, field: str, data: bytes) -> Decoded | Undecodable:
    info = entry.info
    where = f"{field}: schema id {info.schema_id} ({info.schema_type})"
    try:
        indexes: tuple[int, ...] = ()
        if info.schema_type == PROTOBUF:
            indexes = message_indexes(data)[0]
        text = to_json(entry.decode(data, indexes))
    except Exception as exc:  # the deserializers raise whatever their readers raise
        return Undecodable(
            UNDECODABLE_PAYLOAD, f"{where} does not read these bytes: {type(exc).__name__}: {exc}"
        )
    subject, version = info.subject_version(f"{topic}-{field}") or ("", 0)
    return Decoded(text, info.schema_id, info.schema_type, subject, version, info.sensitive)
