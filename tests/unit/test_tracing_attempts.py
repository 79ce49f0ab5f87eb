"""Attempt spans (sidecar.telemetry.tracing, sidecar.engines.attempts): what an attempt is sent and records.

Issue 19, item 6: a span the sampler drops must cost only the sampler's decision and its ids. It still
gives the app a W3C context (sampled flag off, so the app's parent-based sampler drops its spans too),
and a record without a producer context starts a trace of its own, whatever span is current.
"""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.core.record import SourceRecord, Tracked
from sidecar.core.wire import Answer, AppError
from sidecar.engines.attempts import attempt_view, end_attempt_span
from sidecar.telemetry.tracing import Tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def record(traceparent: str | None = None) -> Tracked:
    return Tracked(SourceRecord("orders", 2, 7, b"k", b"value", (), 1, "create", traceparent, None))


def tracing_with(
    monkeypatch: pytest.MonkeyPatch, sampler: str
) -> tuple[Tracing, InMemorySpanExporter]:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    exporter = InMemorySpanExporter()
    return Tracing("svc", "g", "none", processors=[SimpleSpanProcessor(exporter)]), exporter


def test_an_unsampled_attempt_sends_its_context_and_records_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracing, exporter = tracing_with(monkeypatch, "always_off")
    tracked = record()
    view, actx = attempt_view(tracing, tracked, 1, "id-1")
    assert actx is not None and not actx.recording
    assert view.traceparent == actx.traceparent
    version, trace_id, span_id, flags = view.traceparent.split("-")
    assert version == "00" and int(trace_id, 16) and int(span_id, 16)
    assert int(flags, 16) & 1 == 0  # not sampled (the SDK may set the W3C random-trace-id bit)
    assert (view.delivery_count, view.delivery_id, view.offset) == (1, "id-1", 7)
    end_attempt_span(actx, tracked, Answer("release", AppError("app.Busy", "later")))
    assert exporter.get_finished_spans() == ()
    # The DLQ write still links to the (unsampled) attempt, and its log line names it.
    assert tracked.last_span == actx.span.get_span_context()


def test_an_unsampled_producer_context_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    tracing, exporter = tracing_with(monkeypatch, "parentbased_always_on")
    tracked = record(TRACEPARENT[:-2] + "00")
    view, actx = attempt_view(tracing, tracked, 1, "id-1")
    assert actx is not None and not actx.recording
    assert view.traceparent.split("-")[1] == TRACE_ID
    assert int(view.traceparent.split("-")[3], 16) & 1 == 0
    end_attempt_span(actx, tracked, Answer("accept"))
    assert exporter.get_finished_spans() == ()


def test_a_sampled_attempt_is_the_producers_child_with_its_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracing, exporter = tracing_with(monkeypatch, "parentbased_always_on")
    tracked = record(TRACEPARENT)
    view, actx = attempt_view(tracing, tracked, 2, "id-2")
    assert actx is not None and actx.recording
    end_attempt_span(actx, tracked, Answer("reject", AppError("app.Poison", "no")))
    (span,) = exporter.get_finished_spans()
    assert view.traceparent == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"
    assert span.parent is not None and f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert span.name == "process orders"
    attrs = dict(span.attributes or {})
    assert attrs["dlq_sidecar.delivery.count"] == 2
    assert attrs["messaging.kafka.message.key"] == "k"
    assert attrs["dlq_sidecar.outcome"] == "reject"
    assert span.status.status_code is trace.StatusCode.ERROR


def test_a_record_without_a_producer_context_starts_its_own_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracing, exporter = tracing_with(monkeypatch, "parentbased_always_on")
    current = tracing.tracer.start_span("unrelated")
    with trace.use_span(current, end_on_exit=True):
        _view, actx = attempt_view(tracing, record(), 1, "id-1")
    assert actx is not None
    end_attempt_span(actx, record(), Answer("accept"))
    attempt = next(s for s in exporter.get_finished_spans() if s.name == "process orders")
    assert attempt.parent is None
    assert attempt.context.trace_id != current.get_span_context().trace_id


def test_with_tracing_off_the_view_carries_the_producers_context() -> None:
    tracing = Tracing("svc", "g", "none")
    view, actx = attempt_view(tracing, record(TRACEPARENT), 3, "id-3")
    assert actx is None and view.traceparent == TRACEPARENT and view.delivery_count == 3
