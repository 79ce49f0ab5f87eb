"""The sidecar killed (SIGKILL) five times at random points while records with 5% poison flow."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import trio

from tests.faults.workload import assert_clean, env_seed, open_run, plan_records
from tests.harness import sidecar


async def test_sidecar_killed_five_times_transactional(bootstrap: str, tmp_path: Path) -> None:
    seed = env_seed(101)
    rng = random.Random(seed)
    async with open_run(
        tmp_path, bootstrap=bootstrap, name="kill", transactional=True, app_delay_s=0.03
    ) as run:
        n = await run.produce(plan_records(10_000, seed=seed, poison_ratio=0.05))
        cfg = run.config()
        for _ in range(5):
            async with sidecar(cfg) as sc:
                await sc.wait_assigned(1)
                await trio.sleep(rng.uniform(1.0, 4.0))
                sc.proc.send_signal(signal.SIGKILL)
                run.fault("sidecar_kill", f"pid {sc.proc.pid} after {run.app.seen} deliveries")
                assert await sc.wait_exit(30) == -signal.SIGKILL
            await run.check_midway()
        seen_before_last = run.app.seen
        async with sidecar(cfg) as sc:
            await run.wait_done(240)
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"5 kills, transactional ({run.elapsed_s():.0f}s)")
    assert n == 10_000
    assert report.crashes == 5
    assert 0 < seen_before_last < n  # the kills landed while records were flowing
    assert report.dlq_duplicates == 0
