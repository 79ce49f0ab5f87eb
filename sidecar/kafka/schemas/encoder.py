"""The app's custom DLQ value (KIP-1034) encoded with a configured subject's latest schema.

Owns `ValueEncoder`: per source topic a subject (`schemas.dlq.value.subject`); the value the app
gave (JSON text) serialized by confluent-kafka's own `AvroSerializer` or `JSONSerializer` with the
subject's latest version, never registering one, in the Confluent wire format; or why not (a text:
the DLQ record then keeps the app's bytes and says why). Blocking (a worker thread's call).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from sidecar.kafka.schemas.catalog import AVRO, JSON, RegistrySettings

Serialize = Callable[[Any, SerializationContext], bytes]


class ValueEncoder:
    """Encodes the custom DLQ values of the source topics `subjects` names, one serializer per
    subject (made at its first value; the client caches the subject's latest version)."""

    def __init__(self, settings: RegistrySettings, subjects: Mapping[str, str]) -> None:
        self.settings = settings
        self.subjects = dict(subjects)
        self._client = SchemaRegistryClient(settings.client_conf())
        self._serializers: dict[str, Serialize] = {}
        self._lock = threading.Lock()

    def encodes(self, topic: str) -> bool:
        return topic in self.subjects

    def close(self) -> None:
        self._client.close()

    def encode_sync(self, topic: str, value: bytes) -> bytes | str:
        """`value` (JSON text) encoded with the latest schema of `topic`'s subject, or why not."""
        subject = self.subjects[topic]
        try:
            document = json.loads(value)
        except ValueError as exc:
            return f"the custom DLQ value is not JSON text, so not encoded with {subject}: {exc}"
        where = f"the latest schema of {subject} could not be had from {self.settings.url}"
        try:
            with self._lock:
                serialize = self._serializers.get(subject) or self._serializer(subject)
        except SchemaRegistryError as exc:
            return f"{where}: HTTP {exc.http_status_code}, {exc.error_message}"
        except Exception as exc:  # no connection, a timeout, TLS: the client's transport errors
            return f"{where}: {type(exc).__name__}: {exc}"
        if isinstance(serialize, str):
            return serialize
        try:
            data = serialize(document, SerializationContext(topic, MessageField.VALUE))
        except SchemaRegistryError as exc:
            return f"{where}: HTTP {exc.http_status_code}, {exc.error_message}"
        except Exception as exc:  # the serializers raise whatever their writers raise
            return (
                f"the custom DLQ value does not fit the latest schema of {subject}: "
                f"{type(exc).__name__}: {exc}"
            )
        return bytes(data)

    def _serializer(self, subject: str) -> Serialize | str:
        """The subject's serializer (kept), or why there is none (its type)."""
        schema = self._client.get_latest_version(subject).schema
        kind = schema.schema_type or AVRO
        conf: dict[str, Any] = {
            "auto.register.schemas": False,
            "use.latest.version": True,
            "subject.name.strategy": lambda _ctx, _name: subject,
        }
        serialize: Serialize
        if kind == AVRO:
            serialize = AvroSerializer(self._client, schema.schema_str, conf=conf)
        elif kind == JSON:
            serialize = JSONSerializer(schema.schema_str, self._client, conf=conf)
        else:
            return (
                f"{subject} is a {kind} subject: a custom DLQ value is encoded with Avro or JSON "
                "Schema only"
            )
        self._serializers[subject] = serialize
        return serialize


__all__ = ["ValueEncoder"]
