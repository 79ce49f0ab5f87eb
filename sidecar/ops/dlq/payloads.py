"""Decoded payloads for the DLQ tools (`dlq inspect`, `dlq replay --dry-run`, the console).

Owns `PayloadReader`: a DLQ record's value and key read through the Schema Registry (blocking; a
headers-only record's from its source record, which the caller passes), the configured fields and
those the schema tags sensitive redacted (``***``), and the filters on decoded fields (compared on
the redacted value, so a redacted field cannot be probed); `payloads_for` builds one from the config.

Imports: the standard library, `sidecar.config`, `sidecar.kafka.tools` (the record type) and
`sidecar.kafka.schemas` (confluent-kafka's `schema_registry`: only when a registry is named).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.kafka.tools import ReadRecord
from sidecar.ops.dlq.entries import DlqEntry
from sidecar.ops.dlq.errors import UsageError

REDACTED = "***"


@dataclass(frozen=True, slots=True)
class Decoded:
    """A key or value decoded (and redacted), with its schema."""

    value: Any
    schema: dict[str, Any]
    tagged: bool = False  # fields the schema tags sensitive were redacted

    def preview(self) -> str:
        """The schema, then the decoded value, compact: ``orders-value v1: {"id":7}``."""
        text = json.dumps(self.value, separators=(",", ":"), ensure_ascii=False)
        subject = self.schema["subject"] or f"schema id {self.schema['id']}"
        return f"{subject} v{self.schema['version']}: {text}"


@dataclass(frozen=True, slots=True)
class Payload:
    """A DLQ record's value as the tools show it: decoded (and redacted) JSON with its schema, or
    the reason it is not; its key decoded when the key is in the wire format; `from_source` when
    both were read back from the source topic (a headers-only record)."""

    decoded: Any = None
    schema: dict[str, Any] | None = None
    reason: str | None = None  # why the value is shown as bytes
    hide_bytes: bool = False  # decoded with fields redacted: the raw bytes are not shown either
    key: Decoded | None = None
    from_source: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any]
        if self.schema is not None:
            out = {"value_decoded": self.decoded, "value_schema": self.schema}
        else:
            out = {"value_not_decoded": self.reason}
        if self.key is not None:
            out["key_decoded"] = self.key.value
            out["key_schema"] = self.key.schema
        if self.from_source:
            out["decoded_from_source"] = True
        return out

    def preview(self) -> str:
        """The schema, then the decoded value, compact: ``orders-value v1: {"id":7}`` (the key's
        first when it is decoded: ``key orders-key v1: 7; ...``)."""
        if self.schema is None:
            return ""
        text = Decoded(self.decoded, self.schema).preview()
        if self.key is not None:
            text = f"key {self.key.preview()}; {text}"
        return f"(from the source) {text}" if self.from_source else text


def redact(value: Any, names: frozenset[str], paths: frozenset[str], at: str = "") -> Any:
    """`value` with every field named in `names` (any depth) or at a path in `paths` replaced."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            path = f"{at}.{key}" if at else str(key)
            if key in names or path in paths:
                out[key] = REDACTED
            else:
                out[key] = redact(inner, names, paths, path)
        return out
    if isinstance(value, list):
        return [redact(item, names, paths, at) for item in value]
    return value


def in_wire_format(data: bytes) -> bool:
    """Whether `data` may be in the Confluent wire format (the magic byte 0 and a schema id): a key
    that is not is plain bytes, shown as it is rather than with a reason."""
    return len(data) >= 5 and data[0] == 0


def field_at(value: Any, path: str) -> Any:
    """The value at dotted `path` (list items by index), or a sentinel missing object."""
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


_MISSING = object()


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def parse_field_filter(text: str) -> tuple[str, str]:
    """``PATH=VALUE`` of ``--field``."""
    path, sep, value = text.partition("=")
    if not sep or not path:
        raise UsageError(f"--field {text!r}: expected PATH=VALUE (customer.id=42)")
    return path, value


class PayloadReader:
    """Decodes, redacts and filters DLQ values through one registry.

    A value in the Confluent wire format is read through `sidecar.kafka.schemas`; `redact` names a
    field at any depth, or a dotted path from the top; ``--field PATH=VALUE`` filters on the redacted
    value. A value that does not decode keeps its bytes and says why.
    """

    def __init__(
        self,
        catalog: Any,
        redacted: Sequence[str] = (),
        fields: Sequence[tuple[str, str]] = (),
        *,
        tagged: bool = True,
    ) -> None:
        self._catalog = catalog  # sidecar.kafka.schemas.catalog.Catalog
        self.names = frozenset(r for r in redacted if "." not in r)
        self.paths = frozenset(r for r in redacted if "." in r)
        self.fields = tuple(fields)
        # Redact the fields a schema tags sensitive (`sidecar.kafka.schemas.tags`); on by default.
        self.tagged = tagged

    def filtered(self, fields: Sequence[tuple[str, str]]) -> PayloadReader:
        """A reader with the same registry and redaction and these ``--field`` filters (the console's,
        per request); closing it is the original's business."""
        reader = PayloadReader(self._catalog, (), fields, tagged=self.tagged)
        reader.names, reader.paths = self.names, self.paths
        return reader

    @property
    def redacting(self) -> bool:
        return bool(self.names or self.paths)

    def payload(self, entry: DlqEntry, original: ReadRecord | None = None) -> Payload | None:
        """The entry's value decoded, or why not; None when it has no value to decode. A
        headers-only entry's value and key are `original`'s (its source record), when given."""
        from sidecar.kafka.schemas.catalog import RegistryUnreachable

        key, value = entry.key, entry.value
        from_source = entry.headers_only
        if from_source:
            if original is None:
                return None
            key, value = original.key, original.value
        if value is None:
            return None
        topic = entry.source_topic or ""
        try:
            found = self._decode(value, "value", topic)
            key_read = (
                self._decode(key, "key", topic) if key is not None and in_wire_format(key) else None
            )
        except RegistryUnreachable as exc:
            return Payload(reason=str(exc), from_source=from_source)
        # A key that does not decode is shown as it is.
        decoded_key = key_read if isinstance(key_read, Decoded) else None
        if not isinstance(found, Decoded):
            return Payload(reason=found, key=decoded_key, from_source=from_source)
        tagged = found.tagged or (decoded_key is not None and decoded_key.tagged)
        return Payload(
            found.value,
            found.schema,
            hide_bytes=self.redacting or tagged,
            key=decoded_key,
            from_source=from_source,
        )

    def _decode(self, data: bytes, field: str, topic: str) -> Decoded | str:
        """`data` decoded and redacted, or why not. Raises RegistryUnreachable."""
        from sidecar.kafka.schemas.decoder import Decoded as Read
        from sidecar.kafka.schemas.decoder import decode_blocking

        found = decode_blocking(self._catalog, data, field, topic)
        if not isinstance(found, Read):
            return f"{found.exception_class}: {found.message}"
        schema: dict[str, Any] = {
            "subject": found.subject,
            "version": found.version,
            "id": found.schema_id,
            "type": found.schema_type,
        }
        paths = self.paths
        tagged = self.tagged and bool(found.sensitive)
        if tagged:
            # Fields the schema tags sensitive (PII, ...): redacted by default, named here.
            schema["sensitive"] = sorted(found.sensitive)
            paths = paths | found.sensitive
        return Decoded(redact(json.loads(found.json), self.names, paths), schema, tagged)

    def read(self, entry: DlqEntry, original: ReadRecord | None = None) -> bool:
        """Decode `entry`'s value onto it (`DlqEntry.payload`; a headers-only entry's from
        `original`); whether it passes the filters."""
        payload = self.payload(entry, original)
        object.__setattr__(entry, "payload", payload)
        return self.matches(payload)

    def matches(self, payload: Payload | None) -> bool:
        """Whether a decoded value passes every ``--field`` filter (none given: all pass)."""
        if not self.fields:
            return True
        if payload is None or payload.schema is None:
            return False
        return all(
            (found := field_at(payload.decoded, path)) is not _MISSING and _as_text(found) == want
            for path, want in self.fields
        )

    def close(self) -> None:
        self._catalog.close()


def payloads_for(
    config: Any,
    registry_url: str | None,
    redacted: Sequence[str],
    fields: Sequence[tuple[str, str]],
    *,
    tagged: bool = True,
) -> PayloadReader | None:
    """A reader for the registry named by `registry_url` or the config's ``schemas.registry``;
    None when neither names one (``--field`` then is a usage error)."""
    schemas = None if config is None else config.schemas
    url = registry_url or (schemas.registry.url if schemas is not None else "")
    if not url:
        if fields:
            raise UsageError("--field needs a schema registry: --registry URL or --config FILE")
        return None
    from sidecar.kafka.schemas.catalog import Catalog, RegistrySettings

    timeout_s = 10.0
    properties: Any = None
    if schemas is not None and schemas.registry.url == url:
        timeout_s = schemas.registry.timeout_ms / 1000
        properties = schemas.registry.properties
    configured = tuple(schemas.redact) if schemas is not None else ()
    catalog = Catalog(RegistrySettings(url, timeout_s, properties), 1000)
    return PayloadReader(catalog, (*configured, *redacted), fields, tagged=tagged)
