"""The lag the autoscaler and the lag alert read, against a real sidecar holding a backlog behind a slow app.

A real broker, a real HTTP app that answers nothing until the test lets it, one sidecar (consumer engine). The
sidecar fetches the whole backlog into its buffer and hands `app.max.in.flight` records to the app, so the
consumer's position reaches the high watermark while nothing is finished. `/metrics` is scraped:
`dlq_sidecar_committed_lag_records` (high watermark minus the committed offset: what KEDA's Prometheus query,
DlqSidecarLagGrowing and the dashboard read; what KEDA's Kafka scaler computes from the broker) counts every held
record, and matches the group's committed offset on the broker; `dlq_sidecar_commit_lag_records` (high watermark
minus the position) says 0. Once the app answers, the committed lag drains to 0.

Imports: trio, the sidecar's Response, the test harness and the Prometheus text reader.
"""

from __future__ import annotations

from pathlib import Path

import trio

from sidecar.http.server import Response
from tests.harness import FAST, Delivery, RecordingApp, running_sidecar, wait_until
from tests.kafkatools import Broker, Rec
from tests.promtext import prometheus_values

BACKLOG = 300
IN_FLIGHT = 4


class HeldApp:
    """Takes every delivery and answers only once `release` is set."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.recording = RecordingApp(self.answer)

    async def answer(self, _d: Delivery) -> Response:
        await self.release.wait()
        return Response(200)


def lags(text: str, topic: str) -> tuple[float | None, float | None]:
    """(committed lag, position lag) of partition 0 from `/metrics` text (None: no sample yet)."""
    values = prometheus_values(text)
    where = f'{{partition="0",topic="{topic}"}}'
    return (
        values.get(f"dlq_sidecar_committed_lag_records{where}"),
        values.get(f"dlq_sidecar_commit_lag_records{where}"),
    )


async def test_committed_lag_counts_the_records_held_behind_a_slow_app(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    app = HeldApp()
    async with running_sidecar(
        broker,
        tmp_path,
        app.recording,
        unique=unique,
        extra=FAST,
        app_extra={"max.in.flight": IN_FLIGHT},
        wait="assigned",
    ) as rig:
        await rig.produce([Rec(key=None, value=f"r{i}".encode()) for i in range(BACKLOG)])
        await wait_until(
            lambda: app.recording.concurrency >= IN_FLIGHT, 60, "the app holding its deliveries"
        )
        seen: tuple[float | None, float | None] = (None, None)
        with trio.move_on_after(60):
            while True:
                code, text = await rig.sc.get("/metrics")
                assert code == 200 and isinstance(text, str)
                seen = lags(text, rig.topic)
                # The watermarks are read each second: wait for the read after the whole backlog.
                if seen == (BACKLOG, 0):
                    break
                await trio.sleep(0.2)
        committed, position = seen
        assert committed == BACKLOG, f"committed-offset lag {committed}, position lag {position}"
        assert position == 0
        status = await rig.sc.wait_status(lambda st: bool(st["partitions"]), 10, "a partition")
        [part] = status["partitions"]
        assert part["committed_lag"] == BACKLOG
        assert part["in_flight"] == IN_FLIGHT and part["buffered"] >= BACKLOG - IN_FLIGHT  # held
        # The broker's view, which KEDA's Kafka scaler reads: the same lag.
        committed_offsets = await trio.to_thread.run_sync(
            rig.broker.committed, rig.group, rig.topic, [0]
        )
        assert BACKLOG - max(0, committed_offsets[0][0]) == BACKLOG

        app.release.set()
        with trio.move_on_after(120):
            while True:
                _code, text = await rig.sc.get("/metrics")
                seen = lags(text, rig.topic)
                if seen[0] == 0:
                    break
                await trio.sleep(0.2)
        assert seen[0] == 0, f"the committed lag did not drain: {seen}"
        assert len(app.recording.deliveries) >= BACKLOG
