"""Faults around the sidecar: the app down mid-stream, a second sidecar joining and leaving, the DLQ unavailable."""

from __future__ import annotations

import signal
from pathlib import Path

import trio
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from tests.faults.workload import Run, assert_clean, env_seed, open_run, plan_records
from tests.harness import sidecar, wait_until
from tests.kafkatools import Broker


async def test_app_down_for_10_s_counts_and_archives_nothing(
    bootstrap: str, tmp_path: Path
) -> None:
    seed = env_seed(202)
    async with open_run(tmp_path, bootstrap=bootstrap, name="appdown", app_delay_s=0.01) as run:
        await run.produce(plan_records(3000, seed=seed, poison_ratio=0.05))
        async with sidecar(run.config()) as sc:
            await wait_until(lambda: run.app.seen >= 500, 60, "500 deliveries")
            run.server.down()
            run.fault("app_down")
            # In-flight requests cut by the app's going away are attempts (sent, then failed); give
            # them a moment to settle, then nothing may be counted or archived while it stays down.
            await trio.sleep(1.5)
            before = (await sc.status())["counters"]
            await trio.sleep(9.0)
            during = await sc.status()
            code, _ = await sc.get("/readyz")
            after = during["counters"]
            assert code == 503
            assert not during["app_reachable"]
            assert after["attempts"] == before["attempts"], (before, after)
            assert after["archived"] == before["archived"], (before, after)
            assert after["dlq_written"] == before["dlq_written"]
            await run.check_midway()
            await run.server.up()
            run.fault("app_up")
            await run.wait_done(120)
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"app down 10 s ({run.elapsed_s():.0f}s)")
    # Refused connections are not attempts: no record needed more than the one cut attempt plus one.
    assert report.max_delivery_count <= 2
    assert report.by_kind("unexpected_dlq") == []


async def test_second_sidecar_joins_and_leaves(bootstrap: str, tmp_path: Path) -> None:
    seed = env_seed(505)
    async with open_run(
        tmp_path, bootstrap=bootstrap, name="scale", partitions=6, app_delay_s=0.01
    ) as run:
        await run.produce(plan_records(4000, seed=seed, poison_ratio=0.05))
        cfg_a, cfg_b = run.config(), run.config()
        async with sidecar(cfg_a) as a:
            await a.wait_assigned(6)
            await wait_until(lambda: run.app.seen >= 400, 60, "400 deliveries")
            async with sidecar(cfg_b) as b:
                run.fault("sidecar_join")
                await b.wait_assigned(1, timeout_s=60)
                seen = run.app.seen
                await wait_until(lambda: run.app.seen >= seen + 500, 60, "progress with two")
                await run.check_midway()
                assert await b.stop(signal.SIGTERM) == 0
                run.fault("sidecar_leave")
            await a.wait_assigned(6, timeout_s=60)
            await run.wait_done(120)
            st = await a.status()
            assert await a.stop() == 0
        report = await run.check()
    assert_clean(report, f"second sidecar joins and leaves ({run.elapsed_s():.0f}s)")
    assert st["counters"]["rebalances"] >= 2
    # Graceful hand-overs commit first: no record is delivered twice.
    assert report.redelivered_after_accept == 0
    assert set(report.distribution) == {1}


def _set_min_isr(bootstrap: str, topic: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("min.insync.replicas", value, incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)


async def _dlq_outage(run: Run, outage_s: float) -> None:
    """The DLQ topic refuses acks=all writes (min.insync.replicas above its replica count), then heals."""
    broker = Broker(run.direct)
    await trio.to_thread.run_sync(_set_min_isr, run.direct, run.dlq_topic, "2")
    run.fault("dlq_unavailable")
    dlq_before = await trio.to_thread.run_sync(broker.count_records, run.dlq_topic)
    rejects_before = run.app.answers.get("reject", 0)
    await trio.sleep(outage_s)
    await run.check_midway()
    # The outage bit: records were rejected meanwhile and none of them reached the DLQ yet.
    assert run.app.answers.get("reject", 0) > rejects_before
    assert await trio.to_thread.run_sync(broker.count_records, run.dlq_topic) == dlq_before
    await trio.to_thread.run_sync(_set_min_isr, run.direct, run.dlq_topic, "1")
    run.fault("dlq_restored")


async def test_dlq_unavailable_then_restored(bootstrap: str, tmp_path: Path) -> None:
    seed = env_seed(707)
    async with open_run(tmp_path, bootstrap=bootstrap, name="dlqdown", app_delay_s=0.01) as run:
        await run.produce(plan_records(3000, seed=seed, poison_ratio=0.05))
        async with sidecar(run.config()) as sc:
            await wait_until(lambda: run.app.seen >= 300, 60, "300 deliveries")
            await _dlq_outage(run, 10.0)
            mid = await sc.status()
            await run.wait_done(120)
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"DLQ unavailable 10 s ({run.elapsed_s():.0f}s)")
    assert mid["failure"] is None
