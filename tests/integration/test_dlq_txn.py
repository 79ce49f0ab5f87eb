"""Transactional DLQ mode: DLQ records and the offset commit in one transaction, so kill -9 cannot duplicate them."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import trio

from sidecar.httpserver import Response
from tests.harness import RecordingApp, free_port, running_app, sidecar, write_config
from tests.kafkatools import Broker, Rec


async def _wait_thread(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    with trio.move_on_after(timeout_s):
        while not await trio.to_thread.run_sync(predicate):
            await trio.sleep(0.2)
        return
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


async def test_kill_9_repeatedly_gives_no_duplicate_and_no_lost_dlq_record(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=2)
    group = f"g-{unique}"
    dlq = f"dlq.{topic}"
    n = 600
    poison = {i for i in range(n) if i % 3 == 0}

    async def slow_reject(d):  # type: ignore[no-untyped-def]
        await trio.sleep(0.005)  # keep the stream flowing while the kills land
        return Response(400) if (d.value or b"").startswith(b"poison") else Response(200)

    app = RecordingApp(policy=slow_reject)
    port = free_port()
    rng = random.Random(7)
    async with running_app(app, ("tcp", "127.0.0.1", port)):
        cfg = write_config(
            tmp_path / "sidecar.yaml",
            bootstrap=broker.bootstrap,
            group=group,
            topics=[topic],
            app_url=f"http://127.0.0.1:{port}/",
            extra={
                "errors.deadletterqueue.transactional.enable": True,
                "errors.deadletterqueue.copy.record.enable": True,
            },
            app_extra={"max.in.flight": 4},
            kafka_extra={
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
                # Static membership: a restarted sidecar takes over its dead incarnation at once.
                "group.instance.id": f"sidecar-{unique}",
            },
        )
        recs = [
            Rec(
                key=f"k{i % 13}".encode(),
                value=(b"poison:" if i in poison else b"ok:") + str(i).encode(),
            )
            for i in range(n)
        ]
        await trio.to_thread.run_sync(broker.produce, topic, recs)
        kills = 0
        for _ in range(4):
            async with sidecar(cfg) as sc:
                # Let it make progress (a rebalance after a kill takes up to the session timeout).
                await trio.sleep(rng.uniform(5.0, 8.0))
                sc.proc.send_signal(signal.SIGKILL)
                assert await sc.wait_exit(30) == -signal.SIGKILL
                kills += 1
        async with sidecar(cfg) as sc:
            ends = broker.end_offsets(topic, [0, 1])
            await _wait_thread(
                lambda: all(
                    broker.committed(group, topic, [0, 1])[p][0] == ends[p] for p in (0, 1)
                ),
                180,
                "every record done",
            )
            assert await sc.stop() == 0
    assert kills == 4
    got = broker.read_topic(
        dlq, len(poison), timeout_s=60
    )  # read_committed: aborted writes are invisible
    values = [r.value for r in got]
    assert len(values) == len(set(values)), "duplicate DLQ records"
    assert {int((v or b"").split(b":")[1]) for v in values} == poison, "lost or extra DLQ records"
    # Every ok record was accepted at least once (at-least-once to the app).
    accepted = {
        int((d.value or b"").split(b":")[1])
        for d in app.deliveries
        if (d.value or b"").startswith(b"ok")
    }
    assert accepted == set(range(n)) - poison
