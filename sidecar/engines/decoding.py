"""Records with schemas, the pipeline's step: a record's key and value decoded before its first attempt.

Owns the decoder the config asks for (`decoding_for`: None unless ``schemas.decode`` names a topic),
`SchemaStep` (ready, undecodable or waiting: told in its docstring) and the registry's reachability.

Must not import either engine or confluent-kafka (`sidecar.kafka.schemas` does).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
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
    """Decoding for the pipeline.

    Given by the pipeline: `reject` (answer a delivery with a reject carrying the error, as if the
    app had: the record goes to the DLQ, never to the app), `intake_changed` (the adapter hears that
    the registry went down or came back), `stopping` (the pipeline is stopping).

    `sort` runs where the pipeline makes an attempt's view (a push request, a pull): each delivery is
    ready (decoded now, decoded before, or of a topic that does not decode), undecodable (to the DLQ
    without a delivery: the pipeline answers it with a reject carrying the reason), or waiting for a
    schema to be loaded. `load` loads on a worker thread; a registry that cannot be reached marks it
    down (intake pauses as for an unreachable app, `/readyz` names it) and `probe` tries again with
    backoff until it answers.
    """

    def __init__(
        self,
        decoder: Any,
        *,
        reject: Callable[[Delivery[Any], AppError], object],
        intake_changed: Callable[[], object],
        stopping: Callable[[], bool],
    ) -> None:
        # sidecar.kafka.schemas.decoder.SchemaDecoder, imported only when a topic decodes.
        self._decoder = decoder
        self._reject = reject
        self._intake_changed = intake_changed
        self._stopping = stopping
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

    def ready(self, live: Sequence[Delivery[Any]]) -> tuple[list[Delivery[Any]], set[int]]:
        """The deliveries of `live` that can be sent now, and the schema ids the others wait for;
        the undecodable ones are rejected (to the DLQ) at once."""
        ready, bad, missing = self.sort(live)
        for d, error in bad:
            self._reject(d, error)
        return ready, missing

    async def load_or_probe(self, schema_ids: set[int], nursery: trio.Nursery) -> bool:
        """Load `schema_ids`; when the registry cannot be used, pause intake and probe it in
        `nursery` until it answers (intake resumes then). Whether they are loaded."""
        if await self.load(schema_ids):
            return True
        self._intake_changed()
        nursery.start_soon(self._probe_then_resume, schema_ids)
        return False

    async def _probe_then_resume(self, schema_ids: set[int]) -> None:
        if await self.probe(schema_ids, self._stopping):
            self._intake_changed()

    async def ready_pulled(
        self,
        taken: list[Delivery[Any]],
        is_live: Callable[[Delivery[Any]], bool],
        nursery: trio.Nursery,
        not_reached: Callable[[list[Delivery[Any]]], Awaitable[bool]],
        put_back: Callable[[Delivery[Any]], object],
    ) -> list[Delivery[Any]]:
        """Pull mode: the deliveries of a poll that can be handed out, their schemas loaded first.
        With the registry down the rest are not an attempt: back to their adapter (or, when it says
        they may go again now, back in the pull queue)."""
        out: list[Delivery[Any]] = []
        todo = taken
        while todo:
            ready, missing = self.ready([d for d in todo if is_live(d)])
            out.extend(ready)
            todo = [d for d in todo if d not in ready and is_live(d)]
            if not missing or not todo:
                break
            if not await self.load_or_probe(missing, nursery):
                if await not_reached(todo):
                    for d in todo:
                        put_back(d)
                break
        return out

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

    async def probe(self, schema_ids: set[int], stopping: Callable[[], bool]) -> bool:
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


def decoding_for(
    config: Config,
    *,
    reject: Callable[[Delivery[Any], AppError], object],
    intake_changed: Callable[[], object],
    stopping: Callable[[], bool],
) -> SchemaStep | None:
    """The decoding step `config` asks for; None when no topic decodes (nothing imported then)."""
    schemas = config.schemas
    if not schemas.enabled:
        return None
    from sidecar.kafka.schemas.catalog import Catalog, RegistrySettings
    from sidecar.kafka.schemas.decoder import SchemaDecoder

    registry = schemas.registry
    settings = RegistrySettings(registry.url, registry.timeout_ms / 1000, registry.properties)
    catalog = Catalog(settings, schemas.cache_max_schemas)
    return SchemaStep(
        SchemaDecoder(catalog, schemas.decode),
        reject=reject,
        intake_changed=intake_changed,
        stopping=stopping,
    )
