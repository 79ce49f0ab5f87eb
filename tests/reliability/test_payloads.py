"""Oversized and binary records: byte-exact to the app and into the DLQ, too-large DLQ copies headers-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.workload import assert_clean, env_seed, open_run, plan_binary_records
from tests.harness import sidecar


@pytest.mark.parametrize("transactional", [False, True], ids=["at-least-once", "transactional"])
async def test_oversized_and_binary_records(
    bootstrap: str, tmp_path: Path, transactional: bool
) -> None:
    seed = env_seed(808)
    n = 120
    async with open_run(
        tmp_path,
        bootstrap=bootstrap,
        name="payload",
        transactional=transactional,
        # Smaller than the biggest records: their DLQ copies must fall back to headers only.
        dlq_config={"max.message.bytes": "100000"},
    ) as run:
        plans = plan_binary_records(n, seed=seed, big_every=10, big_bytes=300_000)
        await run.produce(plans)
        async with sidecar(run.config(app_extra={"max.in.flight": 8})) as sc:
            await run.wait_done(120)
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(
        report,
        f"binary and oversized records, {'txn' if transactional else 'alo'} ({run.elapsed_s():.0f}s)",
    )
    poison = [p for p in plans if p.kind == "poison"]
    assert report.dead_lettered == len(poison)
    assert report.accepted == n - len(poison)
    # The app journals a digest of every body it got: any byte changed would be an app_payload_mismatch.
    assert report.by_kind("app_payload_mismatch") == []
    big_poison = [p for p in poison if len(p.value) > 100_000]
    assert big_poison
    assert report.dlq_copies_dropped == len(big_poison)
