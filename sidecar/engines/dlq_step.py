"""The pipeline's DLQ step: one record archived (stopped, skipped, held, or written) and its trace.

Owns `DlqStep` (between `Outlet.dead_letter` and the DLQ record confirmed: the topic, the plan, the
breaker's say, the log lines, the span, the counters: told in its docstring), building the DLQ
writer from the configuration, and the one decision whether the DLQ is transactional
(`transactional_dlq`).

Must not import either engine, the pipeline, the ledger, or confluent-kafka.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import trio
from opentelemetry import trace

from sidecar.config import Config, ErrorsTolerance, dlq_routes
from sidecar.config import Engine as EngineKind
from sidecar.core.deadletter import (
    ArchiveOutcome,
    DeadLetterPlan,
    FailedRecord,
    archived_log_fields,
    dead_letter,
)
from sidecar.core.outcome import DLQ_WRITE_FAILED, ArchiveReason, ErrorInfo, dead_letter_error
from sidecar.core.pointers import SourcePointers
from sidecar.core.record import Tracked
from sidecar.core.routes import RouteChoice
from sidecar.engines.breaker_gate import BreakerGate
from sidecar.engines.dlq_summary import DlqSummary
from sidecar.engines.interfaces import Counters, DlqSink
from sidecar.engines.payload_watch import PayloadWatch
from sidecar.kafka.dlq import DlqFatalError, DlqRecord, DlqWriter, default_transactional_id
from sidecar.telemetry.tracing import Tracing

if TYPE_CHECKING:
    from sidecar.kafka.schemas.encoder import ValueEncoder

log = logging.getLogger("sidecar.engine")  # the engine's messages, whichever adapter runs


# The exception class is the app's word: a metric label keeps the first few distinct ones only.
DEAD_LETTERED_CLASSES_MAX = 50
_CLASS_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_.$:-]{0,127}")


def dead_lettered_key(counters: Counters, plan: DeadLetterPlan) -> tuple[str, str, str, str]:
    """The labels of one DLQ record: source topic, reason, exception class, DLQ topic (one of the
    topics the routes can name: bounded by the configuration).

    The class is `none` when nobody said one, and `other` when it does not look like a class name or
    when DEAD_LETTERED_CLASSES_MAX distinct classes are already counted (a metric must stay bounded).
    """
    topic = plan.failed.topic if plan.failed is not None else ""
    name = plan.failed.exception_class if plan.failed is not None else None
    if not name:
        label = "none"
    elif _CLASS_LABEL.fullmatch(name) is None:
        label = "other"
    else:
        label = name
        seen = {k[2] for k in counters.dead_lettered}
        if label not in seen and len(seen) >= DEAD_LETTERED_CLASSES_MAX:
            label = "other"
    return topic, plan.reason.label, label, plan.dlq_topic or ""


def dlq_topics(config: Config, sources: Sequence[str] | None = None) -> list[str]:
    """Every DLQ topic the configuration can write to (sorted): the default DLQ of each source
    topic, the routes' topics and the names a reject may choose (`errors.deadletterqueue.routes*`);
    of `sources` only when given (the source topics that exist)."""
    routes = dlq_routes(config)
    if routes is None:
        return []
    return routes.topics_for(config.source.topics if sources is None else sources)


def transactional_dlq(config: Config) -> bool:
    """Whether DLQ records are written in transactions with the offset commit: the one place that
    decides (`errors.deadletterqueue.transactional.enable`, with a DLQ, consumer engine only)."""
    dlq = config.errors.dlq
    return dlq.transactional_enable and dlq.enabled and config.engine is EngineKind.CONSUMER


def dlq_writer_for(config: Config) -> DlqWriter:
    """The DLQ writer the configuration asks for; transactional (:func:`transactional_dlq`) with
    its transactional id from the start."""
    dlq = config.errors.dlq
    transactional = transactional_dlq(config)
    return DlqWriter(
        config.kafka,
        config.group_id,
        copy_record=dlq.copy_record_enable,
        stacktrace_max_bytes=dlq.stacktrace_max_bytes,
        retries_timeout_ms=dlq.produce_retries_timeout_ms,
        auto_create=dlq.auto_create_enable,
        topic_partitions=dlq.topic_partitions,
        topic_replication_factor=dlq.topic_replication_factor,
        transactional_id=default_transactional_id(config) if transactional else None,
    )


def value_encoder_for(config: Config) -> ValueEncoder | None:
    """The encoder of the app's custom DLQ values `config` asks for (``schemas.dlq.value.subject``);
    None when it names no topic (nothing of the registry client imported then)."""
    schemas = config.schemas
    if not schemas.dlq_value_subject:
        return None
    from sidecar.kafka.schemas.catalog import RegistrySettings
    from sidecar.kafka.schemas.encoder import ValueEncoder

    registry = schemas.registry
    settings = RegistrySettings(registry.url, registry.timeout_ms / 1000, registry.properties)
    return ValueEncoder(settings, schemas.dlq_value_subject)


class DlqStep:
    """Archives records for the pipeline.

    Owns what happens between an adapter deciding a record is done with (`Outlet.dead_letter`) and its
    DLQ record being confirmed: the record's DLQ topic (the routes, :class:`sidecar.core.routes.DlqRoutes`,
    the same for both engines), the plan (:func:`sidecar.core.deadletter.dead_letter`), the circuit
    breaker's say (:class:`~sidecar.engines.breaker_gate.BreakerGate`), the `record archived` log
    line (and, always, the per-burst line of :class:`~sidecar.engines.dlq_summary.DlqSummary`), the DLQ write's span, the counters,
    the app's custom DLQ value encoded with a configured subject (`schemas.dlq.value.subject`),
    the watch on headers-only records' source offsets (:class:`~sidecar.engines.payload_watch.PayloadWatch`), and building the DLQ writer from the configuration,
    including the one decision whether the DLQ is transactional (:func:`transactional_dlq`). The
    write goes to the `sink` the adapter chose when it was built: the DLQ writer, or (transactional
    consumer engine) its committer's transaction. Must not import either engine, the pipeline, the
    ledger, or confluent-kafka.
    """

    def __init__(
        self,
        config: Config,
        tracing: Tracing,
        counters: Counters,
        gate: BreakerGate | None,
        fail: Callable[[str], None],
    ) -> None:
        self.config = config
        self.tracing = tracing
        self.counters = counters
        self._gate = gate
        self._fail = fail
        self._observe: Callable[[float], None] = _ignore
        self._routes = dlq_routes(config)
        # One log line per burst of DLQ writes (its `run` is the pipeline's task).
        self.summary = DlqSummary()
        # The app's custom DLQ values encoded with a subject (schemas.dlq.value.subject); None: off.
        self._encoder = value_encoder_for(config)
        # Headers-only DLQ records whose source offset is deleted since (its `run` too).
        self.payload_watch = PayloadWatch(
            counters, config.errors.dlq.source_check_interval_ms / 1000, SourcePointers()
        )

    def observe_latency(self, observe: Callable[[float], None]) -> None:
        """The DLQ writes' latency observer (seconds; a Prometheus histogram)."""
        self._observe = observe

    async def dead_letter(
        self,
        tracked: Tracked,
        delivery_count: int,
        reason: ArchiveReason,
        error: ErrorInfo | None,
        *,
        consequence: str,
        sink: DlqSink,
        may_hold: bool = True,
    ) -> ArchiveOutcome:
        """Archive one record: stop (errors.tolerance: none), skip (no DLQ), or write its DLQ record.

        The outcome says whether the record is done (`ArchiveOutcome.done`); a write that fails for
        good stops the sidecar. `consequence` says what stopping leaves the record as. While the
        circuit breaker is not closed the record is held (`ArchiveOutcome.HELD`), unless the
        caller cannot keep it (`may_hold` False: the share engine on the broker's last delivery).
        """
        config = self.config
        route = self._route(tracked, reason, error)
        plan = dead_letter(
            tracked,
            delivery_count,
            reason,
            error,
            group=config.group_id,
            dlq_topic=route.topic if route is not None else None,
            tolerate=config.errors.tolerance != ErrorsTolerance.NONE,
            consequence=consequence,
            route_refused=route.refused if route is not None else None,
        )
        if plan.stop is not None:
            self._fail(plan.stop)
            return ArchiveOutcome.STOPPED
        if self._gate is not None and may_hold and not self._gate.admits():
            return ArchiveOutcome.HELD
        self._log_archived(tracked, delivery_count, plan)
        if plan.failed is None or plan.dlq_topic is None:
            self.counters.bump(self.counters.archived, reason.label)
            return ArchiveOutcome.NO_DLQ
        failed = plan.failed
        if self._encoder is not None and self._encoder.encodes(failed.topic):
            failed = await self._encode_custom_value(failed)
        span, failed = self._start_dlq_span(tracked, plan, failed, plan.dlq_topic)
        started = time.perf_counter()
        try:
            written = await sink.write(failed, plan.dlq_topic)
        except DlqFatalError as exc:
            self.counters.dlq_failed += 1
            if span is not None:
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                span.add_event(
                    "exception",
                    {"exception.type": DLQ_WRITE_FAILED, "exception.message": str(exc)},
                )
                span.end()
            self._fail(str(exc))
            return ArchiveOutcome.FAILED
        except BaseException:
            if span is not None:
                span.end()
            raise
        if written is False:  # the record went to another owner first
            if span is not None:
                span.end()
            return ArchiveOutcome.HANDED_OVER
        self._observe(time.perf_counter() - started)
        if span is not None:
            span.end()
        self.counters.dlq_written += 1
        if isinstance(written, DlqRecord) and not written.copied:
            self.payload_watch.written(failed.topic, failed.partition, failed.offset)
        self.counters.bump(self.counters.archived, reason.label)
        key = dead_lettered_key(self.counters, plan)
        self.counters.bump(self.counters.dead_lettered, key)
        if failed.route_refused is not None:
            self.counters.bump(self.counters.route_refused, failed.topic)
        self.summary.written(key[0], key[3], key[1], key[2])
        return ArchiveOutcome.WRITTEN

    def _route(
        self, tracked: Tracked, reason: ArchiveReason, error: ErrorInfo | None
    ) -> RouteChoice | None:
        """The DLQ topic of one record (None: no DLQ): the app's allowed name, the first rule that
        matches (on the error the DLQ record carries), or the default DLQ."""
        if self._routes is None:
            return None
        custom = tracked.custom
        return self._routes.choose(
            tracked.record.topic,
            reason,
            dead_letter_error(reason, error),
            custom.topic if custom is not None else None,
        )

    async def _encode_custom_value(self, failed: FailedRecord) -> FailedRecord:
        """`failed` with the app's custom DLQ value (KIP-1034) encoded with its topic's subject, or
        as given with the reason it is not (`__dlq.errors.value.not.encoded`); unchanged when the
        app gave none (or a null one)."""
        encoder = self._encoder
        value = failed.replacement_value
        if encoder is None or not failed.replacement_value_set or value is None:
            return failed
        encoded = await trio.to_thread.run_sync(encoder.encode_sync, failed.topic, value)
        if isinstance(encoded, bytes):
            return dataclasses.replace(failed, replacement_value=encoded)
        log.warning(
            "the custom DLQ value of %s[%d]@%d is written as the app gave it: %s",
            failed.topic,
            failed.partition,
            failed.offset,
            encoded,
        )
        return dataclasses.replace(failed, value_not_encoded=encoded)

    def close(self) -> None:
        """Close the custom DLQ values' registry client (the pipeline's last step)."""
        if self._encoder is not None:
            self._encoder.close()

    def route_status(self) -> dict[str, object]:
        """`/v1/status`'s `dlq_routes`: the rules in order, the names a reject may choose, and
        the DLQ records written per DLQ topic and refused names per source topic so far."""
        routes = self._routes
        written: dict[str, int] = {}
        for key, n in self.counters.dead_lettered.items():
            written[key[3]] = written.get(key[3], 0) + n
        return {
            "default": routes.default if routes is not None else None,
            "rules": [
                {
                    "exception_class": list(r.exception_classes),
                    "reason": list(r.reasons),
                    "source_topic": list(r.source_topics),
                    "topic": r.topic_name,
                }
                for r in (routes.rules if routes is not None else ())
            ],
            "app_allowed": list(routes.app_allowed) if routes is not None else [],
            "topics": dlq_topics(self.config),
            "written_by_dlq_topic": dict(sorted(written.items())),
            "refused_by_source_topic": dict(sorted(self.counters.route_refused.items())),
        }

    def _start_dlq_span(
        self, tracked: Tracked, plan: DeadLetterPlan, failed: FailedRecord, dlq_topic: str
    ) -> tuple[trace.Span | None, FailedRecord]:
        """The DLQ write's span (linked to the last attempt's); the record carries its context."""
        if not self.tracing.enabled:
            return None, failed
        rec = tracked.record
        last = tracked.last_span
        span, trace_headers = self.tracing.start_dlq_write(
            source_topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            dlq_topic=dlq_topic,
            reason=plan.reason.label,
            traceparent=rec.traceparent,
            tracestate=rec.tracestate,
            links=[trace.Link(last)] if last is not None else [],
        )
        # The DLQ record carries the write's context (overriding a copied traceparent).
        extra = (*failed.extra_headers, *trace_headers)
        return span, dataclasses.replace(failed, extra_headers=extra)

    def _log_archived(self, tracked: Tracked, delivery_count: int, plan: DeadLetterPlan) -> None:
        errors = self.config.errors
        if not errors.log_enable:
            return
        fields = archived_log_fields(
            tracked, delivery_count, plan, include_messages=errors.log_include_messages
        )
        last = tracked.last_span
        if last is not None and last.is_valid:
            fields["trace_id"] = f"{last.trace_id:032x}"
            fields["span_id"] = f"{last.span_id:016x}"
        log.error("record archived", extra={"fields": fields})


def _ignore(_seconds: float) -> None:
    return None


__all__ = ["DlqStep", "dlq_topics", "dlq_writer_for", "transactional_dlq"]
