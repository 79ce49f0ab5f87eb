"""A group coordinator that never answers (the fault proxy's blackhole): commits and shutdown stay bounded.

librdkafka defers a commit while it has no coordinator and retries it without a time limit, and closing the
consumer retries its final commit the same way (librdkafka #3740). A caller that waited for either would hold
everything behind it: before the fix the poll thread sat in a synchronous commit, so no record was handed out
and a SIGTERM never finished.
"""

from __future__ import annotations

import time
from pathlib import Path

import trio

from sidecar.kafka.source import CommitTimeout, KafkaSource, OffsetToCommit
from tests.faults.broker import PrivateBroker
from tests.faults.proxy import BLACKHOLE, PASS, FaultProxy
from tests.faults.workload import assert_clean, open_run, plan_records
from tests.harness import RecordingListener, sidecar, wait_until
from tests.kafkatools import Broker, Rec


async def test_a_commit_nobody_answers_times_out_and_holds_nothing(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy],
) -> None:
    broker, proxy = kafka_behind_proxy
    direct = Broker(broker.direct)
    topic, group = f"stuck-{time.monotonic_ns()}", f"g-stuck-{time.monotonic_ns()}"
    await trio.to_thread.run_sync(direct.create_topic, topic, 1)
    await trio.to_thread.run_sync(
        direct.produce, topic, [Rec(key=None, value=b"x", partition=0) for _ in range(5)]
    )
    listener = RecordingListener(revoke_commit=(1, "final"))
    source = KafkaSource(
        {"bootstrap.servers": broker.external, "group.id": group}, [topic], listener
    )
    source.commit_timeout_s = 3.0
    source.close_timeout_s = 3.0
    async with trio.open_nursery() as nursery:
        source.start()
        nursery.start_soon(source.run)
        await wait_until(lambda: len(listener.messages) >= 5, 60, "the records")
        await source.commit([OffsetToCommit(topic, 0, 2, "before")])

        await trio.to_thread.run_sync(proxy.set_mode, BLACKHOLE)
        try:
            t0 = time.monotonic()
            async with trio.open_nursery() as inner:
                failures: list[BaseException] = []

                async def stuck_commit() -> None:
                    try:
                        await source.commit([OffsetToCommit(topic, 0, 3, "during")])
                    except CommitTimeout as exc:
                        failures.append(exc)

                inner.start_soon(stuck_commit)
                await trio.sleep(0.5)
                # Meanwhile the poll thread still runs other consumer calls: well before the stuck
                # commit's 3 s timeout (at ~2.5 s from here) would free a blocked one.
                t1 = time.monotonic()
                await source._call(lambda c: c.assignment())
                assert time.monotonic() - t1 < 2.0
            took = time.monotonic() - t0
            assert len(failures) == 1, "the commit did not time out"
            assert 2.5 < took < 10.0, took  # the 3 s timeout; librdkafka alone would retry for ever
        finally:
            await trio.to_thread.run_sync(proxy.set_mode, PASS)

        # Healed: commits land again (the given-up one may land first; this one lands last).
        await wait_until_commit(source, OffsetToCommit(topic, 0, 4, "after"))
        assert await trio.to_thread.run_sync(direct.committed, group, topic, [0]) == {
            0: (4, "after")
        }

        # A coordinator gone at shutdown: closing gives up after its timeout instead of hanging.
        await trio.to_thread.run_sync(proxy.set_mode, BLACKHOLE)
        try:
            source.stop_polling()
            with trio.fail_after(10):
                await source.wait_stopped()
            t0 = time.monotonic()
            await source.close()
            assert time.monotonic() - t0 < 10.0  # the 3 s close timeout, not librdkafka's for ever
        finally:
            await trio.to_thread.run_sync(proxy.set_mode, PASS)
        nursery.cancel_scope.cancel()


async def wait_until_commit(source: KafkaSource, offset: OffsetToCommit) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await source.commit([offset])
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.5)


async def test_sigterm_with_the_broker_unreachable_exits_in_bounded_time(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy], tmp_path: Path
) -> None:
    broker, proxy = kafka_behind_proxy
    async with open_run(
        tmp_path,
        bootstrap=broker.external,
        direct=broker.direct,
        name="stuckstop",
        app_delay_s=0.01,
    ) as run:
        await run.produce(plan_records(400, seed=11, poison_ratio=0.05))
        first = run.config(
            extra={"shutdown.drain.timeout.ms": 2000, "commit.stall.timeout.ms": 1000}
        )
        async with sidecar(first) as sc:
            assert (await sc.get("/healthz"))[0] == 200
            await wait_until(lambda: run.app.seen >= 100, 60, "100 deliveries")
            await trio.to_thread.run_sync(proxy.set_mode, BLACKHOLE)
            run.fault("blackhole")
            try:
                # A commit nobody answers fails after its timeout; the status says so.
                failing: list[float] = []

                async def commits_failing() -> bool:
                    st = await sc.status()
                    if st["commits_failing_s"] is not None:
                        failing.append(st["commits_failing_s"])
                    return bool(failing)

                deadline = trio.current_time() + 40
                while not await commits_failing():
                    assert trio.current_time() < deadline, "no commit failed in 40 s"
                    await trio.sleep(0.5)
                # Failing for longer than commit.stall.timeout.ms (1 s): the liveness check says so.
                with trio.move_on_after(30):
                    while (health_reply := await sc.get("/healthz"))[0] != 503:
                        await trio.sleep(0.2)
                code, health = health_reply
                assert code == 503 and health["status"] == "stalled", health
                t0 = time.monotonic()
                # drain (2 s) + final commit (15 s) + close (10 s), with room for a slow machine
                code = await sc.stop(timeout_s=45)
                took = time.monotonic() - t0
            finally:
                await trio.to_thread.run_sync(proxy.set_mode, PASS)
                run.fault("heal")
            assert code == 0, sc.log_text()[-3000:]
            assert took < 40, took
        # A second sidecar finishes the job from what the first one managed to commit.
        async with sidecar(run.config()) as sc:
            await run.wait_done(120)
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"SIGTERM with the broker blackholed (stopped in {took:.1f}s)")
