"""The ``schemas:`` section: records with schemas, decoded through a Schema Registry for the app.

Owns `SchemasConfig` (the registry's address and client properties, which source topics decode their key
and/or value, the bounded schema cache, the fields the DLQ tools redact, the subjects that encode the app's
custom DLQ values), the readers of its keys
(`SCHEMAS_KEY`, for `sidecar.config.schema`'s top-level table) and its cross-key check against
``source.topics``. Off unless ``schemas.decode`` names a topic.

Imports: the standard library and the `sidecar.config` modules errors, environment, kinds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sidecar.config.environment import ReadContext
from sidecar.config.errors import Invalid
from sidecar.config.kinds import (
    CustomKey,
    IntKey,
    Key,
    Section,
    StrKey,
    describe_value,
    join_path,
    mapping_at,
)

KEY = "key"
VALUE = "value"

# SchemaRegistryClient's properties a config may set (besides url and timeout, which have keys of their own).
CLIENT_PROPERTIES = frozenset(
    {
        "basic.auth.credentials.source",
        "basic.auth.user.info",
        "bearer.auth.credentials.source",
        "bearer.auth.token",
        "bearer.auth.logical.cluster",
        "bearer.auth.identity.pool.id",
        "bearer.auth.client.id",
        "bearer.auth.client.secret",
        "bearer.auth.scope",
        "bearer.auth.issuer.endpoint.url",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "max.retries",
        "retries.wait.ms",
        "retries.max.wait.ms",
        "proxy",
    }
)
_INT_PROPERTIES = frozenset({"max.retries", "retries.wait.ms", "retries.max.wait.ms"})
# A redacted field: a name (any depth), or a dotted path from the top ("customer.card.number").
_FIELD = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*(\.[A-Za-z_$][A-Za-z0-9_$-]*)*")


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryConfig:
    """Where the Schema Registry is, and the client's properties (auth, TLS, retries)."""

    url: str = ""
    timeout_ms: int = 10_000
    properties: Mapping[str, str | int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemasConfig:
    """Which fields of which source topics are decoded, through which registry."""

    registry: RegistryConfig = field(default_factory=RegistryConfig)
    # source topic -> the fields decoded ("key", "value"); a topic left out is handed over byte-exact.
    decode: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    cache_max_schemas: int = 1000
    # Fields the DLQ tools (inspect, replay --dry-run, the console) show as "***".
    redact: tuple[str, ...] = ()
    # source topic -> the subject whose latest schema encodes the app's custom DLQ value (KIP-1034).
    dlq_value_subject: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def enabled(self) -> bool:
        return any(self.decode.values())


def _url_error(value: str) -> str | None:
    if value and not re.match(r"https?://[^/\s]+", value):
        return "must be an http:// or https:// URL (comma-separated for several)"
    return None


def _read_properties(raw: object, path: str, ctx: ReadContext) -> Mapping[str, str | int]:
    data = mapping_at({} if raw is None else raw, path)
    out: dict[str, str | int] = {}
    for name, value in data.items():
        where = join_path(path, name)
        if name in ("url", "timeout"):
            raise Invalid(where, f"set schemas.registry.{'url' if name == 'url' else 'timeout.ms'}")
        if name not in CLIENT_PROPERTIES:
            raise Invalid(
                where,
                "not a Schema Registry client property; known: "
                + ", ".join(sorted(CLIENT_PROPERTIES)),
            )
        if name in _INT_PROPERTIES:
            out[name] = IntKey(0, 3_600_000).read(value, where, ctx)
        else:
            out[name] = StrKey(allow_empty=False).read(value, where, ctx)
    return MappingProxyType(out)


def _read_decode(raw: object, path: str, ctx: ReadContext) -> Mapping[str, frozenset[str]]:
    data = mapping_at({} if raw is None else raw, path)
    out: dict[str, frozenset[str]] = {}
    for topic, fields in data.items():
        where = join_path(path, topic)
        if not isinstance(fields, list) or not fields:
            raise Invalid(
                where, f"expected a list of key and/or value, got {describe_value(fields)}"
            )
        chosen: set[str] = set()
        for item in fields:
            if item not in (KEY, VALUE):
                raise Invalid(where, f"expected key or value, got {describe_value(item)}")
            if item in chosen:
                raise Invalid(where, f"{item} is listed twice")
            chosen.add(item)
        out[topic] = frozenset(chosen)
    return MappingProxyType(out)


def _read_redact(raw: object, path: str, ctx: ReadContext) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise Invalid(
            path, f"expected a list of field names or dotted paths, got {describe_value(raw)}"
        )
    out: list[str] = []
    for index, item in enumerate(raw):
        where = f"{path}[{index}]"
        if not isinstance(item, str) or not _FIELD.fullmatch(item):
            raise Invalid(
                where, f"expected a field name or a dotted path, got {describe_value(item)}"
            )
        if item not in out:
            out.append(item)
    return tuple(out)


def _read_subjects(raw: object, path: str, ctx: ReadContext) -> Mapping[str, str]:
    data = mapping_at({} if raw is None else raw, path)
    return MappingProxyType(
        {
            str(topic): StrKey(allow_empty=False).read(subject, join_path(path, topic), ctx)
            for topic, subject in data.items()
        }
    )


_REGISTRY_KEYS = (
    Key("url", StrKey(check=_url_error), RegistryConfig, "url"),
    Key("timeout.ms", IntKey(100, 600_000), RegistryConfig, "timeout_ms"),
    Key(
        "properties",
        CustomKey(_read_properties, "a mapping of Schema Registry client properties"),
        RegistryConfig,
        "properties",
    ),
)

_SCHEMAS_KEYS = (
    Key("registry", Section(RegistryConfig, _REGISTRY_KEYS), SchemasConfig, "registry"),
    Key(
        "decode",
        CustomKey(_read_decode, "a mapping of source topic to [key, value]"),
        SchemasConfig,
        "decode",
    ),
    Key("cache.max.schemas", IntKey(1, 1_000_000), SchemasConfig, "cache_max_schemas"),
    Key(
        "redact",
        CustomKey(_read_redact, "a list of field names or dotted paths"),
        SchemasConfig,
        "redact",
    ),
    Key(
        "dlq.value.subject",
        CustomKey(_read_subjects, "a mapping of source topic to a subject"),
        SchemasConfig,
        "dlq_value_subject",
    ),
)


def schemas_key(owner: type) -> Key:
    """The top-level ``schemas:`` key of `owner` (the whole configuration's dataclass)."""
    return Key("schemas", Section(SchemasConfig, _SCHEMAS_KEYS), owner, "schemas")


def check_schemas(schemas: SchemasConfig, source_topics: tuple[str, ...]) -> None:
    """The section against the rest: decoded topics are source topics, and a registry is named."""
    for topic in schemas.decode:
        if topic not in source_topics:
            raise Invalid(
                f"schemas.decode.{topic}",
                f"is not a source topic (source.topics: {', '.join(source_topics)})",
            )
    if schemas.enabled and not schemas.registry.url:
        raise Invalid("schemas.registry.url", "is required when schemas.decode names a topic")
    for topic in schemas.dlq_value_subject:
        if topic not in source_topics:
            raise Invalid(
                f"schemas.dlq.value.subject.{topic}",
                f"is not a source topic (source.topics: {', '.join(source_topics)})",
            )
    if schemas.dlq_value_subject and not schemas.registry.url:
        raise Invalid(
            "schemas.registry.url", "is required when schemas.dlq.value.subject names a topic"
        )
