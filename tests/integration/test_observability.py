"""Spans tied to every record, OTLP export, and Prometheus metrics that match what happened (real broker)."""

from __future__ import annotations

import os
from pathlib import Path

import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from sidecar.http.server import Request, Response, json_response, serve_http
from sidecar.telemetry.tracing import Tracing
from tests.harness import (
    Delivery,
    RecordingApp,
    free_port,
    running_sidecar,
)
from tests.harness import wait_until_thread as _wait_thread
from tests.kafkatools import Broker, Rec
from tests.promtext import prometheus_values

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"


def _release_twice_then_reject(d: Delivery) -> Response:
    if d.delivery_count < 3:
        return json_response({"ack": "release", "error": {"class": "app.Busy", "message": "later"}})
    return json_response(
        {"ack": "reject", "error": {"class": "app.Poison", "message": "cannot parse"}}
    )


async def test_attempt_spans_join_the_producer_trace_and_reach_the_dlq_record(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    group = f"g-{unique}"
    exporter = InMemorySpanExporter()
    tracing = Tracing("dlq-sidecar-test", group, "none", processors=[SimpleSpanProcessor(exporter)])
    app = RecordingApp(policy=_release_twice_then_reject)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={"errors.deadletterqueue.copy.record.enable": True},
        produce_first=[
            Rec(key=b"order-1", value=b"{}", headers=(("traceparent", TRACEPARENT.encode()),))
        ],
        mode="in_process",
        run_kwargs={"tracing": tracing},
    ) as rig:
        await _wait_thread(
            lambda: (
                broker.topic_exists(f"dlq.{topic}") and broker.count_records(f"dlq.{topic}") >= 1
            ),
            60,
            "the DLQ record",
        )
        rig.in_process.request_stop()
    assert rig.in_process.codes == [0]

    attempts = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert len(attempts) == 3
    for n, span in enumerate(
        sorted(attempts, key=lambda s: s.attributes["dlq_sidecar.delivery.count"]), start=1
    ):  # type: ignore[index,arg-type,return-value]
        assert f"{span.context.trace_id:032x}" == TRACE_ID
        assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT_SPAN
        assert span.name == f"process {topic}"
        attrs = span.attributes or {}
        assert attrs["messaging.system"] == "kafka"
        assert attrs["messaging.destination.name"] == topic
        assert attrs["messaging.destination.partition.id"] == "0"
        assert attrs["messaging.kafka.offset"] == 0
        assert attrs["messaging.consumer.group.name"] == group
        assert attrs["messaging.kafka.message.key"] == "order-1"
        assert attrs["dlq_sidecar.delivery.count"] == n
        assert attrs["dlq_sidecar.outcome"] == ("reject" if n == 3 else "release")
        assert span.status.status_code.name == "ERROR"
        assert any(e.name == "exception" for e in span.events)

    # The app received each attempt's own context (so its spans are children of the attempt).
    got = [dict(d.raw_headers).get("traceparent") for d in app.deliveries]
    assert len(got) == 3
    attempt_ids = {f"{s.context.span_id:016x}" for s in attempts}
    for tp in got:
        assert tp is not None and tp.split("-")[1] == TRACE_ID and tp.split("-")[2] in attempt_ids

    producer = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert len(producer) == 1
    assert f"{producer[0].context.trace_id:032x}" == TRACE_ID
    assert producer[0].links and f"{producer[0].links[0].context.span_id:016x}" in attempt_ids

    dlq = broker.read_topic(f"dlq.{topic}", 1)
    headers = dict(dlq[0].headers)
    tp = (headers["traceparent"] or b"").decode()
    assert tp.split("-")[1] == TRACE_ID  # the DLQ record leads back to the record's trace
    assert tp.split("-")[2] == f"{producer[0].context.span_id:016x}"


async def test_spans_are_exported_over_otlp_http(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    received: list[ExportTraceServiceRequest] = []

    async def collector(request: Request) -> Response:
        if request.method == "POST" and request.path == "/v1/traces":
            msg = ExportTraceServiceRequest()
            msg.ParseFromString(request.body)
            received.append(msg)
            return Response(200, (("Content-Type", "application/x-protobuf"),), b"")
        return Response(404)

    app = RecordingApp()
    otlp_port = free_port()
    async with (
        running_sidecar(
            broker,
            tmp_path,
            app,
            unique=unique,
            topic=topic,
            path="/",
            extra={"tracing": {"exporter": "otlp-http", "service.name": "otlp-test"}},
            start=False,
        ) as rig,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(serve_http, collector, ("tcp", "127.0.0.1", otlp_port))
        os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://127.0.0.1:{otlp_port}/v1/traces"
        os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"
        try:
            await trio.to_thread.run_sync(
                broker.produce, topic, [Rec(key=b"k", value=b"v") for _ in range(5)]
            )
            async with rig.sidecar() as sc:
                with trio.fail_after(60):
                    while (
                        sum(
                            len(ss.spans)
                            for r in received
                            for rs in r.resource_spans
                            for ss in rs.scope_spans
                        )
                        < 5
                    ):
                        await trio.sleep(0.2)
                assert await sc.stop() == 0
        finally:
            del os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
            del os.environ["OTEL_BSP_SCHEDULE_DELAY"]
        nursery.cancel_scope.cancel()
    spans = [
        s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans
    ]
    services = {
        a.value.string_value
        for r in received
        for rs in r.resource_spans
        for a in rs.resource.attributes
        if a.key == "service.name"
    }
    assert services == {"otlp-test"}
    assert {s.name for s in spans} == {f"process {topic}"}
    offsets = sorted(
        a.value.int_value for s in spans for a in s.attributes if a.key == "messaging.kafka.offset"
    )
    assert offsets == [0, 1, 2, 3, 4]


async def test_metrics_count_what_happened(broker: Broker, unique: str, tmp_path: Path) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    app = RecordingApp(
        policy=lambda d: Response(422) if (d.value or b"").startswith(b"bad") else Response(200)
    )
    async with running_sidecar(
        broker, tmp_path, app, topic=topic, group=f"g-{unique}", path="/", start=False
    ) as rig:
        recs = [Rec(key=None, value=b"bad" if i < 7 else b"good") for i in range(20)]
        await trio.to_thread.run_sync(broker.produce, topic, recs)
        async with rig.sidecar() as sc:
            await _wait_thread(
                lambda: (
                    broker.topic_exists(f"dlq.{topic}")
                    and broker.count_records(f"dlq.{topic}") >= 7
                ),
                60,
                "7 DLQ records",
            )
            want = f'dlq_sidecar_records_delivered_total{{outcome="accept",topic="{topic}"}} 13.0'
            text = ""
            with trio.move_on_after(60):
                while want not in text:
                    code, text = await sc.get("/metrics")
                    assert code == 200
                    await trio.sleep(0.2)
            assert want in text, [ln for ln in text.splitlines() if "delivered" in ln]
            assert await sc.stop() == 0
    lines = prometheus_values(text)
    assert lines[f'dlq_sidecar_records_delivered_total{{outcome="reject",topic="{topic}"}}'] == 7
    assert lines['dlq_sidecar_records_archived_total{reason="rejected"}'] == 7
    assert lines["dlq_sidecar_dlq_written_total"] == 7
    assert lines["dlq_sidecar_attempts_total"] == 20
    assert lines["dlq_sidecar_app_request_duration_seconds_count"] == 20
    assert lines["dlq_sidecar_dlq_write_duration_seconds_count"] == 7
    assert lines["dlq_sidecar_in_flight_records"] == 0
