"""A DLQ write that fails for good, seen in the metrics of the process that restarts after it.

A real broker, a real app, the sidecar as a subprocess with `metrics.exit.record.path`: the DLQ topic is deleted
(auto-create off), a rejected record's DLQ write fails, the sidecar exits 1. The next process (the DLQ topic back)
starts `dlq_sidecar_dlq_failed_total` at 0, as the alerts used to see it, but exports the exit the record kept:
`dlq_sidecar_fatal_exits_total{reason="dlq_write_failed"}` 1, the time of that exit, and one restart.

Imports: the standard library, trio, the sidecar's Response, the test harness and the Prometheus text reader.
"""

from __future__ import annotations

import time
from pathlib import Path

import trio

from sidecar.http.server import Response
from tests.harness import RecordingApp, running_sidecar, wait_until, wait_until_thread
from tests.kafkatools import Broker, Rec
from tests.promtext import prometheus_values


async def test_a_fatal_dlq_failure_shows_after_the_restart(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    dlq = await trio.to_thread.run_sync(lambda: broker.create_topic(f"dlq.{topic}"))
    record = tmp_path / "exit-record"
    app = RecordingApp(policy=lambda d: Response(200) if d.value == b"ok" else Response(400))
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        path="/",
        extra={
            "errors.deadletterqueue.auto.create.enable": False,
            "metrics": {"exit.record.path": str(record)},
        },
        start=False,
    ) as rig:
        async with rig.sidecar() as sc:
            # Past its start-up check of the DLQ topic (deleting it sooner is a start-up failure).
            await rig.produce([Rec(key=None, value=b"ok")])
            await wait_until(lambda: len(app.deliveries) >= 1, 60, "the first record delivered")
            code, text = await sc.get("/metrics")
            assert code == 200 and "dlq_sidecar_restarts_total 0.0" in text
            await trio.to_thread.run_sync(broker.delete_topic, dlq)
            await wait_until_thread(lambda: not broker.topic_exists(dlq), 30, "DLQ topic gone")
            before = time.time()
            await rig.produce([Rec(key=None, value=b"poison")])
            assert await sc.wait_exit(120) == 1
        await trio.to_thread.run_sync(lambda: broker.create_topic(dlq))
        async with rig.sidecar() as sc:
            code, text = await sc.get("/metrics")
            assert code == 200
            values = prometheus_values(text)
            assert values["dlq_sidecar_dlq_failed_total"] == 0  # what the old alert read
            assert values["dlq_sidecar_restarts_total"] == 1
            assert values['dlq_sidecar_fatal_exits_total{reason="dlq_write_failed"}'] == 1
            assert values['dlq_sidecar_fatal_exits_total{reason="other"}'] == 0
            at = values['dlq_sidecar_last_fatal_exit_timestamp_seconds{reason="dlq_write_failed"}']
            assert before <= at <= time.time()
            assert await sc.stop() == 0
