"""OpenTelemetry for the sidecar: one CONSUMER span per delivery attempt and one PRODUCER span per DLQ write.

Owns the tracer provider set-up (exporter from the config file or the standard `OTEL_*` variables, a
parent-based sampler by default so a producer's sampling decision is honoured) and the W3C trace-context
plumbing between Kafka record headers, the HTTP request to the app and the DLQ record. When tracing is off,
`Tracing.enabled` is False and the engine skips every call: a disabled tracer costs nothing per record.

Must not import the engine, the source or the HTTP modules.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar.core.record import SourceRecord

log = logging.getLogger("sidecar.tracing")

_PROPAGATOR = TraceContextTextMapPropagator()

# Semantic-convention attribute names (messaging, v1.26+), spelled out so a reader can grep them.
A_SYSTEM = "messaging.system"
A_OPERATION_TYPE = "messaging.operation.type"
A_OPERATION_NAME = "messaging.operation.name"
A_DESTINATION = "messaging.destination.name"
A_PARTITION = "messaging.destination.partition.id"
A_OFFSET = "messaging.kafka.offset"
A_GROUP = "messaging.consumer.group.name"
A_KEY = "messaging.kafka.message.key"
A_BODY_SIZE = "messaging.message.body.size"
A_DELIVERY_COUNT = "dlq_sidecar.delivery.count"
A_DELIVERY_ID = "dlq_sidecar.delivery.id"
A_OUTCOME = "dlq_sidecar.outcome"
A_DLQ_REASON = "dlq_sidecar.dlq.reason"


def _exporter(name: str) -> SpanExporter | None:
    if name in ("", "none"):
        return None
    if name == "console":
        return ConsoleSpanExporter()
    if name in ("otlp-http", "otlp", "http/protobuf"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if name in ("otlp-grpc", "grpc"):
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "tracing.exporter otlp-grpc needs the opentelemetry-exporter-otlp-proto-grpc package"
            ) from exc
        return GrpcExporter()
    raise ValueError(f"unknown span exporter {name!r}")


def exporter_name(config_exporter: str) -> str:
    """The config file's choice, unless it is `none` and OTEL_TRACES_EXPORTER names one."""
    if config_exporter != "none":
        return config_exporter
    env = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if env in ("otlp",):
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        return "otlp-grpc" if protocol == "grpc" else "otlp-http"
    if env in ("console",):
        return "console"
    return "none"


# The parent of a record that carries no producer context: explicitly none. (With `context=None` the
# SDK looks the current context up, three times per span, and would make the attempt a child of
# whatever span happened to be current.)
_NO_PARENT = Context()


class AttemptContext(NamedTuple):
    """An attempt's span, the W3C context the app is sent, and whether the span is recorded.

    A named tuple: one is made per attempt (a frozen dataclass costs several times more).
    """

    span: Span
    traceparent: str
    tracestate: str | None
    recording: bool


class Tracing:
    """The sidecar's tracer; `enabled` False means every method is a no-op the engine does not call."""

    def __init__(
        self,
        service_name: str,
        group: str,
        exporter: str = "none",
        *,
        processors: Sequence[SpanProcessor] = (),
    ) -> None:
        self.group = group
        self._span_names: dict[str, str] = {}  # topic -> the attempt span's name
        name = exporter_name(exporter)
        span_exporter = _exporter(name)
        self.enabled = span_exporter is not None or bool(processors)
        self.provider: TracerProvider | None = None
        if not self.enabled:
            self.tracer: trace.Tracer = trace.NoOpTracer()
            return
        # No sampler argument: the SDK reads OTEL_TRACES_SAMPLER, and its default is
        # parentbased_always_on, which honours the producer's sampled flag.
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        for p in processors:
            provider.add_span_processor(p)
        if span_exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(span_exporter))
        self.provider = provider
        self.tracer = provider.get_tracer("dlq-sidecar")
        log.info("tracing on: exporter %s", name if span_exporter is not None else "in-process")

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()

    @staticmethod
    def parent_context(traceparent: str | None, tracestate: str | None) -> Context | None:
        if not traceparent:
            return None
        carrier = {"traceparent": traceparent}
        if tracestate:
            carrier["tracestate"] = tracestate
        ctx = _PROPAGATOR.extract(carrier)
        return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None

    def start_attempt(
        self, record: SourceRecord, delivery_count: int, delivery_id: str
    ) -> AttemptContext:
        """The CONSUMER span of one attempt, a child of the producer's span when there is one.

        A span the sampler drops costs what the SDK needs to decide and to give it ids (the app
        is still sent its context, with the sampled flag off, so the app's spans honour the
        decision), and nothing else: no attributes, and `end_attempt` returns at once.
        """
        parent = (
            self.parent_context(record.traceparent, record.tracestate) or _NO_PARENT
            if record.traceparent
            else _NO_PARENT
        )
        topic = record.topic
        name = self._span_names.get(topic)
        if name is None:
            name = self._span_names[topic] = f"process {topic}"
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.CONSUMER)
        recording = span.is_recording()
        # Attributes only for spans that are recorded: with a ratio sampler most spans are not,
        # and building the dict would be most of their cost. (The SDK's samplers decide on the trace
        # id and the parent, not on these attributes.)
        if recording:
            attributes: dict[str, Any] = {
                A_SYSTEM: "kafka",
                A_OPERATION_TYPE: "process",
                A_OPERATION_NAME: "process",
                A_DESTINATION: topic,
                A_PARTITION: str(record.partition),
                A_OFFSET: record.offset,
                A_GROUP: self.group,
                A_BODY_SIZE: len(record.value or b""),
                A_DELIVERY_COUNT: delivery_count,
                A_DELIVERY_ID: delivery_id,
            }
            if record.key is not None:
                # Binary keys are not attributes (semantic conventions: UTF-8 strings only).
                with contextlib.suppress(UnicodeDecodeError):
                    attributes[A_KEY] = record.key.decode("utf-8")
            span.set_attributes(attributes)
        # The W3C trace context for the app, formatted directly: the propagator's inject() goes
        # through a Context and a carrier for the same two strings.
        sc = span.get_span_context()
        header = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"
        return AttemptContext(span, header, sc.trace_state.to_header() or None, recording)

    @staticmethod
    def end_attempt(
        ctx: AttemptContext,
        outcome: str,
        error_class: str | None = None,
        error_message: str | None = None,
    ) -> None:
        if not ctx.recording:
            return  # nothing to set, and ending a span that is not recorded does nothing
        span = ctx.span
        span.set_attribute(A_OUTCOME, outcome)
        if error_class or outcome in ("release", "reject", "not_attempted"):
            if error_class:
                span.add_event(
                    "exception",
                    {"exception.type": error_class, "exception.message": error_message or ""},
                )
            span.set_status(Status(StatusCode.ERROR, error_message or error_class or outcome))
        span.end()

    def start_dlq_write(
        self,
        *,
        source_topic: str,
        partition: int,
        offset: int,
        dlq_topic: str,
        reason: str,
        traceparent: str | None,
        tracestate: str | None,
        links: Sequence[Link] = (),
    ) -> tuple[Span, list[tuple[str, bytes]]]:
        """A PRODUCER span for the DLQ write, in the record's trace; returns it and the headers to inject."""
        parent = self.parent_context(traceparent, tracestate)
        span = self.tracer.start_span(
            f"send {dlq_topic}",
            context=parent,
            kind=SpanKind.PRODUCER,
            links=list(links),
            attributes={
                A_SYSTEM: "kafka",
                A_OPERATION_TYPE: "send",
                A_OPERATION_NAME: "send",
                A_DESTINATION: dlq_topic,
                "dlq_sidecar.source.topic": source_topic,
                "dlq_sidecar.source.partition": partition,
                "dlq_sidecar.source.offset": offset,
                A_DLQ_REASON: reason,
            },
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return span, [(k, v.encode()) for k, v in carrier.items()]


def span_ids(span: Span) -> dict[str, str]:
    """trace_id / span_id for log lines, hex like the W3C header."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return {}
    return {"trace_id": f"{sc.trace_id:032x}", "span_id": f"{sc.span_id:016x}"}
