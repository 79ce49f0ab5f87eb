"""Broker and network faults on a private broker behind the fault proxy: SIGKILL and restart on the same log
dir, SIGSTOP for 15 s, a blackholed connection for 10 s, and the DLQ unavailable for 10 s (only the
sidecar's producer connections blackholed)."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from tests.faults.broker import PrivateBroker
from tests.faults.proxy import BLACKHOLE, BLACKHOLE_PRODUCE, PASS, FaultProxy
from tests.faults.workload import Run, assert_clean, env_seed, open_run, plan_records
from tests.harness import Sidecar, sidecar, wait_until

Coord = tuple[str, int, int]

N = 2000
MODES = pytest.mark.parametrize(
    "transactional", [False, True], ids=["at-least-once", "transactional"]
)


async def _flowing(run: Run, seed: int) -> None:
    await run.produce(plan_records(N, seed=seed, poison_ratio=0.05))


def _copy_broker_logs(run: Run, broker: PrivateBroker) -> None:
    """The broker's own log and its group, transaction and DLQ logs next to the journal. Read them with
    kafka.tools.DumpLogSegments (--offsets-decoder, --transaction-log-decoder; --print-data-log shows a
    DLQ record's transaction markers, producer id and epoch)."""
    for log_dir in [
        *broker.data_dir.glob("__consumer_offsets-*"),
        *broker.data_dir.glob("__transaction_state-*"),
        *broker.data_dir.glob(f"{run.dlq_topic}-*"),
    ]:
        with contextlib.suppress(OSError):
            shutil.copytree(log_dir, run.workdir / "broker-logs" / log_dir.name, dirs_exist_ok=True)
    with contextlib.suppress(OSError):
        shutil.copy(broker.log_path, run.workdir / "broker-logs" / "server.log")


async def _check(run: Run, broker: PrivateBroker, what: str) -> None:
    report = await run.check()
    if not report.ok:
        _copy_broker_logs(run, broker)
    assert_clean(report, what)


async def _dump_stuck(run: Run, sc: Sidecar, broker: PrivateBroker) -> None:
    """Evidence for a stuck run, next to the journal: the sidecar's status, every thread's stack, and
    the broker's logs (a pending transactional offset commit shows in the group log)."""
    with contextlib.suppress(Exception):
        (run.workdir / "stuck-status.json").write_text(json.dumps(await sc.status(), indent=2))
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if Path(spy).exists():
        res = await trio.run_process(
            [spy, "dump", "--pid", str(sc.proc.pid)], capture_stdout=True, check=False
        )
        (run.workdir / "stuck-stacks.txt").write_bytes(res.stdout)
    _copy_broker_logs(run, broker)
    # Also into the test's report: CI keeps that, not the temporary directories.
    state = "running" if broker.proc and broker.proc.poll() is None else "exited"
    print(f"private broker {state}; its log's last lines:\n{broker.log_tail(80)}")
    print(f"sidecar log's last lines:\n{sc.log_text()[-6000:]}")


def _alive(sc: Sidecar) -> Callable[[], None]:
    """For `Run.wait_done`: fail at once when the sidecar exited (it must ride out every fault here)."""

    def check() -> None:
        if sc.proc.poll() is not None:
            raise AssertionError(
                f"the sidecar exited ({sc.proc.returncode}) during the run:\n{sc.log_text()[-3000:]}"
            )

    return check


async def _wait_done(run: Run, sc: Sidecar, broker: PrivateBroker, timeout_s: float) -> None:
    try:
        await run.wait_done(timeout_s, _alive(sc))
    except AssertionError:
        await _dump_stuck(run, sc, broker)
        raise


def _rejects_around(run: Run, fault: str) -> tuple[set[Coord], set[Coord]]:
    """Source coordinates the app rejected before the journal's `fault` line, and those it rejected only
    after it. The app journals an answer before the sidecar gets it, so a reject after the line was
    answered after the fault began (one answered just before the line counts as before)."""
    before: set[Coord] = set()
    after: set[Coord] = set()
    seen_fault = False
    text = run.journal.path.read_text(encoding="utf-8")
    for line in text[: text.rfind("\n") + 1].splitlines():  # whole lines only: the app still writes
        ev = json.loads(line)
        if ev["ev"] == "fault" and ev["kind"] == fault:
            seen_fault = True
        elif ev["ev"] == "delivery" and ev["answer"] == "reject":
            (after if seen_fault else before).add((ev["topic"], ev["partition"], ev["offset"]))
    assert seen_fault, f"no {fault} line in the journal"
    return before, after - before


@MODES
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
            await _wait_done(run, sc, broker, 120)
            assert sc.proc.returncode is None, sc.log_text()[-3000:]
            assert await sc.stop() == 0
        await _check(run, broker, f"broker SIGSTOP 15 s ({run.elapsed_s():.0f}s)")


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
            await _wait_done(run, sc, broker, 120)
            assert sc.proc.returncode is None, sc.log_text()[-3000:]
            assert await sc.stop() == 0
        await _check(run, broker, f"blackholed broker connection 10 s ({run.elapsed_s():.0f}s)")


# Kafka's transaction coordinator, restarted after a SIGKILL of the only broker, can load a transaction that
# was committing before the partitions have leaders again; it takes them for deleted partitions and skips
# their COMMIT markers (the KAFKA-20734 family: see tests/reliability/test_txn_markers.py for the ABORT case).
# The group's offsets then stay unstable (UNSTABLE_OFFSET_COMMIT) for good: no read_committed consumer (the
# sidecar's, the checker's) can read them, and the scenario cannot end, whatever the sidecar does.
_MARKERS_SKIPPED = "Couldn't find leader endpoint for partitions"
_ATTEMPTS = 3


def _broker_skipped_markers(broker: PrivateBroker, group: str, log_from: int) -> bool:
    """The broker's log since `log_from` shows the skip, for a transactional id of `group`'s sidecar."""
    text = broker.log_text()[log_from:]
    return any(
        _MARKERS_SKIPPED in line and f"transaction markers for dlq-sidecar.{group}." in line
        for line in text.splitlines()
    )


async def _kill_and_restart_once(
    broker: PrivateBroker, tmp_path: Path, transactional: bool, attempt: int
) -> bool:
    """One run of the scenario; False (nothing asserted) when the broker skipped the markers."""
    async with open_run(
        tmp_path / f"attempt-{attempt}",
        bootstrap=broker.external,
        direct=broker.direct,
        name="bkill",
        app_delay_s=0.01,
        transactional=transactional,
    ) as run:
        await _flowing(run, env_seed(303))
        async with sidecar(run.config()) as sc:
            await wait_until(lambda: run.app.seen >= 300, 60, "300 deliveries")
            log_from = len(broker.log_text())
            run.fault("broker_sigkill")
            took = await trio.to_thread.run_sync(broker.restart)
            run.fault("broker_restarted", f"{took:.1f}s")
            try:
                await run.wait_done(180, _alive(sc))
            except AssertionError:
                if transactional and _broker_skipped_markers(broker, run.group, log_from):
                    print(
                        f"attempt {attempt}: the broker skipped the COMMIT markers of a DLQ transaction "
                        "at its restart (the group's offsets stay unstable); the scenario starts over"
                    )
                    sc.proc.kill()
                    return False
                await _dump_stuck(run, sc, broker)
                sc.proc.kill()  # wedged: a SIGTERM would wait for the same lock
                raise
            assert sc.proc.returncode is None, sc.log_text()[-3000:]
            assert await sc.stop() == 0
        await _check(
            run, broker, f"broker SIGKILL + restart ({run.elapsed_s():.0f}s, restart {took:.0f}s)"
        )
    return True


@MODES
async def test_broker_killed_and_restarted_on_same_log_dir(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy], tmp_path: Path, transactional: bool
) -> None:
    """SIGKILL of the broker mid-stream and a restart on the same log dir: nothing lost, nothing
    dead-lettered twice. In transactional mode the broker itself can leave the group's offsets unstable
    for good (above); only then, and only on that evidence in its log, the scenario starts over on a
    fresh topic and group (at most three runs in all)."""
    broker, _proxy = kafka_behind_proxy
    for attempt in range(1, _ATTEMPTS + 1):
        if await _kill_and_restart_once(broker, tmp_path, transactional, attempt):
            return
    raise AssertionError(
        f"the broker skipped the COMMIT markers of a DLQ transaction at {_ATTEMPTS} restarts in a row"
    )


@MODES
async def test_dlq_unavailable_then_restored(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy], tmp_path: Path, transactional: bool
) -> None:
    broker, proxy = kafka_behind_proxy
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
            rejects_at_fault = run.app.answers.get("reject", 0)
            run.fault("dlq_unavailable")
            outage_began = trio.current_time()
            # The fault is in effect once the sidecar's DLQ producer tried to send and is held.
            await wait_until(
                lambda: proxy.held_producer_chunks > 0, 60, "a DLQ producer request held back"
            )
            dlq_before = await run.dlq_by_source()
            if not transactional:
                # At-least-once, other keys keep flowing: more records are rejected during the outage.
                # (Transactional mode stalls every partition instead: the pending transaction holds
                # the commit lock that the write-ahead commits need.)
                await wait_until(
                    lambda: run.app.answers.get("reject", 0) >= rejects_at_fault + 3,
                    90,
                    "3 rejects during the DLQ outage",
                )
            # The outage lasts 10 s from its start, however long the waits above took.
            await trio.sleep_until(outage_began + 10.0)
            await run.check_midway()
            # The outage bit: no record rejected during it reached the DLQ (read_committed), and
            # the only DLQ records added since its start are writes that were under way when it began.
            dlq_after = await run.dlq_by_source()
            rejected_before, rejected_during = _rejects_around(run, "dlq_unavailable")
            assert not rejected_during & dlq_after.keys()
            assert dlq_after.keys() - dlq_before.keys() <= rejected_before
            await trio.to_thread.run_sync(proxy.set_mode, PASS)
            run.fault("dlq_restored")
            await run.wait_done(120, _alive(sc))
            st = await sc.status()
            assert await sc.stop() == 0
        await _check(run, broker, f"DLQ unavailable 10 s ({run.elapsed_s():.0f}s)")
    assert st["failure"] is None
