"""The registry client and the schemas it loaded, by id, bounded.

Owns `Catalog`: loading a schema (blocking: a worker thread) with its subjects and references, and at
most `capacity` of them kept, least recently used dropped first; decoding never makes a request (how:
its docstring).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry import protobuf as protobuf_serde
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.common.protobuf import _init_pool, _str_to_proto
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass

from sidecar.core.errors import SidecarError
from sidecar.kafka.schemas.tags import protobuf_sensitive, sensitive_paths
from sidecar.kafka.schemas.wire import UNKNOWN_SCHEMA_ID, UNREADABLE_SCHEMA, Undecodable

AVRO = "AVRO"
PROTOBUF = "PROTOBUF"
JSON = "JSON"


class RegistryUnreachable(SidecarError):
    """The registry did not answer (or answered with an error that is not the record's fault)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"schema registry {url}: {reason}")
        self.url = url
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RegistrySettings:
    """Where the registry is and how the client talks to it."""

    url: str
    timeout_s: float = 10.0
    # SchemaRegistryClient's other properties, verbatim: basic.auth.*, bearer.auth.*, ssl.*, max.retries...
    properties: Mapping[str, str | int | bool] | None = None

    def client_conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = dict(self.properties or {})
        conf["url"] = self.url
        conf["timeout"] = self.timeout_s
        return conf


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """A loaded schema: its id, type, and the (subject, version) pairs it is registered under."""

    schema_id: int
    schema_type: str
    versions: tuple[tuple[str, int], ...]
    # Fields the schema tags sensitive (`sidecar.kafka.schemas.tags`): the DLQ tools redact them.
    sensitive: frozenset[str] = frozenset()

    def subject_version(self, preferred: str) -> tuple[str, int] | None:
        """The (subject, version) under `preferred` (``<topic>-value``), else the first one."""
        for pair in self.versions:
            if pair[0] == preferred:
                return pair
        return self.versions[0] if self.versions else None


def _no_subject(ctx: object, record_name: object) -> None:
    """No subject: the writer schema comes by id, no rules or latest-version lookups by subject."""
    return None


_NO_SUBJECT: dict[str, Any] = {"subject.name.strategy": _no_subject}


class _Pinned:
    """A registry of recorded answers, handed to a deserializer: it asks for its writer schema (and,
    parsing it, for the schemas that one references) and gets them without a request."""

    def __init__(self, schemas: dict[int, Any], versions: dict[tuple[str, int], Any]) -> None:
        self._schemas = schemas
        self._versions = versions

    def get_schema(self, schema_id: int, *args: object, **kwargs: object) -> Any:
        return self._schemas[schema_id]

    def get_version(self, subject: str, version: int, *args: object, **kwargs: object) -> Any:
        return self._versions[(subject, version)]

    def config(self) -> dict[str, Any]:
        return {}


@dataclass(slots=True)
class LoadedSchema:
    """A schema and confluent-kafka's deserializer for it (Protobuf: one per message of the file)."""

    info: SchemaInfo
    _decode: Callable[[bytes, tuple[int, ...]], object]

    def decode(self, data: bytes, indexes: tuple[int, ...] = ()) -> object:
        """`data` (the whole wire-format value) decoded; raises whatever the deserializer raises."""
        return self._decode(data, indexes)


class Catalog:
    """Schemas by id, at most `capacity`, loaded through the registry on demand.

    `Catalog.load` (blocking: run it on a worker thread) fetches a schema by id through confluent-kafka's
    `SchemaRegistryClient` (its auth, TLS, retries; a request timeout always), with the subjects and versions
    it is registered under and every schema it references, and builds confluent-kafka's own deserializer for
    it. The deserializer is given a registry of that one schema's answers (`_Pinned`), so decoding a record
    never makes a request; the client's own caches are emptied after each load, so what is kept is what the
    catalog keeps: at most `capacity` schemas, the least recently used dropped first.

    Protobuf is read with the message class built from the schema's file descriptor and no registry-aware
    fetch: a registry that keeps the descriptor as registered (Apicurio) answers the default format with it,
    and one that turns it into .proto text (Confluent's) answers `format=serialized` with it.
    """

    def __init__(self, settings: RegistrySettings, capacity: int = 1000) -> None:
        self.settings = settings
        self.capacity = capacity
        self._client = SchemaRegistryClient(settings.client_conf())
        self._entries: OrderedDict[int, LoadedSchema | Undecodable] = OrderedDict()
        self._lock = threading.Lock()  # loads run on worker threads; lookups on the event loop
        self.loads = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, schema_id: int) -> LoadedSchema | Undecodable | None:
        """The schema of `schema_id` (or why it cannot be had), None when it has yet to be loaded."""
        with self._lock:
            entry = self._entries.get(schema_id)
            if entry is not None:
                self._entries.move_to_end(schema_id)
            return entry

    def load(self, schema_id: int) -> LoadedSchema | Undecodable:
        """Fetch and keep the schema of `schema_id`. Blocking. Raises RegistryUnreachable."""
        found = self.get(schema_id)
        if found is not None:
            return found
        try:
            entry = self._fetch(schema_id)
        finally:
            self._client.clear_caches()  # type: ignore[no-untyped-call]
        with self._lock:
            self._entries[schema_id] = entry
            self._entries.move_to_end(schema_id)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
            self.loads += 1
        return entry

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------------------ fetching

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """A registry request; its failures that are not a 404 mean the registry cannot be used now."""
        try:
            return fn()
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise
            raise RegistryUnreachable(
                self.settings.url, f"{what}: HTTP {exc.http_status_code}, {exc.error_message}"
            ) from exc
        except Exception as exc:
            raise RegistryUnreachable(
                self.settings.url, f"{what}: {type(exc).__name__}: {exc}"
            ) from exc

    def _fetch(self, schema_id: int) -> LoadedSchema | Undecodable:
        client = self._client
        try:
            schema = self._call(f"schema id {schema_id}", lambda: client.get_schema(schema_id))
        except SchemaRegistryError as exc:
            return Undecodable(
                UNKNOWN_SCHEMA_ID,
                f"schema id {schema_id} is not in the registry ({exc.error_code}: {exc.error_message})",
            )
        try:
            listed = self._call(
                f"versions of schema id {schema_id}", lambda: client.get_schema_versions(schema_id)
            )
        except SchemaRegistryError:
            listed = []
        info = SchemaInfo(
            schema_id,
            schema.schema_type or AVRO,
            tuple((v.subject, int(v.version)) for v in listed if v.subject is not None),
            sensitive_paths(schema.schema_type or AVRO, schema.schema_str or ""),
        )
        versions: dict[tuple[str, int], Any] = {}
        try:
            if info.schema_type == PROTOBUF:
                return self._protobuf(info, schema, versions)
            self._references(schema, versions, serialized=False)
            pinned = _Pinned({schema_id: schema}, versions)
            if info.schema_type == JSON:
                json_deserializer = JSONDeserializer(
                    None, schema_registry_client=pinned, conf=_NO_SUBJECT
                )
                return LoadedSchema(info, lambda data, _: json_deserializer(data, None))
            if info.schema_type == AVRO:
                avro_deserializer = AvroDeserializer(pinned, conf=_NO_SUBJECT)
                return LoadedSchema(info, lambda data, _: avro_deserializer(data, None))
            return Undecodable(
                UNREADABLE_SCHEMA,
                f"schema id {schema_id} is of type {info.schema_type}, not one read here",
            )
        except SchemaRegistryError as exc:
            return Undecodable(
                UNREADABLE_SCHEMA,
                f"schema id {schema_id} references a schema not in the registry ({exc.error_message})",
            )

    def _references(
        self, schema: Any, into: dict[tuple[str, int], Any], *, serialized: bool
    ) -> None:
        """Every schema `schema` references, transitively, fetched into `into`."""
        for ref in schema.references or []:
            key = (ref.subject, int(ref.version))
            if key in into:
                continue
            subject: str = ref.subject
            version: int = ref.version
            registered = self._call(
                f"reference {subject} version {version}",
                functools.partial(self._client.get_version, subject, version, True),
            )
            if serialized:
                registered = self._serialized_version(registered, ref.name or ref.subject)
            into[key] = registered
            self._references(registered.schema, into, serialized=serialized)

    # ------------------------------------------------------------------------------ Protobuf

    def _serialized_schema_str(self, schema_str: str, name: str, refetch: Callable[[], Any]) -> str:
        """The base64 file descriptor of a Protobuf schema: as answered, else refetched serialized."""
        try:
            _str_to_proto(name, schema_str)
            return schema_str
        except Exception:
            again = self._call(f"{name} in the serialized format", refetch)
            text: str = (
                again.schema_str if hasattr(again, "schema_str") else again.schema.schema_str
            )
            return text

    def _serialized_version(self, registered: Any, name: str) -> Any:
        text = self._serialized_schema_str(
            registered.schema.schema_str,
            name,
            lambda: self._client.get_version(
                registered.subject, registered.version, True, "serialized"
            ),
        )
        registered.schema.schema_str = text
        return registered

    def _protobuf(
        self, info: SchemaInfo, schema: Any, versions: dict[tuple[str, int], Any]
    ) -> LoadedSchema | Undecodable:
        schema_id = info.schema_id
        text = self._serialized_schema_str(
            schema.schema_str,
            f"schema id {schema_id}",
            lambda: self._client.get_schema(schema_id, None, "serialized"),
        )
        self._references(schema, versions, serialized=True)
        try:
            pool = DescriptorPool()
            _init_pool(pool)
            # The sync module's resolver (the package also has an async one of that name).
            resolve: Any = cast(Any, protobuf_serde)._resolve_named_schema
            resolve(schema, _Pinned({}, versions), pool)
            file_proto = _str_to_proto(f"schema-{schema_id}.proto", text)
            pool.Add(file_proto)
            file_desc = pool.FindFileByName(file_proto.name)
        except Exception as exc:
            return Undecodable(
                UNREADABLE_SCHEMA, f"schema id {schema_id} is not a readable Protobuf schema: {exc}"
            )
        info = dataclasses.replace(info, sensitive=protobuf_sensitive(file_desc))
        by_indexes: dict[tuple[int, ...], Any] = {}

        def decode(data: bytes, indexes: tuple[int, ...]) -> object:
            deserializer = by_indexes.get(indexes)
            if deserializer is None:
                descriptor = _message_descriptor(file_desc, indexes or (0,))
                deserializer = ProtobufDeserializer(
                    GetMessageClass(descriptor), {"use.deprecated.format": False}
                )
                by_indexes[indexes] = deserializer
            return deserializer(data, None)

        return LoadedSchema(info, decode)


def _message_descriptor(file_desc: Any, indexes: tuple[int, ...]) -> Any:
    """The message the indexes name: the file's n-th message, then its nested ones. ValueError if none."""
    messages = list(file_desc.message_types_by_name.values())
    descriptor: Any = None
    for depth, index in enumerate(indexes):
        if index >= len(messages):
            where = "the file" if depth == 0 else descriptor.full_name
            raise ValueError(
                f"message index {index} out of range: {where} has {len(messages)} messages"
            )
        descriptor = messages[index]
        messages = list(descriptor.nested_types)
    return descriptor
