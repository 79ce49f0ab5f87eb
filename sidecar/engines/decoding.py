"""Records with schemas, the pipeline's step: a record's key and value decoded before its first attempt.

Owns the decoder the config asks for (`decoding_for`: None unless ``schemas.decode`` names a topic) and
the registry's reachability. `SchemaStep.sort` runs where the pipeline makes an attempt's view (a push
request, a pull): each delivery is ready (decoded now, decoded before, or of a topic that does not
decode), undecodable (to the DLQ without a delivery: the pipeline answers it with a reject carrying the
reason), or waiting for a schema to be loaded. `SchemaStep.load` loads on a worker thread; a registry
that cannot be reached marks it down (intake pauses as for an unreachable app, `/readyz` names it) and
`probe` tries again with backoff until it answers. Must not import either engine or confluent-kafka
(`sidecar.kafka.schemas` does).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import trio

from sidecar.config import Config
from sidecar.core.record import Decoded, Tracked
from sidecar.core.wire import AppError, SchemaRef
from sidecar.engines.interfaces import Delivery
from sidecar.engines.outlet import Reachability

log = logging.getLogger("sidecar.schemas")

_PROBE_INITIAL_S = 0.2
_PROBE_MAX_S = 10.0


class SchemaStep:
    """Decoding for the pipeline (see the module docstring)."""

    def __init__(self, decoder: Any) -> None:
        # sidecar.kafka.schemas.decoder.SchemaDecoder, imported only when a topic decodes.
        self._decoder = decoder
        self.registry = Reachability()
        self.url = decoder.catalog.settings.url
        self.reason: str | None = None  # why the registry cannot be used, while it cannot
        self.undecodable = 0  # records dead-lettered because they do not decode
        self._probing = False

    def sort(
        self, deliveries: Sequence[Delivery[Any]]
    ) -> tuple[list[Delivery[Any]], list[tuple[Delivery[Any], AppError]], set[int]]:
        """(ready, undecodable with the error to reject them with, schema ids to load first)."""
        from sidecar.kafka.schemas.decoder import DecodedRecord, MissingSchema

        decoder = self._decoder
        ready: list[Delivery[Any]] = []
        bad: list[tuple[Delivery[Any], AppError]] = []
        missing: set[int] = set()
        for d in deliveries:
            tracked = d.tracked
            rec = tracked.record
            if tracked.decoded is not None or not decoder.decodes(rec.topic):
                ready.append(d)
                continue
            found = decoder.decode_record(rec.topic, rec.key, rec.value)
            if isinstance(found, DecodedRecord):
                tracked.decoded = _decoded(tracked, found)
                ready.append(d)
            elif isinstance(found, MissingSchema):
                missing.add(found.schema_id)
            else:
                self.undecodable += 1
                bad.append((d, AppError(found.exception_class, found.message)))
        return ready, bad, missing

    async def load(self, schema_ids: set[int]) -> bool:
        """Load the schemas of `schema_ids`; False (and the registry marked down) if it cannot."""
        from sidecar.kafka.schemas.catalog import RegistryUnreachable

        try:
            for schema_id in sorted(schema_ids):
                await self._decoder.load(schema_id)
        except RegistryUnreachable as exc:
            self.reason = exc.reason
            if self.registry.lost():
                log.warning(
                    "the schema registry %s cannot be used (%s): pausing intake until it answers",
                    self.url,
                    exc.reason,
                )
            return False
        return True

    async def probe(self, schema_ids: set[int], stopping: Any) -> bool:
        """Try `schema_ids` again with backoff until the registry answers (True) or `stopping()`."""
        if self._probing:
            return False
        self._probing = True
        delay_s = _PROBE_INITIAL_S
        try:
            while not stopping():
                await trio.sleep(delay_s)
                if await self.load(schema_ids):
                    log.info("the schema registry %s answers again: resuming intake", self.url)
                    self.reason = None
                    self.registry.back()
                    return True
                delay_s = min(delay_s * 2, _PROBE_MAX_S)
            return False
        finally:
            self._probing = False

    def status(self) -> dict[str, Any]:
        catalog = self._decoder.catalog
        return {
            "registry": self.url,
            "registry_reachable": self.registry.reachable,
            "registry_error": self.reason,
            "schemas_cached": len(catalog),
            "schemas_loaded": catalog.loads,
            "undecodable": self.undecodable,
        }

    def close(self) -> None:
        self._decoder.close()


def _ref(decoded: Any) -> SchemaRef:
    return SchemaRef(decoded.subject, decoded.version, decoded.schema_id, decoded.schema_type)


def _decoded(tracked: Tracked, found: Any) -> Decoded:
    rec = tracked.record
    key, value = found.key, found.value
    return Decoded(
        rec.key if key is None else key.json,
        None if key is None else _ref(key),
        rec.value if value is None else value.json,
        None if value is None else _ref(value),
    )


def decoding_for(config: Config) -> SchemaStep | None:
    """The decoding step `config` asks for; None when no topic decodes (nothing imported then)."""
    schemas = config.schemas
    if not schemas.enabled:
        return None
    from sidecar.kafka.schemas.catalog import Catalog, RegistrySettings
    from sidecar.kafka.schemas.decoder import SchemaDecoder

    registry = schemas.registry
    settings = RegistrySettings(registry.url, registry.timeout_ms / 1000, registry.properties)
    catalog = Catalog(settings, schemas.cache_max_schemas)
    return SchemaStep(SchemaDecoder(catalog, schemas.decode))
