"""Broker and network faults on a private broker behind the fault proxy: SIGKILL and restart on the same log
dir, SIGSTOP for 15 s, a blackholed connection for 10 s, and the DLQ unavailable for 10 s (only the
sidecar's producer connections blackholed)."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import trio

from tests.faults.broker import PrivateBroker
from tests.faults.proxy import BLACKHOLE, BLACKHOLE_PRODUCE, PASS, FaultProxy
from tests.faults.workload import Run, assert_clean, env_seed, open_run, plan_records
from tests.harness import Sidecar, sidecar, wait_until
from tests.kafkatools import Broker

N = 2000
MODES = pytest.mark.parametrize(
    "transactional", [False, True], ids=["at-least-once", "transactional"]
)
TXN_OFFSETS_PENDING = pytest.mark.xfail(
    strict=False,  # passed in some runs (XPASS in CI), failed in others
    reason=(
        "open bug, transactional mode: after a broker pause or blackhole, the sidecar finishes every "
        "record (its /v1/status shows the end offsets committed, lag 0), but the test's committed() "
        "keeps timing out for minutes, as if a transactional offset commit of the group stayed pending. "
        "(The earlier duplicate-after-lost-partition bug is fixed: Engine.txn_loop skips records of "
        "partitions it no longer owns.)"
    ),
)
TXN_MODES = pytest.mark.parametrize(
    "transactional",
    [False, pytest.param(True, marks=TXN_OFFSETS_PENDING)],
    ids=["at-least-once", "transactional"],
)


async def _flowing(run: Run, seed: int) -> None:
    await run.produce(plan_records(N, seed=seed, poison_ratio=0.05))


@TXN_MODES
async def test_broker_paused_15_s(
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
                await trio.sleep(15.0)
            finally:
                broker.resume()
            run.fault("broker_sigcont")
            await run.wait_done(120)
            assert sc.proc.returncode is None, sc.log_text()[-3000:]
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"broker SIGSTOP 15 s ({run.elapsed_s():.0f}s)")


@TXN_MODES
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


async def _dump_stuck(run: Run, sc: Sidecar) -> None:
    """Evidence for a stuck sidecar: its status and every thread's stack, next to the journal."""
    with contextlib.suppress(Exception):
        (run.workdir / "stuck-status.json").write_text(json.dumps(await sc.status(), indent=2))
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if Path(spy).exists():
        res = await trio.run_process(
            [spy, "dump", "--pid", str(sc.proc.pid)], capture_stdout=True, check=False
        )
        (run.workdir / "stuck-stacks.txt").write_bytes(res.stdout)


STUCK_TXN_COMMIT = pytest.mark.xfail(
    strict=False,  # nondeterministic: seen in 3 of 4 runs before the deadline was added
    reason=(
        "librdkafka: after a broker SIGKILL+restart, send_offsets_to_transaction can overstay its own "
        "timeout for minutes. The sidecar no longer wedges (Engine._txn_once gives the commit 60 s, then "
        "stops with exit 1 and nothing committed past its records), but this test expects it to ride "
        "the restart out without exiting"
    ),
)


@pytest.mark.parametrize(
    "transactional",
    [False, pytest.param(True, marks=STUCK_TXN_COMMIT)],
    ids=["at-least-once", "transactional"],
)
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
            try:
                await run.wait_done(90)
            except AssertionError:
                await _dump_stuck(run, sc)
                sc.proc.kill()  # wedged: a SIGTERM would wait for the same lock
                raise
            assert sc.proc.returncode is None, sc.log_text()[-3000:]
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"broker SIGKILL + restart ({run.elapsed_s():.0f}s, restart {took:.0f}s)")


@MODES
async def test_dlq_unavailable_then_restored(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy], tmp_path: Path, transactional: bool
) -> None:
    broker, proxy = kafka_behind_proxy
    direct = Broker(broker.direct)
    async with open_run(
        tmp_path,
        bootstrap=broker.external,
        direct=broker.direct,
        name="dlqdown",
        app_delay_s=0.01,
        transactional=transactional,
    ) as run:
        await _flowing(run, env_seed(707))
        async with sidecar(run.config()) as sc:
            await wait_until(lambda: run.app.seen >= 300, 60, "300 deliveries")
            await trio.to_thread.run_sync(proxy.set_mode, BLACKHOLE_PRODUCE)
            run.fault("dlq_unavailable")
            dlq_before = await trio.to_thread.run_sync(direct.count_records, run.dlq_topic)
            rejects_before = run.app.answers.get("reject", 0)
            await trio.sleep(10.0)
            await run.check_midway()
            # The outage bit: nothing reached the DLQ; at-least-once, other keys kept flowing and more
            # records were rejected meanwhile. (Transactional mode stalls every partition instead: the
            # pending transaction holds the commit lock that the write-ahead commits need.)
            if not transactional:
                assert run.app.answers.get("reject", 0) > rejects_before
            assert await trio.to_thread.run_sync(direct.count_records, run.dlq_topic) == dlq_before
            await trio.to_thread.run_sync(proxy.set_mode, PASS)
            run.fault("dlq_restored")
            await run.wait_done(120)
            st = await sc.status()
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"DLQ unavailable 10 s ({run.elapsed_s():.0f}s)")
    assert st["failure"] is None
