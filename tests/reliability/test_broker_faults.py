"""Broker and network faults on a private broker behind the fault proxy: SIGKILL and restart on the same log
dir, SIGSTOP for 10 s, and a blackholed connection for 10 s."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.faults.broker import PrivateBroker
from tests.faults.proxy import BLACKHOLE, PASS, FaultProxy
from tests.faults.workload import Run, assert_clean, env_seed, open_run, plan_records
from tests.harness import sidecar, wait_until

N = 2000
MODES = pytest.mark.parametrize(
    "transactional", [False, True], ids=["at-least-once", "transactional"]
)


async def _flowing(run: Run, seed: int) -> None:
    await run.produce(plan_records(N, seed=seed, poison_ratio=0.05))


@MODES
async def test_broker_paused_10_s(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy], tmp_path: Path, transactional: bool
) -> None:
    broker, _proxy = kafka_behind_proxy
    async with open_run(
        tmp_path,
        bootstrap=broker.external,
        direct=broker.direct,
        name="pause",
        app_delay_s=0.01,
        transactional=transactional,
    ) as run:
        await _flowing(run, env_seed(404))
        async with sidecar(run.config()) as sc:
            await wait_until(lambda: run.app.seen >= 300, 60, "300 deliveries")
            broker.pause()
            run.fault("broker_sigstop")
            try:
                await trio.sleep(10.0)
            finally:
                broker.resume()
            run.fault("broker_sigcont")
            await run.wait_done(120)
            assert sc.proc.returncode is None, sc.log_text()[-3000:]
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"broker SIGSTOP 10 s ({run.elapsed_s():.0f}s)")


@MODES
async def test_blackholed_broker_connection_10_s(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy], tmp_path: Path, transactional: bool
) -> None:
    broker, proxy = kafka_behind_proxy
    async with open_run(
        tmp_path,
        bootstrap=broker.external,
        direct=broker.direct,
        name="blackhole",
        app_delay_s=0.01,
        transactional=transactional,
    ) as run:
        await _flowing(run, env_seed(606))
        async with sidecar(run.config()) as sc:
            await wait_until(lambda: run.app.seen >= 300, 60, "300 deliveries")
            await trio.to_thread.run_sync(proxy.set_mode, BLACKHOLE)
            run.fault("blackhole")
            await trio.sleep(10.0)
            await run.check_midway()
            await trio.to_thread.run_sync(proxy.set_mode, PASS)
            run.fault("heal")
            await run.wait_done(120)
            assert sc.proc.returncode is None, sc.log_text()[-3000:]
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"blackholed broker connection 10 s ({run.elapsed_s():.0f}s)")


@MODES
async def test_broker_killed_and_restarted_on_same_log_dir(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy], tmp_path: Path, transactional: bool
) -> None:
    broker, _proxy = kafka_behind_proxy
    async with open_run(
        tmp_path,
        bootstrap=broker.external,
        direct=broker.direct,
        name="bkill",
        app_delay_s=0.01,
        transactional=transactional,
    ) as run:
        await _flowing(run, env_seed(303))
        async with sidecar(run.config()) as sc:
            await wait_until(lambda: run.app.seen >= 300, 60, "300 deliveries")
            run.fault("broker_sigkill")
            took = await trio.to_thread.run_sync(broker.restart)
            run.fault("broker_restarted", f"{took:.1f}s")
            await run.wait_done(180)
            assert sc.proc.returncode is None, sc.log_text()[-3000:]
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"broker SIGKILL + restart ({run.elapsed_s():.0f}s, restart {took:.0f}s)")
