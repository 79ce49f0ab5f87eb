"""The byte budget on the real broker: large records behind an app that holds them.

With `max.buffered.bytes` at its default (64 MiB), a backlog of ~190 MB of 16 KiB records behind an
app that answers nothing: every partition is paused once its share of the budget is full (well
before the record-count bound), resumes when the app drains it, every record is delivered, and the
sidecar's peak RSS (VmHWM of the subprocess) stays far below the backlog's size. Before the budget
the sidecar held every record of this backlog (4,000 per partition, under the 10,000 count bound):
no partition paused and its RSS passed 250 MB.
"""

from __future__ import annotations

from pathlib import Path

import trio

from sidecar.core.budget import DEFAULT_BUFFERED_BYTES, RECORD_OVERHEAD_BYTES, split_budget
from sidecar.http.server import Response
from tests.harness import Delivery, RecordingApp, free_port, running_app, sidecar, write_config
from tests.integration.test_daemon_answers import FAST, produce, wait_committed_at_end
from tests.kafkatools import Broker, Rec

PARTITIONS = 3
RECORDS = 12_000
VALUE_BYTES = 16 * 1024
# Generous: the interpreter and libraries (~45 MB), the 64 MiB budget, allocator slack. The same
# backlog without a byte budget took more than 250 MB.
PEAK_RSS_BOUND_MB = 170


def vm_hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_large_records_pause_at_the_share_resume_and_keep_rss_bounded(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = await trio.to_thread.run_sync(
        lambda: broker.create_topic(f"src-{unique}", partitions=PARTITIONS)
    )
    group = f"g-{unique}"
    value = b"v" * VALUE_BYTES
    await produce(
        broker,
        topic,
        [Rec(key=f"k{i}".encode(), value=value, partition=i % PARTITIONS) for i in range(RECORDS)],
    )
    release = trio.Event()

    async def hold(_d: Delivery) -> Response:
        await release.wait()  # the slow app: nothing is answered until the test says so
        return Response(200)

    app = RecordingApp(policy=hold)
    port = free_port()
    share = split_budget(DEFAULT_BUFFERED_BYTES, {}).share_bytes(PARTITIONS)
    per_record = RECORD_OVERHEAD_BYTES + 2 * (VALUE_BYTES + 8)  # key "k<n>": at most 6 bytes
    async with running_app(app, ("tcp", "127.0.0.1", port)):
        config = write_config(
            tmp_path / "sidecar.yaml",
            bootstrap=broker.bootstrap,
            group=group,
            topics=[topic],
            app_url=f"http://127.0.0.1:{port}/records",
            # The app holds its records as long as the test needs: no attempt times out meanwhile.
            app_extra={"timeout.ms": 300_000},
            extra={**FAST, "ordering": "none", "share.record.lock.duration.ms": 600_000},
        )
        async with sidecar(config) as sc:
            # Every partition paused by its share of the bytes, not by the record count.
            with trio.move_on_after(120):
                while True:
                    parts = (await sc.status())["partitions"]
                    if len(parts) == PARTITIONS and all(p["paused"] for p in parts):
                        break
                    await trio.sleep(0.2)
            assert len(parts) == PARTITIONS and all(p["paused"] for p in parts), (
                parts,
                sc.log_text()[-2000:],
            )
            for p in parts:
                assert p["buffered_bytes"] >= share, p
                assert p["buffered"] < 10_000, p  # not the count bound
                # Overshoot: at most what one consume batch brought (librdkafka's queue is a
                # quarter of the budget, one fetch an eighth).
                assert p["buffered_bytes"] <= share + DEFAULT_BUFFERED_BYTES // 2, p
                assert p["buffered"] * per_record >= share, p
            held = sum(p["buffered"] for p in parts)
            assert held < RECORDS // 2, held  # most of the backlog is still in Kafka

            release.set()
            # Resumed: every record delivered and committed.
            await wait_committed_at_end(broker, group, topic, PARTITIONS, timeout_s=180)
            assert {(d.partition, d.offset) for d in app.deliveries} >= {
                (p, o) for p in range(PARTITIONS) for o in range(RECORDS // PARTITIONS)
            }
            final = (await sc.status())["partitions"]
            assert not any(p["paused"] for p in final), final
            assert all(p["buffered_bytes"] == 0 for p in final), final
            peak = vm_hwm_mb(sc.proc.pid)
    assert peak < PEAK_RSS_BOUND_MB, f"peak RSS {peak:.0f} MB"
