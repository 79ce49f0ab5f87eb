"""The effective configuration as plain data, in the YAML file's own shape and key names.

`dump_config` walks the key tables (`sidecar.config.schema`), so every key that can be read is also
written, and masks secrets with `sidecar.config.masking` unless told not to.

Imports: the standard library, the `sidecar.config` modules values, kinds, schema, schemas, masking and
routes (none of them imports this one), and `sidecar.core.routes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

__all__ = ["dump_config"]

from sidecar.config.kinds import Key, Section
from sidecar.config.masking import MASK, is_secret_header, masked_kafka
from sidecar.config.routes import route_plain
from sidecar.config.schema import TOP_KEYS
from sidecar.config.schemas import SchemasConfig
from sidecar.config.tiers import RetryTiersConfig
from sidecar.config.values import (
    ApiConfig,
    AppConfig,
    Config,
    DeadLetterQueueConfig,
    DeliveryConfig,
    ErrorsConfig,
    LoggingConfig,
    MetricsConfig,
    SourceConfig,
    TracingConfig,
)
from sidecar.core.routes import RouteRule


def _plain(value: object) -> Any:
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, RouteRule):
        return route_plain(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(_plain(v) for v in value)
    return value


def _dump_table(owners: Mapping[type, object], keys: tuple[Key, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        if key.replaced_by is not None:
            continue  # an old name is read, never written
        if isinstance(key.kind, Section):  # a section within a section (schemas.registry)
            inner = getattr(owners[key.owner], key.attr)
            out[key.name] = _dump_table({**owners, key.kind.owner: inner}, key.kind.keys)
        else:
            out[key.name] = _plain(getattr(owners[key.owner], key.attr))
    return out


def dump_config(config: Config, *, mask_secrets: bool = True) -> dict[str, Any]:
    """The effective configuration in the YAML file's own shape and key names (JSON-safe).

    Secrets are masked by name (`is_secret_kafka_property`, `is_secret_header`), and the
    userinfo of any URL in a `kafka` value (``https://***@host``). Unmasked, the result
    parses back to an equal Config (unless a value holds a literal ``${``, which would be
    substituted again).
    """
    owners: dict[type, object] = {
        Config: config,
        DeliveryConfig: config.delivery,
        ErrorsConfig: config.errors,
        DeadLetterQueueConfig: config.errors.dlq,
        RetryTiersConfig: config.errors.tiers,
        SourceConfig: config.source,
        AppConfig: config.app,
        ApiConfig: config.api,
        LoggingConfig: config.logging,
        TracingConfig: config.tracing,
        MetricsConfig: config.metrics,
        SchemasConfig: config.schemas,
    }
    out: dict[str, Any] = {}
    for key in TOP_KEYS:
        if key.replaced_by is not None:
            continue  # an old name is read, never written
        if isinstance(key.kind, Section):
            out[key.name] = _dump_table(owners, key.kind.keys)
        else:
            out[key.name] = _plain(getattr(owners[key.owner], key.attr))
    if mask_secrets:
        out["kafka"] = {name: masked_kafka(name, value) for name, value in out["kafka"].items()}
        out["app"]["headers"] = {
            name: MASK if is_secret_header(name) else value
            for name, value in out["app"]["headers"].items()
        }
        if out["api"]["token"]:
            out["api"]["token"] = MASK
        registry = out["schemas"]["registry"]
        registry["url"] = masked_kafka("url", registry["url"])
        registry["properties"] = {
            name: masked_kafka(name, value) for name, value in registry["properties"].items()
        }
    return out
